#include "core/wcs/wcs.hpp"

#include <wcslib/dis.h>
#include <wcslib/lin.h>
#include <wcslib/spc.h>
#include <wcslib/wcs.h>
#include <wcslib/wcserr.h>
#include <wcslib/wcsfix.h>
#include <wcslib/wcshdr.h>
#include <wcslib/wcsunits.h>
#include <wcslib/wcsutil.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <regex>
#include <sstream>
#include <vector>

#include "core/model/header.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"

namespace gpuphot {
// Releases every error object of w and its parts (WCSLIB overwrites them without freeing).
static void clearTransformErrors(wcsprm* w) {
    wcserr_clear(&w->err);
    wcserr_clear(&w->lin.err);
    wcserr_clear(&w->cel.err);
    wcserr_clear(&w->cel.prj.err);
    if (w->lin.dispre) wcserr_clear(&w->lin.dispre->err);
    if (w->lin.disseq) wcserr_clear(&w->lin.disseq->err);
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::size_t kChunk = 4096; // points per wcsp2s/wcss2p call

// wcspih's scanner and the wcserr switch are process-wide: serialise parsing.
std::mutex& parseMutex() {
    static std::mutex m;
    return m;
}

void enableWcsErrors() {
    static std::once_flag once;
    std::call_once(once, [] { wcserr_enable(1); });
}

// An owned wcsprm (heap allocated so that its address never changes).
struct WcsprmDeleter {
    void operator()(wcsprm* w) const {
        if (!w) return;
        wcsfree(w);
        std::free(w);
    }
};
using WcsprmPtr = std::unique_ptr<wcsprm, WcsprmDeleter>;

WcsprmPtr newWcsprm() {
    auto* w = static_cast<wcsprm*>(std::calloc(1, sizeof(wcsprm)));
    if (!w) throw std::bad_alloc();
    w->flag = -1;
    return WcsprmPtr(w);
}

std::string wcsErrorText(const wcsprm* w, int status) {
    if (w && w->err && w->err->msg[0]) return w->err->msg;
    if (status > 0 && status < 14) return wcs_errmsg[status];
    return "WCSLIB status " + std::to_string(status);
}

// Deep copy of `src` (which must be set up) restricted to `axes` (1-based; empty: all axes).
WcsprmPtr copyWcsprm(const wcsprm* src, std::vector<int> axes = {}) {
    WcsprmPtr dst = newWcsprm();
    int nsub = static_cast<int>(axes.size());
    const int status = axes.empty() ? wcssub(1, src, nullptr, nullptr, dst.get())
                                    : wcssub(1, src, &nsub, axes.data(), dst.get());
    if (status != 0) throw InvalidInput("WCS: copying the WCS failed: " + wcsErrorText(dst.get(), status));
    const int setStatus = wcsset(dst.get());
    if (setStatus != 0) throw InvalidInput("WCS: invalid WCS: " + wcsErrorText(dst.get(), setStatus));
    return dst;
}

std::string trimmed(const char* s, std::size_t max) {
    std::string out(s, strnlen(s, max));
    while (!out.empty() && out.back() == ' ')
        out.pop_back();
    return out;
}

bool looksCelestial(const std::string& ctype) {
    // "RA---TAN", "DEC--TPV", "GLON-CAR", "ELAT-SIN", ...: a celestial axis carries a projection code.
    return ctype.size() >= 8 && ctype[4] == '-' &&
           (ctype.rfind("RA", 0) == 0 || ctype.rfind("DEC", 0) == 0 || ctype.find("LON") == 1 ||
            ctype.find("LAT") == 1 || ctype.find("LN") == 2 || ctype.find("LT") == 2);
}

// WCS keywords whose values must be numbers; wcspih silently drops a card it cannot parse, which would
// leave a default (e.g. CRVAL = 0) in place of a broken value.
bool isNumericWcsKey(const std::string& key) {
    static const std::regex re(
        R"(^((CRPIX|CRVAL|CDELT|CROTA)[0-9]{1,2}[A-Z]?|(CD|PC|PV)[0-9]{1,2}_[0-9]{1,2}[A-Z]?|)"
        R"((A|B|AP|BP)_([0-9]_[0-9]|ORDER|DMAX)|LONPOLE[A-Z]?|LATPOLE[A-Z]?)$)");
    return std::regex_match(key, re);
}

// Keywords that define a celestial WCS (with an optional alternate letter): a damaged one makes the
// header WCS broken; any other damaged card is merely left out of what WCSLIB sees.
bool isCelestialWcsKey(const std::string& key) {
    static const std::regex re(
        R"(^((WCSAXES|CTYPE|CUNIT|CRPIX|CRVAL|CDELT|CROTA)[0-9]{0,2}[A-Z]?|)"
        R"((CD|PC|PV|PS)[0-9]{1,2}_[0-9]{1,2}[A-Z]?|(A|B|AP|BP)_([0-9]_[0-9]|ORDER|DMAX)|)"
        R"((LONPOLE|LATPOLE|EQUINOX|RADESYS)[A-Z]?|RADECSYS|EPOCH|)"
        R"((CPDIS|CQDIS)[0-9]{1,2}|(DP|DQ)[0-9]{1,2})$)");
    return std::regex_match(key, re);
}

// Why a value text cannot be handed to WCSLIB as one card (empty: it can). A string must close within
// its card with every inner quote doubled and nothing after it; WCSLIB 7.12's scanner otherwise reads
// on into the next cards and its fortified strcpy aborts the process on the over-long string (found by
// tests/fuzz/fuzz_header_wcs: an unterminated CUNIT1 string).
std::string malformedValue(const std::string& value) {
    constexpr std::size_t kMaxValue = 70; // columns 11-80 of a card
    if (value.size() > kMaxValue)
        return "a value of " + std::to_string(value.size()) + " characters, more than a card holds";
    for (char ch : value)
        if (static_cast<unsigned char>(ch) < 32 || static_cast<unsigned char>(ch) > 126)
            return "a non-printable character in the value";
    if (value.find('\'') == std::string::npos) return {};
    if (value.front() != '\'') return "a quote inside a value that is not a string";
    std::size_t i = 1;
    for (;; ++i) {
        if (i >= value.size()) return "an unterminated string";
        if (value[i] != '\'') continue;
        if (i + 1 < value.size() && value[i + 1] == '\'') {
            ++i; // a doubled quote inside the string
            continue;
        }
        break;
    }
    if (value.find_first_not_of(' ', i + 1) != std::string::npos) return "text after the closing quote";
    return {};
}

std::string printableExcerpt(const std::string& text, std::size_t max) {
    std::string out = text.substr(0, max);
    for (char& ch : out)
        if (static_cast<unsigned char>(ch) < 32 || static_cast<unsigned char>(ch) > 126) ch = '?';
    return out + (text.size() > max ? "..." : "");
}

// The header as WCSLIB's wcspih gets it: only value cards of plain 1-8 character keywords, each
// re-formatted by us without its comment, so that every card is well formed and nothing spans two
// cards. Commentary, HIERARCH and CONTINUE cards carry no WCS and are left out. Returns the reason when a
// celestial WCS keyword itself is damaged (then the header WCS is broken), else empty.
// True when `value` (a card's value text) is a plain integer: optional blanks, an optional sign, digits.
bool plainInteger(const std::string& value) {
    std::size_t i = value.find_first_not_of(' ');
    if (i == std::string::npos) return false;
    if (value[i] == '+' || value[i] == '-') ++i;
    const std::size_t digits = i;
    while (i < value.size() && value[i] >= '0' && value[i] <= '9')
        ++i;
    if (i == digits) return false;
    return value.find_first_not_of(' ', i) == std::string::npos;
}

std::string wcslibHeaderText(const Header& header, std::string& text) {
    text.clear();
    text.reserve(header.size() * 80);
    for (const auto& card : header.cards()) {
        if (card.value.empty() || card.key.empty() || card.key.size() > 8) continue;
        if (card.key.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
            continue;
        if (const std::string why = malformedValue(card.value); !why.empty()) {
            if (isCelestialWcsKey(card.key))
                return "header WCS keyword " + card.key + " is damaged (" + why +
                       "): " + printableExcerpt(card.value, 40);
            continue;
        }
        // WCSLIB 7.12's wcspih sizes its arrays from NAXIS / WCSAXES (NAXIS = 950970851 asked for 7.6 GB;
        // found by tests/fuzz/fuzz_header_wcs): a WCS has at most 99 axes. The value must be a plain integer:
        // wcspih's scanner reads the leading digits of anything else (NAXIS = 361665E-05 is 3.6 as a number
        // but asked for 15.6 GB; found by the CI fuzz run).
        if (card.key == "NAXIS" || card.key.rfind("WCSAXES", 0) == 0) {
            const auto n = parseFitsNumber(card.value);
            if (!plainInteger(card.value) || !n || !(*n >= 0 && *n <= 99))
                return "header keyword " + card.key + " = " + printableExcerpt(card.value, 40) +
                       " is not an axis count for a WCS (an integer, at most 99 axes)";
        }
        text += Header::formatCard({card.key, card.value, {}});
    }
    return {};
}

// Why a CUNITn of a celestial axis of `w` would make wcsset fail (empty: none would). WCSLIB 7.12's
// wcsset frees the unit parser's error object without its message when a celestial axis's unit is not
// an angle (a leak on every such header; found by tests/fuzz/fuzz_header_wcs: CUNIT1 = 'deg    0').
// The same check here, with the error object cleared properly, refuses those headers before wcsset.
std::string unusableCelestialUnit(const wcsprm* w) {
    for (int k = 0; k < w->naxis; ++k) {
        const std::string unit = trimmed(w->cunit[k], 72);
        if (unit.empty() || !looksCelestial(trimmed(w->ctype[k], 72))) continue;
        wcserr* err = nullptr;
        double scale = 0, offset = 0, power = 0;
        const int status = wcsunitse(unit.c_str(), "deg", &scale, &offset, &power, &err);
        const std::string why = err && err->msg ? err->msg : "not an angle";
        wcserr_clear(&err);
        if (status != 0)
            return "CUNIT" + std::to_string(k + 1) + " = '" + printableExcerpt(unit, 40) +
                   "' is not an angle unit: " + why;
    }
    return {};
}

// What WCSLIB's spcfix does (an AIPS-convention spectral CTYPE such as 'FELO-HEL' with VELREF becomes the
// standard type, 'VOPT-F2W', and SPECSYS, 'BARYCENT'), through WCSLIB's spcaips, without spcfix's messages:
// WCSLIB 7.12's spcfix loses the first of its two messages when it changes both CTYPE and SPECSYS (a leak on
// every such header; found by the CI fuzz run, 'FELO-OBS'). As in spcfix, the first
// axis with an AIPS spectral type is translated; a bad VELREF is left for wcsset to report.
void translateAipsSpectral(wcsprm* w) {
    for (int i = 0; i < w->naxis; ++i) {
        char ctype[9] = {}, specsys[9] = {};
        if (spcaips(w->ctype[i], w->velref, ctype, specsys) != 0) continue; // not an AIPS spectral type
        if (w->specsys[0] == '\0' && specsys[0] != '\0') {
            std::memset(w->specsys, 0, sizeof w->specsys);
            std::memcpy(w->specsys, specsys, std::strlen(specsys));
        }
        if (std::strncmp(w->ctype[i], ctype, 9) != 0) {
            std::memset(w->ctype[i], 0, sizeof w->ctype[i]);
            std::memcpy(w->ctype[i], ctype, std::strlen(ctype));
        }
        return;
    }
}

enum class ParseOutcome { Ok, NoWcs, Broken };

struct ParseResult {
    ParseOutcome outcome = ParseOutcome::NoWcs;
    std::string reason;
    WcsprmPtr wcs;
};

ParseResult broken(std::string reason) {
    return {ParseOutcome::Broken, std::move(reason), nullptr};
}

ParseResult parseHeader(const Header& header) {
    enableWcsErrors();
    for (const auto& card : header.cards()) {
        if (card.value.empty() || !isNumericWcsKey(card.key)) continue;
        const auto v = parseFitsNumber(card.value);
        if (!v) return broken("header WCS keyword " + card.key + " = " + card.value + " is not a number");
        if (!std::isfinite(*v))
            return broken("header WCS keyword " + card.key + " = " + card.value + " is not finite");
    }

    std::string text;
    if (std::string damaged = wcslibHeaderText(header, text); !damaged.empty()) return broken(damaged);
    const int nkeyrec = static_cast<int>(text.size() / 80);
    int nreject = 0, nwcs = 0;
    wcsprm* all = nullptr;
    {
        std::lock_guard lock(parseMutex());
        const int status = wcspih(text.data(), nkeyrec, WCSHDR_all, 0, &nreject, &nwcs, &all);
        if (status != 0) {
            if (all) wcsvfree(&nwcs, &all);
            return broken(std::string("header WCS could not be parsed: ") +
                          wcshdr_errmsg[std::min(status, 6)]);
        }
    }
    struct Guard {
        int& n;
        wcsprm*& p;
        ~Guard() {
            if (p) wcsvfree(&n, &p);
        }
    } guard{nwcs, all};
    if (nwcs == 0) return {ParseOutcome::NoWcs, "the header has no WCS keywords", nullptr};

    // Primary description (alt ' ') first, then the alternates A..Z in header order.
    std::vector<int> order(nwcs);
    for (int i = 0; i < nwcs; ++i)
        order[i] = i;
    std::stable_partition(order.begin(), order.end(),
                          [&](int i) { return all[i].alt[0] == ' ' || all[i].alt[0] == 0; });

    std::string noCelestial;
    for (int i : order) {
        wcsprm* w = &all[i];
        const std::string altName = (w->alt[0] == ' ' || w->alt[0] == 0) ? std::string("primary WCS")
                                                                         : std::string("WCS ") + w->alt[0];
        bool celestialCtype = false;
        std::string ctypes;
        for (int k = 0; k < w->naxis; ++k) {
            const std::string ct = trimmed(w->ctype[k], 72);
            celestialCtype = celestialCtype || looksCelestial(ct);
            ctypes += (k ? ", " : "") + std::string("CTYPE") + std::to_string(k + 1) + " = '" + ct + "'";
        }
        // The fixes astropy applies (dates, units, AIPS-convention celestial types, spectral types); failures
        // surface in wcsset below. cdfix (unit diagonal for an axis whose CD row and column are all zero)
        // only beyond two axes, where a cube's spectral axis needs it; on an image it would turn an
        // all-zero CD matrix into 1 deg/px instead of an error.
        // Each fix may leave an informative message in w->err (e.g. datfix's "Set MJD-OBS ... from
        // DATE-OBS"); WCSLIB 7.12's unitfix then loses that error object (a leak on every header with
        // DATE-OBS but no MJD-OBS, found by tests/fuzz/fuzz_header_wcs). The messages are not used here:
        // clear each one.
        if (w->naxis > 2) cdfix(w);
        wcserr_clear(&w->err);
        datfix(w);
        wcserr_clear(&w->err);
        unitfix(1, w);
        wcserr_clear(&w->err);
        // celfix only translates AIPS NCP/GLS; on any other header it merely runs wcsset, and when that
        // fails WCSLIB 7.12 leaks the error message (found by tests/fuzz/fuzz_header_wcs, e.g. CTYPE2 =
        // 'DEC-2-TAN'). wcsset below reports the same error without the leak.
        bool aipsCelestial = false;
        for (int k = 0; k < w->naxis; ++k) {
            const std::string ct = trimmed(w->ctype[k], 72);
            aipsCelestial = aipsCelestial || (ct.size() > 4 && (ct.compare(ct.size() - 4, 4, "-NCP") == 0 ||
                                                                ct.compare(ct.size() - 4, 4, "-GLS") == 0));
        }
        // Before any wcsset: a celestial unit that wcsset cannot read makes it leak its error object.
        if (std::string bad = unusableCelestialUnit(w); !bad.empty())
            return broken("header " + altName + ": " + bad);
        // celfix runs wcsset first, and a wcsset that fails loses its error objects and, when run once more,
        // the linear transformation's arrays (found by the deep fuzz run on NCP/GLS headers): wcsset runs
        // once here, and a header it refuses is reported at once.
        if (aipsCelestial) {
            if (const int status = wcsset(w); status != 0)
                return broken("header " + altName + " is invalid: " + wcsErrorText(w, status));
            celfix(w);
        }
        wcserr_clear(&w->err);
        translateAipsSpectral(w);
        const int status = wcsset(w);
        if (status != 0) {
            if (celestialCtype || w->lng >= 0 || w->lat >= 0)
                return broken("header " + altName + " is invalid: " + wcsErrorText(w, status));
            if (noCelestial.empty()) noCelestial = altName + " has no celestial axes (" + ctypes + ")";
            continue;
        }
        if (w->lng < 0 || w->lat < 0) {
            if (celestialCtype)
                return broken("header " + altName + " has unpaired celestial axes (" + ctypes + ")");
            if (noCelestial.empty()) noCelestial = altName + " has no celestial axes (" + ctypes + ")";
            continue;
        }
        WcsprmPtr own;
        try {
            if (w->naxis == 2) {
                own = copyWcsprm(w);
            } else {
                const int a = std::min(w->lng, w->lat) + 1, b = std::max(w->lng, w->lat) + 1;
                own = copyWcsprm(w, {a, b});
            }
        } catch (const InvalidInput& e) {
            return broken("header " + altName + ": " + e.what());
        }
        // WCSLIB only rejects an exactly singular matrix; rows that are parallel to rounding are no better.
        // (After wcsset a CD matrix lives in pc with cdelt = 1.)
        const double* pc = own->lin.pc;
        const double* cdelt = own->lin.cdelt;
        const double m[4] = {cdelt[0] * pc[0], cdelt[0] * pc[1], cdelt[1] * pc[2], cdelt[1] * pc[3]};
        const double det = m[0] * m[3] - m[1] * m[2];
        if (!(std::fabs(det) > 1e-12 * std::hypot(m[0], m[1]) * std::hypot(m[2], m[3])))
            return broken("header " + altName + " has a singular CD (or PC x CDELT) matrix");
        // A reference point that does not transform means the keywords are inconsistent.
        double pix[2] = {own->crpix[0], own->crpix[1]}, img[2], phi, theta, world[2];
        int pstat = 0;
        const int ps = wcsp2s(own.get(), 1, 2, pix, img, &phi, &theta, world, &pstat);
        if (ps != 0 || !std::isfinite(world[0]) || !std::isfinite(world[1]))
            return broken("header " + altName +
                          " does not transform its reference pixel: " + wcsErrorText(own.get(), ps));
        return {ParseOutcome::Ok, {}, std::move(own)};
    }
    return {ParseOutcome::NoWcs, noCelestial.empty() ? "the header has no celestial WCS" : noCelestial,
            nullptr};
}

double wrapRa(double ra) {
    if (!std::isfinite(ra)) return ra;
    double r = std::fmod(ra, 360.0);
    if (r < 0) r += 360.0;
    if (r >= 360.0) r = 0.0; // fmod of a tiny negative number plus 360 can round up to 360
    return r;
}

std::string formatRaHms(double ra) {
    long long ms = std::llround(wrapRa(ra) / 15.0 * 3600.0 * 1000.0);
    ms %= 24LL * 3600 * 1000;
    const long long h = ms / 3600000, m = (ms / 60000) % 60, s = (ms / 1000) % 60, f = ms % 1000;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld.%03lld", h, m, s, f);
    return buf;
}

std::string formatDecDms(double dec) {
    const char sign = dec < 0 ? '-' : '+';
    long long cs = std::llround(std::fabs(dec) * 3600.0 * 100.0);
    const long long d = cs / 360000, m = (cs / 6000) % 60, s = (cs / 100) % 60, f = cs % 100;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%c%02lld:%02lld:%02lld.%02lld", sign, d, m, s, f);
    return buf;
}

} // namespace

struct Wcs::Impl {
    WcsprmPtr wcs;
    mutable std::mutex mutex;

    // The caller holds `mutex`. Transforms n points; failed points become NaN.
    void p2s(std::size_t n, const double* x, const double* y, double* ra, double* dec) const;
    void s2p(std::size_t n, const double* ra, const double* dec, double* x, double* y) const;
    // Jacobian of (xi, eta) [deg] on the tangent plane at pixel (x, y) per pixel; false if it fails.
    bool jacobian(double x, double y, double j[2][2], double* raC = nullptr, double* decC = nullptr) const;
};

namespace {

// The work arrays of one wcsp2s/wcss2p call over m points (two coordinates each). valid[k] = 0 marks an
// input the caller replaced by the reference point; stat[k] != 0 a point WCSLIB could not transform.
struct TransformChunk {
    std::vector<double> pix, img, phi, theta, world;
    std::vector<int> stat;
    std::vector<char> valid;

    void reset(std::size_t m) {
        pix.resize(2 * m);
        img.resize(2 * m);
        world.resize(2 * m);
        phi.resize(m);
        theta.resize(m);
        stat.assign(m, 0);
        valid.assign(m, 1);
    }

    // call(k, count) transforms points k..k+count-1 and returns WCSLIB's status. A whole-call failure
    // other than `badPointStatus` (e.g. a distortion that does not converge) is retried point by point.
    template <class Call> void transform(std::size_t m, int badPointStatus, Call call) {
        const int status = call(0, static_cast<int>(m));
        if (status == 0 || status == badPointStatus) return;
        for (std::size_t k = 0; k < m; ++k)
            if (call(k, 1) != 0) stat[k] = 1;
    }
};

} // namespace

// WCSLIB 7.12 reuses the error objects of a wcsprm and its parts when a point fails to transform and
// loses the previous message each time (the fuzzer's leaks in wcsp2s/celx2s and wcss2p/disx2p): after a
// failed call every error object is released (their messages are never used; failed points become NaN).

void Wcs::Impl::p2s(std::size_t n, const double* x, const double* y, double* ra, double* dec) const {
    wcsprm* w = wcs.get();
    const int lng = w->lng, lat = w->lat;
    TransformChunk c;
    for (std::size_t start = 0; start < n; start += kChunk) {
        const std::size_t m = std::min(kChunk, n - start);
        c.reset(m);
        for (std::size_t k = 0; k < m; ++k) {
            const double px = x[start + k], py = y[start + k];
            if (!std::isfinite(px) || !std::isfinite(py)) {
                c.valid[k] = 0;
                c.pix[2 * k] = w->crpix[0];
                c.pix[2 * k + 1] = w->crpix[1];
            } else {
                c.pix[2 * k] = px + 1.0; // WCSLIB pixel coordinates are 1-based
                c.pix[2 * k + 1] = py + 1.0;
            }
        }
        c.transform(m, WCSERR_BAD_PIX, [&](std::size_t k, int count) {
            const int status = wcsp2s(w, count, 2, &c.pix[2 * k], &c.img[2 * k], &c.phi[k], &c.theta[k],
                                      &c.world[2 * k], &c.stat[k]);
            if (status != 0) clearTransformErrors(w);
            return status;
        });
        for (std::size_t k = 0; k < m; ++k) {
            const bool ok = c.valid[k] && c.stat[k] == 0;
            ra[start + k] = ok ? wrapRa(c.world[2 * k + lng]) : kNaN;
            dec[start + k] = ok ? c.world[2 * k + lat] : kNaN;
        }
    }
}

void Wcs::Impl::s2p(std::size_t n, const double* ra, const double* dec, double* x, double* y) const {
    wcsprm* w = wcs.get();
    const int lng = w->lng, lat = w->lat;
    TransformChunk c;
    for (std::size_t start = 0; start < n; start += kChunk) {
        const std::size_t m = std::min(kChunk, n - start);
        c.reset(m);
        for (std::size_t k = 0; k < m; ++k) {
            const double a = ra[start + k], d = dec[start + k];
            if (!std::isfinite(a) || !std::isfinite(d) || std::fabs(d) > 90.0) {
                c.valid[k] = 0;
                c.world[2 * k + lng] = w->crval[lng];
                c.world[2 * k + lat] = w->crval[lat];
            } else {
                c.world[2 * k + lng] = a;
                c.world[2 * k + lat] = d;
            }
        }
        c.transform(m, WCSERR_BAD_WORLD, [&](std::size_t k, int count) {
            const int status = wcss2p(w, count, 2, &c.world[2 * k], &c.phi[k], &c.theta[k], &c.img[2 * k],
                                      &c.pix[2 * k], &c.stat[k]);
            if (status != 0) clearTransformErrors(w);
            return status;
        });
        for (std::size_t k = 0; k < m; ++k) {
            const bool ok = c.valid[k] && c.stat[k] == 0 && std::isfinite(c.pix[2 * k]) &&
                            std::isfinite(c.pix[2 * k + 1]);
            x[start + k] = ok ? c.pix[2 * k] - 1.0 : kNaN;
            y[start + k] = ok ? c.pix[2 * k + 1] - 1.0 : kNaN;
        }
    }
}

bool Wcs::Impl::jacobian(double x, double y, double j[2][2], double* raC, double* decC) const {
    constexpr double h = 0.5;
    const double px[5] = {x, x + h, x - h, x, x};
    const double py[5] = {y, y, y, y + h, y - h};
    double ra[5], dec[5];
    p2s(5, px, py, ra, dec);
    double xi[5], eta[5];
    for (int k = 0; k < 5; ++k) {
        if (!std::isfinite(ra[k])) return false;
        if (!tanProject(ra[0], dec[0], ra[k], dec[k], xi[k], eta[k])) return false;
    }
    j[0][0] = (xi[1] - xi[2]) / (2 * h);
    j[1][0] = (eta[1] - eta[2]) / (2 * h);
    j[0][1] = (xi[3] - xi[4]) / (2 * h);
    j[1][1] = (eta[3] - eta[4]) / (2 * h);
    if (raC) *raC = ra[0];
    if (decC) *decC = dec[0];
    return true;
}

Wcs::Wcs(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}

Wcs Wcs::fromHeader(const Header& header) {
    ParseResult r = parseHeader(header);
    if (r.outcome != ParseOutcome::Ok) throw InvalidInput(r.reason);
    auto impl = std::make_unique<Impl>();
    impl->wcs = std::move(r.wcs);
    return Wcs(std::move(impl));
}

std::optional<Wcs> Wcs::tryFromHeader(const Header& header, std::string* why) {
    ParseResult r = parseHeader(header);
    if (r.outcome == ParseOutcome::Broken) throw InvalidInput(r.reason);
    if (r.outcome == ParseOutcome::NoWcs) {
        if (why) *why = r.reason;
        return std::nullopt;
    }
    auto impl = std::make_unique<Impl>();
    impl->wcs = std::move(r.wcs);
    return Wcs(std::move(impl));
}

Wcs Wcs::fromTanSip(const TanSip& solution) {
    return fromHeader(solution.toHeader());
}

Wcs::Wcs(const Wcs& other) {
    auto impl = std::make_unique<Impl>();
    {
        std::lock_guard lock(other.m_impl->mutex);
        impl->wcs = copyWcsprm(other.m_impl->wcs.get());
    }
    m_impl = std::move(impl);
}

Wcs& Wcs::operator=(const Wcs& other) {
    if (this != &other) {
        Wcs copy(other);
        m_impl = std::move(copy.m_impl);
    }
    return *this;
}

Wcs::Wcs(Wcs&&) noexcept = default;
Wcs& Wcs::operator=(Wcs&&) noexcept = default;
Wcs::~Wcs() = default;

void Wcs::pixelToWorld(std::span<const double> x, std::span<const double> y, std::span<double> ra,
                       std::span<double> dec) const {
    if (y.size() != x.size() || ra.size() != x.size() || dec.size() != x.size())
        throw InvalidInput("Wcs::pixelToWorld: x, y, ra and dec must have the same length");
    std::lock_guard lock(m_impl->mutex);
    m_impl->p2s(x.size(), x.data(), y.data(), ra.data(), dec.data());
}

void Wcs::worldToPixel(std::span<const double> ra, std::span<const double> dec, std::span<double> x,
                       std::span<double> y) const {
    if (dec.size() != ra.size() || x.size() != ra.size() || y.size() != ra.size())
        throw InvalidInput("Wcs::worldToPixel: ra, dec, x and y must have the same length");
    std::lock_guard lock(m_impl->mutex);
    m_impl->s2p(ra.size(), ra.data(), dec.data(), x.data(), y.data());
}

std::pair<double, double> Wcs::pixelToWorld(double x, double y) const {
    double ra = 0, dec = 0;
    std::lock_guard lock(m_impl->mutex);
    m_impl->p2s(1, &x, &y, &ra, &dec);
    return {ra, dec};
}

std::pair<double, double> Wcs::worldToPixel(double ra, double dec) const {
    double x = 0, y = 0;
    std::lock_guard lock(m_impl->mutex);
    m_impl->s2p(1, &ra, &dec, &x, &y);
    return {x, y};
}

double Wcs::pixelScaleArcsec(double x, double y) const {
    double j[2][2];
    std::lock_guard lock(m_impl->mutex);
    if (!m_impl->jacobian(x, y, j)) return kNaN;
    return std::sqrt(std::fabs(j[0][0] * j[1][1] - j[0][1] * j[1][0])) * 3600.0;
}

std::string Wcs::projectionCode() const {
    std::lock_guard lock(m_impl->mutex);
    const wcsprm* w = m_impl->wcs.get();
    std::string code = trimmed(w->cel.prj.code, 4);
    std::string dist;
    for (const disprm* d : {w->lin.dispre, w->lin.disseq}) {
        if (!d || !d->dtype) continue;
        for (int k = 0; k < d->naxis && dist.empty(); ++k)
            dist = trimmed(d->dtype[k], 72);
    }
    if (dist.empty()) return code;
    if (dist == "TPV") return "TPV";
    return code + "-" + dist;
}

std::string Wcs::summary(int width, int height) const {
    const double cx = 0.5 * (width - 1), cy = 0.5 * (height - 1);
    double j[2][2], ra = kNaN, dec = kNaN;
    bool ok = false;
    std::pair<double, double> corner[4];
    const double cornerX[4] = {0.0, width - 1.0, width - 1.0, 0.0};
    const double cornerY[4] = {0.0, 0.0, height - 1.0, height - 1.0};
    {
        std::lock_guard lock(m_impl->mutex);
        ok = m_impl->jacobian(cx, cy, j, &ra, &dec);
        for (int k = 0; k < 4; ++k)
            m_impl->p2s(1, &cornerX[k], &cornerY[k], &corner[k].first, &corner[k].second);
    }
    const std::string proj = projectionCode();
    std::ostringstream os;
    char buf[256];
    os << "WCS: " << proj << " projection\n";
    if (!ok) {
        os << "  the centre of the image does not transform\n";
        return os.str();
    }
    const double det = j[0][0] * j[1][1] - j[0][1] * j[1][0];
    const double scale = std::sqrt(std::fabs(det)) * 3600.0;
    // Position angle of the image's +y axis, east of north; parity from the sign of the Jacobian.
    const double rotation = std::atan2(j[0][1], j[1][1]) * 180.0 / 3.14159265358979323846;
    std::snprintf(buf, sizeof buf, "  centre (pixel %.1f, %.1f): RA %s, Dec %s (%.6f, %+.6f deg)\n", cx + 1,
                  cy + 1, formatRaHms(ra).c_str(), formatDecDms(dec).c_str(), ra, dec);
    os << buf;
    std::snprintf(buf, sizeof buf,
                  "  pixel scale: %.4f arcsec/px; rotation: +y is %.2f deg E of N; parity: %s\n", scale,
                  rotation, det < 0 ? "normal (E left when N up)" : "flipped");
    os << buf;
    const double fw = width * scale / 60.0, fh = height * scale / 60.0;
    if (std::max(fw, fh) >= 120.0)
        std::snprintf(buf, sizeof buf, "  field: %d x %d px = %.3f x %.3f deg\n", width, height, fw / 60,
                      fh / 60);
    else
        std::snprintf(buf, sizeof buf, "  field: %d x %d px = %.2f x %.2f arcmin\n", width, height, fw, fh);
    os << buf;
    os << "  corners (1-based pixel -> RA, Dec deg):\n";
    for (int k = 0; k < 4; ++k) {
        std::snprintf(buf, sizeof buf, "    (%g, %g) -> (%.6f, %+.6f)\n", cornerX[k] + 1, cornerY[k] + 1,
                      corner[k].first, corner[k].second);
        os << buf;
    }
    return os.str();
}

Header Wcs::toHeader() const {
    int nkeyrec = 0;
    char* text = nullptr;
    int status = 0;
    {
        std::lock_guard lock(m_impl->mutex);
        status = wcshdo(WCSHDO_safe | WCSHDO_P17, m_impl->wcs.get(), &nkeyrec, &text);
        if (status != 0) {
            const std::string msg = wcsErrorText(m_impl->wcs.get(), status);
            wcsdealloc(text);
            throw InvalidInput("Wcs::toHeader: WCSLIB could not write the WCS: " + msg);
        }
    }
    const Header raw = Header::fromFitsString(std::string_view(text, static_cast<std::size_t>(nkeyrec) * 80));
    wcsdealloc(text);

    // wcshdo writes PCi_j with CDELTi; SIP and TPV are defined on CDi_j and many readers (astrometry.net
    // and its kin) look only for CD, so a WCS that came with CD goes out as CD. MJDREF = 0 is noise.
    bool useCd = false;
    {
        std::lock_guard lock(m_impl->mutex);
        useCd = (m_impl->wcs->altlin & 2) != 0;
    }
    const double cdelt[2] = {raw.getDouble("CDELT1").value_or(1.0), raw.getDouble("CDELT2").value_or(1.0)};
    Header out;
    for (const auto& card : raw.cards()) {
        if (card.key == "COMMENT") {
            out.addComment(card.comment);
        } else if (card.key == "HISTORY") {
            out.addHistory(card.comment);
        } else if (card.key == "MJDREF" && parseFitsNumber(card.value).value_or(1.0) == 0.0) {
            continue;
        } else if (useCd && (card.key == "CDELT1" || card.key == "CDELT2")) {
            continue;
        } else if (useCd && card.key.size() == 5 && card.key.rfind("PC", 0) == 0 && card.key[3] == '_') {
            const int i = card.key[2] - '1', j = card.key[4] - '1';
            const auto pc = parseFitsNumber(card.value);
            if (i < 0 || i > 1 || j < 0 || j > 1 || !pc) {
                out.setRaw(card.key, card.value, card.comment);
                continue;
            }
            out.set("CD" + card.key.substr(2), cdelt[i] * *pc, "[deg/px] linear transformation matrix");
        } else {
            out.setRaw(card.key, card.value, card.comment);
        }
    }
    return out;
}

} // namespace gpuphot
