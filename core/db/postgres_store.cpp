// The PostgreSQL back end (libpq, Q3C for cone searches): the same columns as the SQLite store, so that
// frames() and cone() return the same tables. One transaction per frame, its sources bulk-loaded with
// COPY; a writer killed mid-frame leaves its transaction uncommitted, which the server rolls back.
// Every value travels as a statement parameter (PQexecParams), never pasted into SQL text.
#include <libpq-fe.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <regex>
#include <string_view>

#include "core/db/backends.hpp"
#include "core/db/db_records.hpp"

namespace gpuphot::db {

namespace {

using Kind = DatabaseError::Kind;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Key of the advisory lock that serialises schema creation/migration (ASCII "gpuphot\0"): four processes
// opening a fresh database at once must not all create the tables.
constexpr const char* kSchemaLockKey = "7453586508947092480";

// Schema v1 (docs/DATABASE.md): the SQLite store's tables, with Q3C's index on (ra, dec) in place of
// SQLite's (zone, ra) and the apertures' fluxes as arrays in place of its blob. Deleting a frame deletes
// its sources through a trigger, not a foreign key: a key's check of every inserted row would cost 0.5 s
// of a 134,000-source frame's 1 s (putFrame writes the frame row first, in the same transaction).
const char* const kSchemaV1 = R"SQL(
CREATE TABLE configs(hash text PRIMARY KEY, config text NOT NULL);
CREATE TABLE frames(
  id bigserial PRIMARY KEY, path text NOT NULL, hdu integer NOT NULL, checksum text,
  mjd double precision, filter text, object text, exptime double precision, airmass double precision,
  width bigint, height bigint, fwhm double precision, ellipticity double precision, sky double precision,
  sky_rms double precision, zp double precision, zp_err double precision, astrometric_rms double precision,
  sources bigint, calibrators bigint, aperture_radii text, software text,
  config_hash text REFERENCES configs(hash), seconds double precision, timings text, status text,
  written text, UNIQUE(path, hdu));
CREATE INDEX frames_mjd ON frames(mjd);
CREATE TABLE sources(
  frame_id bigint NOT NULL, id bigint NOT NULL,
  ra double precision, dec double precision, x double precision, y double precision,
  flux_auto double precision, fluxerr_auto double precision, flux_psf double precision,
  fluxerr_psf double precision, mag_cal double precision, magerr_cal double precision,
  fwhm double precision, flags bigint, ref_id bigint,
  flux_aper double precision[], fluxerr_aper double precision[],
  PRIMARY KEY(frame_id, id));
CREATE INDEX sources_q3c ON sources(q3c_ang2ipix(ra, dec));
CREATE FUNCTION gpuphot_delete_sources() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- the sources table next to this frames table, whatever the deleting session's search_path
  EXECUTE format('DELETE FROM %I.sources WHERE frame_id = $1', TG_TABLE_SCHEMA) USING OLD.id;
  RETURN NULL;
END $$;
CREATE TRIGGER frames_delete_sources AFTER DELETE ON frames
  FOR EACH ROW EXECUTE FUNCTION gpuphot_delete_sources();
CREATE TABLE series_objects(id bigserial PRIMARY KEY, name text, ra double precision, dec double precision,
  kind text);
CREATE TABLE series_points(
  object_id bigint NOT NULL REFERENCES series_objects(id) ON DELETE CASCADE,
  frame_id bigint NOT NULL REFERENCES frames(id) ON DELETE CASCADE,
  bjd_tdb double precision, rel_flux double precision, rel_flux_err double precision,
  mag double precision, mag_err double precision, PRIMARY KEY(object_id, frame_id));
CREATE INDEX series_points_frame ON series_points(frame_id);
)SQL";

// Schema v2: the sources lose their primary key (frame_id, id) for a BRIN index on frame_id. The key's
// b-tree took a descent per inserted row (sources arrive in sky order, not id order): with it a
// 134,000-source frame took twice as long to store. A frame's sources are written together, so they
// fill neighbouring heap pages and BRIN finds them for the delete that replaces a frame; the ids are
// unique per frame by construction.
const char* const kMigrationV2 = R"SQL(
ALTER TABLE sources DROP CONSTRAINT IF EXISTS sources_pkey;
CREATE INDEX IF NOT EXISTS sources_frame ON sources USING brin(frame_id);
)SQL";

