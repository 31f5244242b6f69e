#include "core/series/barycentric.hpp"

#include <cmath>

#include <erfa.h>
#include <erfam.h>

#include "core/io/target_list.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

constexpr double kDeg = ERFA_DD2R;

// A header angle: a number, or sexagesimal text in degrees.
std::optional<double> angleOf(const Header& h, const char* key) {
    if (auto v = h.getDouble(key)) return v;
    if (auto s = h.getString(key)) {
        if (auto a = parseSexagesimalAngle(*s)) return a;
        throw InvalidInput(std::string(key) + " = '" + *s + "' is not an angle");
    }
    return std::nullopt;
}

std::optional<ObservingSite> siteFrom(const Header& h, const char* lat, const char* lon, const char* elev) {
    const auto la = angleOf(h, lat), lo = angleOf(h, lon);
    if (!la || !lo) return std::nullopt;
    if (!(std::fabs(*la) <= 90.0) || !(std::fabs(*lo) <= 360.0))
        throw InvalidInput(std::string(lat) + "/" + lon + " out of range: " + std::to_string(*la) + ", " +
                           std::to_string(*lo));
    ObservingSite s;
    s.latitude = *la;
    s.longitude = *lo > 180.0 ? *lo - 360.0 : *lo;
    s.elevation = h.getDouble(elev).value_or(0.0);
    s.source = std::string(lat) + "/" + lon;
    return s;
}

} // namespace

std::optional<ObservingSite> siteFromHeader(const Header& h) {
    if (auto s = siteFrom(h, "SITELAT", "SITELONG", "SITEELEV")) return s;
    if (auto s = siteFrom(h, "LAT-OBS", "LONG-OBS", "ALT-OBS")) return s;
    const auto x = h.getDouble("OBSGEO-X"), y = h.getDouble("OBSGEO-Y"), z = h.getDouble("OBSGEO-Z");
    if (x && y && z) {
        double xyz[3] = {*x, *y, *z}, elong = 0, phi = 0, height = 0;
        if (eraGc2gd(ERFA_WGS84, xyz, &elong, &phi, &height) != 0 || std::hypot(*x, *y, *z) < 6.0e6)
            throw InvalidInput("OBSGEO-X/Y/Z is not a position on the Earth (metres, geocentric)");
        return ObservingSite{phi / kDeg, elong / kDeg, height, "OBSGEO-X/Y/Z"};
    }
    return std::nullopt;
}

ObserverEphemeris observerAt(double mjdUtc, const ObservingSite* site) {
    if (!std::isfinite(mjdUtc)) throw InvalidInput("observation time: the MJD must be finite");
    ObserverEphemeris o;
    o.utc1 = ERFA_DJM0;
    o.utc2 = mjdUtc;
    double tai1, tai2, tt1, tt2;
    if (eraUtctai(o.utc1, o.utc2, &tai1, &tai2) < 0 || eraTaitt(tai1, tai2, &tt1, &tt2) != 0)
        throw InvalidInput("observation time: MJD " + std::to_string(mjdUtc) + " is outside ERFA's range");

    double itrs[3] = {0.0, 0.0, 0.0}, elong = 0.0;
    if (site) {
        elong = site->longitude * kDeg;
        if (eraGd2gc(ERFA_WGS84, elong, site->latitude * kDeg, site->elevation, itrs) != 0)
            throw InvalidInput("observation time: the site is not a position on the Earth");
    }
    const double ut = mjdUtc - std::floor(mjdUtc); // fraction of the UT day (UT1 ~ UTC)
    const double dtdb = eraDtdb(tt1, tt2, ut, elong, std::hypot(itrs[0], itrs[1]) / 1000.0, itrs[2] / 1000.0);
    o.tdb1 = tt1;
    o.tdb2 = tt2 + dtdb / ERFA_DAYSEC;

    double pvh[2][3], pvb[2][3];
    eraEpv00(o.tdb1, o.tdb2, pvh, pvb); // au; the status only says the date is far from 1900-2100
    double rc2t[3][3], gcrs[3];
    eraC2t06a(tt1, tt2, o.utc1, o.utc2, 0.0, 0.0, rc2t);
    eraTrxp(rc2t, itrs, gcrs); // ITRS -> GCRS (metres)
    for (int k = 0; k < 3; ++k) {
        o.bary[k] = pvb[0][k] + gcrs[k] / ERFA_DAU;
        o.helio[k] = pvh[0][k] + gcrs[k] / ERFA_DAU;
    }
    return o;
}

ObservationTimes towards(const ObserverEphemeris& o, double raDeg, double decDeg) {
    if (!std::isfinite(raDeg) || !std::isfinite(decDeg))
        throw InvalidInput("observation time: the target's position must be finite");
    const double cd = std::cos(decDeg * kDeg);
    const double n[3] = {cd * std::cos(raDeg * kDeg), cd * std::sin(raDeg * kDeg), std::sin(decDeg * kDeg)};
    double bary = 0.0, helio = 0.0;
    for (int k = 0; k < 3; ++k) {
        bary += o.bary[k] * n[k];
        helio += o.helio[k] * n[k];
    }
    ObservationTimes t;
    t.barycentricDelay = bary * ERFA_AULT;
    t.heliocentricDelay = helio * ERFA_AULT;
    t.jdUtc = o.utc1 + o.utc2;
    t.jdTdb = o.tdb1 + o.tdb2;
    t.bjdTdb = o.tdb1 + (o.tdb2 + t.barycentricDelay / ERFA_DAYSEC);
    t.hjdUtc = o.utc1 + (o.utc2 + t.heliocentricDelay / ERFA_DAYSEC);
    return t;
}

} // namespace gpuphot
