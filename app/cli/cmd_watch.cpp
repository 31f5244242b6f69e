// gpuphot watch DIR: at the telescope, reduce each new frame as soon as the camera has finished writing it,
// in one warm pipeline (one RunContext for every frame), one line per frame and the JSON status lines.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fnmatch.h>
#include <map>
#include <mutex>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "app/cli/batch.hpp"
#include "app/cli/commands.hpp"
#include "app/cli/db_cli.hpp"
#include "app/cli/settle.hpp"
#include "core/pipeline/frame_status.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};
void watchStopSignal(int) {
    g_stop.store(true);
}

struct WatchCli {
    ReduceCliOptions options;
    std::string dir;
    std::string pattern = "*.fits";
    double settle = 1.0;
    double rescan = 5.0;
    bool once = false;
    double timeout = 0.0;
    std::string jsonl;
    bool force = false;
    std::string db; // --db URL
};

// Files reduce writes into OUTDIR: never taken for new frames when OUTDIR is the watched directory.
bool isOutputName(const std::string& name) {
    for (const char* s : {".cat.fits", ".bkg.fits", ".rms.fits", ".seg.fits", ".psf.fits", ".resid.fits",
                          ".solved.fits", ".targets.fits"}) {
        const std::size_t l = std::strlen(s);
        if (name.size() > l && name.compare(name.size() - l, l, s) == 0) return true;
    }
    return false;
}

// A file seen in the directory, waiting until it has been at rest for --settle seconds (SettleClock).
struct Candidate {
    bool submitted = false; // handed to the pipeline; erased when its status line comes back
};

using Version = FileVersion;

class Watcher {
public:
    // Frames go through a FramePipeline (--prefetch, --concurrent): a settled frame is read while the one
    // before is in its stages; lines come back on the pipeline's writer thread and are finished on this one.
    Watcher(const WatchCli& o, FrameReducer& reducer, std::string jsonl)
        : m_o(o), m_jsonl(std::move(jsonl)), m_db(o.db, o.options.common.verbosity),
          m_pipeline(
              reducer, o.options.prefetch,
              [this](std::size_t ticket, nlohmann::json line) {
                  std::lock_guard lock(m_doneMutex);
                  m_finished.emplace_back(ticket, std::move(line));
              },
              o.options.concurrent) {}

    int run() {
        m_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (m_fd < 0) throw IoError(std::string("watch: inotify_init1: ") + std::strerror(errno));
        if (::inotify_add_watch(m_fd, m_o.dir.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0) {
            const int err = errno;
            ::close(m_fd);
            throw IoError("watch: " + m_o.dir + ": cannot watch: " + std::strerror(err));
        }
        const auto start = Clock::now();
        rescan();
        std::vector<std::string> initial;
        for (const auto& [path, c] : m_candidates)
            initial.push_back(path);
        auto lastRescan = Clock::now();
        if (verbosity() > 0)
            std::fprintf(stderr, "gpuphot: watching %s for %s (%zu present), results in %s\n",
                         m_o.dir.c_str(), m_o.pattern.c_str(), initial.size(), m_jsonl.c_str());
        while (!g_stop.load()) {
            if (m_o.timeout > 0 && seconds(Clock::now() - start) >= m_o.timeout) break;
            if (m_o.once && std::all_of(initial.begin(), initial.end(),
                                        [&](const std::string& p) { return !m_candidates.count(p); }))
                break;
            pollfd p{m_fd, POLLIN, 0};
            const int n = ::poll(&p, 1, 100);
            if (n < 0 && errno != EINTR) throw IoError(std::string("watch: poll: ") + std::strerror(errno));
            if (n > 0) readEvents();
            if (!m_o.once && seconds(Clock::now() - lastRescan) >= m_o.rescan) {
                rescan();
                lastRescan = Clock::now();
            }
            step();
            drain();
        }
        // A signal stops after the current frame: the frames read ahead of it are dropped, not reduced.
        if (g_stop.load())
            m_pipeline.finishStarted();
        else
            m_pipeline.finish(); // --once, --timeout: every frame handed over is completed
        drain();
        ::close(m_fd);
        const std::vector<nlohmann::json> last = lastLinePerFrame();
        if (verbosity() > 0 && !last.empty()) {
            std::size_t ok = 0, skipped = 0, failed = 0;
            for (const auto& j : last) {
                const std::string s = j.value("status", "");
                ok += s == "ok";
                skipped += s == "skipped";
                failed += s == "failed";
            }
            std::fprintf(stderr, "gpuphot: watch ended: %zu frames: %zu ok, %zu skipped, %zu failed\n",
                         last.size(), ok, skipped, failed);
        }
        return m_db.finish(batchExitStatus(last));
    }

private:
    static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

    bool matches(const std::string& name) const {
        if (name.empty() || name[0] == '.' || isOutputName(name)) return false; // hidden: temporary files
        return ::fnmatch(m_o.pattern.c_str(), name.c_str(), 0) == 0;
    }

    void consider(const fs::path& path) {
        std::error_code ec;
        if (!matches(path.filename().string()) || !fs::is_regular_file(path, ec)) return;
        const std::string key = path.string();
        if (m_candidates.count(key)) return;
        const Version v{fs::file_size(path, ec), fs::last_write_time(path, ec)};
        if (ec) return;
        if (auto it = m_done.find(key); it != m_done.end() && it->second == v) return; // reduced this version
        m_candidates[key] = Candidate{};
    }

    void rescan() {
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(m_o.dir, ec))
            consider(e.path());
        if (ec) throw IoError("watch: " + m_o.dir + ": cannot list: " + ec.message());
    }

