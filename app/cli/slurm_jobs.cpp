#include "app/cli/slurm_jobs.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <spawn.h>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include "core/pipeline/frame_status.hpp"
#include "core/util/errors.hpp"

extern char** environ;

namespace gpuphot::cli {
namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
    const auto b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::vector<std::string> splitLines(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    std::string line;
    while (std::getline(ss, line))
        if (!trim(line).empty()) out.push_back(trim(line));
    return out;
}

std::string normalPath(const std::string& p) {
    std::error_code ec;
    const fs::path a = fs::absolute(p, ec);
    return ec ? p : a.lexically_normal().string();
}

// "CANCELLED by 0" -> "CANCELLED"
std::string firstWord(const std::string& s) {
    return s.substr(0, s.find(' '));
}

// Task ids named by a sacct JobID ("12_3", "12_[0-3%2]") of array job `jobId`; none for other rows.
std::vector<long> tasksOfSacctId(const std::string& id, const std::string& jobId) {
    if (id.rfind(jobId + "_", 0) != 0) return {};
    return expandTaskIds(id.substr(jobId.size() + 1));
}

std::map<long, SlurmTaskState> fromSacct(const std::string& jobId, bool* answered) {
    *answered = false;
    ProcessResult r;
    try {
        r = runProcess({"sacct", "-n", "-P", "-X", "-j", jobId, "--format=JobID,State,ExitCode"});
    } catch (const IoError&) {
        return {};
    }
    if (r.exitCode != 0) return {};
    *answered = true;
    std::map<long, SlurmTaskState> out;
    for (const auto& line : splitLines(r.out)) {
        std::vector<std::string> f;
        std::stringstream ss(line);
        std::string part;
        while (std::getline(ss, part, '|'))
            f.push_back(part);
        if (f.size() < 3) continue;
        for (long t : tasksOfSacctId(f[0], jobId))
            out[t] = {firstWord(f[1]), f[2]};
    }
    return out;
}

std::map<long, SlurmTaskState> fromScontrol(const std::string& jobId, bool* answered) {
    *answered = false;
    ProcessResult r;
    try {
        r = runProcess({"scontrol", "show", "job", "-o", jobId});
    } catch (const IoError&) {
        return {};
    }
    if (r.exitCode != 0) return {};
    *answered = true;
    std::map<long, SlurmTaskState> out;
    for (const auto& line : splitLines(r.out)) {
        std::map<std::string, std::string> kv;
        std::stringstream ss(line);
        std::string tok;
        while (ss >> tok)
            if (const auto eq = tok.find('='); eq != std::string::npos)
                kv.emplace(tok.substr(0, eq), tok.substr(eq + 1));
        if (kv["ArrayJobId"] != jobId || !kv.count("ArrayTaskId")) continue;
        for (long t : expandTaskIds(kv["ArrayTaskId"]))
            out[t] = {kv["JobState"], kv["ExitCode"]};
    }
    return out;
}

std::string fmt(const char* format, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

std::string numberOr(const nlohmann::json& line, const char* key, const char* format,
                     const char* none = "-") {
    if (!line.is_object() || !line.contains(key) || !line[key].is_number()) return none;
    return fmt(format, line[key].get<double>());
}

} // namespace

SlurmLayout slurmLayout(const std::string& outdir) {
    const fs::path d = fs::path(normalPath(outdir)) / "slurm";
    return {d.string(), (d / "frames.txt").string(), (d / "job.sh").string(), (d / "job_id").string(),
            (d / "status").string()};
}

ProcessResult runProcess(const std::vector<std::string>& argv) {
    if (argv.empty()) throw InvalidInput("runProcess: no program given");
    int outPipe[2], errPipe[2];
    if (pipe2(outPipe, O_CLOEXEC) != 0)
        throw IoError(argv[0] + ": cannot create a pipe: " + std::strerror(errno));
    if (pipe2(errPipe, O_CLOEXEC) != 0) {
        const int e = errno;
        close(outPipe[0]);
        close(outPipe[1]);
        throw IoError(argv[0] + ": cannot create a pipe: " + std::strerror(e));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, outPipe[1], 1);
    posix_spawn_file_actions_adddup2(&actions, errPipe[1], 2);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    std::vector<char*> args;
    for (const auto& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(outPipe[1]);
    close(errPipe[1]);
    if (rc != 0) {
        close(outPipe[0]);
        close(errPipe[0]);
        if (rc == ENOENT) throw IoError(argv[0] + ": not found on PATH");
        throw IoError(argv[0] + ": cannot start: " + std::strerror(rc));
    }
    ProcessResult result;
    pollfd fds[2] = {{outPipe[0], POLLIN, 0}, {errPipe[0], POLLIN, 0}};
    std::string* sinks[2] = {&result.out, &result.err};
    int open = 2;
    char buf[4096];
    while (open > 0) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            const ssize_t n = read(fds[i].fd, buf, sizeof buf);
            if (n > 0) {
                sinks[i]->append(buf, static_cast<std::size_t>(n));
            } else if (n == 0 || errno != EINTR) {
                close(fds[i].fd);
                fds[i].fd = -1;
                --open;
            }
        }
    }
    for (auto& f : fds)
        if (f.fd >= 0) close(f.fd);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return result;
}