struct ResultDeleter {
    void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

bool contains(const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
}

// A libpq/server message on one line: "a\n\tb\n" -> "a; b".
std::string oneLine(const char* message) {
    std::string out;
    for (const char* p = message ? message : ""; *p; ++p) {
        if (*p != '\n') {
            out += *p == '\t' ? ' ' : *p;
        } else if (p[1] != '\0') {
            out += "; ";
            while (p[1] == '\t' || p[1] == ' ')
                ++p;
        }
    }
    while (!out.empty() && out.back() == ' ')
        out.pop_back();
    return out;
}

// The database's name in messages: the URL (or "pg:" conninfo) with its password left out.
std::string redactedUrl(const std::string& url) {
    static const std::regex userinfo(R"(^([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*):[^/?#]*@)");
    static const std::regex parameter(R"(password\s*=\s*('(?:[^'\\]|\\.)*'|[^&\s]*))");
    return std::regex_replace(std::regex_replace(url, userinfo, "$1@"), parameter, "password=***");
}

// The kind of a failed connection, from libpq's message (the server sends no SQLSTATE before it is up).
Kind connectKind(PGconn* conn, const std::string& m) {
    if (PQconnectionNeedsPassword(conn) || contains(m, "password authentication failed") ||
        contains(m, "no password supplied") || contains(m, "authentication failed") ||
        contains(m, "pg_hba.conf") || (contains(m, "role \"") && contains(m, "does not exist")))
        return Kind::Authentication;
    if (contains(m, "too many clients") || contains(m, "connection slots are reserved") ||
        contains(m, "out of memory"))
        return Kind::Full;
    if (contains(m, "does not exist")) return Kind::Other; // database "x" does not exist
    static const char* const unreachable[] = {"Connection refused",
                                              "could not translate host name",
                                              "No such file or directory",
                                              "Name or service not known",
                                              "Temporary failure in name resolution",
                                              "timeout expired",
                                              "Network is unreachable",
                                              "No route to host",
                                              "Connection timed out",
                                              "Connection reset",
                                              "server closed the connection unexpectedly",
                                              "could not connect to server",
                                              "Is the server running",
                                              "the database system is",
                                              "Cannot assign requested address",
                                              "Host is down"};
    for (const char* part : unreachable)
        if (contains(m, part)) return Kind::Unreachable;
    return Kind::Other;
}

// The kind of a failed statement, from its SQLSTATE (class 53: insufficient resources; 28: authorization;
// 08 and a lost connection: the server went away).
Kind resultKind(PGconn* conn, const PGresult* result) {
    if (PQstatus(conn) == CONNECTION_BAD) return Kind::Unreachable;
    const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
    const std::string_view s = state ? state : "";
    if (s.substr(0, 2) == "53") return Kind::Full;
    if (s.substr(0, 2) == "28") return Kind::Authentication;
    if (s.substr(0, 2) == "08" || s == "57P01" || s == "57P02" || s == "57P03") return Kind::Unreachable;
    return Kind::Other;
}

// The server's message of a failed statement (primary, detail, hint), else libpq's.
std::string resultMessage(PGconn* conn, const PGresult* result) {
    const char* primary = result ? PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
    if (!primary) return oneLine(PQerrorMessage(conn));
    std::string out = primary;
    if (const char* detail = PQresultErrorField(result, PG_DIAG_MESSAGE_DETAIL))
        out += std::string("; ") + detail;
    if (const char* hint = PQresultErrorField(result, PG_DIAG_MESSAGE_HINT)) out += std::string("; ") + hint;
    return out;
}

std::string sqlState(const PGresult* result) {
    const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
    return state ? state : "";
}

// Numbers as text, locale-independent, shortest round-trip form (the server parses them exactly).
void appendNumber(std::string& out, double v) {
    if (std::isnan(v)) {
        out += "NaN";
    } else if (std::isinf(v)) {
        out += v > 0 ? "Infinity" : "-Infinity";
    } else {
        char buf[32];
        out.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    }
}

double parseDouble(const char* p) {
    double v = kNaN;
    if (p && *p) std::from_chars(p, p + std::strlen(p), v);
    return v;
}
std::int64_t parseInt(const char* p) {
    std::int64_t v = 0;
    if (p && *p) std::from_chars(p, p + std::strlen(p), v);
    return v;
}
// A float8[] in the server's text form: "{1.5,NaN,-Infinity}" (NULL elements: NaN).
std::vector<double> parseArray(const char* p) {
    std::vector<double> out;
    if (!p || *p != '{') return out;
    for (++p; *p && *p != '}';) {
        const char* end = p;
        while (*end && *end != ',' && *end != '}')
            ++end;
        double v = kNaN;
        std::from_chars(p, end, v); // "NULL" stays NaN
        out.push_back(v);
        p = *end == ',' ? end + 1 : end;
    }
    return out;
}

// A statement's parameters as text; a non-finite double is SQL NULL, as in the SQLite store.
class Params {
public:
    Params& add(const std::string& v) {
        m_values.push_back(v);
        m_null.push_back(false);
        return *this;
    }
    Params& add(std::int64_t v) { return add(std::to_string(v)); }
    Params& add(int v) { return add(std::to_string(v)); }
    Params& add(double v) {
        if (std::isfinite(v)) {
            std::string s;
            appendNumber(s, v);
            return add(s);
        }
        return addNull();
    }
    Params& addNull() {
        m_values.emplace_back();
        m_null.push_back(true);
        return *this;
    }
    int size() const { return static_cast<int>(m_values.size()); }
    std::vector<const char*> pointers() const {
        std::vector<const char*> p;
        for (std::size_t i = 0; i < m_values.size(); ++i)
            p.push_back(m_null[i] ? nullptr : m_values[i].c_str());
        return p;
    }

private:
    std::vector<std::string> m_values;
    std::vector<bool> m_null;
};

// One result row's fields: NULL reads as NaN, 0 or "", as the SQLite store reads it.
struct Row {
    const PGresult* result;
    int row;
    bool null(int c) const { return PQgetisnull(result, row, c); }
    double real(int c) const { return null(c) ? kNaN : parseDouble(PQgetvalue(result, row, c)); }
    std::int64_t integer(int c) const { return null(c) ? 0 : parseInt(PQgetvalue(result, row, c)); }
    std::string str(int c) const { return null(c) ? std::string{} : std::string(PQgetvalue(result, row, c)); }
};

class PostgresStore final : public ResultsStore {
public:
    PostgresStore(const std::string& url, const StoreOptions& options)
        : m_name(redactedUrl(url)), m_options(options) {
        try {
            connect(url.rfind("pg:", 0) == 0 ? url.substr(3) : url);
            migrate();
        } catch (...) { // no destructor runs for a constructor that throws
            PQfinish(m_conn);
            throw;
        }
    }
    ~PostgresStore() override { PQfinish(m_conn); }
    PostgresStore(const PostgresStore&) = delete;
    PostgresStore& operator=(const PostgresStore&) = delete;