    void readEvents() {
        alignas(inotify_event) char buf[16384];
        for (;;) {
            const ssize_t n = ::read(m_fd, buf, sizeof buf);
            if (n <= 0) return;
            for (char* p = buf; p < buf + n;) {
                const auto* ev = reinterpret_cast<const inotify_event*>(p);
                if (ev->len > 0) consider(fs::path(m_o.dir) / ev->name);
                if (ev->mask & IN_Q_OVERFLOW) rescan();
                p += sizeof(inotify_event) + ev->len;
            }
        }
    }

    // Reduces the candidates at rest for --settle seconds (SettleClock) that open as complete
    // FITS files. A file still invalid long after it stopped changing is reported as failed, once.
    void step() {
        const auto now = Clock::now();
        std::vector<std::string> keys;
        for (const auto& [k, c] : m_candidates)
            keys.push_back(k);
        for (const auto& key : keys) {
            if (g_stop.load()) return;
            Candidate& c = m_candidates[key];
            if (c.submitted) continue;
            const auto look = m_settle.look(key, now);
            if (!look) { // gone (renamed away or deleted)
                m_candidates.erase(key);
                continue;
            }
            const double stable = look->stableSeconds;
            if (stable < m_o.settle) continue;
            std::string why;
            if (!fitsFileComplete(key, &why)) {
                const double giveUp = std::max(10.0 * m_o.settle, 5.0);
                if (stable < giveUp) continue;
                finish(key, look->version,
                       frameStatusFailed(key,
                                         key + ": not a complete FITS file after " +
                                             std::to_string(static_cast<int>(stable)) +
                                             " s unchanged: " + why,
                                         2));
                continue;
            }
            if (m_pipeline.full()) continue; // the next step hands it over
            c.submitted = true;
            FrameTask task;
            task.frame = key;
            task.force = m_o.force;
            m_inFlight[m_pipeline.submit(std::move(task))] = {key, look->version};
        }
    }

    // Finishes the frames whose status lines the pipeline has delivered.
    void drain() {
        std::vector<std::pair<std::size_t, nlohmann::json>> lines;
        {
            std::lock_guard lock(m_doneMutex);
            lines.swap(m_finished);
        }
        for (auto& [ticket, line] : lines) {
            const auto it = m_inFlight.find(ticket);
            if (it == m_inFlight.end()) continue;
            finish(it->second.first, it->second.second, line);
            m_inFlight.erase(it);
        }
    }

