#include "core/db/db_records.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <limits>
#include <numeric>

#include "core/util/json_number.hpp"
#include "core/util/text.hpp"
#include "core/wcs/tan_sip.hpp"

namespace gpuphot::db {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double number(const nlohmann::json& j, const char* key) {
    return numberOrNaN(j, key);
}

std::string text(const nlohmann::json& j, const char* key) {
    if (!j.is_object()) return {};
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string{};
}

const nlohmann::json& section(const nlohmann::json& j, const char* key) {
    static const nlohmann::json empty = nlohmann::json::object();
    auto it = j.find(key);
    return it != j.end() && it->is_object() ? *it : empty;
}

std::vector<double> column(const Table& t, const char* name) {
    if (t.find(name)) return t.doubles(name);
    return std::vector<double>(t.rows(), kNaN);
}

std::vector<std::int64_t> intColumn(const Table& t, const char* name, std::int64_t missing) {
    std::vector<std::int64_t> out(t.rows(), missing);
    if (const Column* c = t.find(name))
        for (std::size_t i = 0; i < out.size(); ++i) {
            const double v = c->asDouble(i);
            if (std::isfinite(v)) out[i] = static_cast<std::int64_t>(v);
        }
    return out;
}

int countApertures(const Table& t) {
    int k = 0;
    while (t.find("flux_aper_" + std::to_string(k + 1)))
        ++k;
    return k;
}

// SourceColumns' centre and radius.
void footprint(SourceColumns& s) {
    double x = 0, y = 0, z = 0;
    std::size_t n = 0;
    for (std::size_t i = 0; i < s.rows; ++i) {
        if (s.zone[i] < 0) continue;
        const double a = s.ra[i] * M_PI / 180, d = s.dec[i] * M_PI / 180;
        x += std::cos(d) * std::cos(a), y += std::cos(d) * std::sin(a), z += std::sin(d);
        ++n;
    }
    s.centreRa = s.centreDec = s.radiusDeg = kNaN;
    if (n == 0) return;
    const double norm = std::sqrt(x * x + y * y + z * z);
    s.centreDec = norm > 0 ? std::asin(std::clamp(z / norm, -1.0, 1.0)) * 180 / M_PI : 0.0;
    s.centreRa = std::fmod(std::atan2(y, x) * 180 / M_PI + 360.0, 360.0);
    double r = 0;
    for (std::size_t i = 0; i < s.rows; ++i)
        if (s.zone[i] >= 0) r = std::max(r, angularSeparationDeg(s.centreRa, s.centreDec, s.ra[i], s.dec[i]));
    s.radiusDeg = norm > 0 ? r * (1 + 1e-9) + 1e-9 : 180.0; // sources all round the sky: everywhere
}

} // namespace

std::int64_t zoneOf(double decDeg) {
    return static_cast<std::int64_t>(std::floor((std::clamp(decDeg, -90.0, 90.0) + 90.0) / kZoneHeightDeg));
}

std::vector<RaRange> coneBoxes(double raDeg, double decDeg, double radiusDeg) {
    std::vector<RaRange> boxes;
    const double decLo = std::max(-90.0, decDeg - radiusDeg), decHi = std::min(90.0, decDeg + radiusDeg);
    const double maxAbsDec = std::max(std::fabs(decLo), std::fabs(decHi));
    // Half-width in RA of the circle at its widest declination; the whole circle of RA near a pole.
    double half = 180.0;
    if (maxAbsDec < 89.999) half = std::min(180.0, radiusDeg / std::cos(maxAbsDec * M_PI / 180.0) + 1e-9);
    const double ra = std::fmod(std::fmod(raDeg, 360.0) + 360.0, 360.0);
    for (std::int64_t z = zoneOf(decLo); z <= zoneOf(decHi); ++z) {
        if (half >= 180.0) {
            boxes.push_back({z, 0.0, 360.0});
        } else if (ra - half < 0.0) {
            boxes.push_back({z, 0.0, ra + half});
            boxes.push_back({z, ra - half + 360.0, 360.0});
        } else if (ra + half > 360.0) {
            boxes.push_back({z, ra - half, 360.0});
            boxes.push_back({z, 0.0, ra + half - 360.0});
        } else {
            boxes.push_back({z, ra - half, ra + half});
        }
    }
    return boxes;
}

double separationArcsec(double ra1, double dec1, double ra2, double dec2) {
    return angularSeparationDeg(ra1, dec1, ra2, dec2) * 3600.0;
}

