// The results store (core/db) against SQLite files, and against a real PostgreSQL server when
// GPUPHOT_TEST_PG_URL names one (tests/db/postgres_test.sh starts a private server and sets it).
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "core/db/db_records.hpp"
#include "core/db/db_writer.hpp"
#include "core/db/results_store.hpp"
#include "core/wcs/tan_sip.hpp"
#include "tests/test_support.hpp"

namespace gpuphot {
namespace {

// A synthetic catalog of n sources scattered over a box of `sizeDeg` around (ra0, dec0), RA wrapped.
Table makeCatalog(std::size_t n, double ra0, double dec0, double sizeDeg, unsigned seed, int apertures = 3) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(-0.5, 0.5);
    std::vector<double> ra(n), dec(n), x(n), y(n), flux(n), magCal(n);
    std::vector<std::int64_t> id(n), refId(n, -1);
    std::vector<std::int32_t> flags(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
        dec[i] = std::clamp(dec0 + sizeDeg * u(rng), -89.9999, 89.9999);
        ra[i] = std::fmod(ra0 + sizeDeg * u(rng) / std::cos(dec0 * M_PI / 180) + 720.0, 360.0);
        x[i] = 1 + 1000 * (u(rng) + 0.5), y[i] = 1 + 1000 * (u(rng) + 0.5);
        flux[i] = 1000.0 + i;
        magCal[i] = i % 7 == 0 ? std::numeric_limits<double>::quiet_NaN() : 15.0 + 1e-3 * i;
        id[i] = static_cast<std::int64_t>(i + 1);
        flags[i] = static_cast<std::int32_t>(i % 4);
    }
    Table t;
    t.add("id", id);
    t.add("x", x);
    t.add("y", y);
    t.add("ra", ra);
    t.add("dec", dec);
    for (int k = 1; k <= apertures; ++k) {
        std::vector<double> f(n), e(n);
        for (std::size_t i = 0; i < n; ++i)
            f[i] = flux[i] * k, e[i] = std::sqrt(flux[i] * k);
        t.add("flux_aper_" + std::to_string(k), f);
        t.add("fluxerr_aper_" + std::to_string(k), e);
    }
    t.add("flux_auto", flux);
    t.add("mag_cal", magCal);
    t.add("flags", flags);
    t.add("ref_id", refId);
    return t;
}

nlohmann::json makeReport(const std::string& path, double mjd, std::size_t sources, double zp = 25.0) {
    return {{"software", "gpuphot test"},
            {"frame", {{"path", path}, {"hdu", 0}, {"width", 1000}, {"height", 1000}}},
            {"instrument", {{"mjd_mid", mjd}, {"filter", "V"}, {"exptime", 30.0}, {"airmass", 1.2}}},
            {"counts", {{"sources", sources}}},
            {"fwhm", 3.1},
            {"zp", zp},
            {"zp_err", 0.01},
            {"aperture", {{"radii", {3.0, 5.0, 8.0}}}},
            {"stages", {{{"stage", "detect"}, {"seconds", 0.1}}}},
            {"config", {{"detection", {{"threshold", 1.5}}}}}};
}

std::int64_t put(ResultsStore& store, const std::string& path, double mjd, const Table& cat,
                 double zp = 25.0) {
    FrameRecord r;
    r.report = makeReport(path, mjd, cat.rows(), zp);
    r.catalog = &cat;
    r.checksum = "adler32:00000001";
    return store.putFrame(r);
}

// The sources of `cat` within radius of (ra, dec), by brute force.
std::set<std::int64_t> bruteCone(const Table& cat, double ra, double dec, double radiusArcsec) {
    std::set<std::int64_t> ids;
    const auto r = cat.doubles("ra"), d = cat.doubles("dec");
    const auto& id = cat.at("id").as<std::int64_t>();
    for (std::size_t i = 0; i < cat.rows(); ++i)
        if (angularSeparationDeg(ra, dec, r[i], d[i]) * 3600 <= radiusArcsec) ids.insert(id[i]);
    return ids;
}

std::set<std::int64_t> coneIds(const Table& cone) {
    const auto& id = cone.at("id").as<std::int64_t>();
    return {id.begin(), id.end()};
}

// Empties the PostgreSQL database the environment names (the tests share one server).
void resetPostgres(const std::string& url) {
    PGconn* c = PQconnectdb(url.c_str());
    ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
    PQclear(PQexec(c, "SET client_min_messages = warning"));
    PGresult* r = PQexec(c, "DROP SCHEMA public CASCADE; CREATE SCHEMA public;");
    EXPECT_EQ(PQresultStatus(r), PGRES_COMMAND_OK) << PQerrorMessage(c);
    PQclear(r);
    PQfinish(c);
}

class ResultsStoreTest : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        if (GetParam() == "postgresql") {
            const char* url = std::getenv("GPUPHOT_TEST_PG_URL");
            if (!url || !*url)
                GTEST_SKIP() << "GPUPHOT_TEST_PG_URL not set (tests/db/postgres_test.sh sets it)";
            m_url = url;
            resetPostgres(m_url);
        } else {
            m_url = m_dir.file("sub/dir/night.sqlite"); // its directories made on open
        }
    }
    std::unique_ptr<ResultsStore> open(StoreOptions o = {}) { return openResultsStore(m_url, o); }
    test::TempDir m_dir{"gpuphot_store"};
    std::string m_url;
};