    std::string backend() const override { return "postgresql"; }
    int schemaVersion() const override { return m_version; }
    std::int64_t putFrame(const FrameRecord& record) override;
    std::optional<std::string> frameChecksum(const std::string& path, int hdu) override;
    Table frames(const FrameQuery& query) override;
    Table cone(double raDeg, double decDeg, double radiusArcsec) override;
    std::string frameConfig(std::int64_t frameId) override;
    SeriesWriteResult putSeries(const std::vector<SeriesObjectRecord>& objects) override;
    Table seriesCurve(const std::string& name) override;

private:
    std::int64_t seriesObjectId(const SeriesObjectRecord& object);
    void connect(const std::string& conninfo);
    void ensureConnected();
    void configureSession();
    void migrate();
    void createExtension();
    int storedVersion();
    Result exec(const char* sql, const std::string& what, const Params& params = {});
    void rollback();
    std::int64_t insertFrame(const FrameFields& f, const std::string& what);
    void copySources(std::int64_t frameId, const SourceColumns& s, const std::string& what);
    void putCopyData(const std::string& data, const std::string& what);
    [[noreturn]] void copyFailed(const std::string& what);
    [[noreturn]] void fail(const std::string& what, const PGresult* result);
    std::string where(const std::string& what) const { return m_name + ": " + what; }