std::string fnv1a64Hex(const std::string& s) {
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

FrameFields frameFields(const FrameRecord& record) {
    const nlohmann::json& r = record.report;
    const nlohmann::json& frame = section(r, "frame");
    const nlohmann::json& in = section(r, "instrument");
    FrameFields f;
    f.path = text(frame, "path");
    if (f.path.empty()) throw InvalidInput("results store: the frame's report has no frame.path");
    f.hdu = static_cast<int>(std::isfinite(number(frame, "hdu")) ? number(frame, "hdu") : 0);
    f.checksum = record.checksum;
    f.status = record.status;
    f.filter = text(in, "filter");
    f.object = text(in, "object");
    f.software = text(r, "software");
    f.mjd = number(in, "mjd_mid");
    f.exptime = number(in, "exptime");
    f.airmass = number(in, "airmass");
    f.width = static_cast<std::int64_t>(std::isfinite(number(frame, "width")) ? number(frame, "width") : 0);
    f.height =
        static_cast<std::int64_t>(std::isfinite(number(frame, "height")) ? number(frame, "height") : 0);
    f.fwhm = number(r, "fwhm");
    f.ellipticity = number(r, "ellipticity");
    f.sky = number(section(r, "background"), "level");
    f.skyRms = number(section(r, "background"), "rms");
    f.zp = number(r, "zp");
    f.zpErr = number(r, "zp_err");
    f.astrometricRms = number(r, "astrometric_rms_arcsec");
    f.seconds = number(r, "total_seconds");
    const double n = number(section(r, "counts"), "sources");
    f.sources = std::isfinite(n) ? static_cast<std::int64_t>(n) : 0;
    const double nc = number(section(r, "calibration"), "calibrators");
    f.calibrators = std::isfinite(nc) ? static_cast<std::int64_t>(nc) : 0;
    auto radii = section(r, "aperture").find("radii");
    f.apertureRadii = radii != section(r, "aperture").end() ? radii->dump() : "[]";
    nlohmann::json timings = nlohmann::json::object();
    if (auto st = r.find("stages"); st != r.end() && st->is_array())
        for (const auto& s : *st)
            if (s.is_object() && s.contains("stage")) timings[text(s, "stage")] = number(s, "seconds");
    f.timings = timings.dump();
    auto config = r.find("config");
    f.config = config != r.end() ? config->dump() : "{}";
    f.configHash = fnv1a64Hex(f.config);
    f.written = utcNowIso();
    return f;
}

SourceColumns sourceColumns(const Table& t) {
    if (!t.find("ra") || !t.find("dec"))
        throw InvalidInput("results store: the catalog has no ra/dec columns");
    SourceColumns s;
    s.rows = t.rows();
    s.apertures = countApertures(t);
    s.id = intColumn(t, "id", 0);
    if (!t.find("id")) std::iota(s.id.begin(), s.id.end(), 1);
    s.flags = intColumn(t, "flags", 0);
    s.refId = intColumn(t, "ref_id", -1);
    s.ra = column(t, "ra");
    s.dec = column(t, "dec");
    s.x = column(t, "x");
    s.y = column(t, "y");
    s.fluxAuto = column(t, "flux_auto");
    s.fluxErrAuto = column(t, "fluxerr_auto");
    s.fluxPsf = column(t, "flux_psf");
    s.fluxErrPsf = column(t, "fluxerr_psf");
    s.magCal = column(t, "mag_cal");
    s.magErrCal = column(t, "magerr_cal");
    s.fwhm = column(t, "fwhm");
    s.aper.assign(s.rows * 2 * s.apertures, kNaN);
    for (int k = 0; k < s.apertures; ++k) {
        const std::vector<double> f = column(t, ("flux_aper_" + std::to_string(k + 1)).c_str());
        const std::vector<double> e = column(t, ("fluxerr_aper_" + std::to_string(k + 1)).c_str());
        for (std::size_t i = 0; i < s.rows; ++i) {
            s.aper[(i * s.apertures + k) * 2] = f[i];
            s.aper[(i * s.apertures + k) * 2 + 1] = e[i];
        }
    }
    s.zone.resize(s.rows);
    for (std::size_t i = 0; i < s.rows; ++i) {
        // A source without a sky position (no WCS) is stored with NaN ra/dec in zone -1: never in a cone.
        s.zone[i] = std::isfinite(s.ra[i]) && std::isfinite(s.dec[i]) ? zoneOf(s.dec[i]) : -1;
    }
    std::vector<std::uint32_t> order(s.rows);
    std::iota(order.begin(), order.end(), 0u);
    // The stores' key order: (zone, RA, id), a source off the sky (zone -1) at RA 0.
    auto raKey = [&](std::uint32_t i) { return s.zone[i] >= 0 ? s.ra[i] : 0.0; };
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
        if (s.zone[a] != s.zone[b]) return s.zone[a] < s.zone[b];
        if (raKey(a) != raKey(b)) return raKey(a) < raKey(b);
        return s.id[a] < s.id[b];
    });
    // The arrays themselves reordered, one at a time: the writers then read them front to back.
    auto permute = [&](auto& v, std::size_t stride) {
        auto copy = v;
        for (std::size_t i = 0; i < s.rows; ++i)
            std::copy_n(copy.begin() + order[i] * stride, stride, v.begin() + i * stride);
    };
    for (auto* v : {&s.id, &s.zone, &s.flags, &s.refId})
        permute(*v, 1);
    for (auto* v : {&s.ra, &s.dec, &s.x, &s.y, &s.fluxAuto, &s.fluxErrAuto, &s.fluxPsf, &s.fluxErrPsf,
                    &s.magCal, &s.magErrCal, &s.fwhm})
        permute(*v, 1);
    permute(s.aper, static_cast<std::size_t>(2 * s.apertures));
    s.order.resize(s.rows);
    std::iota(s.order.begin(), s.order.end(), 0u);
    footprint(s);
    return s;
}

