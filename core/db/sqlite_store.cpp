// The SQLite back end: one file, WAL journal (readers never block the writer; a killed writer's open
// transaction is simply not in the file), one transaction per frame with prepared statements.
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "core/db/backends.hpp"
#include "core/db/db_records.hpp"
#include "core/wcs/tan_sip.hpp"

namespace gpuphot::db {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Schema v1 (docs/DATABASE.md). Sources are one B-tree clustered by (frame, declination zone, RA, id):
// a frame's rows are written in key order after every earlier frame's (frame ids only grow), so a write
// appends whatever the store holds, and replacing a frame deletes one key range. A cone search takes the
// frames whose footprint (centre and radius in the frame row) reaches the circle and seeks, in each, the
// (zone, RA) ranges that cover it.
const char* const kSchemaV1 = R"SQL(
CREATE TABLE configs(hash TEXT PRIMARY KEY, config TEXT NOT NULL);
CREATE TABLE frames(
  id INTEGER PRIMARY KEY, path TEXT NOT NULL, hdu INTEGER NOT NULL, checksum TEXT,
  mjd REAL, filter TEXT, object TEXT, exptime REAL, airmass REAL, width INTEGER, height INTEGER,
  fwhm REAL, ellipticity REAL, sky REAL, sky_rms REAL, zp REAL, zp_err REAL, astrometric_rms REAL,
  sources INTEGER, calibrators INTEGER, aperture_radii TEXT, software TEXT,
  config_hash TEXT REFERENCES configs(hash), seconds REAL, timings TEXT, status TEXT, written TEXT,
  centre_ra REAL, centre_dec REAL, radius_deg REAL,
  UNIQUE(path, hdu));
CREATE INDEX frames_mjd ON frames(mjd);
CREATE TABLE sources(
  frame_id INTEGER NOT NULL, zone INTEGER NOT NULL, ra REAL NOT NULL, id INTEGER NOT NULL, dec REAL,
  x REAL, y REAL, flux_auto REAL, fluxerr_auto REAL, flux_psf REAL, fluxerr_psf REAL, mag_cal REAL,
  magerr_cal REAL, fwhm REAL, flags INTEGER, ref_id INTEGER, aper BLOB,
  PRIMARY KEY(frame_id, zone, ra, id)) WITHOUT ROWID;
CREATE TABLE series_objects(id INTEGER PRIMARY KEY, name TEXT, ra REAL, dec REAL, kind TEXT);
CREATE TABLE series_points(
  object_id INTEGER NOT NULL, frame_id INTEGER NOT NULL, bjd_tdb REAL, rel_flux REAL, rel_flux_err REAL,
  mag REAL, mag_err REAL, PRIMARY KEY(object_id, frame_id)) WITHOUT ROWID;
)SQL";

DatabaseError::Kind kindOf(int code) {
    switch (code & 0xff) {
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
        return DatabaseError::Kind::Unreachable;
    case SQLITE_FULL:
        return DatabaseError::Kind::Full;
    default:
        return DatabaseError::Kind::Other;
    }
}

class Statement {
public:
    Statement(sqlite3* db, const char* sql, const std::string& where) : m_db(db) {
        if (sqlite3_prepare_v2(db, sql, -1, &m_stmt, nullptr) != SQLITE_OK)
            throw DatabaseError(kindOf(sqlite3_errcode(db)), where + ": " + sqlite3_errmsg(db));
    }
    ~Statement() { sqlite3_finalize(m_stmt); }
    Statement(const Statement&) = delete;
    Statement& operator=(const Statement&) = delete;