    std::string m_name; // the URL without its password
    StoreOptions m_options;
    PGconn* m_conn = nullptr;
    int m_version = 0;
};

void PostgresStore::connect(const std::string& conninfo) {
    // The URL's own settings override these defaults (they come before the expanded dbname).
    const char* keys[] = {"connect_timeout", "fallback_application_name", "dbname", nullptr};
    const char* values[] = {"15", "gpuphot", conninfo.c_str(), nullptr};
    m_conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
    if (!m_conn) throw DatabaseError(Kind::Other, where("cannot connect: out of memory"));
    if (PQstatus(m_conn) != CONNECTION_OK) {
        const std::string message = oneLine(PQerrorMessage(m_conn));
        throw DatabaseError(connectKind(m_conn, message), where("cannot connect: " + message));
    }
    PQsetNoticeProcessor(
        m_conn, [](void*, const char*) {}, nullptr); // "already exists, skipping" etc.
    configureSession();
}

// A connection lost since the last call (server restart) is reopened once before giving up.
void PostgresStore::ensureConnected() {
    if (PQstatus(m_conn) == CONNECTION_OK) return;
    PQreset(m_conn);
    if (PQstatus(m_conn) != CONNECTION_OK) {
        const std::string message = oneLine(PQerrorMessage(m_conn));
        throw DatabaseError(connectKind(m_conn, message), where("connection lost: " + message));
    }
    configureSession();
}

// UTF-8 paths; doubles printed exactly (a server set to extra_float_digits=0 would round them); no JIT,
// whose compilation (~70 ms) costs more than the small queries here take.
void PostgresStore::configureSession() {
    if (PQsetClientEncoding(m_conn, "UTF8") != 0) fail("client encoding", nullptr);
    exec("SET extra_float_digits = 3; SET jit = off", "session settings");
}

Result PostgresStore::exec(const char* sql, const std::string& what, const Params& params) {
    // Without values PQexec, which also runs a script of several statements (the schema).
    const std::vector<const char*> values = params.pointers();
    Result r(params.size() == 0
                 ? PQexec(m_conn, sql)
                 : PQexecParams(m_conn, sql, params.size(), nullptr, values.data(), nullptr, nullptr, 0));
    const ExecStatusType status = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK && status != PGRES_COPY_IN)
        fail(what, r.get());
    return r;
}

void PostgresStore::fail(const std::string& what, const PGresult* result) {
    throw DatabaseError(resultKind(m_conn, result), where(what + ": " + resultMessage(m_conn, result)));
}

// Undoes the open transaction; after a lost connection there is none left to undo.
void PostgresStore::rollback() {
    if (PQstatus(m_conn) != CONNECTION_OK) return;
    while (PGresult* r = PQgetResult(m_conn))
        PQclear(r);
    PQclear(PQexec(m_conn, "ROLLBACK"));
}

// Q3C serves the cone searches; without it the schema cannot be made (its index uses q3c_ang2ipix).
void PostgresStore::createExtension() {
    Result r(PQexec(m_conn, "CREATE EXTENSION IF NOT EXISTS q3c"));
    if (r && PQresultStatus(r.get()) == PGRES_COMMAND_OK) return;
    const std::string state = sqlState(r.get()), message = resultMessage(m_conn, r.get());
    if (state == "58P01" || state == "0A000" || contains(message, "q3c.control") ||
        contains(message, "is not available"))
        throw DatabaseError(Kind::Other,
                            where("the server lacks the Q3C extension (install postgresql-15-q3c, "
                                  "or the package for the server's version): " +
                                  message));
    if (state == "42501")
        throw DatabaseError(Kind::Other, where("CREATE EXTENSION q3c needs a superuser (run it once in this "
                                               "database as one): " +
                                               message));
    fail("CREATE EXTENSION q3c", r.get());
}

// The schema version recorded in gpuphot_meta; 0 for a database without our tables.
int PostgresStore::storedVersion() {
    Result t = exec("SELECT to_regclass('gpuphot_meta') IS NOT NULL", "schema");
    if (std::strcmp(PQgetvalue(t.get(), 0, 0), "t") != 0) return 0;
    Result v = exec("SELECT value FROM gpuphot_meta WHERE key = 'schema_version'", "schema");
    if (PQntuples(v.get()) == 0) return 0;
    const std::string text = PQgetvalue(v.get(), 0, 0);
    const int version = parseSchemaVersion(text);
    if (version < 0)
        throw DatabaseError(Kind::Other, where("bad schema_version '" + text + "' in gpuphot_meta"));
    return version;
}

