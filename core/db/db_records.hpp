#pragma once
// What both back ends store, taken out of a FrameRecord once: the frame row's fields and the sources'
// columns as flat arrays (core/db internal; docs/DATABASE.md has the schema).
#include <cstdint>
#include <string>
#include <vector>

#include "core/db/results_store.hpp"

namespace gpuphot::db {

// Declination zones of the sources' index: zone = floor((dec + 90) / kZoneHeightDeg). A cone search
// scans the index (zone, ra) over the zones and right-ascension ranges that cover the circle.
inline constexpr double kZoneHeightDeg = 1.0 / 120.0; // 30 arcsec
std::int64_t zoneOf(double decDeg);

struct RaRange {
    std::int64_t zone;
    double raMin, raMax; // degrees, raMin <= raMax, within [0, 360]
};
// The (zone, ra range) boxes whose union covers the circle of radiusDeg around (ra, dec).
std::vector<RaRange> coneBoxes(double raDeg, double decDeg, double radiusDeg);
double separationArcsec(double ra1, double dec1, double ra2, double dec2);

struct FrameFields {
    std::string path;
    int hdu = 0;
    std::string checksum, filter, object, software, status;
    double mjd, exptime, airmass, fwhm, ellipticity, sky, skyRms, zp, zpErr, astrometricRms, seconds;
    std::int64_t width = 0, height = 0, sources = 0, calibrators = 0;
    std::string apertureRadii; // JSON array text
    std::string timings;       // JSON object text: stage -> seconds
    std::string config;        // JSON text of the configuration
    std::string configHash;    // 16 hex digits (FNV-1a 64 of `config`)
    std::string written;       // UTC ISO 8601 time of the write
};
// Throws InvalidInput when the report lacks frame.path.
FrameFields frameFields(const FrameRecord& record);

// The schema version a store's meta table holds (its text, as both back ends keep it): the number, or -1
// when the text is not a plain non-negative integer (a damaged or foreign database).
int parseSchemaVersion(const std::string& text);

// The sources' columns; missing catalog columns are NaN (or -1 for ref_id, 0 for flags).
struct SourceColumns {
    std::size_t rows = 0;
    int apertures = 0;
    std::vector<std::int64_t> id, zone, flags, refId;
    std::vector<double> ra, dec, x, y, fluxAuto, fluxErrAuto, fluxPsf, fluxErrPsf, magCal, magErrCal, fwhm;
    // aper[row * 2 * apertures + 2k] = flux_aper_{k+1}, [.. + 2k + 1] = fluxerr_aper_{k+1}
    std::vector<double> aper;
    // The rows are sorted by (zone, ra), so that the cone index is written in key order; `order` is the
    // order to write them in (the identity).
    std::vector<std::uint32_t> order;
    // The footprint: the mean direction of the sources with a sky position and the largest separation of
    // one from it (degrees; NaN without any).
    double centreRa, centreDec, radiusDeg;
};
// Throws InvalidInput when the catalog is missing or lacks ra/dec.
SourceColumns sourceColumns(const Table& catalog);

// The empty result table of cone() with `apertures` flux_aper_k/fluxerr_aper_k columns; appendConeRow
// adds one row.
Table coneTable(int apertures);
struct ConeRow {
    std::int64_t frameId = 0, hdu = 0, id = 0, flags = 0, refId = -1;
    std::string path, filter;
    double mjd, ra, dec, x, y, sep, fluxAuto, fluxErrAuto, fluxPsf, fluxErrPsf, magCal, magErrCal;
    const double* aper = nullptr; // 2 * naper values (flux, err interleaved)
    int naper = 0;
};
void appendConeRow(Table& table, const ConeRow& row);
// Sorts the cone table by (mjd, frame_id, sep).
Table sortCone(const Table& table);

// The seriesCurve() result table, and one row of it.
Table seriesTable();
struct SeriesRow {
    std::string object, kind, path, filter;
    double ra, dec, mjd, bjdTdb, relFlux, relFluxErr, mag, magErr;
    std::int64_t frameId = 0, hdu = 0;
};
void appendSeriesRow(Table& table, const SeriesRow& row);
// The columns both stores' seriesCurve query selects, in this order (kSeriesCurveColumns), read from a
// result row with real(c) / integer(c) / str(c).
inline constexpr const char* kSeriesCurveColumns = "o.name, o.kind, o.ra, o.dec, f.id, f.path, f.hdu, f.mjd, "
                                                   "f.filter, p.bjd_tdb, p.rel_flux, p.rel_flux_err, "
                                                   "p.mag, p.mag_err";
template <class Row> SeriesRow seriesRowOf(const Row& q) {
    SeriesRow r;
    r.object = q.str(0), r.kind = q.str(1), r.ra = q.real(2), r.dec = q.real(3), r.frameId = q.integer(4);
    r.path = q.str(5), r.hdu = q.integer(6), r.mjd = q.real(7), r.filter = q.str(8), r.bjdTdb = q.real(9);
    r.relFlux = q.real(10), r.relFluxErr = q.real(11), r.mag = q.real(12), r.magErr = q.real(13);
    return r;
}

// The frames() result table's empty columns.
Table framesTable();

std::string fnv1a64Hex(const std::string& text);

} // namespace gpuphot::db