    void finish(const std::string& key, const Version& v, const nlohmann::json& line) {
        m_candidates.erase(key);
        m_settle.forget(key);
        m_done[key] = v;
        m_lines.push_back(line);
        appendJsonLine(m_jsonl, line);
        m_db.add(line);
        const std::string text = describeStatus(line);
        if (line.value("status", "") == "failed")
            std::fprintf(stderr, "gpuphot: error: %s\n", text.c_str());
        else if (verbosity() > 0)
            std::printf("%s\n", text.c_str());
        if (line.contains("warnings") && line["warnings"].is_array())
            for (const auto& w : line["warnings"])
                if (w.is_string())
                    std::fprintf(stderr, "gpuphot: warning: %s: %s\n", key.c_str(),
                                 w.get<std::string>().c_str());
        std::fflush(stdout);
    }

    // A frame seen twice (failed while incomplete, later reduced; or rewritten by the camera) counts by
    // its latest line, in the order frames first finished.
    std::vector<nlohmann::json> lastLinePerFrame() const {
        std::vector<nlohmann::json> out;
        std::map<std::string, std::size_t> index;
        for (const auto& j : m_lines) {
            const auto [it, fresh] = index.emplace(j.value("frame", ""), out.size());
            if (fresh)
                out.push_back(j);
            else
                out[it->second] = j;
        }
        return out;
    }

    int verbosity() const { return m_o.options.common.verbosity; }

    const WatchCli& m_o;
    int m_fd = -1;
    std::string m_jsonl;
    std::mutex m_doneMutex;
    std::vector<std::pair<std::size_t, nlohmann::json>> m_finished;    // delivered, not yet finished
    std::map<std::size_t, std::pair<std::string, Version>> m_inFlight; // ticket -> frame
    StatusDatabase m_db;      // --db: its writer thread stores each finished frame
    FramePipeline m_pipeline; // last: its threads end before the members above go
    std::map<std::string, Candidate> m_candidates;
    SettleClock m_settle;
    std::map<std::string, Version> m_done;
    std::vector<nlohmann::json> m_lines;
};

int run(WatchCli& o) {
    std::error_code ec;
    if (!fs::is_directory(o.dir, ec)) throw InvalidInput("watch: " + o.dir + " is not a directory");
    if (!(o.settle >= 0.0)) throw InvalidInput("watch: --settle must be >= 0 seconds");
    FrameReducer reducer(o.options); // validates the reduce options, loads the reference once
    const std::string jsonl =
        o.jsonl.empty() ? (fs::path(o.options.common.outdir) / "gpuphot.jsonl").string() : o.jsonl;
    struct sigaction sa {
    }, oldInt{}, oldTerm{};
    sa.sa_handler = watchStopSignal; // no SA_RESTART: poll returns at once
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &oldInt);
    ::sigaction(SIGTERM, &sa, &oldTerm);
    g_stop.store(false);
    Watcher w(o, reducer, jsonl);
    const int rc = w.run();
    ::sigaction(SIGINT, &oldInt, nullptr);
    ::sigaction(SIGTERM, &oldTerm, nullptr);
    return rc;
}

} // namespace

Command registerWatch(CLI::App& app) {
    auto o = std::make_shared<WatchCli>();
    auto* sub = app.add_subcommand(
        "watch", "Reduce each new frame in a directory as soon as it is completely written");
    sub->add_option("dir", o->dir, "Directory the camera writes frames into")->required();
    addReduceOptions(*sub, o->options);
    sub->add_option("--pattern", o->pattern, "File name pattern of frames (shell glob)")
        ->capture_default_str();
    sub->add_option("--settle", o->settle, "Seconds a file's size must stay unchanged before it is read")
        ->capture_default_str();
    sub->add_option("--rescan", o->rescan, "Seconds between full directory rescans (besides inotify)")
        ->capture_default_str();
    sub->add_flag("--once", o->once, "Reduce the frames present at start, then exit");
    sub->add_option("--timeout", o->timeout, "Exit after this many seconds (after the current frame)");
    sub->add_option("--jsonl", o->jsonl,
                    "Append one JSON status line per frame here (default: OUTDIR/gpuphot.jsonl)");
    sub->add_flag("--force", o->force, "Reduce frames again even when their outputs are complete and newer");
    addDbOption(*sub, o->db);
    return {sub, [o] { return run(*o); }};
}

} // namespace gpuphot::cli