Table coneTable(int apertures) {
    Table t;
    t.name = "CONE";
    t.add("frame_id", std::vector<std::int64_t>{}, "", "frame id in the store");
    t.add("path", std::vector<std::string>{}, "", "frame file");
    t.add("hdu", std::vector<std::int64_t>{}, "", "HDU (0-based)");
    t.add("mjd", std::vector<double>{}, "d", "mid-exposure MJD");
    t.add("filter", std::vector<std::string>{}, "", "FILTER");
    t.add("id", std::vector<std::int64_t>{}, "", "source id in the frame's catalog");
    t.add("ra", std::vector<double>{}, "deg", "right ascension");
    t.add("dec", std::vector<double>{}, "deg", "declination");
    t.add("x", std::vector<double>{}, "pix", "x (1-based)");
    t.add("y", std::vector<double>{}, "pix", "y (1-based)");
    t.add("sep", std::vector<double>{}, "arcsec", "separation from the query position");
    for (int k = 1; k <= apertures; ++k) {
        t.add("flux_aper_" + std::to_string(k), std::vector<double>{}, "adu", "aperture flux");
        t.add("fluxerr_aper_" + std::to_string(k), std::vector<double>{}, "adu", "aperture flux error");
    }
    t.add("flux_auto", std::vector<double>{}, "adu", "Kron flux");
    t.add("fluxerr_auto", std::vector<double>{}, "adu", "Kron flux error");
    t.add("flux_psf", std::vector<double>{}, "adu", "PSF flux");
    t.add("fluxerr_psf", std::vector<double>{}, "adu", "PSF flux error");
    t.add("mag_cal", std::vector<double>{}, "mag", "calibrated magnitude");
    t.add("magerr_cal", std::vector<double>{}, "mag", "calibrated magnitude error");
    t.add("flags", std::vector<std::int64_t>{}, "", "flag bits (docs/FLAGS.md)");
    t.add("ref_id", std::vector<std::int64_t>{}, "", "matched reference star (-1: none)");
    return t;
}

void appendConeRow(Table& t, const ConeRow& r) {
    auto& cols = t.columns();
    std::size_t c = 0;
    auto putI = [&](std::int64_t v) { cols[c++].as<std::int64_t>().push_back(v); };
    auto putD = [&](double v) { cols[c++].as<double>().push_back(v); };
    auto putS = [&](const std::string& v) { cols[c++].as<std::string>().push_back(v); };
    putI(r.frameId);
    putS(r.path);
    putI(r.hdu);
    putD(r.mjd);
    putS(r.filter);
    putI(r.id);
    putD(r.ra);
    putD(r.dec);
    putD(r.x);
    putD(r.y);
    putD(r.sep);
    // The table's aperture columns: this row's values, NaN past the row's own apertures.
    const std::size_t fixedAfter = 8; // flux_auto .. ref_id
    const std::size_t aperCols = cols.size() - c - fixedAfter;
    for (std::size_t k = 0; k < aperCols; ++k)
        putD(static_cast<int>(k / 2) < r.naper && r.aper ? r.aper[k] : kNaN);
    putD(r.fluxAuto);
    putD(r.fluxErrAuto);
    putD(r.fluxPsf);
    putD(r.fluxErrPsf);
    putD(r.magCal);
    putD(r.magErrCal);
    putI(r.flags);
    putI(r.refId);
}

