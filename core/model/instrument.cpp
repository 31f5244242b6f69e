#include "core/model/instrument.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/model/header.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

std::string formatValue(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    return buf;
}

// The first key of `keys` whose value is a finite number. A present value that is not a number
// ('NaN', 'unknown') counts as absent: headers use it for "not measured".
std::optional<double> firstFinite(const Header& h, const std::vector<std::string>& keys, std::string& which) {
    for (const auto& k : keys) {
        auto v = h.getDouble(k);
        if (v && std::isfinite(*v)) {
            which = k;
            return v;
        }
    }
    return std::nullopt;
}

std::optional<std::string> firstNonEmptyString(const Header& h, const std::vector<std::string>& keys,
                                               std::string& which) {
    for (const auto& k : keys) {
        auto v = h.getString(k);
        if (!v) continue;
        std::string s = *v;
        while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
            s.erase(s.begin());
        while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
            s.pop_back();
        if (s.empty()) continue;
        which = k;
        return s;
    }
    return std::nullopt;
}

[[noreturn]] void badValue(const std::string& key, double v, const char* rule) {
    throw InvalidInput("header keyword " + key + " = " + formatValue(v) + ": " + rule);
}

[[noreturn]] void badOverride(const char* what, double v, const char* rule) {
    throw InvalidInput(std::string("instrument override ") + what + " = " + formatValue(v) + ": " + rule);
}

// The bound a quantity read by readBounded must keep: > 0, or >= 0 when zero is allowed.
struct Bound {
    const char* overrideName; // in the override's message
    const char* headerName;   // in the header keyword's message
    bool zeroAllowed;
    const char* unit;
    bool infiniteOverride; // an infinite override is accepted (header values are always finite)
};

// `value` from the override, else from the first finite keyword of `keys`, either checked against `b`;
// `source` says "override" or names the keyword. False (nothing set) when neither is there.
bool readBounded(const Header& h, const std::vector<std::string>& keys, const std::optional<double>& ov,
                 const Bound& b, double& value, std::string& source) {
    const auto inBound = [&](double v) { return b.zeroAllowed ? v >= 0 : v > 0; };
    const std::string rule = std::string(b.zeroAllowed ? "must be >= 0 " : "must be > 0 ") + b.unit;
    std::string which;
    if (ov) {
        if (!inBound(*ov) || (!b.infiniteOverride && !std::isfinite(*ov)))
            badOverride(b.overrideName, *ov, rule.c_str());
        value = *ov;
        source = "override";
        return true;
    }
    if (auto v = firstFinite(h, keys, which)) {
        if (!inBound(*v)) badValue(which, *v, (b.headerName + (" " + rule)).c_str());
        value = *v;
        source = which;
        return true;
    }
    return false;
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil algorithm).
long long daysFromCivil(long long y, unsigned m, unsigned d) {
    y -= m <= 2;
    const long long era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = static_cast<unsigned>(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + static_cast<long long>(doe) - 719468;
}

bool parseInt(std::string_view s, int& out) {
    if (s.empty()) return false;
    for (char c : s)
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && p == s.data() + s.size();
}

bool isLeap(int y) {
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

} // namespace

std::optional<double> isoDateToMjd(const std::string& isoIn) {
    std::string iso = isoIn;
    while (!iso.empty() && std::isspace(static_cast<unsigned char>(iso.back())))
        iso.pop_back();
    while (!iso.empty() && std::isspace(static_cast<unsigned char>(iso.front())))
        iso.erase(iso.begin());
    if (!iso.empty() && (iso.back() == 'Z' || iso.back() == 'z')) iso.pop_back();
    if (iso.size() < 10 || iso[4] != '-' || iso[7] != '-') return std::nullopt;
    int y = 0, mo = 0, d = 0;
    if (!parseInt(std::string_view(iso).substr(0, 4), y) ||
        !parseInt(std::string_view(iso).substr(5, 2), mo) || !parseInt(std::string_view(iso).substr(8, 2), d))
        return std::nullopt;
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (mo < 1 || mo > 12 || d < 1) return std::nullopt;
    if (d > mdays[mo - 1] + (mo == 2 && isLeap(y) ? 1 : 0)) return std::nullopt;
    double dayFraction = 0.0;
    if (iso.size() > 10) {
        if (iso[10] != 'T' && iso[10] != ' ') return std::nullopt;
        std::string_view t = std::string_view(iso).substr(11);
        if (t.size() < 5 || t[2] != ':') return std::nullopt;
        int hh = 0, mm = 0;
        double ss = 0.0;
        if (!parseInt(t.substr(0, 2), hh) || !parseInt(t.substr(3, 2), mm)) return std::nullopt;
        if (t.size() > 5) {
            if (t[5] != ':' || t.size() < 8) return std::nullopt;
            std::string_view sec = t.substr(6);
            auto [p, ec] = std::from_chars(sec.data(), sec.data() + sec.size(), ss);
            if (ec != std::errc() || p != sec.data() + sec.size() ||
                !std::isdigit(static_cast<unsigned char>(sec[0])))
                return std::nullopt;
        }
        if (hh > 23 || mm > 59 || ss < 0 || ss >= 61) return std::nullopt; // 60.x: leap second
        dayFraction = (hh * 3600.0 + mm * 60.0 + ss) / 86400.0;
    }
    // MJD 40587 = 1970-01-01.
    return static_cast<double>(daysFromCivil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d)) +
                               40587) +
           dayFraction;
}

