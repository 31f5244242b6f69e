// AtomicBatch: files committed together appear at finish(), the durable ones last and newest.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/io/atomic_file.hpp"

namespace fs = std::filesystem;
using namespace gpuphot;

namespace {
struct AtomicBatchTest : ::testing::Test {
    void SetUp() override {
        dir = fs::temp_directory_path() / ("gpuphot_batch_" + std::to_string(::getpid()));
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }
    std::string at(const char* name) const { return (dir / name).string(); }
    std::size_t entries() const {
        return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
    }
    fs::path dir;
};
} // namespace

TEST_F(AtomicBatchTest, FilesAppearAtFinishAndTheDurableOneIsNewest) {
    AtomicBatch batch;
    batch.durable(at("state"));
    {
        AtomicBatch::Join join(batch);
        writeTextFileAtomic(at("state"), "state\n"); // written first, like a state flushed early
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        writeTextFileAtomic(at("derived.json"), "{}\n");
    }
    EXPECT_FALSE(fs::exists(at("state")));
    EXPECT_FALSE(fs::exists(at("derived.json")));
    EXPECT_EQ(entries(), 2u); // the two temporaries
    batch.finish();
    ASSERT_TRUE(fs::exists(at("state")));
    ASSERT_TRUE(fs::exists(at("derived.json")));
    EXPECT_EQ(entries(), 2u);
    EXPECT_GE(fs::last_write_time(at("state")), fs::last_write_time(at("derived.json")));
    std::ifstream in(at("state"));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, "state");
}

TEST_F(AtomicBatchTest, UnfinishedBatchLeavesNothing) {
    {
        AtomicBatch batch;
        AtomicBatch::Join join(batch);
        writeTextFileAtomic(at("a.txt"), "a\n");
        writeTextFileAtomic(at("b.txt"), "b\n");
    }
    EXPECT_EQ(entries(), 0u);
}