    Statement& bind(int i, double v) {
        if (std::isfinite(v))
            sqlite3_bind_double(m_stmt, i, v);
        else
            sqlite3_bind_null(m_stmt, i); // NaN: SQL NULL
        return *this;
    }
    Statement& bind(int i, std::int64_t v) {
        sqlite3_bind_int64(m_stmt, i, v);
        return *this;
    }
    Statement& bind(int i, const std::string& v) {
        sqlite3_bind_text(m_stmt, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
        return *this;
    }
    Statement& bindBlob(int i, const void* p, std::size_t n) {
        sqlite3_bind_blob(m_stmt, i, p, static_cast<int>(n), SQLITE_STATIC);
        return *this;
    }
    // One step: true when a row is ready, false when done. Throws DatabaseError.
    bool step(const std::string& where) {
        const int rc = sqlite3_step(m_stmt);
        if (rc == SQLITE_ROW) return true;
        if (rc == SQLITE_DONE) return false;
        throw DatabaseError(kindOf(rc), where + ": " + sqlite3_errmsg(m_db));
    }
    void reset() { sqlite3_reset(m_stmt); } // the bindings stay: every use binds all its parameters
    double real(int c) const {
        return sqlite3_column_type(m_stmt, c) == SQLITE_NULL ? kNaN : sqlite3_column_double(m_stmt, c);
    }
    std::int64_t integer(int c) const { return sqlite3_column_int64(m_stmt, c); }
    std::string str(int c) const {
        const auto* p = sqlite3_column_text(m_stmt, c);
        return p ? reinterpret_cast<const char*>(p) : "";
    }
    const void* blob(int c, int& bytes) const {
        bytes = sqlite3_column_bytes(m_stmt, c);
        return sqlite3_column_blob(m_stmt, c);
    }

private:
    sqlite3* m_db;
    sqlite3_stmt* m_stmt = nullptr;
};

// Checkpoints the WAL into the database file on a connection and thread of its own, after each commit
// the store asks for, so that a frame's commit does not also copy the frame into the file (a 134,000-
// source frame is 25 MB of WAL: SQLite's own checkpoint at commit added ~0.1 s to every frame's write).
// PASSIVE: it never blocks the writer or readers; one it cannot finish is taken up by the next.
// Failures are left to the writer's connection, whose automatic checkpoint stays on at a larger size
// as the safety net.
class Checkpointer {
public:
    explicit Checkpointer(std::string path) : m_path(std::move(path)) {}
    ~Checkpointer() {
        {
            std::lock_guard lock(m_mutex);
            m_stop = true;
        }
        m_wake.notify_one();
        if (m_thread.joinable()) m_thread.join();
    }
    Checkpointer(const Checkpointer&) = delete;
    Checkpointer& operator=(const Checkpointer&) = delete;

    void request() {
        {
            std::lock_guard lock(m_mutex);
            m_pending = true;
            if (!m_thread.joinable()) m_thread = std::thread([this] { run(); });
        }
        m_wake.notify_one();
    }

private:
    void run() {
        sqlite3* db = nullptr;
        if (sqlite3_open_v2(m_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
            sqlite3_close_v2(db); // the writer's own checkpoints remain
            return;
        }
        sqlite3_busy_timeout(db, 0);
        // A connection learns that the file is in WAL mode when it first reads it.
        sqlite3_exec(db, "SELECT count(*) FROM sqlite_master", nullptr, nullptr, nullptr);
        std::unique_lock lock(m_mutex);
        for (;;) {
            m_wake.wait(lock, [&] { return m_pending || m_stop; });
            if (m_stop) break;
            m_pending = false;
            lock.unlock();
            sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
            lock.lock();
        }
        lock.unlock();
        sqlite3_close_v2(db);
    }

    std::string m_path;
    std::mutex m_mutex;
    std::condition_variable m_wake;
    bool m_pending = false, m_stop = false;
    std::thread m_thread;
};

class SqliteStore final : public ResultsStore {
public:
    SqliteStore(const std::string& path, const StoreOptions& options) : m_path(path), m_options(options) {
        try {
            open();
            migrate();
        } catch (...) { // no destructor runs for a constructor that throws
            sqlite3_close_v2(m_db);
            throw;
        }
    }
    ~SqliteStore() override {
        m_checkpointer.reset(); // its connection closes first: the last one to close checkpoints all
        sqlite3_close_v2(m_db);
    }

