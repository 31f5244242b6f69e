#pragma once
// Frames into a ResultsStore on a thread of its own, so that the reduction of the next frame goes on
// while the last one is written (reduce, watch, worker; docs/DATABASE.md). The store is opened on that
// thread at the first frame and reopened after a failure, so a server that comes back is used again. A
// database error never stops the reduction: the frame's files are written either way, the error is
// reported once per kind, and finish() says which frames are not in the database.
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/db/results_store.hpp"

namespace gpuphot {

// Writes one reduced frame into `store`: the report (read from reportPath, or *reportInMemory) and the
// catalog (*catalogInMemory, else read from catalogPath or the report's outputs.catalog: only the stored
// columns). The frame is recorded by absolute path with its file's checksum. With onlyIfMissing a frame the
// store has already is left alone (returns false). Throws DatabaseError, IoError, InvalidInput.
bool storeReducedFrame(ResultsStore& store, const std::string& reportPath, std::string catalogPath = {},
                       bool onlyIfMissing = false, const nlohmann::json* reportInMemory = nullptr,
                       const Table* catalogInMemory = nullptr);

// The frame (absolute path as storeReducedFrame stores it, HDU) that a catalog STEM.cat.fits was made
// from, from the STEM.report.json beside it; nullopt without a readable report.
std::optional<std::pair<std::string, int>> frameOfCatalog(const std::string& catalogPath);

struct DatabaseWriterResult {
    std::size_t stored = 0, alreadyStored = 0;
    std::vector<std::string> notStored;      // frame paths
    std::optional<DatabaseError> firstError; // the first failure (its kind gives the exit status)
};

class DatabaseWriter {
public:
    // `onError` (optional) is called on the writer thread with each frame's failure.
    using OnError = std::function<void(const std::string& frame, const DatabaseError& error)>;
    DatabaseWriter(std::string url, StoreOptions options = {}, OnError onError = {},
                   std::size_t queueLimit = 4);
    ~DatabaseWriter(); // finish()es
    DatabaseWriter(const DatabaseWriter&) = delete;
    DatabaseWriter& operator=(const DatabaseWriter&) = delete;

    // A reduced frame from its files: STEM.report.json (its frame.path, hdu) and STEM.cat.fits ("": the
    // report's outputs.catalog). With
    // `onlyIfMissing` (a frame skipped because its outputs are complete) it is written only when the store
    // does not have (path, hdu) yet. Blocks while queueLimit frames wait.
    void submitFiles(const std::string& reportPath, const std::string& catalogPath,
                     bool onlyIfMissing = false);
    // A reduced frame in memory (the report as written, with its outputs section, and the catalog).
    void submit(nlohmann::json report, std::shared_ptr<const Table> catalog);
    // Waits until every submitted frame is written or has failed, and returns the totals.
    DatabaseWriterResult finish();
    const std::string& url() const { return m_url; }

private:
    struct Job {
        std::string reportPath, catalogPath;
        bool onlyIfMissing = false;
        nlohmann::json report;
        std::shared_ptr<const Table> catalog;
    };
    void enqueue(Job job);
    void run();
    void write(Job& job);

    std::string m_url;
    StoreOptions m_options;
    OnError m_onError;
    std::size_t m_limit;
    std::unique_ptr<ResultsStore> m_store; // writer thread only
    std::mutex m_mutex;
    std::condition_variable m_cv;
    std::deque<Job> m_queue;
    bool m_busy = false, m_stop = false;
    DatabaseWriterResult m_result;
    std::thread m_thread;
};

} // namespace gpuphot