// Creates or migrates the schema in one transaction, under an advisory lock held until its end.
void PostgresStore::migrate() {
    exec("BEGIN", "schema");
    try {
        exec("SELECT pg_advisory_xact_lock($1::bigint)", "schema lock", Params().add(kSchemaLockKey));
        createExtension();
        const int found = storedVersion();
        if (found > kResultsSchemaVersion)
            throw DatabaseError(Kind::SchemaTooNew,
                                where("written by a newer gpuphot: schema " + std::to_string(found) +
                                      ", this build reads up to " + std::to_string(kResultsSchemaVersion)));
        if (found < 1) {
            exec("CREATE TABLE IF NOT EXISTS gpuphot_meta(key text PRIMARY KEY, value text)", "schema v1");
            exec(kSchemaV1, "schema v1");
            exec("INSERT INTO gpuphot_meta VALUES('schema_version', '1') ON CONFLICT(key) DO UPDATE SET "
                 "value = excluded.value",
                 "schema v1");
        }
        if (found < 2) {
            exec(kMigrationV2, "schema v2");
            exec("UPDATE gpuphot_meta SET value = '2' WHERE key = 'schema_version'", "schema v2");
        }
        exec("COMMIT", "schema");
    } catch (...) {
        rollback();
        throw;
    }
    m_version = kResultsSchemaVersion;
}

// The frame's configuration and row (replacing the frame's earlier row and, through the trigger, its
// sources).
std::int64_t PostgresStore::insertFrame(const FrameFields& f, const std::string& what) {
    Params cfg;
    cfg.add(f.configHash).add(f.config);
    exec("INSERT INTO configs(hash, config) VALUES($1, $2) ON CONFLICT DO NOTHING", what, cfg);
    Params key;
    key.add(f.path).add(f.hdu);
    exec("DELETE FROM frames WHERE path = $1 AND hdu = $2::integer", what, key);
    Params p;
    p.add(f.path).add(f.hdu).add(f.checksum).add(f.mjd).add(f.filter).add(f.object).add(f.exptime);
    p.add(f.airmass).add(f.width).add(f.height).add(f.fwhm).add(f.ellipticity).add(f.sky).add(f.skyRms);
    p.add(f.zp).add(f.zpErr).add(f.astrometricRms).add(f.sources).add(f.calibrators).add(f.apertureRadii);
    p.add(f.software).add(f.configHash).add(f.seconds).add(f.timings).add(f.status).add(f.written);
    Result r = exec("INSERT INTO frames(path, hdu, checksum, mjd, filter, object, exptime, airmass, width, "
                    "height, fwhm, ellipticity, sky, sky_rms, zp, zp_err, astrometric_rms, sources, "
                    "calibrators, aperture_radii, software, config_hash, seconds, timings, status, written) "
                    "VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, "
                    "$19, $20, $21, $22, $23, $24, $25, $26) RETURNING id",
                    what, p);
    return parseInt(PQgetvalue(r.get(), 0, 0));
}

// COPY's binary format (network byte order): a 19-byte header, then per row a field count and per field
// its length and value; float8 is IEEE 754, int8 two's complement, float8[] array_send's layout.
constexpr char kCopyHeader[19] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', '\377', '\r', '\n', '\0'};
constexpr std::uint32_t kFloat8Oid = 701;
constexpr std::int16_t kSourceFields = 17;

void appendBig(std::string& out, std::uint64_t v, int bytes) {
    char buf[8];
    for (int b = 0; b < bytes; ++b)
        buf[b] = static_cast<char>(v >> (8 * (bytes - 1 - b)));
    out.append(buf, bytes);
}
void appendField(std::string& out, std::int64_t v) {
    appendBig(out, 8, 4);
    appendBig(out, static_cast<std::uint64_t>(v), 8);
}
void appendField(std::string& out, double v) {
    appendBig(out, 8, 4);
    appendBig(out, std::bit_cast<std::uint64_t>(v), 8);
}
// A one-dimensional float8[] of n values at p[0], p[stride], ...; n == 0: the empty array '{}'.
void appendArray(std::string& out, const double* p, int n, int stride) {
    appendBig(out, n ? 20 + 12 * static_cast<std::uint64_t>(n) : 12, 4);
    appendBig(out, n ? 1 : 0, 4); // dimensions
    appendBig(out, 0, 4);         // no NULL elements
    appendBig(out, kFloat8Oid, 4);
    if (n == 0) return;
    appendBig(out, static_cast<std::uint64_t>(n), 4);
    appendBig(out, 1, 4); // lower bound
    for (int k = 0; k < n; ++k)
        appendField(out, p[static_cast<std::size_t>(k) * stride]);
}

