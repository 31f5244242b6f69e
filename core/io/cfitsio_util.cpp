#include "core/io/cfitsio_util.hpp"

#include <cctype>
#include <vector>

namespace gpuphot {

FitsHandle::~FitsHandle() {
    if (f) {
        int st = 0;
        fits_close_file(f, &st);
        fits_clear_errmsg();
    }
}

int FitsHandle::close() {
    int st = 0;
    if (f) fits_close_file(f, &st);
    f = nullptr;
    return st;
}

std::string cfitsioText(int status) {
    char text[FLEN_STATUS] = {};
    fits_get_errstatus(status, text);
    std::string msg = text;
    std::vector<std::string> stack;
    char m[FLEN_ERRMSG] = {};
    while (fits_read_errmsg(m)) stack.emplace_back(m);
    if (!stack.empty()) {
        msg += " [CFITSIO:";
        const std::size_t first = stack.size() > 3 ? stack.size() - 3 : 0;
        for (std::size_t i = first; i < stack.size(); ++i) {
            std::string s = stack[i];
            while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
            msg += (i == first ? " " : "; ") + s;
        }
        msg += "]";
    }
    return msg;
}

} // namespace gpuphot
