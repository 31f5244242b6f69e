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

// A batch over existing files (a series' every append): each file holds its new content, the old content
// is gone (the names were exchanged and the old file removed), and only the final names are left. A second
// name (a hard link) of an old derived file keeps the old content: the new file is a new inode, as after a
// rename.
TEST_F(AtomicBatchTest, ReplacesExistingFilesAndLeavesNothingElse) {
    writeTextFileAtomic(at("state"), "state 1\n");
    writeTextFileAtomic(at("curve.csv"), "old\n");
    fs::create_hard_link(at("curve.csv"), at("reader.csv"));
    ASSERT_EQ(entries(), 3u);
    AtomicBatch batch;
    batch.durable(at("state"));
    {
        AtomicBatch::Join join(batch);
        writeTextFileAtomic(at("curve.csv"), "new\n");
        writeTextFileAtomic(at("state"), "state 2\n");
    }
    EXPECT_EQ(entries(), 5u); // the two temporaries beside the finals
    batch.finish();
    const auto text = [&](const char* name) {
        std::ifstream in(at(name));
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_EQ(text("curve.csv"), "new\n");
    EXPECT_EQ(text("state"), "state 2\n");
    EXPECT_EQ(text("reader.csv"), "old\n");
    EXPECT_EQ(entries(), 3u) << "a temporary or the old content was left behind";
}
