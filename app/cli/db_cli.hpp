#pragma once
// --db for reduce, watch, series and worker: the status lines of reduced frames go to a DatabaseWriter
// (core/db/db_writer.hpp), beside the reduction of the next frame; a database failure never stops the
// reduction, and sets the exit status to the error's code (docs/CLI.md, exit codes).
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/db/db_writer.hpp"

namespace CLI {
class App;
}

namespace gpuphot::cli {

// Adds --db URL (a SQLite file, or postgresql://user@host/db) to `sub`.
void addDbOption(CLI::App& sub, std::string& url);
// The store options of this binary (gpuphot-testhooks: fault injection from the environment).
StoreOptions cliStoreOptions();

class StatusDatabase {
public:
    StatusDatabase(const std::string& url, int verbosity); // url "": does nothing
    // A frame's status line: "ok" frames are written, "skipped" ones only when the store lacks them.
    void add(const nlohmann::json& line);
    // Waits for the writes, reports the frames not stored, and returns `status`, or the database error's
    // exit code when a frame could not be stored.
    int finish(int status);
    bool enabled() const { return m_writer != nullptr; }

private:
    std::unique_ptr<DatabaseWriter> m_writer;
    int m_verbosity = 1;
};

} // namespace gpuphot::cli
