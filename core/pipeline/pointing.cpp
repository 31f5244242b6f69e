#include "core/pipeline/pointing.hpp"

#include <cmath>

#include "core/io/target_list.hpp"
#include "core/model/header.hpp"

namespace gpuphot {

namespace {
// A coordinate card: a number is degrees (RA too); a sexagesimal string is hours for RA, degrees for Dec.
std::optional<double> coordinate(const Header& h, const char* key, bool isRa) {
    const HeaderCard* c = h.find(key);
    if (!c) return std::nullopt;
    std::string v = c->value;
    const bool quoted = !v.empty() && v.front() == '\'';
    if (!quoted) {
        if (auto d = h.getDouble(key); d && std::isfinite(*d)) return d;
        return std::nullopt;
    }
    v.erase(0, 1);
    if (const auto q = v.find_last_of('\''); q != std::string::npos) v.erase(q);
    while (!v.empty() && v.back() == ' ') v.pop_back();
    while (!v.empty() && v.front() == ' ') v.erase(v.begin());
    if (v.find_first_of(":hdm ") != std::string::npos) {
        if (auto s = parseSexagesimalAngle(v)) return isRa ? *s * 15.0 : *s;
        return std::nullopt;
    }
    if (auto d = parseFitsNumber(v); d && std::isfinite(*d)) return d;
    return std::nullopt;
}
} // namespace

std::optional<Pointing> framePointing(const Header& header) {
    static const char* pairs[][2] = {{"RA", "DEC"},       {"OBJCTRA", "OBJCTDEC"}, {"RA-MNT", "DEC-MNT"},
                                     {"TELRA", "TELDEC"}, {"CAT-RA", "CAT-DEC"},   {"RA_OBJ", "DEC_OBJ"}};
    for (const auto& p : pairs) {
        const auto ra = coordinate(header, p[0], true), dec = coordinate(header, p[1], false);
        if (ra && dec && std::fabs(*dec) <= 90.0) {
            double r = std::fmod(*ra, 360.0);
            if (r < 0) r += 360.0;
            return Pointing{r, *dec, std::string(p[0]) + "/" + p[1]};
        }
    }
    return std::nullopt;
}

} // namespace gpuphot