Table sortCone(const Table& t) {
    const std::size_t n = t.rows();
    const auto& mjd = t.at("mjd").as<double>();
    const auto& frame = t.at("frame_id").as<std::int64_t>();
    const auto& sep = t.at("sep").as<double>();
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        const double ma = std::isfinite(mjd[a]) ? mjd[a] : 1e300, mb = std::isfinite(mjd[b]) ? mjd[b] : 1e300;
        if (ma != mb) return ma < mb;
        if (frame[a] != frame[b]) return frame[a] < frame[b];
        return sep[a] < sep[b];
    });
    Table out = t;
    for (auto& col : out.columns())
        std::visit(
            [&](auto& v) {
                auto copy = v;
                for (std::size_t i = 0; i < n; ++i)
                    v[i] = copy[order[i]];
            },
            col.data);
    return out;
}

Table seriesTable() {
    Table t;
    t.name = "SERIES";
    t.add("object", std::vector<std::string>{}, "", "series object");
    t.add("kind", std::vector<std::string>{}, "", "target | star");
    t.add("ra", std::vector<double>{}, "deg", "the object's right ascension");
    t.add("dec", std::vector<double>{}, "deg", "the object's declination");
    t.add("frame_id", std::vector<std::int64_t>{}, "", "frame id in the store");
    t.add("path", std::vector<std::string>{}, "", "frame file");
    t.add("hdu", std::vector<std::int64_t>{}, "", "HDU (0-based)");
    t.add("mjd", std::vector<double>{}, "d", "mid-exposure MJD");
    t.add("filter", std::vector<std::string>{}, "", "FILTER");
    t.add("bjd_tdb", std::vector<double>{}, "d", "barycentric Julian date (TDB)");
    t.add("rel_flux", std::vector<double>{}, "", "flux relative to the comparison ensemble");
    t.add("rel_flux_err", std::vector<double>{}, "", "its error");
    t.add("mag", std::vector<double>{}, "mag", "calibrated magnitude");
    t.add("mag_err", std::vector<double>{}, "mag", "its error");
    return t;
}

void appendSeriesRow(Table& t, const SeriesRow& r) {
    auto& c = t.columns();
    c[0].as<std::string>().push_back(r.object);
    c[1].as<std::string>().push_back(r.kind);
    c[2].as<double>().push_back(r.ra);
    c[3].as<double>().push_back(r.dec);
    c[4].as<std::int64_t>().push_back(r.frameId);
    c[5].as<std::string>().push_back(r.path);
    c[6].as<std::int64_t>().push_back(r.hdu);
    c[7].as<double>().push_back(r.mjd);
    c[8].as<std::string>().push_back(r.filter);
    c[9].as<double>().push_back(r.bjdTdb);
    c[10].as<double>().push_back(r.relFlux);
    c[11].as<double>().push_back(r.relFluxErr);
    c[12].as<double>().push_back(r.mag);
    c[13].as<double>().push_back(r.magErr);
}

Table framesTable() {
    Table t;
    t.name = "FRAMES";
    t.add("id", std::vector<std::int64_t>{}, "", "frame id in the store");
    t.add("path", std::vector<std::string>{}, "", "frame file");
    t.add("hdu", std::vector<std::int64_t>{}, "", "HDU (0-based)");
    t.add("checksum", std::vector<std::string>{}, "", "frame file checksum");
    t.add("mjd", std::vector<double>{}, "d", "mid-exposure MJD");
    t.add("filter", std::vector<std::string>{}, "", "FILTER");
    t.add("exptime", std::vector<double>{}, "s", "exposure time");
    t.add("airmass", std::vector<double>{}, "", "airmass");
    t.add("fwhm", std::vector<double>{}, "pix", "median FWHM");
    t.add("sky", std::vector<double>{}, "adu", "background level");
    t.add("zp", std::vector<double>{}, "mag", "zero point");
    t.add("zp_err", std::vector<double>{}, "mag", "zero point error");
    t.add("astrometric_rms", std::vector<double>{}, "arcsec", "astrometric fit RMS");
    t.add("sources", std::vector<std::int64_t>{}, "", "sources detected");
    t.add("calibrators", std::vector<std::int64_t>{}, "", "zero-point calibrators");
    t.add("software", std::vector<std::string>{}, "", "gpuphot version");
    t.add("config_hash", std::vector<std::string>{}, "", "FNV-1a 64 of the configuration");
    t.add("seconds", std::vector<double>{}, "s", "reduction time");
    t.add("status", std::vector<std::string>{}, "", "ok | uncalibrated");
    t.add("written", std::vector<std::string>{}, "", "UTC time of the write");
    return t;
}

int parseSchemaVersion(const std::string& text) {
    int version = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), version);
    return ec == std::errc{} && end == text.data() + text.size() && version >= 0 ? version : -1;
}

} // namespace gpuphot::db
