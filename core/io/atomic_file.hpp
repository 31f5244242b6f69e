#pragma once
// Crash-safe output: write to a temporary name in the destination directory, then rename over the
// final name. A crash, a kill or an exception leaves no half-written file under the final name.
//
// Temporary names: ".<final file name>.<host>.<pid>.<8 hex digits>.tmp" next to the final file (hidden,
// so globs for outputs never pick them up). An exception removes its temporary file; a SIGKILL or a
// power cut cannot, so the first AtomicOutput a process creates in a directory removes that directory's
// stale temporaries: those of this host whose process no longer exists (docs/RELIABILITY.md).
#include <cstddef>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace gpuphot {

class AtomicOutput {
public:
    explicit AtomicOutput(std::string finalPath);
    ~AtomicOutput(); // removes the temporary file unless commit() succeeded
    AtomicOutput(const AtomicOutput&) = delete;
    AtomicOutput& operator=(const AtomicOutput&) = delete;

    const std::string& tempPath() const { return m_temp; } // write here (it does not exist yet)
    const std::string& finalPath() const { return m_final; }
    void commit(); // fsyncs and renames; throws IoError naming the file

private:
    std::string m_final;
    std::string m_temp;
    bool m_committed = false;
};

// Many files committed together: AtomicOutputs committed on a thread that has joined the batch are
// renamed by finish(), in the order they were committed, the files marked durable() last; those are
// flushed to disk (fsync) by the thread that commits them, while the others go on writing (mark them
// before they are committed), and stamped with the time of finish() so that they are the batch's newest
// files. Files not marked are put in place without a flush (over an existing file by exchanging the two
// names, then removing the old one: no write-back forced inside the call): a killed process still leaves no
// partial file under a final name, but after a power cut such a file may be empty until it is written
// again. For outputs derived from others (a series' light curves, rewritten by every call) this saves
// one flush per file.
class AtomicBatch {
public:
    AtomicBatch() = default;
    ~AtomicBatch(); // removes the temporaries of a batch that was not finished
    AtomicBatch(const AtomicBatch&) = delete;
    AtomicBatch& operator=(const AtomicBatch&) = delete;

    // While a Join lives, this thread's commits go to the batch.
    class Join {
    public:
        explicit Join(AtomicBatch& batch);
        ~Join();
        Join(const Join&) = delete;
        Join& operator=(const Join&) = delete;

    private:
        AtomicBatch* m_previous;
    };

    void add(std::string temp, std::string final); // called by AtomicOutput::commit
    void durable(const std::string& final);        // flush this one before the renames
    void finish();                                 // throws IoError naming the file

private:
    std::mutex m_mutex;
    std::vector<std::pair<std::string, std::string>> m_files; // temporary, final
    std::set<std::string> m_durable;
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
