#include "app/cli/db_cli.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <mutex>
#include <set>

#include "app/cli/test_hooks.hpp"

namespace gpuphot::cli {

void addDbOption(CLI::App& sub, std::string& url) {
    sub.add_option("--db", url,
                   "Also store each frame's results in this database: a SQLite file (made when missing) or "
                   "postgresql://USER@HOST/DB (docs/DATABASE.md)");
}

StoreOptions cliStoreOptions() {
    StoreOptions o;
    o.test.killAfterRows = cliTestHooks().dbKillAfterRows;
    o.test.maxPageCount = cliTestHooks().dbMaxPageCount;
    return o;
}

StatusDatabase::StatusDatabase(const std::string& url, int verbosity) : m_verbosity(verbosity) {
    if (url.empty()) return;
    // One message per kind of failure, not one per frame.
    auto seen = std::make_shared<std::pair<std::mutex, std::set<int>>>();
    m_writer = std::make_unique<DatabaseWriter>(
        url, cliStoreOptions(), [seen](const std::string& frame, const DatabaseError& e) {
            std::lock_guard lock(seen->first);
            if (seen->second.insert(static_cast<int>(e.kind())).second)
                std::fprintf(stderr, "gpuphot: database error: %s: %s (files written; frames go on)\n",
                             frame.c_str(), e.what());
        });
}

void StatusDatabase::add(const nlohmann::json& line) {
    if (!m_writer) return;
    const std::string status = line.value("status", "");
    const std::string report = line.value("report", "");
    if (report.empty()) return;
    if (status == "ok")
        m_writer->submitFiles(report, {});
    else if (status == "skipped")
        m_writer->submitFiles(report, {}, true);
}

int StatusDatabase::finish(int status) {
    if (!m_writer) return status;
    const DatabaseWriterResult r = m_writer->finish();
    if (m_verbosity > 0 || !r.notStored.empty())
        std::fprintf(
            stderr, "database %s: %zu frames stored%s%s\n", m_writer->url().c_str(), r.stored,
            r.alreadyStored ? (", " + std::to_string(r.alreadyStored) + " already there").c_str() : "",
            r.notStored.empty() ? "" : (", " + std::to_string(r.notStored.size()) + " NOT stored").c_str());
    if (!r.firstError) return status;
    return databaseExitCode(r.firstError->kind());
}

} // namespace gpuphot::cli