    std::string backend() const override { return "sqlite"; }
    int schemaVersion() const override { return m_version; }
    std::int64_t putFrame(const FrameRecord& record) override;
    std::optional<std::string> frameChecksum(const std::string& path, int hdu) override;
    Table frames(const FrameQuery& query) override;
    Table cone(double raDeg, double decDeg, double radiusArcsec) override;
    std::string frameConfig(std::int64_t frameId) override;
    SeriesWriteResult putSeries(const std::vector<SeriesObjectRecord>& objects) override;
    Table seriesCurve(const std::string& name) override;

private:
    void open();
    void migrate();
    void exec(const char* sql, const std::string& where);
    std::string where(const std::string& what) const { return m_path + ": " + what; }
    std::int64_t insertFrame(const FrameFields& f);
    void insertSources(std::int64_t frameId, const SourceColumns& s);
    std::vector<ConeRow> coneFrames(double raDeg, double decDeg, double radiusDeg);
    std::int64_t seriesObjectId(const SeriesObjectRecord& object);

    std::string m_path;
    StoreOptions m_options;
    sqlite3* m_db = nullptr;
    int m_version = 0;
    std::unique_ptr<Checkpointer> m_checkpointer = std::make_unique<Checkpointer>(m_path);
};

void SqliteStore::exec(const char* sql, const std::string& what) {
    char* msg = nullptr;
    const int rc = sqlite3_exec(m_db, sql, nullptr, nullptr, &msg);
    if (rc != SQLITE_OK) {
        const std::string text = msg ? msg : sqlite3_errstr(rc);
        sqlite3_free(msg);
        throw DatabaseError(kindOf(rc), where(what) + ": " + text);
    }
}

void SqliteStore::open() {
    namespace fs = std::filesystem;
    const fs::path parent = fs::path(m_path).parent_path();
    std::error_code ec;
    if (!parent.empty() && !fs::exists(parent, ec)) fs::create_directories(parent, ec);
    if (ec)
        throw DatabaseError(DatabaseError::Kind::Unreachable,
                            "cannot make " + parent.string() + ": " + ec.message());
    const int rc =
        sqlite3_open_v2(m_path.c_str(), &m_db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    if (rc != SQLITE_OK) {
        const std::string msg = m_db ? sqlite3_errmsg(m_db) : sqlite3_errstr(rc);
        throw DatabaseError(kindOf(rc), where("cannot open the database: " + msg));
    }
    sqlite3_extended_result_codes(m_db, 0);
    sqlite3_busy_timeout(m_db, static_cast<int>(m_options.busyTimeoutSeconds * 1000));
    // Not a database (e.g. a FITS file given by mistake) fails here with "file is not a database".
    // 16 KiB pages (a new file only; before WAL): a third less time per frame than 4 KiB.
    exec("PRAGMA page_size=16384; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA "
         "cache_size=-65536; PRAGMA mmap_size=17179869184; "
         "PRAGMA temp_store=MEMORY; PRAGMA wal_autocheckpoint=16384;",
         "cannot open the database");
    if (m_options.test.maxPageCount > 0) {
        const std::string sql = "PRAGMA max_page_count=" + std::to_string(m_options.test.maxPageCount);
        exec(sql.c_str(), "max_page_count");
    }
}

void SqliteStore::migrate() {
    exec("BEGIN IMMEDIATE", "schema");
    try {
        exec("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)", "schema");
        Statement q(m_db, "SELECT value FROM meta WHERE key = 'schema_version'", where("schema"));
        const std::string text = q.step(where("schema")) ? q.str(0) : "0";
        const int found = parseSchemaVersion(text);
        if (found < 0)
            throw DatabaseError(DatabaseError::Kind::Other,
                                where("bad schema_version '" + text + "' in meta"));
        if (found > kResultsSchemaVersion)
            throw DatabaseError(DatabaseError::Kind::SchemaTooNew,
                                where("written by a newer gpuphot: schema version " + std::to_string(found) +
                                      ", this build reads up to " + std::to_string(kResultsSchemaVersion)));
        if (found < 1) {
            exec(kSchemaV1, "schema v1");
            exec("INSERT OR REPLACE INTO meta VALUES('schema_version', '1')", "schema v1");
        }
        // v2 changed only the PostgreSQL schema.
        if (found < 2) exec("INSERT OR REPLACE INTO meta VALUES('schema_version', '2')", "schema v2");
        exec("COMMIT", "schema");
    } catch (...) {
        sqlite3_exec(m_db, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
    }
    m_version = kResultsSchemaVersion;
}

std::int64_t SqliteStore::insertFrame(const FrameFields& f) {
    Statement cfg(m_db, "INSERT OR IGNORE INTO configs VALUES(?1, ?2)", where("configs"));
    cfg.bind(1, f.configHash).bind(2, f.config).step(where("configs"));
    Statement old(m_db, "SELECT id FROM frames WHERE path = ?1 AND hdu = ?2", where("frames"));
    old.bind(1, f.path).bind(2, std::int64_t{f.hdu});
    if (old.step(where("frames"))) {
        const std::int64_t id = old.integer(0);
        Statement del(m_db, "DELETE FROM sources WHERE frame_id = ?1", where("sources"));
        del.bind(1, id).step(where("replacing the frame's sources"));
        Statement delPoints(m_db, "DELETE FROM series_points WHERE frame_id = ?1", where("series_points"));
        delPoints.bind(1, id).step(where("replacing the frame's light-curve points"));
        Statement delFrame(m_db, "DELETE FROM frames WHERE id = ?1", where("frames"));
        delFrame.bind(1, id).step(where("replacing the frame"));
    }
    Statement ins(
        m_db,
        "INSERT INTO frames(path, hdu, checksum, mjd, filter, object, exptime, airmass, width, height, "
        "fwhm, ellipticity, sky, sky_rms, zp, zp_err, astrometric_rms, sources, calibrators, "
        "aperture_radii, software, config_hash, seconds, timings, status, written) VALUES(?1, ?2, ?3, "
        "?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, "
        "?24, ?25, ?26)",
        where("frames"));
    ins.bind(1, f.path).bind(2, std::int64_t{f.hdu}).bind(3, f.checksum).bind(4, f.mjd).bind(5, f.filter);
    ins.bind(6, f.object).bind(7, f.exptime).bind(8, f.airmass).bind(9, f.width).bind(10, f.height);
    ins.bind(11, f.fwhm).bind(12, f.ellipticity).bind(13, f.sky).bind(14, f.skyRms).bind(15, f.zp);
    ins.bind(16, f.zpErr).bind(17, f.astrometricRms).bind(18, f.sources).bind(19, f.calibrators);
    ins.bind(20, f.apertureRadii).bind(21, f.software).bind(22, f.configHash).bind(23, f.seconds);
    ins.bind(24, f.timings).bind(25, f.status).bind(26, f.written);
    ins.step(where("writing the frame"));
    return sqlite3_last_insert_rowid(m_db);
}

// Appends the sources in key order, and the frame's footprint to its row. A source without a sky
// position is stored in zone -1 at RA 0 (the key needs a value; read back as NaN). Rows go kSourceBatch
// to a statement: one statement per row spent a third of the write starting and resetting statements.
constexpr int kSourceColumns = 17, kSourceBatch = 64;

std::string sourceInsertSql(int rows) {
    std::string sql = "INSERT INTO sources VALUES";
    for (int r = 0; r < rows; ++r) {
        sql += r ? ",(" : "(";
        for (int c = 1; c <= kSourceColumns; ++c)
            sql += "?" + std::to_string(r * kSourceColumns + c) + (c < kSourceColumns ? "," : ")");
    }
    return sql;
}

void SqliteStore::insertSources(std::int64_t frameId, const SourceColumns& s) {
    const std::size_t aperBytes = sizeof(double) * 2 * s.apertures;
    const std::size_t n = s.order.size(), full = n / kSourceBatch * kSourceBatch;
    std::optional<Statement> batch, single;
    long sent = 0;
    for (std::size_t k = 0; k < n;) {
        const bool whole = k < full;
        Statement& ins = whole ? (batch ? *batch : batch.emplace(m_db, sourceInsertSql(kSourceBatch).c_str(),
                                                                where("sources")))
                               : (single ? *single : single.emplace(m_db, sourceInsertSql(1).c_str(),
                                                                    where("sources")));
        const int rows = whole ? kSourceBatch : 1;
        for (int r = 0; r < rows; ++r, ++k) {
            const std::uint32_t i = s.order[k];
            const int b = r * kSourceColumns;
            const bool onSky = s.zone[i] >= 0;
            ins.bind(b + 1, frameId).bind(b + 2, s.zone[i]).bind(b + 3, onSky ? s.ra[i] : 0.0);
            ins.bind(b + 4, s.id[i]).bind(b + 5, s.dec[i]).bind(b + 6, s.x[i]).bind(b + 7, s.y[i]);
            ins.bind(b + 8, s.fluxAuto[i]).bind(b + 9, s.fluxErrAuto[i]).bind(b + 10, s.fluxPsf[i]);
            ins.bind(b + 11, s.fluxErrPsf[i]).bind(b + 12, s.magCal[i]).bind(b + 13, s.magErrCal[i]);
            ins.bind(b + 14, s.fwhm[i]).bind(b + 15, s.flags[i]).bind(b + 16, s.refId[i]);
            ins.bindBlob(b + 17, s.aper.data() + i * 2 * s.apertures, aperBytes);
        }
        ins.step(where("writing the frame's sources"));
        ins.reset();
        sent += rows;
        if (m_options.test.killAfterRows > 0 && sent >= m_options.test.killAfterRows) ::kill(::getpid(), SIGKILL);
    }
    Statement foot(m_db, "UPDATE frames SET centre_ra = ?1, centre_dec = ?2, radius_deg = ?3 WHERE id = ?4",
                   where("frames"));
    foot.bind(1, s.centreRa).bind(2, s.centreDec).bind(3, s.radiusDeg).bind(4, frameId);
    foot.step(where("writing the frame"));
}

std::int64_t SqliteStore::putFrame(const FrameRecord& record) {
    if (!record.catalog) throw InvalidInput("results store: a frame without its catalog");
    const FrameFields f = frameFields(record);
    const SourceColumns s = sourceColumns(*record.catalog);
    exec("BEGIN IMMEDIATE", "writing " + f.path);
    try {
        const std::int64_t id = insertFrame(f);
        insertSources(id, s);
        exec("COMMIT", "writing " + f.path);
        m_checkpointer->request();
        return id;
    } catch (...) {
        sqlite3_exec(m_db, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
    }
}

std::optional<std::string> SqliteStore::frameChecksum(const std::string& path, int hdu) {
    Statement q(m_db, "SELECT checksum FROM frames WHERE path = ?1 AND hdu = ?2", where("frames"));
    q.bind(1, path).bind(2, std::int64_t{hdu});
    if (!q.step(where("frames"))) return std::nullopt;
    return q.str(0);
}

Table SqliteStore::frames(const FrameQuery& query) {
    Statement q(
        m_db,
        "SELECT id, path, hdu, checksum, mjd, filter, exptime, airmass, fwhm, sky, zp, zp_err, "
        "astrometric_rms, sources, calibrators, software, config_hash, seconds, status, written FROM frames "
        "WHERE (?1 IS NULL OR mjd >= ?1) AND (?2 IS NULL OR mjd <= ?2) AND (?3 = '' OR filter = ?3) "
        "AND (?4 = '' OR path LIKE ?4) ORDER BY mjd IS NULL, mjd, path, hdu",
        where("frames"));
    q.bind(1, query.mjdMin.value_or(kNaN)).bind(2, query.mjdMax.value_or(kNaN));
    q.bind(3, query.filter).bind(4, query.pathLike);
    Table t = framesTable();
    auto& c = t.columns();
    while (q.step(where("frames"))) {
        for (int i = 0; i < static_cast<int>(c.size()); ++i)
            std::visit(
                [&](auto& v) {
                    using T = typename std::decay_t<decltype(v)>::value_type;
                    if constexpr (std::is_same_v<T, std::string>)
                        v.push_back(q.str(i));
                    else if constexpr (std::is_same_v<T, double>)
                        v.push_back(q.real(i));
                    else if constexpr (std::is_same_v<T, std::int64_t>)
                        v.push_back(q.integer(i));
                },
                c[i].data);
    }
    return t;
}

// The frames whose footprint reaches the circle (a scan of the frame rows), then in each the key ranges
// of coneBoxes; the exact separation decides.
std::vector<ConeRow> SqliteStore::coneFrames(double raDeg, double decDeg, double radiusDeg) {
    Statement q(m_db,
                "SELECT id, path, hdu, mjd, filter, centre_ra, centre_dec, radius_deg FROM frames "
                "WHERE radius_deg IS NOT NULL",
                where("cone"));
    std::vector<ConeRow> frames;
    while (q.step(where("cone"))) {
        const double reach = q.real(7) + radiusDeg;
        if (reach < 180.0 && angularSeparationDeg(raDeg, decDeg, q.real(5), q.real(6)) > reach) continue;
        ConeRow f;
        f.frameId = q.integer(0), f.path = q.str(1), f.hdu = q.integer(2), f.mjd = q.real(3),
        f.filter = q.str(4);
        frames.push_back(std::move(f));
    }
    return frames;
}

Table SqliteStore::cone(double raDeg, double decDeg, double radiusArcsec) {
    Statement q(
        m_db,
        "SELECT id, ra, dec, x, y, flux_auto, fluxerr_auto, flux_psf, fluxerr_psf, mag_cal, magerr_cal, "
        "flags, ref_id, aper FROM sources WHERE frame_id = ?1 AND zone = ?2 AND ra BETWEEN ?3 AND ?4",
        where("cone"));
    struct Hit {
        ConeRow row;
        std::vector<double> aper;
    };
    std::vector<Hit> hits;
    int naper = 0;
    const std::vector<RaRange> boxes = coneBoxes(raDeg, decDeg, radiusArcsec / 3600.0);
    for (const ConeRow& frame : coneFrames(raDeg, decDeg, radiusArcsec / 3600.0))
        for (const RaRange& box : boxes) {
            q.bind(1, frame.frameId).bind(2, box.zone).bind(3, box.raMin).bind(4, box.raMax);
            while (q.step(where("cone"))) {
                const double sep = separationArcsec(raDeg, decDeg, q.real(1), q.real(2));
                if (!(sep <= radiusArcsec)) continue;
                Hit h;
                ConeRow& r = h.row;
                r = frame;
                r.id = q.integer(0), r.ra = q.real(1), r.dec = q.real(2), r.x = q.real(3), r.y = q.real(4);
                r.sep = sep, r.fluxAuto = q.real(5), r.fluxErrAuto = q.real(6), r.fluxPsf = q.real(7);
                r.fluxErrPsf = q.real(8), r.magCal = q.real(9), r.magErrCal = q.real(10),
                r.flags = q.integer(11);
                r.refId = q.integer(12);
                int bytes = 0;
                const auto* p = static_cast<const double*>(q.blob(13, bytes));
                h.aper.assign(p, p + bytes / sizeof(double));
                r.naper = static_cast<int>(h.aper.size() / 2);
                naper = std::max(naper, r.naper);
                hits.push_back(std::move(h));
            }
            q.reset();
        }
    Table t = coneTable(naper);
    for (Hit& h : hits) {
        h.row.aper = h.aper.data();
        appendConeRow(t, h.row);
    }
    return sortCone(t);
}

std::string SqliteStore::frameConfig(std::int64_t frameId) {
    Statement q(m_db,
                "SELECT c.config FROM frames f JOIN configs c ON c.hash = f.config_hash WHERE f.id = ?1",
                where("configs"));
    q.bind(1, frameId);
    return q.step(where("configs")) ? q.str(0) : std::string{};
}

// The object of that name and kind (its position updated), else a new one.
std::int64_t SqliteStore::seriesObjectId(const SeriesObjectRecord& o) {
    Statement find(m_db, "SELECT id FROM series_objects WHERE name = ?1 AND kind = ?2",
                   where("series_objects"));
    find.bind(1, o.name).bind(2, o.kind);
    if (find.step(where("series_objects"))) {
        const std::int64_t id = find.integer(0);
        Statement up(m_db, "UPDATE series_objects SET ra = ?1, dec = ?2 WHERE id = ?3",
                     where("series_objects"));
        up.bind(1, o.ra).bind(2, o.dec).bind(3, id).step(where("series_objects"));
        return id;
    }
    Statement ins(m_db, "INSERT INTO series_objects(name, ra, dec, kind) VALUES(?1, ?2, ?3, ?4)",
                  where("series_objects"));
    ins.bind(1, o.name).bind(2, o.ra).bind(3, o.dec).bind(4, o.kind).step(where("series_objects"));
    return sqlite3_last_insert_rowid(m_db);
}

SeriesWriteResult SqliteStore::putSeries(const std::vector<SeriesObjectRecord>& objects) {
    SeriesWriteResult result;
    exec("BEGIN IMMEDIATE", "writing series");
    try {
        Statement frame(m_db, "SELECT id FROM frames WHERE path = ?1 AND hdu = ?2", where("frames"));
        Statement put(m_db, "INSERT OR REPLACE INTO series_points VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                      where("series_points"));
        for (const SeriesObjectRecord& o : objects) {
            const std::int64_t object = seriesObjectId(o);
            ++result.objects;
            for (const SeriesPointRecord& p : o.points) {
                frame.bind(1, p.framePath).bind(2, std::int64_t{p.hdu});
                const bool stored = frame.step(where("frames"));
                const std::int64_t frameId = stored ? frame.integer(0) : 0;
                frame.reset();
                if (!stored) {
                    ++result.pointsWithoutFrame;
                    continue;
                }
                put.bind(1, object)
                    .bind(2, frameId)
                    .bind(3, p.bjdTdb)
                    .bind(4, p.relFlux)
                    .bind(5, p.relFluxErr);
                put.bind(6, p.mag).bind(7, p.magErr).step(where("writing series points"));
                put.reset();
                ++result.points;
            }
        }
        exec("COMMIT", "writing series");
    } catch (...) {
        sqlite3_exec(m_db, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
    }
    return result;
}

Table SqliteStore::seriesCurve(const std::string& name) {
    const std::string sql =
        std::string("SELECT ") + kSeriesCurveColumns +
        " FROM series_objects o JOIN series_points p ON p.object_id = o.id JOIN frames f ON "
        "f.id = p.frame_id WHERE o.name = ?1 ORDER BY o.kind, o.id, p.bjd_tdb, f.id";
    Statement q(m_db, sql.c_str(), where("series"));
    q.bind(1, name);
    Table t = seriesTable();
    while (q.step(where("series")))
        appendSeriesRow(t, seriesRowOf(q));
    return t;
}

} // namespace

std::unique_ptr<ResultsStore> openSqliteStore(const std::string& path, const StoreOptions& options) {
    return std::make_unique<SqliteStore>(path, options);
}

} // namespace gpuphot::db