TEST_P(ResultsStoreTest, FrameRoundTrip) {
    auto store = open();
    EXPECT_EQ(store->schemaVersion(), kResultsSchemaVersion);
    const Table cat = makeCatalog(500, 150.0, 2.0, 0.2, 1);
    const std::int64_t id = put(*store, "/data/a.fits", 60000.25, cat);
    const Table frames = store->frames({});
    ASSERT_EQ(frames.rows(), 1u);
    EXPECT_EQ(frames.at("id").as<std::int64_t>()[0], id);
    EXPECT_EQ(frames.at("path").as<std::string>()[0], "/data/a.fits");
    EXPECT_DOUBLE_EQ(frames.at("mjd").as<double>()[0], 60000.25);
    EXPECT_EQ(frames.at("filter").as<std::string>()[0], "V");
    EXPECT_EQ(frames.at("sources").as<std::int64_t>()[0], 500);
    EXPECT_DOUBLE_EQ(frames.at("zp").as<double>()[0], 25.0);
    EXPECT_TRUE(std::isnan(frames.at("astrometric_rms").as<double>()[0])); // absent: NULL, read back NaN
    EXPECT_EQ(store->frameChecksum("/data/a.fits", 0).value_or(""), "adler32:00000001");
    EXPECT_FALSE(store->frameChecksum("/data/a.fits", 1));
    EXPECT_NE(store->frameConfig(id).find("threshold"), std::string::npos);
    // Every column of a stored source comes back.
    const Table all = store->cone(150.0, 2.0, 3600.0);
    ASSERT_EQ(all.rows(), 500u);
    const auto& ids = all.at("id").as<std::int64_t>();
    for (std::size_t i = 0; i < all.rows(); ++i) {
        const std::size_t row = static_cast<std::size_t>(ids[i] - 1);
        EXPECT_DOUBLE_EQ(all.at("ra").as<double>()[i], cat.doubles("ra")[row]);
        EXPECT_DOUBLE_EQ(all.at("flux_aper_3").as<double>()[i], cat.doubles("flux_aper_3")[row]);
        EXPECT_DOUBLE_EQ(all.at("fluxerr_aper_2").as<double>()[i], cat.doubles("fluxerr_aper_2")[row]);
        EXPECT_EQ(std::isnan(all.at("mag_cal").as<double>()[i]), std::isnan(cat.doubles("mag_cal")[row]));
        EXPECT_EQ(all.at("flags").as<std::int64_t>()[i], static_cast<std::int64_t>(row % 4));
    }
}

TEST_P(ResultsStoreTest, FrameWrittenAgainReplacesItsRows) {
    auto store = open();
    put(*store, "/data/a.fits", 60000.0, makeCatalog(300, 10.0, 10.0, 0.1, 1));
    const Table second = makeCatalog(120, 10.0, 10.0, 0.1, 2);
    put(*store, "/data/a.fits", 60000.0, second, 24.5);
    const Table frames = store->frames({});
    ASSERT_EQ(frames.rows(), 1u);
    EXPECT_DOUBLE_EQ(frames.at("zp").as<double>()[0], 24.5);
    EXPECT_EQ(store->cone(10.0, 10.0, 3600.0).rows(), 120u);
}