std::string shellQuote(const std::string& s) {
    std::string out = "'";
    for (char c : s)
        out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

std::vector<long> expandTaskIds(const std::string& exprIn) {
    std::string expr = exprIn;
    expr.erase(std::remove_if(expr.begin(), expr.end(), [](char c) { return c == '[' || c == ']'; }),
               expr.end());
    if (const auto pct = expr.find('%'); pct != std::string::npos) expr.resize(pct);
    std::vector<long> out;
    std::stringstream ss(expr);
    std::string part;
    while (std::getline(ss, part, ',')) {
        try {
            std::size_t used = 0;
            const long a = std::stol(part, &used);
            if (used == part.size()) {
                out.push_back(a);
            } else if (part[used] == '-') {
                const std::string rest = part.substr(used + 1);
                std::size_t used2 = 0;
                const long b = std::stol(rest, &used2);
                long step = 1;
                if (used2 < rest.size() && rest[used2] == ':')
                    step = std::max(1L, std::stol(rest.substr(used2 + 1)));
                for (long t = a; t <= b && out.size() < 10000000; t += step)
                    out.push_back(t);
            }
        } catch (const std::exception&) {
            // not a task id ("N/A", empty): names nothing
        }
    }
    return out;
}

std::map<long, SlurmTaskState> querySlurmArray(const std::string& jobId, std::string* source) {
    if (source) source->clear();
    if (jobId.empty()) return {};
    bool answered = false;
    auto tasks = fromSacct(jobId, &answered);
    if (answered && !tasks.empty()) {
        if (source) *source = "sacct";
        return tasks;
    }
    // Accounting disabled (sacct fails) or the job not yet recorded: the controller's own memory.
    auto fromCtl = fromScontrol(jobId, &answered);
    if (answered) {
        if (source) *source = "scontrol";
        return fromCtl;
    }
    return tasks;
}

bool slurmArrayActive(const std::string& jobId) {
    const ProcessResult r = runProcess({"squeue", "-h", "-j", jobId, "-o", "%i %T"});
    if (r.exitCode == 0) return !trim(r.out).empty();
    // A job the controller has already purged is not an error for us: it is done.
    if (r.err.find("Invalid job id") != std::string::npos) return false;
    throw IoError("squeue -j " + jobId + " failed (exit " + std::to_string(r.exitCode) + "): " + trim(r.err));
}

nlohmann::json OutdirStatus::toJson() const {
    nlohmann::json j;
    j["totals"] = {{"frames", frames.size()}, {"ok", ok},           {"failed", failed},
                   {"skipped", skipped},      {"missing", missing}, {"malformed_lines", malformedLines}};
    j["all_ok"] = allOk();
    j["job_id"] = jobId.empty() ? nlohmann::json(nullptr) : nlohmann::json(jobId);
    j["slurm_source"] = slurmSource.empty() ? nlohmann::json(nullptr) : nlohmann::json(slurmSource);
    j["frames"] = nlohmann::json::array();
    for (const auto& f : frames) {
        nlohmann::json e = {{"frame", f.frame}, {"status", f.status}, {"line", f.line}};
        if (!f.slurm.empty()) e["slurm"] = f.slurm;
        j["frames"].push_back(std::move(e));
    }
    return j;
}

OutdirStatus collectOutdirStatus(const std::string& outdir, bool askSlurm) {
    std::error_code ec;
    if (!fs::is_directory(outdir, ec)) throw IoError(outdir + ": no such output directory");
    const SlurmLayout L = slurmLayout(outdir);
    OutdirStatus s;

    // frames.txt: the frames a submission expects, in array order.
    std::vector<std::string> expected;
    if (fs::exists(L.frames, ec)) {
        std::ifstream in(L.frames);
        if (!in) throw IoError(L.frames + ": cannot read");
        std::string line;
        while (std::getline(in, line))
            if (!trim(line).empty()) expected.push_back(normalPath(trim(line)));
    }
    if (fs::exists(L.jobId, ec)) {
        std::ifstream in(L.jobId);
        std::getline(in, s.jobId);
        s.jobId = trim(s.jobId);
    }

    // Every JSON line, ordered by its time stamp, then by file and line order: the latest per frame wins.
    std::vector<std::string> files;
    if (fs::is_directory(L.statusDir, ec))
        for (const auto& e : fs::directory_iterator(L.statusDir, ec))
            if (e.is_regular_file() && e.path().extension() == ".jsonl") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    const std::string local = (fs::path(normalPath(outdir)) / "gpuphot.jsonl").string();
    if (fs::exists(local, ec)) files.push_back(local);
    struct Entry {
        std::string time;
        std::size_t order;
        nlohmann::json line;
    };
    std::vector<Entry> entries;
    for (const auto& f : files) {
        std::size_t bad = 0;
        for (auto& j : readJsonLines(f, &bad)) {
            if (!j.contains("frame") || !j["frame"].is_string() || !j.contains("status")) {
                ++s.malformedLines;
                continue;
            }
            entries.push_back({j.value("time", std::string()), entries.size(), std::move(j)});
        }
        s.malformedLines += bad;
    }
    std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.time != b.time ? a.time < b.time : a.order < b.order;
    });
    std::map<std::string, nlohmann::json> latest;
    std::vector<std::string> seenOrder;
    for (auto& e : entries) {
        const std::string frame = normalPath(e.line["frame"].get<std::string>());
        if (!latest.count(frame)) seenOrder.push_back(frame);
        latest[frame] = std::move(e.line);
    }

    std::vector<std::string> order = expected;
    for (const auto& f : seenOrder)
        if (std::find(expected.begin(), expected.end(), f) == expected.end()) order.push_back(f);
    std::map<long, SlurmTaskState> tasks;
    bool queried = false;
    for (std::size_t i = 0; i < order.size(); ++i) {
        FrameState fs_;
        fs_.frame = order[i];
        if (const auto it = latest.find(order[i]); it != latest.end()) {
            fs_.line = it->second;
            fs_.status =
                it->second["status"].is_string() ? it->second["status"].get<std::string>() : "failed";
            if (fs_.status != "ok" && fs_.status != "skipped") fs_.status = "failed";
        } else {
            fs_.status = "missing";
            if (askSlurm && !s.jobId.empty() && i < expected.size()) {
                if (!queried) {
                    tasks = querySlurmArray(s.jobId, &s.slurmSource);
                    queried = true;
                }
                if (const auto t = tasks.find(static_cast<long>(i)); t != tasks.end())
                    fs_.slurm = t->second.state + " (exit " + t->second.exitCode + ")";
                else
                    fs_.slurm = "unknown to Slurm";
            }
        }
        if (fs_.status == "ok")
            ++s.ok;
        else if (fs_.status == "skipped")
            ++s.ok, ++s.skipped;
        else if (fs_.status == "failed")
            ++s.failed;
        else
            ++s.missing;
        s.frames.push_back(std::move(fs_));
    }
    return s;
}

