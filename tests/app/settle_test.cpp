// SettleClock: when `watch` and `series --follow` take a file another process writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "app/cli/settle.hpp"

namespace fs = std::filesystem;
using gpuphot::cli::SettleClock;

namespace {
struct SettleClockTest : ::testing::Test {
    void SetUp() override {
        dir = fs::temp_directory_path() / ("gpuphot_settle_" + std::to_string(::getpid()));
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }
    std::string write(const std::string& name, const std::string& text) {
        const fs::path p = dir / name;
        std::ofstream(p) << text;
        return p.string();
    }
    fs::path dir;
};
} // namespace

TEST_F(SettleClockTest, FileAtRestCountsFromItsModificationTime) {
    const std::string p = write("old.fits", "abc");
    fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::seconds(30));
    SettleClock clock;
    const auto look = clock.look(p, SettleClock::Clock::now());
    ASSERT_TRUE(look);
    EXPECT_GT(look->stableSeconds, 29.0);
    EXPECT_LT(look->stableSeconds, 60.0);
    EXPECT_EQ(look->version.size, 3u);
}

TEST_F(SettleClockTest, ChangeRestartsTheClockAndGoneFilesAreDropped) {
    const std::string p = write("growing.fits", "abc");
    fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::seconds(30));
    SettleClock clock;
    const auto t0 = SettleClock::Clock::now();
    ASSERT_GT(clock.look(p, t0)->stableSeconds, 29.0);
    std::ofstream(p, std::ios::app) << "more"; // the writer goes on
    const auto changed = clock.look(p, t0 + std::chrono::seconds(1));
    ASSERT_TRUE(changed);
    EXPECT_EQ(changed->stableSeconds, 0.0);
    EXPECT_EQ(changed->version.size, 7u);
    const auto later = clock.look(p, t0 + std::chrono::seconds(3));
    EXPECT_NEAR(later->stableSeconds, 2.0, 1e-9); // unchanged since the change was seen
    fs::remove(p);
    EXPECT_FALSE(clock.look(p, t0 + std::chrono::seconds(4)));
}

TEST_F(SettleClockTest, ForgottenFileIsSeenAfresh) {
    const std::string p = write("f.fits", "abc");
    SettleClock clock;
    const auto t0 = SettleClock::Clock::now();
    clock.look(p, t0);
    const double before = clock.look(p, t0 + std::chrono::seconds(5))->stableSeconds;
    EXPECT_GE(before, 5.0);
    clock.forget(p);
    // Seen afresh at t0: its modification time (just now) is the start again, not the first look.
    EXPECT_LT(clock.look(p, t0)->stableSeconds, 5.0);
}