TEST_P(ResultsStoreTest, ConeMatchesBruteForceAcrossRaZeroAndNearThePole) {
    auto store = open();
    struct Field {
        double ra, dec, size;
    };
    for (const Field f : {Field{0.01, 5.0, 0.3}, Field{359.99, -30.0, 0.3}, Field{45.0, 89.9, 0.15},
                          Field{200.0, -89.95, 0.08}}) {
        const Table cat = makeCatalog(4000, f.ra, f.dec, f.size, static_cast<unsigned>(f.dec * 10 + 100));
        put(*store, "/data/f" + std::to_string(f.dec) + ".fits", 60000.0, cat);
        for (double radius : {10.0, 60.0, 300.0}) {
            const auto want = bruteCone(cat, f.ra, f.dec, radius);
            EXPECT_EQ(coneIds(store->cone(f.ra, f.dec, radius)), want)
                << f.ra << " " << f.dec << " r " << radius;
        }
    }
}

TEST_P(ResultsStoreTest, LightCurveIsTheNearestSourceOfEachFrameInTimeOrder) {
    auto store = open();
    const Table cat = makeCatalog(2000, 120.0, -20.0, 0.1, 3);
    for (int k : {2, 0, 1})
        put(*store, "/night/f" + std::to_string(k) + ".fits", 60000.0 + 0.01 * k, cat, 25.0 + 0.1 * k);
    const double ra = cat.doubles("ra")[10], dec = cat.doubles("dec")[10];
    const Table lc = lightCurve(*store, ra, dec, 1.0);
    ASSERT_EQ(lc.rows(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(lc.at("id").as<std::int64_t>()[i], 11);
        EXPECT_DOUBLE_EQ(lc.at("mjd").as<double>()[i], 60000.0 + 0.01 * static_cast<double>(i));
    }
    FrameQuery q;
    q.mjdMin = 60000.005;
    EXPECT_EQ(store->frames(q).rows(), 2u);
    q.filter = "R";
    EXPECT_EQ(store->frames(q).rows(), 0u);
}

// A writer killed in the middle of a frame's sources leaves the frame as it was; the retry writes it once.
TEST_P(ResultsStoreTest, WriterKilledMidFrameLeavesNoPartialFrame) {
    {
        auto store = open();
        put(*store, "/data/keep.fits", 60000.0, makeCatalog(100, 50.0, 0.0, 0.05, 4));
        put(*store, "/data/killed.fits", 60000.1, makeCatalog(100, 50.0, 0.0, 0.05, 5));
    }
    const Table replacement = makeCatalog(5000, 50.0, 0.0, 0.05, 6);
    const pid_t child = fork();
    if (child == 0) {
        StoreOptions o;
        o.test.killAfterRows = 2500;
        auto store = openResultsStore(m_url, o);
        put(*store, "/data/killed.fits", 60000.1, replacement);
        _exit(0); // not reached: SIGKILL at row 2500
    }
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    auto store = open();
    EXPECT_EQ(store->frames({}).rows(), 2u);
    EXPECT_EQ(store->cone(50.0, 0.0, 3600.0).rows(), 200u); // the old rows of both frames, no new ones
    put(*store, "/data/killed.fits", 60000.1, replacement);
    EXPECT_EQ(store->frames({}).rows(), 2u);
    EXPECT_EQ(store->cone(50.0, 0.0, 3600.0).rows(), 5100u);
}

TEST_P(ResultsStoreTest, WriterThreadStoresFramesAndSkipsStoredOnes) {
    auto catalog = std::make_shared<const Table>(makeCatalog(200, 80.0, 30.0, 0.05, 7));
    {
        DatabaseWriter writer(m_url);
        for (int k = 0; k < 6; ++k)
            writer.submit(makeReport("/w/f" + std::to_string(k) + ".fits", 60000.0 + k, 200), catalog);
        const DatabaseWriterResult r = writer.finish();
        EXPECT_EQ(r.stored, 6u);
        EXPECT_TRUE(r.notStored.empty());
    }
    EXPECT_EQ(open()->frames({}).rows(), 6u);
}

TEST_P(ResultsStoreTest, SeriesPointsTieToStoredFramesAndAreReplaced) {
    auto store = open();
    const Table cat = makeCatalog(50, 30.0, 5.0, 0.05, 11);
    put(*store, "/n/a.fits", 60000.10, cat);
    put(*store, "/n/b.fits", 60000.20, cat);
    SeriesObjectRecord o;
    o.name = "WASP-1";
    o.ra = 30.0, o.dec = 5.0;
    for (const auto& [path, bjd] :
         {std::pair{"/n/b.fits", 2460000.7}, {"/n/a.fits", 2460000.6}, {"/n/x.fits", 2460000.8}}) {
        SeriesPointRecord p;
        p.framePath = path, p.bjdTdb = bjd, p.relFlux = 1.0, p.relFluxErr = 0.01, p.mag = 12.0;
        o.points.push_back(p);
    }
    SeriesWriteResult w = store->putSeries({o});
    EXPECT_EQ(w.objects, 1u);
    EXPECT_EQ(w.points, 2u);
    EXPECT_EQ(w.pointsWithoutFrame, 1u); // /n/x.fits is not stored
    for (auto& p : o.points)
        p.relFlux = 0.99;
    w = store->putSeries({o});
    EXPECT_EQ(w.points, 2u);
    const Table t = store->seriesCurve("WASP-1");
    ASSERT_EQ(t.rows(), 2u); // replaced, not added
    EXPECT_DOUBLE_EQ(t.at("bjd_tdb").as<double>()[0], 2460000.6);
    EXPECT_EQ(t.at("path").as<std::string>()[0], "/n/a.fits");
    EXPECT_DOUBLE_EQ(t.at("rel_flux").as<double>()[1], 0.99);
    EXPECT_TRUE(std::isnan(t.at("mag_err").as<double>()[0]));
    EXPECT_EQ(store->seriesCurve("WASP-2").rows(), 0u);
    // A frame reduced again loses its points (they were measured on the old catalog).
    put(*store, "/n/a.fits", 60000.10, cat);
    EXPECT_EQ(store->seriesCurve("WASP-1").rows(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Backends, ResultsStoreTest, ::testing::Values("sqlite", "postgresql"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// --- SQLite's own failure modes ------------------------------------------------------------------------

DatabaseError::Kind kindOfOpen(const std::string& url, StoreOptions o = {}) {
    try {
        openResultsStore(url, o);
    } catch (const DatabaseError& e) {
        return e.kind();
    }
    ADD_FAILURE() << url << " opened";
    return DatabaseError::Kind::Other;
}

TEST(ResultsStoreSqlite, NewerSchemaIsRefused) {
    test::TempDir dir("gpuphot_store");
    const std::string path = dir.file("new.sqlite");
    openResultsStore(path);
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE meta SET value = '99' WHERE key = 'schema_version'", nullptr, nullptr,
                           nullptr),
              SQLITE_OK);
    sqlite3_close(db);
    EXPECT_EQ(kindOfOpen(path), DatabaseError::Kind::SchemaTooNew);
    EXPECT_EQ(databaseExitCode(DatabaseError::Kind::SchemaTooNew), 7);
}

// fuzz_results_db: a schema version that is not a number made std::stoi throw std::invalid_argument out of
// openResultsStore (tests/fuzz/regressions/results_db/schema_version_not_a_number.sqlite).
TEST(ResultsStoreSqlite, DamagedSchemaVersionIsATypedError) {
    test::TempDir dir("gpuphot_store");
    int n = 0;
    for (const char* bad : {"'x'", "''", "'1.5'", "'-3'", "' 2'", "NULL", "'99999999999'"}) {
        SCOPED_TRACE(bad);
        const std::string path = dir.file("bad" + std::to_string(n++) + ".sqlite");
        openResultsStore(path);
        sqlite3* db = nullptr;
        ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
        const std::string sql =
            std::string("UPDATE meta SET value = ") + bad + " WHERE key = 'schema_version'";
        ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
        sqlite3_close(db);
        try {
            openResultsStore(path);
            ADD_FAILURE() << "opened";
        } catch (const DatabaseError& e) {
            EXPECT_EQ(e.kind(), DatabaseError::Kind::Other);
            EXPECT_NE(std::string(e.what()).find("schema_version"), std::string::npos) << e.what();
        }
    }
    const std::string repro =
        std::string(GPUPHOT_TEST_DATA) + "/../fuzz/regressions/results_db/schema_version_not_a_number.sqlite";
    const std::string copy = dir.file("repro.sqlite");
    std::filesystem::copy_file(repro, copy);
    EXPECT_THROW(openResultsStore(copy), DatabaseError);
}

TEST(ResultsStoreSqlite, CheckpointsKeepTheWalToAboutOneFrame) {
    // The store checkpoints on a thread of its own after each frame: the WAL file is reused from its
    // start, not grown by every frame (SQLite's own checkpoint is held back to 256 MB of WAL).
    test::TempDir dir("gpuphot_store");
    const std::string path = dir.file("night.sqlite");
    auto store = openResultsStore(path);
    const Table cat = makeCatalog(20000, 150.0, 2.0, 0.5, 3);
    put(*store, "/data/f0.fits", 60000.0, cat);
    const auto oneFrame = std::filesystem::file_size(path + "-wal");
    ASSERT_GT(oneFrame, 2u << 20) << "a frame of 20,000 sources is a few MB of WAL";
    for (int k = 1; k <= 8; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300)); // room for the checkpoint
        put(*store, "/data/f" + std::to_string(k) + ".fits", 60000.0 + k, cat);
    }
    EXPECT_LT(std::filesystem::file_size(path + "-wal"), 3 * oneFrame);
    EXPECT_EQ(store->frames({}).rows(), 9u);
    store.reset(); // the last connection to close checkpoints everything and removes the WAL
    EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
    EXPECT_EQ(openResultsStore(path)->frames({}).rows(), 9u);
}

TEST(ResultsStoreSqlite, UnopenableAndNotADatabase) {
    test::TempDir dir("gpuphot_store");
    EXPECT_EQ(kindOfOpen("/proc/self/no/such.sqlite"), DatabaseError::Kind::Unreachable);
    const std::string text = dir.file("notes.sqlite");
    std::ofstream(text) << "this is not a database, it is a text file of some length..............\n";
    EXPECT_EQ(kindOfOpen(text), DatabaseError::Kind::Other);
}

TEST(ResultsStoreSqlite, FullDatabaseKeepsEarlierFramesAndHoldsNoPartOfTheFailedOne) {
    test::TempDir dir("gpuphot_store");
    const std::string path = dir.file("full.sqlite");
    StoreOptions o;
    o.test.maxPageCount = 200; // 800 kB
    auto store = openResultsStore(path, o);
    put(*store, "/data/small.fits", 60000.0, makeCatalog(200, 0.5, 0.5, 0.05, 8));
    try {
        put(*store, "/data/big.fits", 60000.1, makeCatalog(50000, 0.5, 0.5, 0.05, 9));
        FAIL() << "a 50,000-source frame fitted in 200 pages";
    } catch (const DatabaseError& e) {
        EXPECT_EQ(e.kind(), DatabaseError::Kind::Full) << e.what();
        EXPECT_EQ(databaseExitCode(e.kind()), 8);
    }
    auto reopened = openResultsStore(path);
    EXPECT_EQ(reopened->frames({}).rows(), 1u);
    EXPECT_EQ(reopened->cone(0.5, 0.5, 3600.0).rows(), 200u);
}

TEST(ResultsStoreSqlite, ConeBoxesCoverTheCircle) {
    for (double dec : {-89.99, -45.0, 0.0, 60.0, 89.999})
        for (double ra : {0.0, 0.001, 180.0, 359.999}) {
            const auto boxes = db::coneBoxes(ra, dec, 10.0 / 3600);
            ASSERT_FALSE(boxes.empty());
            // A point 9.9" away in any direction lies in some box.
            for (double pa = 0; pa < 360; pa += 15) {
                const double d = dec + 9.9 / 3600 * std::cos(pa * M_PI / 180);
                double r = ra + 9.9 / 3600 * std::sin(pa * M_PI / 180) / std::cos(dec * M_PI / 180);
                if (std::fabs(d) > 90) continue;
                r = std::fmod(r + 720.0, 360.0);
                bool in = false;
                for (const auto& b : boxes)
                    in = in || (b.zone == db::zoneOf(d) && r >= b.raMin && r <= b.raMax);
                EXPECT_TRUE(in) << ra << " " << dec << " pa " << pa;
            }
        }
}

} // namespace
} // namespace gpuphot
