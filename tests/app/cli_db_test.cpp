// reduce/watch --db and gpuphot query through the binary, on a SQLite file (the PostgreSQL runs of the same
// paths are in tests/db/postgres_test.sh).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/wcs/tan_sip.hpp"
#include "tests/app/cli_run.hpp"

namespace gpuphot::test {
namespace fs = std::filesystem;

namespace {

constexpr int kFrames = 3;

const TempDir& frameDir() {
    static TempDir frames("gpuphot_db_frames");
    static bool done = [] {
        for (int i = 1; i <= kFrames; ++i) {
            const CliResult r = runCli("simulate --size 256x256 --stars 80 --seed " + std::to_string(30 + i) +
                                       " -o " + frames.str() + " --name f" + std::to_string(i) + " -q");
            EXPECT_EQ(r.exitCode, 0) << r.err;
            fs::remove(frames / ("f" + std::to_string(i) + ".truth.fits"));
        }
        return true;
    }();
    (void)done;
    return frames;
}

std::string frames() {
    std::string s;
    for (int i = 1; i <= kFrames; ++i)
        s += frameDir() / ("f" + std::to_string(i) + ".fits") + " ";
    return s;
}

nlohmann::json queryJson(const std::string& db, const std::string& what) {
    const CliResult r = runCli("query --db " + db + " --format json " + what);
    EXPECT_EQ(r.exitCode, 0) << r.err;
    return r.exitCode == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::array();
}

} // namespace

TEST(CliDb, ReduceStoresEveryFrameAndQueryReadsThemBack) {
    TempDir out("gpuphot_db_out");
    const std::string db = out / "sub/night.sqlite"; // its directory is made
    CliResult r = runCli("reduce " + frames() + " -o " + out.str() + " -j 2 -q --db " + db);
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const nlohmann::json f = queryJson(db, "frames");
    ASSERT_EQ(f.size(), static_cast<std::size_t>(kFrames));
    for (const auto& row : f) {
        const std::string stem = fs::path(row["path"].get<std::string>()).stem().string();
        const Table cat = readFitsTable(out / (stem + ".cat.fits"));
        EXPECT_EQ(row["sources"].get<std::size_t>(), cat.rows());
        EXPECT_EQ(row["checksum"].get<std::string>().rfind("adler32:", 0), 0u);
        EXPECT_TRUE(fs::path(row["path"].get<std::string>()).is_absolute());
    }
    // A cone at a source of f1: every catalog source within 20" of it, from every frame, and nothing else.
    const Table c1 = readFitsTable(out / "f1.cat.fits");
    const double ra = c1.doubles("ra")[5], dec = c1.doubles("dec")[5];
    std::size_t want = 0;
    for (int i = 1; i <= kFrames; ++i) {
        const Table c = readFitsTable(out / ("f" + std::to_string(i) + ".cat.fits"));
        for (std::size_t k = 0; k < c.rows(); ++k)
            want += angularSeparationDeg(ra, dec, c.doubles("ra")[k], c.doubles("dec")[k]) * 3600 <= 20.0;
    }
    char pos[96];
    std::snprintf(pos, sizeof pos, "%.9f %.9f", ra, dec);
    const nlohmann::json cone = queryJson(db, std::string("cone ") + pos + " 20");
    EXPECT_EQ(cone.size(), want);
    ASSERT_GE(cone.size(), 1u);
    EXPECT_TRUE(cone[0].contains("flux_aper_1"));
    // The light curve: one point per frame that has the star, in time order.
    const nlohmann::json lc = queryJson(db, std::string("lightcurve ") + pos + " --radius 1");
    ASSERT_GE(lc.size(), 1u);
    EXPECT_LE(lc.size(), static_cast<std::size_t>(kFrames));
    for (std::size_t i = 1; i < lc.size(); ++i)
        EXPECT_LE(lc[i - 1]["mjd"].get<double>(), lc[i]["mjd"].get<double>());
    // CSV and ECSV to files (directory made), and the human table.
    r = runCli("query --db " + db + " --format ecsv -o " + (out / "q/frames.ecsv") + " frames");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_NE(slurp(out / "q/frames.ecsv").find("%ECSV 1.0"), std::string::npos);
    r = runCli("query --db " + db + " --format csv frames");
    EXPECT_EQ(r.exitCode, 0) << r.err;
    EXPECT_EQ(r.out.rfind("id,path,hdu,checksum,mjd", 0), 0u) << r.out;
    r = runCli("query --db " + db + " frames");
    EXPECT_NE(r.out.find("f2.fits"), std::string::npos) << r.out;

    // Reduced again: the frames are replaced, not added; skipped frames already stored are left alone.
    r = runCli("reduce " + frames() + " -o " + out.str() + " -q --force --db " + db);
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_EQ(queryJson(db, "frames").size(), static_cast<std::size_t>(kFrames));
    EXPECT_EQ(queryJson(db, std::string("cone ") + pos + " 20").size(), want);
    r = runCli("reduce " + frames() + " -o " + out.str() + " --db " + db);
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_NE(r.err.find("0 frames stored, 3 already there"), std::string::npos) << r.err;
}

TEST(CliDb, DatabaseFailuresHaveTheirExitCodesAndTheFilesAreStillWritten) {
    TempDir out("gpuphot_db_bad");
    const std::string frame = frameDir() / "f1.fits";
    // A database of a newer schema: exit 7, the catalog written, the database untouched.
    const std::string newer = out / "newer.sqlite";
    ASSERT_EQ(runCli("query --db " + newer + " frames").exitCode, 5); // query never creates a file
    {
        sqlite3* h = nullptr;
        ASSERT_EQ(sqlite3_open(newer.c_str(), &h), SQLITE_OK);
        sqlite3_exec(h,
                     "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta "
                     "VALUES('schema_version','9')",
                     nullptr, nullptr, nullptr);
        sqlite3_close(h);
    }
    CliResult r = runCli("reduce " + frame + " -o " + (out / "a") + " -q --db " + newer);
    EXPECT_EQ(r.exitCode, 7) << r.err;
    EXPECT_NE(r.err.find("newer gpuphot"), std::string::npos) << r.err;
    EXPECT_TRUE(fs::exists(out / "a/f1.cat.fits"));
    EXPECT_EQ(runCli("query --db " + newer + " frames").exitCode, 7);
    // Not a database: exit 9. A path that cannot be made: exit 5.
    std::ofstream(out / "notes.txt") << "not a database, only some text that is long enough to be read\n";
    r = runCli("reduce " + frame + " -o " + (out / "b") + " -q --db " + (out / "notes.txt"));
    EXPECT_EQ(r.exitCode, 9) << r.err;
    EXPECT_TRUE(fs::exists(out / "b/f1.cat.fits"));
    r = runCli("reduce " + frame + " -o " + (out / "c") + " -q --db /proc/self/none/x.sqlite");
    EXPECT_EQ(r.exitCode, 5) << r.err;
    EXPECT_TRUE(fs::exists(out / "c/f1.cat.fits"));
}

TEST(CliDb, FullDatabaseAndKilledWriterLeaveNoPartialFrame) {
    TempDir out("gpuphot_db_fault");
    const std::string db = out / "night.sqlite";
    // Full: the first frame fits, the second does not (the page limit is per connection).
    CliResult r = runCli("reduce " + (frameDir() / "f1.fits") + " -o " + out.str() + " -q --db " + db);
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const std::size_t before = queryJson(db, "cone 0 0 648000").size(); // every stored source
    // A frame of some 2,000 sources needs pages the store cannot have (the limit is at its present size).
    r = runCli("simulate --size 1024x1024 --stars 2500 --seed 5 -q -o " + (out / "big") + " --name big");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    r = runCli("reduce " + (out / "big/big.fits") + " -o " + out.str() + " -q --db " + db,
               "GPUPHOT_NO_TYCHO2=1 GPUPHOT_TEST_DB_MAX_PAGES=2", GPUPHOT_CLI_TESTHOOKS);
    EXPECT_EQ(r.exitCode, 8) << r.err;
    EXPECT_TRUE(fs::exists(out / "big.cat.fits"));
    EXPECT_EQ(queryJson(db, "frames").size(), 1u);
    EXPECT_EQ(queryJson(db, "cone 0 0 648000").size(), before);
    // Killed half-way through the sources of f3: f3 is not in the database; the retry (f3's outputs are
    // complete, so it is skipped) stores it once.
    r = runCli("reduce " + (frameDir() / "f3.fits") + " -o " + out.str() + " -q --db " + db,
               "GPUPHOT_NO_TYCHO2=1 GPUPHOT_TEST_DB_KILL_AFTER_ROWS=20", GPUPHOT_CLI_TESTHOOKS);
    EXPECT_EQ(r.exitCode, 137) << "not killed (the shell reports SIGKILL as 137): " << r.err;
    EXPECT_EQ(queryJson(db, "frames").size(), 1u);
    r = runCli("reduce " + (frameDir() / "f3.fits") + " " + (frameDir() / "f1.fits") + " -o " + out.str() +
               " --db " + db);
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_NE(r.err.find("1 frames stored, 1 already there"), std::string::npos) << r.err;
    const nlohmann::json f = queryJson(db, "frames");
    ASSERT_EQ(f.size(), 2u);
    const Table c3 = readFitsTable(out / "f3.cat.fits");
    EXPECT_EQ(queryJson(db, "cone 0 0 648000").size(), before + c3.rows());
}

} // namespace gpuphot::test