void printOutdirStatus(const OutdirStatus& s) {
    std::size_t width = 5;
    for (const auto& f : s.frames)
        width = std::max(width, fs::path(f.frame).filename().string().size());
    width = std::min<std::size_t>(width, 48);
    std::printf("%-*s  %-8s %8s %9s %9s %9s\n", static_cast<int>(width), "frame", "status", "sources", "zp",
                "rms[\"]", "seconds");
    for (const auto& f : s.frames) {
        const std::string name = fs::path(f.frame).filename().string();
        std::string sources = "-";
        if (f.line.is_object() && f.line.contains("sources") && f.line["sources"].is_number())
            sources = std::to_string(f.line["sources"].get<long long>());
        std::printf("%-*s  %-8s %8s %9s %9s %9s\n", static_cast<int>(width), name.c_str(), f.status.c_str(),
                    sources.c_str(), numberOr(f.line, "zp", "%.4f").c_str(),
                    numberOr(f.line, "astrometric_rms_arcsec", "%.3f").c_str(),
                    numberOr(f.line, "seconds", "%.2f").c_str());
    }
    for (const auto& f : s.frames) {
        if (f.status == "failed") {
            std::string err = f.line.is_object() && f.line.contains("error") && f.line["error"].is_string()
                                  ? f.line["error"].get<std::string>()
                                  : std::string("(no message)");
            std::printf("failed:  %s: %s\n", f.frame.c_str(), err.c_str());
        } else if (f.status == "missing") {
            std::printf("missing: %s: no status line%s%s\n", f.frame.c_str(),
                        f.slurm.empty() ? "" : "; Slurm: ", f.slurm.c_str());
        }
    }
    std::printf("%zu frames: %zu ok (%zu skipped as complete), %zu failed, %zu missing", s.frames.size(),
                s.ok, s.skipped, s.failed, s.missing);
    if (!s.jobId.empty()) std::printf("; Slurm job %s", s.jobId.c_str());
    if (s.malformedLines) std::printf("; %zu malformed status lines ignored", s.malformedLines);
    std::printf("\n");
}

} // namespace gpuphot::cli
