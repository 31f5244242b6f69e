#include "core/io/atomic_file.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <random>
#include <unistd.h>

#include "core/util/errors.hpp"

namespace gpuphot {
namespace fs = std::filesystem;

AtomicOutput::AtomicOutput(std::string finalPath) : m_final(std::move(finalPath)) {
    const fs::path p(m_final);
    std::random_device rd;
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".%d.%08x.tmp", static_cast<int>(getpid()), rd());
    // The temporary name starts with '.' so that globs for outputs never pick it up.
    m_temp = (p.parent_path() / ("." + p.filename().string() + suffix)).string();
    std::error_code ec;
    if (!p.parent_path().empty() && !fs::is_directory(p.parent_path(), ec))
        throw IoError("cannot write " + m_final + ": directory " + p.parent_path().string() + " does not exist");
}

AtomicOutput::~AtomicOutput() {
    if (!m_committed) ::unlink(m_temp.c_str());
}

void AtomicOutput::commit() {
    const int fd = ::open(m_temp.c_str(), O_RDONLY);
    if (fd < 0) throw IoError("cannot write " + m_final + ": temporary file " + m_temp + " missing");
    ::fsync(fd);
    ::close(fd);
    if (::rename(m_temp.c_str(), m_final.c_str()) != 0)
        throw IoError("cannot write " + m_final + ": rename failed: " + std::strerror(errno));
    m_committed = true;
}

void writeTextFileAtomic(const std::string& path, const std::string& text) {
    AtomicOutput out(path);
    std::FILE* f = std::fopen(out.tempPath().c_str(), "wb");
    if (!f) throw IoError("cannot write " + path + ": " + std::strerror(errno));
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) throw IoError("cannot write " + path + ": " + std::strerror(errno));
    out.commit();
}

} // namespace gpuphot