// One source as a COPY row. Scalars that are not finite are NaN (SQLite stores them as NULL, read back as
// NaN); the aperture arrays keep infinities, as SQLite's blob does.
void appendSourceRow(std::string& out, std::int64_t frameId, const SourceColumns& s, std::uint32_t i) {
    appendBig(out, static_cast<std::uint16_t>(kSourceFields), 2);
    appendField(out, frameId);
    appendField(out, s.id[i]);
    for (const auto* col : {&s.ra, &s.dec, &s.x, &s.y, &s.fluxAuto, &s.fluxErrAuto, &s.fluxPsf, &s.fluxErrPsf,
                            &s.magCal, &s.magErrCal, &s.fwhm})
        appendField(out, std::isfinite((*col)[i]) ? (*col)[i] : kNaN);
    appendField(out, s.flags[i]);
    appendField(out, s.refId[i]);
    const double* aper = s.aper.data() + static_cast<std::size_t>(i) * 2 * s.apertures;
    appendArray(out, aper, s.apertures, 2);     // flux_aper
    appendArray(out, aper + 1, s.apertures, 2); // fluxerr_aper
}

void PostgresStore::putCopyData(const std::string& data, const std::string& what) {
    if (PQputCopyData(m_conn, data.data(), static_cast<int>(data.size())) != 1) copyFailed(what);
}

// Ends a COPY that failed on our side (the connection stays usable for the ROLLBACK) and throws.
void PostgresStore::copyFailed(const std::string& what) {
    const std::string message = oneLine(PQerrorMessage(m_conn));
    if (PQstatus(m_conn) == CONNECTION_OK) PQputCopyEnd(m_conn, "gpuphot: copy aborted");
    while (PGresult* r = PQgetResult(m_conn))
        PQclear(r);
    throw DatabaseError(PQstatus(m_conn) == CONNECTION_OK ? Kind::Other : Kind::Unreachable,
                        where(what + ": " + message));
}

// The sources in SourceColumns::order through COPY ... FROM STDIN in the binary format (the text format
// costs the server ~0.5 s more parsing 134,000 rows' numbers), sent in ~1 MiB pieces.
void PostgresStore::copySources(std::int64_t frameId, const SourceColumns& s, const std::string& what) {
    exec("COPY sources(frame_id, id, ra, dec, x, y, flux_auto, fluxerr_auto, flux_psf, fluxerr_psf, mag_cal, "
         "magerr_cal, fwhm, flags, ref_id, flux_aper, fluxerr_aper) FROM STDIN (FORMAT binary)",
         what);
    const long killAfter = m_options.test.killAfterRows;
    std::string buf(kCopyHeader, sizeof kCopyHeader);
    buf.reserve((1 << 20) + 4096);
    long sent = 0;
    for (std::uint32_t i : s.order) {
        appendSourceRow(buf, frameId, s, i);
        if (killAfter > 0 && ++sent == killAfter) {
            // Test hook: the rows so far are on the wire, the transaction open; die without a word.
            putCopyData(buf, what);
            PQflush(m_conn); // blocking connection: returns when all is sent
            ::kill(::getpid(), SIGKILL);
        }
        if (buf.size() >= (1 << 20)) {
            putCopyData(buf, what);
            buf.clear();
        }
    }
    appendBig(buf, 0xffff, 2); // trailer
    putCopyData(buf, what);
    if (PQputCopyEnd(m_conn, nullptr) != 1) copyFailed(what);
    Result r(PQgetResult(m_conn));
    while (PGresult* extra = PQgetResult(m_conn))
        PQclear(extra);
    if (!r || PQresultStatus(r.get()) != PGRES_COMMAND_OK) fail(what, r.get());
}

std::int64_t PostgresStore::putFrame(const FrameRecord& record) {
    if (!record.catalog) throw InvalidInput("results store: a frame without its catalog");
    const FrameFields f = frameFields(record);
    const SourceColumns s = sourceColumns(*record.catalog);
    ensureConnected();
    const std::string what = "writing " + f.path;
    exec("BEGIN", what);
    try {
        // Concurrent writers of the same frame take turns (the second replaces the first's rows).
        Params key;
        key.add(f.path).add(f.hdu);
        exec("SELECT pg_advisory_xact_lock(hashtext($1), $2::integer)", what, key);
        const std::int64_t id = insertFrame(f, what);
        copySources(id, s, what + " (sources)");
        exec("COMMIT", what);
        return id;
    } catch (...) {
        rollback();
        throw;
    }
}

std::optional<std::string> PostgresStore::frameChecksum(const std::string& path, int hdu) {
    ensureConnected();
    Params p;
    p.add(path).add(hdu);
    Result r = exec("SELECT checksum FROM frames WHERE path = $1 AND hdu = $2::integer", "frames", p);
    if (PQntuples(r.get()) == 0) return std::nullopt;
    return Row{r.get(), 0}.str(0);
}