Instrument readInstrument(const Header& h, const InstrumentKeywords& keys, const InstrumentOverrides& ov) {
    Instrument inst;
    std::string which;

    // Gain: a single keyword, else the mean of the per-amplifier gains present.
    if (!readBounded(h, keys.gain, ov.gain, {"gain", "gain", false, "e-/ADU", false}, inst.gain,
                     inst.gainSource)) {
        double sum = 0.0;
        std::string used;
        int n = 0;
        for (const auto& k : keys.gainPerAmp) {
            auto v = h.getDouble(k);
            if (!v || !std::isfinite(*v)) continue;
            if (!(*v > 0)) badValue(k, *v, "gain must be > 0 e-/ADU");
            sum += *v;
            used += (n ? "," : "") + k;
            ++n;
        }
        if (n > 0) {
            inst.gain = sum / n;
            inst.gainSource = n == 1 ? used : "mean(" + used + ")";
        }
    }
    if (inst.gainSource == "default" && ov.gainIfAbsent) {
        if (!(*ov.gainIfAbsent > 0.0) || !std::isfinite(*ov.gainIfAbsent))
            badOverride("gain where the header has none", *ov.gainIfAbsent, "must be > 0 e-/ADU");
        inst.gain = *ov.gainIfAbsent;
        inst.gainSource = "gainIfAbsent";
    }
    readBounded(h, keys.readNoise, ov.readNoise, {"read noise", "read noise", true, "e-", false},
                inst.readNoise, inst.readNoiseSource);
    // An infinite saturation override means "none".
    readBounded(h, keys.saturation, ov.saturation, {"saturation", "saturation level", false, "ADU", true},
                inst.saturation, inst.saturationSource);
    if (inst.saturationSource == "default" && ov.saturationIfAbsent) {
        if (!(*ov.saturationIfAbsent > 0.0))
            badOverride("saturation where the header has none", *ov.saturationIfAbsent, "must be > 0 ADU");
        inst.saturation = *ov.saturationIfAbsent;
        inst.saturationSource = "saturationIfAbsent";
    }
    readBounded(h, keys.exptime, ov.exptime, {"exposure time", "exposure time", true, "s", false},
                inst.exptime, inst.exptimeSource);

    if (ov.airmass) {
        if (!(*ov.airmass >= 1.0) || !std::isfinite(*ov.airmass))
            badOverride("airmass", *ov.airmass, "must be >= 1");
        inst.airmass = *ov.airmass;
    } else if (auto a = firstFinite(h, keys.airmass, which)) {
        // 0 or negative: "not recorded" in many camera headers; below 1 is not an airmass.
        if (*a >= 1.0) inst.airmass = *a;
    }

    if (ov.filter)
        inst.filter = *ov.filter;
    else if (auto f = firstNonEmptyString(h, keys.filter, which))
        inst.filter = *f;
    if (ov.object)
        inst.object = *ov.object;
    else if (auto o = firstNonEmptyString(h, keys.object, which))
        inst.object = *o;

    if (auto d = firstNonEmptyString(h, keys.dateObs, which)) {
        inst.dateObs = *d;
        // Old headers split date and time: DATE-OBS = '2016-09-09', TIME-OBS = '08:14:34'.
        if (inst.dateObs.size() == 10)
            for (const char* tk : {"TIME-OBS", "UT", "UTSTART", "UT-START"})
                if (auto t = h.getString(tk); t && !t->empty() && (*t)[0] >= '0' && (*t)[0] <= '9' &&
                                              isoDateToMjd(inst.dateObs + "T" + *t)) {
                    inst.dateObs += "T" + *t;
                    break;
                }
    }
    if (auto m = firstFinite(h, keys.mjdObs, which))
        inst.mjdStart = *m;
    else if (!inst.dateObs.empty())
        if (auto m2 = isoDateToMjd(inst.dateObs)) inst.mjdStart = *m2;
    if (std::isfinite(inst.mjdStart) && std::isfinite(inst.exptime))
        inst.mjdMid = inst.mjdStart + inst.exptime / 2.0 / 86400.0;
    return inst;
}

// JSON: core/model/instrument_params.cpp (through the parameter table).

} // namespace gpuphot
