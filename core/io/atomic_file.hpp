#pragma once
// Crash-safe output: write to a temporary name in the destination directory, then rename over the
// final name. A crash, a kill or an exception leaves no half-written file under the final name.
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

} // namespace gpuphot
