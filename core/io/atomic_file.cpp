#include "core/io/atomic_file.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util/errors.hpp"

namespace gpuphot {
namespace fs = std::filesystem;
namespace {

// This host's name as it appears in temporary names: letters, digits and '-' only (at most 32).
const std::string& hostTag() {
    static const std::string tag = [] {
        char buf[256] = {};
        if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("host");
        std::string s;
        for (const char* p = buf; *p && s.size() < 32; ++p)
            s += std::isalnum(static_cast<unsigned char>(*p)) ? *p : '-';
        return s.empty() ? std::string("host") : s;
    }();
    return tag;
}

struct TempNameParts {
    std::string host;
    long pid = 0;
};

// Parses ".<name>.<host>.<pid>.<8 hex>.tmp" from the end (the final name may itself contain dots).
bool parseTempName(const std::string& n, TempNameParts* parts) {
    const std::string suffix = ".tmp";
    if (n.size() < 2 + suffix.size() || n[0] != '.' ||
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0)
        return false;
    std::string rest = n.substr(0, n.size() - suffix.size());
    auto takeField = [&rest](std::string& field) {
        const auto dot = rest.rfind('.');
        if (dot == std::string::npos || dot == 0) return false;
        field = rest.substr(dot + 1);
        rest.resize(dot);
        return !field.empty();
    };
    std::string hex, pid, host;
    if (!takeField(hex) || !takeField(pid) || !takeField(host)) return false;
    if (hex.size() != 8 || rest.size() < 2) return false; // rest = "." + final name
    for (char c : hex)
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    if (pid.size() > 9) return false;
    for (char c : pid)
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    for (char c : host)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    if (parts) {
        parts->host = host;
        parts->pid = std::stol(pid);
    }
    return true;
}

bool processAlive(long pid) {
    if (pid <= 0) return true; // never remove what we cannot attribute
    return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
}

// Runs removeStaleTemporaries once per directory in this process.
void cleanOnce(const fs::path& dir) {
    static std::mutex mutex;
    static std::set<std::string> done;
    std::error_code ec;
    const std::string key = fs::absolute(dir.empty() ? fs::path(".") : dir, ec).string();
    {
        std::lock_guard lock(mutex);
        if (!done.insert(key).second) return;
    }
    removeStaleTemporaries(key);
}

} // namespace

bool isAtomicTemporaryName(const std::string& fileName) {
    return parseTempName(fileName, nullptr);
}

std::size_t removeStaleTemporaries(const std::string& dir) {
    std::size_t removed = 0;
    std::error_code ec;
    fs::directory_iterator it(dir.empty() ? fs::path(".") : fs::path(dir), ec);
    if (ec) return 0;
    for (const auto& e : it) {
        const std::string name = e.path().filename().string();
        if (name.empty() || name[0] != '.') continue;
        TempNameParts parts;
        if (!parseTempName(name, &parts) || parts.host != hostTag() || processAlive(parts.pid)) continue;
        std::error_code ec2;
        if (e.is_regular_file(ec2) && fs::remove(e.path(), ec2)) ++removed;
    }
    return removed;
}

AtomicOutput::AtomicOutput(std::string finalPath) : m_final(std::move(finalPath)) {
    const fs::path p(m_final);
    std::random_device rd;
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ".%d.%08x.tmp", static_cast<int>(getpid()), rd());
    // The temporary name starts with '.' so that globs for outputs never pick it up.
    m_temp = (p.parent_path() / ("." + p.filename().string() + "." + hostTag() + suffix)).string();
    std::error_code ec;
    if (!p.parent_path().empty() && !fs::is_directory(p.parent_path(), ec))
        throw IoError("cannot write " + m_final + ": directory " + p.parent_path().string() +
                      " does not exist");
    cleanOnce(p.parent_path());
}

AtomicOutput::~AtomicOutput() {
    if (!m_committed) ::unlink(m_temp.c_str());
}

namespace {
thread_local AtomicBatch* t_batch = nullptr;

// An unflushed file over an existing one by exchanging the two names, then removing the old content: as
// atomic for a reader as rename(2), but ext4 does not start the new file's write-back inside the call, as
// it does for a rename over an existing file (auto_da_alloc), which now and then held a series' append
// for 100-200 ms. False when there is nothing to exchange with or the file system cannot (then rename).
bool exchangeIntoPlace(const std::string& temp, const std::string& final) {
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) != 0) return false;
    ::unlink(temp.c_str()); // the old content, now under the temporary name
    return true;
#else
    (void)temp;
    (void) final;
    return false;
#endif
}
} // namespace

AtomicBatch::Join::Join(AtomicBatch& batch) : m_previous(t_batch) {
    t_batch = &batch;
}

AtomicBatch::Join::~Join() {
    t_batch = m_previous;
}

// A durable file is flushed here, on the thread that wrote it, while the others write theirs.
void AtomicBatch::add(std::string temp, std::string final) {
    bool flush = false;
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        flush = m_durable.count(final) != 0;
    }
    if (flush) {
        const int fd = ::open(temp.c_str(), O_RDONLY);
        if (fd < 0) throw IoError("cannot write " + final + ": temporary file " + temp + " missing");
        ::fsync(fd);
        ::close(fd);
    }
    std::lock_guard<std::mutex> lock(m_mutex);
    m_files.emplace_back(std::move(temp), std::move(final));
}

AtomicBatch::~AtomicBatch() {
    for (const auto& f : m_files)
        ::unlink(f.first.c_str());
}

void AtomicBatch::durable(const std::string& final) {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_durable.insert(final);
}

void AtomicBatch::finish() {
    std::lock_guard<std::mutex> lock(m_mutex);
    // The durable files were flushed by add(). Their directory is not: after a power cut a durable file
    // holds its old content or its new one (as AtomicOutput's), and the renames are made again by the
    // next call. The durable files last (the others derive from them), each group in commit order.
    // The durable files are also stamped now: they are the batch's newest, so a reader can tell a batch
    // stopped before them (an older durable file beside newer derived ones) from a finished one.
    const auto firstDurable = std::stable_partition(
        m_files.begin(), m_files.end(), [this](const auto& f) { return m_durable.count(f.second) == 0; });
    for (auto f = firstDurable; f != m_files.end(); ++f)
        ::utimensat(AT_FDCWD, f->first.c_str(), nullptr, 0);
    for (std::size_t k = 0; k < m_files.size(); ++k) {
        const auto& [temp, final] = m_files[k];
        const bool exchanged = m_durable.count(final) == 0 && exchangeIntoPlace(temp, final);
        if (!exchanged && ::rename(temp.c_str(), final.c_str()) != 0) {
            const std::string what = "cannot write " + final + ": rename failed: " + std::strerror(errno);
            m_files.erase(m_files.begin(), m_files.begin() + static_cast<long>(k));
            throw IoError(what);
        }
    }
    m_files.clear();
}

void AtomicOutput::commit() {
    if (t_batch) {
        t_batch->add(m_temp, m_final);
        m_committed = true;
        return;
    }
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