// Ordered as the SQLite store orders them: unknown MJD last, paths byte-wise (COLLATE "C"); LIKE without
// an escape character and ASCII case-insensitive, like SQLite's.
Table PostgresStore::frames(const FrameQuery& query) {
    ensureConnected();
    Table t = framesTable();
    std::string sql = "SELECT ";
    for (const Column& c : t.columns())
        sql += (&c == &t.columns().front() ? "" : ", ") + c.name;
    sql += " FROM frames WHERE ($1::float8 IS NULL OR mjd >= $1) AND ($2::float8 IS NULL OR mjd <= $2) AND "
           "($3::text = '' OR filter = $3) AND ($4::text = '' OR path ILIKE $4 ESCAPE '') "
           "ORDER BY mjd NULLS LAST, path COLLATE \"C\", hdu";
    Params p;
    p.add(query.mjdMin.value_or(kNaN)).add(query.mjdMax.value_or(kNaN)).add(query.filter).add(query.pathLike);
    Result r = exec(sql.c_str(), "frames", p);
    auto& cols = t.columns();
    for (int row = 0; row < PQntuples(r.get()); ++row)
        for (int i = 0; i < static_cast<int>(cols.size()); ++i)
            std::visit(
                [&](auto& v) {
                    using T = typename std::decay_t<decltype(v)>::value_type;
                    const Row f{r.get(), row};
                    if constexpr (std::is_same_v<T, std::string>)
                        v.push_back(f.str(i));
                    else if constexpr (std::is_same_v<T, double>)
                        v.push_back(f.real(i));
                    else if constexpr (std::is_same_v<T, std::int64_t>)
                        v.push_back(f.integer(i));
                },
                cols[i].data);
    return t;
}

// One cone result row: the source, its frame, its separation; aper gets the interleaved aperture fluxes.
ConeRow coneRow(const Row& q, double sep, std::vector<double>& aper) {
    ConeRow c;
    c.frameId = q.integer(0), c.path = q.str(1), c.hdu = q.integer(2), c.mjd = q.real(3);
    c.filter = q.str(4), c.id = q.integer(5), c.ra = q.real(6), c.dec = q.real(7), c.x = q.real(8);
    c.y = q.real(9), c.sep = sep, c.fluxAuto = q.real(10), c.fluxErrAuto = q.real(11);
    c.fluxPsf = q.real(12), c.fluxErrPsf = q.real(13), c.magCal = q.real(14), c.magErrCal = q.real(15);
    c.flags = q.integer(16), c.refId = q.integer(17);
    const std::vector<double> flux = parseArray(PQgetvalue(q.result, q.row, 18));
    const std::vector<double> err = parseArray(PQgetvalue(q.result, q.row, 19));
    aper.assign(2 * flux.size(), kNaN); // flux, error per aperture
    for (std::size_t k = 0; k < flux.size(); ++k) {
        aper[2 * k] = flux[k];
        if (k < err.size()) aper[2 * k + 1] = err[k];
    }
    c.naper = static_cast<int>(flux.size());
    return c;
}

// Q3C finds the candidates (on a radius a hair wider); the separation test is the SQLite store's, so both
// back ends agree on sources at the edge.
Table PostgresStore::cone(double raDeg, double decDeg, double radiusArcsec) {
    if (!std::isfinite(raDeg) || !std::isfinite(decDeg) || !(radiusArcsec >= 0)) return coneTable(0);
    ensureConnected();
    Params p;
    p.add(raDeg).add(decDeg).add(radiusArcsec / 3600.0 * (1 + 1e-9) + 1e-12);
    Result r =
        // The sources first, through the Q3C index, then their frames: joined in one query, a planner
        // with stale statistics (a store just filled) walks every frame's sources instead (2 s, not 2 ms).
        exec("WITH s AS MATERIALIZED (SELECT * FROM sources "
             "WHERE q3c_radial_query(ra, dec, $1::float8, $2::float8, $3::float8)) "
             "SELECT s.frame_id, f.path, f.hdu, f.mjd, f.filter, s.id, s.ra, s.dec, s.x, s.y, s.flux_auto, "
             "s.fluxerr_auto, s.flux_psf, s.fluxerr_psf, s.mag_cal, s.magerr_cal, s.flags, s.ref_id, "
             "s.flux_aper, s.fluxerr_aper FROM s JOIN frames f ON f.id = s.frame_id",
             "cone", p);
    std::vector<ConeRow> rows;
    std::vector<std::vector<double>> apers;
    int naper = 0;
    for (int i = 0; i < PQntuples(r.get()); ++i) {
        const Row q{r.get(), i};
        const double sep = separationArcsec(raDeg, decDeg, q.real(6), q.real(7));
        if (!(sep <= radiusArcsec)) continue;
        apers.emplace_back();
        rows.push_back(coneRow(q, sep, apers.back()));
        naper = std::max(naper, rows.back().naper);
    }
    Table t = coneTable(naper);
    for (std::size_t i = 0; i < rows.size(); ++i) {
        rows[i].aper = apers[i].data();
        appendConeRow(t, rows[i]);
    }
    return sortCone(t);
}

