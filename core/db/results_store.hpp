#pragma once
// The results store: reduced frames and their sources in a database, behind one small interface with
// two back ends (docs/DATABASE.md):
//   - SQLite (embedded, one file; the default): openResultsStore("night.sqlite");
//   - PostgreSQL with the Q3C extension for cone searches: openResultsStore("postgresql://user@host/db").
// The schema is versioned; opening applies the migrations a database lacks, and refuses one written by a
// newer version (DatabaseError::Kind::SchemaTooNew). A frame is identified by (path, hdu): writing it
// again replaces its row and its sources in one transaction, so a reader (or a run killed at any point)
// sees the frame before or after, never half of it. Qt-free; every writer (reduce, watch, worker, the
// workbench) goes through DatabaseWriter (db_writer.hpp) or putFrame directly.
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/catalog/table.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {

// A database could not be used. Each kind has its own exit status (docs/CLI.md, exit codes).
class DatabaseError : public Error {
public:
    enum class Kind {
        Unreachable,    // no server at that address, or the file/directory cannot be opened (exit 5)
        Authentication, // the server refused the user or password (exit 6)
        SchemaTooNew,   // written by a newer gpuphot: its schema version is above ours (exit 7)
        Full,           // the disk or the server ran out of space (exit 8)
        Other,          // any other database failure: a corrupt file, a failed statement (exit 9)
    };
    DatabaseError(Kind kind, const std::string& message) : Error(message), m_kind(kind) {}
    Kind kind() const { return m_kind; }

private:
    Kind m_kind;
};
int databaseExitCode(DatabaseError::Kind kind); // 5..9, as above

// The schema version this build writes (migrations from every earlier one are applied on open).
inline constexpr int kResultsSchemaVersion = 2;

// One reduced frame as the store takes it: the report (STEM.report.json, reduceFrame's summary.report,
// with its "outputs" section when written) and the catalog table (STEM.cat.fits's columns).
struct FrameRecord {
    nlohmann::json report;
    const Table* catalog = nullptr; // required
    std::string checksum;           // of the frame file ("adler32:..."; fileChecksum), may be empty
    std::string status = "ok";      // ok | uncalibrated
};

// The frame file's checksum as the store records it: "adler32:" and 8 hex digits over the whole file.
// Throws IoError naming the file.
std::string fileChecksum(const std::string& path);

// The frame table's selection (frames): every field optional.
struct FrameQuery {
    std::optional<double> mjdMin, mjdMax; // mid-exposure MJD range (inclusive)
    std::string filter;                   // exact FILTER value ("": any)
    std::string pathLike;                 // SQL LIKE pattern on the frame path ("": any)
};

// The light curves of the time-series work (`gpuphot series --db`): an object and its points, each
// point tied to a stored frame by the frame file's path (absolute, as putFrame stores it) and HDU.
struct SeriesPointRecord {
    std::string framePath;
    int hdu = 0;
    double bjdTdb = NAN, relFlux = NAN, relFluxErr = NAN, mag = NAN, magErr = NAN;
};
struct SeriesObjectRecord {
    std::string name;
    std::string kind = "target";
    double ra = NAN, dec = NAN; // degrees
    std::vector<SeriesPointRecord> points;
};
struct SeriesWriteResult {
    std::size_t objects = 0, points = 0;
    std::size_t pointsWithoutFrame = 0; // their frame is not in the store: not written
};

// The store. Not thread-safe: one thread at a time per object (DatabaseWriter owns one on its thread).
class ResultsStore {
public:
    virtual ~ResultsStore() = default;
    virtual std::string backend() const = 0; // "sqlite" | "postgresql"
    virtual int schemaVersion() const = 0;

    // Writes (or replaces) the frame and all its sources in one transaction; returns the frame's id.
    // Throws DatabaseError; on error the database holds what it held before the call.
    virtual std::int64_t putFrame(const FrameRecord& frame) = 0;
    // The checksum recorded for (path, hdu), or nullopt when the frame is not in the store.
    virtual std::optional<std::string> frameChecksum(const std::string& path, int hdu) = 0;

    // One row per frame, ordered by MJD then path: id, path, hdu, checksum, mjd, filter, exptime, airmass,
    // fwhm, sky, zp, zp_err, astrometric_rms, sources, calibrators, software, config_hash, seconds, status,
    // written (UTC ISO time of the write).
    virtual Table frames(const FrameQuery& query) = 0;
    // Every stored source within radiusArcsec of (ra, dec), with its frame: frame_id, path, hdu, mjd,
    // filter, source id, ra, dec, x, y, sep (arcsec), flux/fluxerr per aperture, auto and psf fluxes,
    // mag_cal, magerr_cal, flags, ref_id; ordered by mjd, frame, separation.
    virtual Table cone(double raDeg, double decDeg, double radiusArcsec) = 0;
    // The stored configuration (JSON text) of a frame id; empty when unknown.
    virtual std::string frameConfig(std::int64_t frameId) = 0;

    // Writes series objects and their points in one transaction. An object is the stored one of the same
    // name and kind (its position updated), else a new one; a point replaces the object's point of the
    // same frame. Throws DatabaseError; on error nothing of the call is stored.
    virtual SeriesWriteResult putSeries(const std::vector<SeriesObjectRecord>& objects) = 0;
    // The stored points of the series objects named `name`, by BJD: object, kind, ra, dec, frame_id, path,
    // hdu, mjd, filter, bjd_tdb, rel_flux, rel_flux_err, mag, mag_err.
    virtual Table seriesCurve(const std::string& name) = 0;
};

// Fault injection for the store's own tests (the CLI sets it only in gpuphot-testhooks).
struct StoreTestHooks {
    long killAfterRows = 0; // > 0: SIGKILL this process after that many source rows of a frame are sent
    long maxPageCount = 0;  // > 0 (SQLite): PRAGMA max_page_count, so that the file "fills up"
};
struct StoreOptions {
    double busyTimeoutSeconds = 60; // SQLite: wait this long for another writer's lock
    StoreTestHooks test;
};

// Opens (creating when missing) the store at `url`: "postgresql://..." or "postgres://..." (libpq's URI,
// also "host=... dbname=..." key=value strings starting with "pg:"), else a SQLite file path (its
// directory made when missing). Applies the schema migrations. Throws DatabaseError.
std::unique_ptr<ResultsStore> openResultsStore(const std::string& url, const StoreOptions& options = {});
bool isPostgresUrl(const std::string& url);

// The light curve at (ra, dec): from cone(radiusArcsec), the nearest source of each frame, ordered by
// mjd (the cone's columns).
Table lightCurve(ResultsStore& store, double raDeg, double decDeg, double radiusArcsec);

} // namespace gpuphot
