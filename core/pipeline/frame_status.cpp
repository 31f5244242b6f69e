#include "core/pipeline/frame_status.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <fitsio.h>
#include <fstream>
#include <unistd.h>

#include "core/io/cfitsio_util.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/util/errors.hpp"
#include "core/util/text.hpp"

namespace gpuphot {
namespace {

std::string hostName() {
    char buf[256] = {};
    if (gethostname(buf, sizeof buf - 1) != 0) return "";
    return buf;
}

nlohmann::json base(const std::string& frame, const char* status, int exitCode) {
    return {{"frame", frame},
            {"status", status},
            {"exit_code", exitCode},
            {"host", hostName()},
            {"pid", static_cast<long>(getpid())},
            {"time", utcNowIso()}};
}

nlohmann::json field(const nlohmann::json& j, const char* key) {
    return j.is_object() && j.contains(key) ? j[key] : nlohmann::json(nullptr);
}

} // namespace

nlohmann::json frameStatusOk(const ReduceSummary& s) {
    nlohmann::json j = base(s.frame, "ok", s.calibrationFailed ? 4 : 0);
    j["seconds"] = s.seconds;
    j["sources"] = s.sources;
    j["fwhm"] = field(s.report, "fwhm");
    j["zp"] = field(s.report, "zp");
    j["zp_err"] = field(s.report, "zp_err");
    j["astrometric_rms_arcsec"] = field(s.report, "astrometric_rms_arcsec");
    const nlohmann::json cal = field(s.report, "calibration");
    j["matched"] = cal.is_object() ? cal.value("matched", 0) : 0;
    j["calibration_failed"] = s.calibrationFailed;
    const nlohmann::json outs = field(s.report, "outputs");
    j["outputs"] = outs.is_object() ? outs : nlohmann::json::object();
    if (outs.is_object() && outs.contains("report")) j["report"] = outs["report"];
    j["warnings"] = s.warnings;
    return j;
}

nlohmann::json frameStatusFailed(const std::string& frame, const std::string& error, int exitCode) {
    nlohmann::json j = base(frame, "failed", exitCode);
    j["error"] = error;
    return j;
}

nlohmann::json frameStatusSkipped(const std::string& frame, const std::string& report) {
    nlohmann::json j = base(frame, "skipped", 0);
    j["report"] = report;
    return j;
}

bool outputsComplete(const std::string& framePath, const OutputOptions& options, const std::string& hduSpec) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string rep = reportPath(framePath, options, hduSpec);
    // A CFITSIO suffix (file.fits[1]) is not part of the file's name.
    std::string file = framePath;
    if (const auto b = file.find('['); b != std::string::npos && file.back() == ']') file.resize(b);
    const auto repTime = fs::last_write_time(rep, ec);
    if (ec) return false;
    const auto frameTime = fs::last_write_time(file, ec);
    if (ec || repTime < frameTime) return false;
    nlohmann::json report;
    try {
        std::ifstream in(rep);
        report = nlohmann::json::parse(in);
    } catch (const std::exception&) {
        return false;
    }
    if (!report.is_object() || !report.contains("outputs") || !report["outputs"].is_object()) return false;
    for (const auto& [key, value] : report["outputs"].items())
        if (!value.is_string() || !fs::exists(value.get<std::string>(), ec)) return false;
    return true;
}

namespace {

// True when the bytes of `path` at `offset` begin an extension's header.
bool extensionStartsAt(const std::string& path, long long offset) {
    std::ifstream in(path, std::ios::binary);
    char key[8] = {};
    in.seekg(offset);
    return static_cast<bool>(in.read(key, sizeof key)) && std::string(key, sizeof key) == "XTENSION";
}

} // namespace

bool fitsFileComplete(const std::string& path, std::string* why) {
    auto fail = [why](std::string text) {
        if (why) *why = std::move(text);
        return false;
    };
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) return fail("cannot read its size: " + ec.message());

    // No CFITSIO extended syntax; the header checks that readFrame makes (a header that would crash CFITSIO
    // is refused before CFITSIO moves through the HDUs here); a gzip file inflated with zlib.
    const std::vector<unsigned char> head = fileHead(path, 4);
    const bool gz = compressionOf(head.data(), head.size()) == "gzip"; // by content, as the readers decide
    if (!gz && size < 2880) return fail("shorter than one FITS block (" + std::to_string(size) + " bytes)");
    FitsHandle h;
    int status = 0;
    try {
        status = openFitsForReading(path, h, head);
    } catch (const IoError& e) { // a gzip stream that ends early: still being written
        return fail(e.what());
    } catch (const InvalidInput&) { // complete enough to judge: the reduction reports what is wrong
        return true;
    }
    fitsfile* const f = h.f;
    if (status) {
        char text[FLEN_STATUS] = {};
        fits_get_errstatus(status, text);
        fits_clear_errmsg();
        return fail(std::string("not FITS: ") + text);
    }
    int nhdu = 0;
    fits_get_num_hdus(f, &nhdu, &status);
    LONGLONG headStart = 0, dataStart = 0, dataEnd = 0;
    if (!status && nhdu > 0) fits_movabs_hdu(f, nhdu, nullptr, &status);
    if (!status) fits_get_hduaddrll(f, &headStart, &dataStart, &dataEnd, &status);
    h.close();
    if (status || nhdu < 1) {
        char text[FLEN_STATUS] = {};
        fits_get_errstatus(status, text);
        fits_clear_errmsg();
        return fail(std::string("cannot read its HDUs: ") + text);
    }
    // dataEnd counts the data's padding to a whole 2880-byte block; writers pad, so compare with it.
    if (!gz && static_cast<LONGLONG>(size) < dataEnd)
        return fail("truncated: " + std::to_string(size) + " of " + std::to_string(dataEnd) + " bytes");
    // CFITSIO counts only the HDUs whose header has its END card: bytes after the last one that begin
    // another ("XTENSION") are an extension whose header is still being written.
    if (!gz && static_cast<LONGLONG>(size) > dataEnd && extensionStartsAt(path, dataEnd))
        return fail("the extension after byte " + std::to_string(dataEnd) + " has no complete header yet");
    return true;
}

void appendJsonLine(const std::string& path, const nlohmann::json& line) {
    const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw IoError(path + ": cannot open for appending: " + std::strerror(errno));
    const ssize_t n = ::write(fd, text.data(), text.size());
    const int err = errno;
    ::close(fd);
    if (n != static_cast<ssize_t>(text.size()))
        throw IoError(path +
                      ": cannot append a status line: " + (n < 0 ? std::strerror(err) : "short write"));
}

std::vector<nlohmann::json> readJsonLines(const std::string& path, std::size_t* malformed) {
    std::vector<nlohmann::json> out;
    std::size_t bad = 0;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        try {
            nlohmann::json j = nlohmann::json::parse(line);
            if (j.is_object())
                out.push_back(std::move(j));
            else
                ++bad;
        } catch (const std::exception&) {
            ++bad;
        }
    }
    if (malformed) *malformed = bad;
    return out;
}

} // namespace gpuphot
