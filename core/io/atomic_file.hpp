#pragma once
// Crash-safe output: write to a temporary name in the destination directory, then rename over the
// final name. A crash, a kill or an exception leaves no half-written file under the final name.
//
// Temporary names: ".<final file name>.<host>.<pid>.<8 hex digits>.tmp" next to the final file (hidden,
// so globs for outputs never pick them up). An exception removes its temporary file; a SIGKILL or a
// power cut cannot, so the first AtomicOutput a process creates in a directory removes that directory's
// stale temporaries: those of this host whose process no longer exists (docs/RELIABILITY.md).
#include <cstddef>
#include <string>

namespace gpuphot {

class AtomicOutput {
public:
    explicit AtomicOutput(std::string finalPath);
    ~AtomicOutput(); // removes the temporary file unless commit() succeeded
    AtomicOutput(const AtomicOutput&) = delete;
    AtomicOutput& operator=(const AtomicOutput&) = delete;

    const std::string& tempPath() const { return m_temp; }   // write here (it does not exist yet)
    const std::string& finalPath() const { return m_final; }
    void commit(); // fsyncs and renames; throws IoError naming the file

private:
    std::string m_final;
    std::string m_temp;
    bool m_committed = false;
};

// Writes `text` to `path` atomically.
void writeTextFileAtomic(const std::string& path, const std::string& text);

// True when `fileName` (no directory) has the form of an AtomicOutput temporary name.
bool isAtomicTemporaryName(const std::string& fileName);

// Removes the temporary files in `dir` left by killed processes of this host (name of the form above, our
// host name, a process id that no longer exists); returns how many. Temporaries of live processes and of
// other hosts are left alone. AtomicOutput calls it once per directory and process.
std::size_t removeStaleTemporaries(const std::string& dir);

} // namespace gpuphot