std::string PostgresStore::frameConfig(std::int64_t frameId) {
    ensureConnected();
    Params p;
    p.add(frameId);
    Result r =
        exec("SELECT c.config FROM frames f JOIN configs c ON c.hash = f.config_hash WHERE f.id = $1::bigint",
             "configs", p);
    return PQntuples(r.get()) ? Row{r.get(), 0}.str(0) : std::string{};
}

// The object of that name and kind (its position updated), else a new one.
std::int64_t PostgresStore::seriesObjectId(const SeriesObjectRecord& o) {
    Params p;
    p.add(o.name).add(o.kind).add(o.ra).add(o.dec);
    Result r =
        exec("UPDATE series_objects SET ra = $3::float8, dec = $4::float8 WHERE name = $1 AND kind = $2 "
             "RETURNING id",
             "series objects", p);
    if (PQntuples(r.get()) > 0) return Row{r.get(), 0}.integer(0);
    r = exec(
        "INSERT INTO series_objects(name, kind, ra, dec) VALUES($1, $2, $3::float8, $4::float8) RETURNING id",
        "series objects", p);
    return Row{r.get(), 0}.integer(0);
}

SeriesWriteResult PostgresStore::putSeries(const std::vector<SeriesObjectRecord>& objects) {
    ensureConnected();
    SeriesWriteResult result;
    exec("BEGIN", "writing series");
    try {
        exec("SELECT pg_advisory_xact_lock(hashtext('gpuphot series'))", "writing series");
        for (const SeriesObjectRecord& o : objects) {
            const std::int64_t object = seriesObjectId(o);
            ++result.objects;
            for (const SeriesPointRecord& pt : o.points) {
                Params p;
                p.add(object).add(pt.framePath).add(pt.hdu).add(pt.bjdTdb).add(pt.relFlux).add(pt.relFluxErr);
                p.add(pt.mag).add(pt.magErr);
                Result r = exec("INSERT INTO series_points SELECT $1::bigint, f.id, $4::float8, $5::float8, "
                                "$6::float8, $7::float8, $8::float8 FROM frames f WHERE f.path = $2 AND "
                                "f.hdu = $3::integer ON CONFLICT (object_id, frame_id) DO UPDATE SET "
                                "bjd_tdb = EXCLUDED.bjd_tdb, rel_flux = EXCLUDED.rel_flux, rel_flux_err = "
                                "EXCLUDED.rel_flux_err, mag = EXCLUDED.mag, mag_err = EXCLUDED.mag_err",
                                "writing series points", p);
                const bool stored = std::string(PQcmdTuples(r.get())) != "0";
                ++(stored ? result.points : result.pointsWithoutFrame);
            }
        }
        exec("COMMIT", "writing series");
    } catch (...) {
        rollback();
        throw;
    }
    return result;
}

Table PostgresStore::seriesCurve(const std::string& name) {
    ensureConnected();
    Params p;
    p.add(name);
    const std::string sql =
        std::string("SELECT ") + kSeriesCurveColumns +
        " FROM series_objects o JOIN series_points p ON p.object_id = o.id JOIN frames f ON "
        "f.id = p.frame_id WHERE o.name = $1 ORDER BY o.kind, o.id, p.bjd_tdb, f.id";
    Result r = exec(sql.c_str(), "series", p);
    Table t = seriesTable();
    for (int i = 0; i < PQntuples(r.get()); ++i)
        appendSeriesRow(t, seriesRowOf(Row{r.get(), i}));
    return t;
}

} // namespace

std::unique_ptr<ResultsStore> openPostgresStore(const std::string& url, const StoreOptions& options) {
    return std::make_unique<PostgresStore>(url, options);
}

} // namespace gpuphot::db
