#pragma once
// Observation times for light curves: mid-exposure UTC -> JD_UTC, BJD_TDB and HJD_UTC for a target's
// position and the observatory, with ERFA (the IAU SOFA algorithms): UTC -> TAI -> TT (leap seconds),
// TT -> TDB (eraDtdb, with the site), the Earth's barycentric and heliocentric position (eraEpv00) plus
// the site's geocentric position rotated into the GCRS (eraC2t06a, UT1 taken as UTC and no polar motion:
// both below a microsecond here), and the Roemer delay towards the target.
#include <optional>
#include <string>

#include "core/model/header.hpp"

namespace gpuphot {

struct ObservingSite {
    double latitude = 0.0;  // deg, geodetic (WGS84)
    double longitude = 0.0; // deg, east positive
    double elevation = 0.0; // m above the ellipsoid
    std::string source;     // where it came from ("SITELAT/SITELONG", "OBSGEO-X/Y/Z", "options", ...)
};

// The site from a header: SITELAT/SITELONG[/SITEELEV], LAT-OBS/LONG-OBS[/ALT-OBS] (numbers, or
// sexagesimal text "+31:57:12"; longitudes east positive) or OBSGEO-X/Y/Z (m, geocentric ITRS).
// nullopt when none is there; InvalidInput for a value that cannot be a site.
std::optional<ObservingSite> siteFromHeader(const Header& header);

struct ObservationTimes {
    double jdUtc = 0.0;  // Julian date, UTC
    double jdTdb = 0.0;  // Julian date, TDB, at the observatory
    double bjdTdb = 0.0; // barycentric Julian date (TDB) of the target's light
    double hjdUtc = 0.0; // heliocentric Julian date in UTC (the convention of older variable-star work)
    double barycentricDelay = 0.0;  // s, BJD_TDB - JD_TDB
    double heliocentricDelay = 0.0; // s, HJD_UTC - JD_UTC
};

// The observer at one instant: what every target of a frame shares (the costly part: ephemerides).
struct ObserverEphemeris {
    double utc1 = 0.0, utc2 = 0.0; // JD_UTC as two parts
    double tdb1 = 0.0, tdb2 = 0.0; // JD_TDB at the observatory as two parts
    double bary[3] = {0, 0, 0};    // the observer's barycentric position (au, BCRS)
    double helio[3] = {0, 0, 0};   // the observer's heliocentric position (au)
};

// `site` null: the geocentre (the site's delay, up to 21 ms, is then left out). Throws InvalidInput for
// an MJD outside ERFA's range or a site that is not on the Earth.
ObserverEphemeris observerAt(double mjdUtc, const ObservingSite* site);

// The times of light from the target at (ra, dec) ICRS degrees. Throws InvalidInput for a non-finite
// position.
ObservationTimes towards(const ObserverEphemeris& observer, double raDeg, double decDeg);

inline ObservationTimes observationTimes(double mjdUtc, double raDeg, double decDeg,
                                         const ObservingSite* site) {
    return towards(observerAt(mjdUtc, site), raDeg, decDeg);
}

} // namespace gpuphot
