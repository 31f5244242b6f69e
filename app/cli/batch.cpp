// Many frames: shared reduce options, input expansion, one warm pipeline, and the local batch runner.
#include "app/cli/batch.hpp"
#include "app/cli/db_cli.hpp"
#include "app/cli/test_hooks.hpp"
#include "core/util/timeline.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <filesystem>
#include <fnmatch.h>
#include <fstream>
#include <glob.h>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <poll.h>
#include <pthread.h>
#include <sstream>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "core/catalog/reference_catalog.hpp"
#include "core/catalog/tycho2_index.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/target_list.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/exposure.hpp"
#include "core/pipeline/frame_status.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/pointing.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/pipeline/sextractor_config.hpp"
#include "core/util/background_release.hpp"
#include "core/util/errors.hpp"
#include "core/util/memory.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot::cli {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> splitList(const std::vector<std::string>& items) {
    std::vector<std::string> out;
    for (const auto& item : items) {
        std::stringstream ss(item);
        std::string part;
        while (std::getline(ss, part, ','))
            if (!part.empty()) out.push_back(part);
    }
    return out;
}

// The Tycho-2 stars around a frame: centre and radius from its header WCS (half diagonal + 10%), or from
// its pointing keywords when the WCS is missing or ignored (radius: the astrometric search radius plus
// the half diagonal at the largest scale searched).
ReferenceCatalog tycho2ForFrame(const std::string& path, const ReduceOptions& ro,
                                const std::vector<std::string>& files) {
    const Header h = readHeader(path, ro.read.hdu);
    long long w = 0, hgt = 0;
    for (const HduSummary& s : listHdus(path))
        if (s.type == "IMAGE" && s.axes.size() == 2 &&
            (ro.read.hdu.empty() ? true
                                 : (ro.read.hdu == std::to_string(s.index) || ro.read.hdu == s.extname))) {
            w = s.axes[0];
            hgt = s.axes[1];
            break;
        }
    if (w <= 0 || hgt <= 0) return {};
    const double halfDiag = 0.5 * std::hypot(static_cast<double>(w), static_cast<double>(hgt));
    std::optional<Wcs> wcs;
    if (!ro.ignoreHeaderWcs) {
        try {
            wcs = Wcs::tryFromHeader(h);
        } catch (const InvalidInput&) {
        }
    }
    if (wcs) {
        const auto [ra, dec] = wcs->pixelToWorld(0.5 * (w - 1), 0.5 * (hgt - 1));
        const double scale = wcs->pixelScaleArcsec(0.5 * (w - 1), 0.5 * (hgt - 1));
        if (std::isfinite(ra) && std::isfinite(dec) && scale > 0)
            return loadTycho2Region(ra, dec, 1.1 * halfDiag * scale / 3600.0 + 0.05, files);
    }
    const auto p = framePointing(h);
    if (!p) return {};
    const double radius =
        ro.config.astrometry.searchRadiusDeg + halfDiag * ro.config.astrometry.scaleHigh / 3600.0;
    return loadTycho2Region(p->ra, p->dec, std::min(radius, 30.0), files);
}

// The Tycho-2 stars around every CCD of a mosaic exposure: a circle about the CCDs' mean centre that holds
// each CCD's half diagonal (from the header WCS); the first CCD's cut when the headers give no WCS.
ReferenceCatalog tycho2ForExposure(const std::string& path, const std::vector<ExposureExtension>& exts,
                                   const ReduceOptions& ro, const std::vector<std::string>& files) {
    struct Disc {
        double ra, dec, radius;
    };
    std::vector<Disc> discs;
    double vx = 0, vy = 0, vz = 0;
    constexpr double d2r = M_PI / 180.0;
    for (const ExposureExtension& e : exts) {
        if (ro.ignoreHeaderWcs) break;
        std::optional<Wcs> wcs;
        try {
            wcs = Wcs::tryFromHeader(readHeader(path, std::to_string(e.hdu)));
        } catch (const InvalidInput&) {
        }
        if (!wcs) continue;
        const double cx = 0.5 * (e.width - 1), cy = 0.5 * (e.height - 1);
        const auto [ra, dec] = wcs->pixelToWorld(cx, cy);
        const double scale = wcs->pixelScaleArcsec(cx, cy);
        if (!std::isfinite(ra) || !std::isfinite(dec) || !(scale > 0)) continue;
        discs.push_back({ra, dec, 0.5 * std::hypot(double(e.width), double(e.height)) * scale / 3600.0});
        vx += std::cos(dec * d2r) * std::cos(ra * d2r);
        vy += std::cos(dec * d2r) * std::sin(ra * d2r);
        vz += std::sin(dec * d2r);
    }
    if (discs.empty()) {
        ReduceOptions one = ro;
        one.read.hdu = std::to_string(exts.front().hdu);
        return tycho2ForFrame(path, one, files);
    }
    const double ra = std::fmod(std::atan2(vy, vx) / d2r + 360.0, 360.0);
    const double dec = std::atan2(vz, std::hypot(vx, vy)) / d2r;
    double radius = 0.0;
    for (const Disc& d : discs)
        radius = std::max(radius, angularSeparationDeg(ra, dec, d.ra, d.dec) + d.radius);
    return loadTycho2Region(ra, dec, std::min(1.1 * radius + 0.05, 30.0), files);
}

bool isFitsName(const std::string& name) {
    std::string n = name;
    for (const char* z : {".gz", ".fz"})
        if (n.size() > 3 && n.compare(n.size() - 3, 3, z) == 0) n.resize(n.size() - 3);
    for (const char* ext : {".fits", ".fit", ".fts", ".FITS", ".FIT", ".FTS"}) {
        const std::size_t l = std::strlen(ext);
        if (n.size() > l && n.compare(n.size() - l, l, ext) == 0) return true;
    }
    return name.size() > 3 && name.compare(name.size() - 3, 3, ".fz") == 0;
}

bool hasGlobChars(const std::string& s) {
    return s.find_first_of("*?[") != std::string::npos;
}

std::vector<std::string> readListFile(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw InvalidInput("list file " + path + ": cannot be read");
    const fs::path base = fs::path(path).parent_path();
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line)) {
        if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
        const auto b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
        if (b == std::string::npos) continue;
        line = line.substr(b, e - b + 1);
        out.push_back(fs::path(line).is_absolute() || base.empty() ? line : (base / line).string());
    }
    return out;
}

std::vector<std::string> directoryFrames(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.is_regular_file() && isFitsName(e.path().filename().string())) out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

int exitCodeFor(const std::exception& e) {
    if (dynamic_cast<const InvalidInput*>(&e)) return 2;
    if (dynamic_cast<const IoError*>(&e)) return 3;
    if (dynamic_cast<const OutOfMemory*>(&e) || dynamic_cast<const std::bad_alloc*>(&e))
        return kExitOutOfMemory;
    return 1;
}

std::string fmt(const char* f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string num(const nlohmann::json& j, const char* key, const char* f) {
    return j.contains(key) && j[key].is_number() ? fmt(f, j[key].get<double>()) : "-";
}

std::string clock(double s) {
    if (!std::isfinite(s) || s < 0) return "--:--";
    const long t = std::lround(s);
    char buf[32];
    if (t >= 3600)
        std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else
        std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

// Progress on stderr: a bar rewritten with \r on a TTY, else one line per frame on stdout.
class Progress {
public:
    Progress(std::size_t total, bool tty, int verbosity)
        : m_total(total), m_tty(tty), m_verbosity(verbosity), m_start(std::chrono::steady_clock::now()) {}

    void frameDone(const nlohmann::json& line) {
        ++m_done;
        const std::string status = line.value("status", "");
        if (m_tty) clearBar();
        if (status == "failed") {
            std::fprintf(stderr, "gpuphot: error: %s\n", describeStatus(line).c_str());
        } else if (m_verbosity > 0 && !m_tty) {
            std::printf("%s\n", describeStatus(line).c_str());
            std::fflush(stdout);
        }
        if (line.contains("warnings") && line["warnings"].is_array())
            for (const auto& w : line["warnings"])
                if (w.is_string())
                    std::fprintf(stderr, "gpuphot: warning: %s: %s\n", line.value("frame", "").c_str(),
                                 w.get<std::string>().c_str());
        if (m_tty) drawBar();
    }
    void start() {
        if (m_tty) drawBar();
    }
    void finish() {
        if (m_tty) clearBar();
    }
    double elapsed() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - m_start).count();
    }

private:
    void clearBar() { std::fprintf(stderr, "\r%79s\r", ""); }
    void drawBar() {
        const double t = elapsed();
        const double rate = t > 0 ? m_done / t : 0.0;
        const double eta = rate > 0 ? (m_total - m_done) / rate : NAN;
        constexpr int width = 30;
        const int filled = m_total ? static_cast<int>(width * m_done / m_total) : width;
        std::string bar(filled, '#');
        bar.resize(width, '.');
        std::fprintf(stderr, "\r[%s] %zu/%zu  %.2f frames/s  ETA %s ", bar.c_str(), m_done, m_total, rate,
                     clock(eta).c_str());
        std::fflush(stderr);
    }

    std::size_t m_total, m_done = 0;
    bool m_tty;
    int m_verbosity;
    std::chrono::steady_clock::time_point m_start;
};

// A child process of this binary in `reduce --batch-child` mode.
struct Child {
    pid_t pid = -1;
    int in = -1;  // its stdin (we write frame paths)
    int out = -1; // its stdout (we read status lines)
    std::string buffer;
    std::deque<std::size_t> held; // indices of the frames sent to it and not yet answered, in order
    bool isolated = false;        // it holds one frame that must run alone (see runChildren)
    bool ready = false;           // it has set up its pipeline (sent {"ready": true})
    std::string gpu;              // CUDA_VISIBLE_DEVICES for it ("" : inherit)
};

std::string selfExe() {
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0)
        throw IoError(std::string("/proc/self/exe: cannot resolve this program's path: ") +
                      std::strerror(errno));
    buf[n] = '\0';
    return buf;
}

void spawnChild(Child& c, const std::string& exe, const std::vector<std::string>& args) {
    int toChild[2], fromChild[2];
    if (::pipe2(toChild, O_CLOEXEC) != 0) throw IoError(std::string("batch: pipe: ") + std::strerror(errno));
    if (::pipe2(fromChild, O_CLOEXEC) != 0) {
        ::close(toChild[0]);
        ::close(toChild[1]);
        throw IoError(std::string("batch: pipe: ") + std::strerror(errno));
    }
    std::vector<std::string> argv = {exe, "reduce", "--batch-child"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv)
        cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw IoError(std::string("batch: fork: ") + std::strerror(errno));
    if (pid == 0) {
        // A child dies with the batch: SIGKILL when the thread that forked it ends (runChildren runs on
        // the parent's main thread), and at once when the parent died before this line. Otherwise an
        // orphan goes on reducing the frames it holds while a re-run reduces them again.
        if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) _exit(127);
        ::dup2(toChild[0], STDIN_FILENO);
        ::dup2(fromChild[1], STDOUT_FILENO);
        if (!c.gpu.empty()) ::setenv("CUDA_VISIBLE_DEVICES", c.gpu.c_str(), 1);
        ::execv(exe.c_str(), cargv.data());
        _exit(127);
    }
    ::close(toChild[0]);
    ::close(fromChild[1]);
    c.pid = pid;
    c.in = toChild[1];
    c.out = fromChild[0];
    c.buffer.clear();
    c.held.clear();
    c.isolated = false;
    c.ready = false;
}

std::string describeWaitStatus(int status) {
    if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        const char* name = ::strsignal(sig);
        return "killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
    }
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    return "ended";
}

void closeChild(Child& c) {
    if (c.in >= 0) ::close(c.in);
    if (c.out >= 0) ::close(c.out);
    c.in = c.out = -1;
}

bool writeAll(int fd, const std::string& text) {
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += static_cast<std::size_t>(n);
    }
    return true;
}

// The GPUs children are spread over: CUDA_VISIBLE_DEVICES entries, else 0..n-1 of the listed devices.
std::vector<std::string> visibleGpus() {
    const auto devices = listCudaDevices();
    std::vector<std::string> out;
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
        std::stringstream ss(v);
        std::string part;
        while (std::getline(ss, part, ','))
            if (!part.empty()) out.push_back(part);
        if (out.size() > devices.size()) out.resize(devices.size());
    } else {
        for (std::size_t i = 0; i < devices.size(); ++i)
            out.push_back(std::to_string(i));
    }
    return out;
}

// Runs the frames not skipped through N children; fills `results` (one line per frame index). Each child
// holds up to `window` frames (it reads ahead while it reduces, --prefetch). A child that dies holding one
// frame costs that frame; one that dies holding several hands them back to be run alone, one at a time
// (a frame that then kills its child fails), so a crash never costs an innocent frame.
void runChildren(const std::vector<std::string>& frames, const std::vector<std::size_t>& todo, int jobs,
                 std::size_t window, const std::vector<std::string>& gpus, std::vector<std::string> args,
                 std::vector<nlohmann::json>& results, Progress& progress, const std::string& jsonl,
                 StatusDatabase& db) {
    const std::string exe = selfExe();
    struct sigaction ignore {
    }, oldPipe{};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &oldPipe);
    std::vector<Child> children(static_cast<std::size_t>(std::min<std::size_t>(jobs, todo.size())));
    for (std::size_t i = 0; i < children.size(); ++i) {
        if (!gpus.empty()) children[i].gpu = gpus[i % gpus.size()];
        spawnChild(children[i], exe, args);
    }
    std::size_t next = 0, finished = 0;
    std::size_t restarts = 0;
    auto record = [&](std::size_t index, nlohmann::json line) {
        results[index] = std::move(line);
        if (!jsonl.empty()) appendJsonLine(jsonl, results[index]);
        db.add(results[index]);
        progress.frameDone(results[index]);
        ++finished;
    };
    std::deque<std::size_t> alone; // frames held by a child that died with several: each runs alone
    auto send = [&](Child& c, std::size_t index) {
        c.held.push_back(index);
        return writeAll(c.in, frames[index] + "\n"); // false: it died, seen as EOF on its stdout
    };
    auto dispatch = [&](Child& c) {
        if (c.pid <= 0 || c.isolated) return;
        if (!alone.empty()) {
            if (!c.held.empty()) return;
            c.isolated = true;
            const std::size_t index = alone.front();
            alone.pop_front();
            send(c, index);
            return;
        }
        while (c.held.size() < window && next < todo.size())
            if (!send(c, todo[next++])) return;
    };
    for (auto& c : children)
        dispatch(c);
    while (finished < todo.size()) {
        std::vector<pollfd> fds;
        std::vector<Child*> owners;
        for (auto& c : children)
            if (c.pid > 0) {
                fds.push_back({c.out, POLLIN, 0});
                owners.push_back(&c);
            }
        if (fds.empty()) throw IoError("batch: no worker process left");
        const int n = ::poll(fds.data(), fds.size(), 1000);
        if (n < 0 && errno != EINTR) throw IoError(std::string("batch: poll: ") + std::strerror(errno));
        for (std::size_t k = 0; k < fds.size(); ++k) {
            if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            Child& c = *owners[k];
            char buf[65536];
            const ssize_t got = ::read(c.out, buf, sizeof buf);
            if (got < 0 && errno == EINTR) continue;
            if (got > 0) {
                c.buffer.append(buf, static_cast<std::size_t>(got));
                std::size_t nl;
                while ((nl = c.buffer.find('\n')) != std::string::npos) {
                    const std::string text = c.buffer.substr(0, nl);
                    c.buffer.erase(0, nl + 1);
                    nlohmann::json line;
                    try {
                        line = nlohmann::json::parse(text);
                    } catch (const std::exception&) {
                        continue; // not a status line
                    }
                    if (!line.is_object()) continue;
                    if (line.contains("ready")) {
                        c.ready = true;
                        continue;
                    }
                    if (c.held.empty()) continue;
                    const std::size_t index = c.held.front();
                    c.held.pop_front();
                    c.isolated = false;
                    line["frame"] = frames[index];
                    record(index, std::move(line));
                }
                for (auto& d : children)
                    dispatch(d);
                continue;
            }
            // EOF: the child ended; the frame it held failed. Start another when work remains.
            closeChild(c);
            int status = 0;
            ::waitpid(c.pid, &status, 0);
            c.pid = -1;
            if (!c.ready) // it could not even set up (bad options, unreadable reference): its error is above
                throw IoError("batch: a worker process " + describeWaitStatus(status) +
                              " before it was ready (see its error above)");
            if (c.held.size() == 1) {
                const std::size_t index = c.held.front();
                record(index, frameStatusFailed(frames[index],
                                                "worker process " + describeWaitStatus(status) +
                                                    " while reducing this frame",
                                                1));
            } else {
                alone.insert(alone.end(), c.held.begin(), c.held.end());
            }
            c.held.clear();
            c.isolated = false;
            if (next < todo.size() || !alone.empty()) {
                if (++restarts > todo.size() + children.size())
                    throw IoError("batch: worker processes keep dying (" + describeWaitStatus(status) + ")");
                spawnChild(c, exe, args);
                for (auto& d : children)
                    dispatch(d);
            }
        }
    }
    for (auto& c : children) {
        if (c.pid <= 0) continue;
        closeChild(c); // end of input: the child returns
        int status = 0;
        ::waitpid(c.pid, &status, 0);
    }
    ::sigaction(SIGPIPE, &oldPipe, nullptr);
}

// The SExtractor catalog of --sex (its CATALOG_NAME, CATALOG_TYPE and parameters; --param wins over
// PARAMETERS_NAME) and the parameters of --formats ldac.
void applySextractorOutputs(const ReduceCliOptions& o, bool sexGiven, const SextractorMapping& m,
                            OutputOptions& out) {
    out.sextractor = m.catalog;
    out.sextractor.prefixStem = o.sexPerFrameNames;
    out.sextractorCatalog = sexGiven && m.writesCatalog;
    if (!o.param.empty() && out.sextractor.params.empty()) { // not read with the configuration
        out.sextractor.params = readSextractorParams(o.param);
        if (out.sextractor.params.empty()) throw InvalidInput("--param " + o.param + " names no parameter");
        out.sextractorCatalog = sexGiven && out.sextractor.type != "NONE";
    }
    if (!o.param.empty() || out.sextractorCatalog) out.ldacParams = out.sextractor.params;
}

} // namespace

void addReduceOptions(CLI::App& sub, ReduceCliOptions& o) {
    addCommonOptions(sub, o.common);
    addPrepareOptions(sub, o.prepare);
    sub.add_option("--hdu", o.hdu,
                   "HDU by 0-based number or EXTNAME; several for a mosaic exposure: all, a list 1,3,5 or a "
                   "range 1-60 (default: every image extension of a mosaic, else the first image with data)");
    sub.add_option("--ccds-at-once", o.ccdsAtOnce,
                   "Mosaic exposures: CCDs in their stages at once, each with its own CUDA stream and memory "
                   "pool (0: 16 with the CUDA backend, 1 on the CPU)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    sub.add_option("--ccd-gpus", o.ccdGpus,
                   "Mosaic exposures: the GPUs the CCDs are spread over, round robin (0: every visible GPU; "
                   "1: the first only)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    sub.add_option("--sex", o.sex,
                   "SExtractor configuration file (.sex): its detection, background and photometry keys, "
                   "SExtractor's defaults for the others; upper-case -KEY value pairs override it "
                   "(docs/SEXTRACTOR.md)");
    sub.add_option("--sex-set", o.sexSettings, "")->group(""); // -KEY value, rewritten by main as KEY=value
    sub.add_option(
        "--param", o.param,
        "SExtractor parameter file (.param): the columns of the SExtractor catalog of --sex and of "
        "STEM.ldac (overrides PARAMETERS_NAME)");
    sub.add_flag("--sex-per-frame-names", o.sexPerFrameNames, "")
        ->group(""); // set by reduce for several frames
    sub.add_option(
           "--formats", o.formats,
           "Extra catalog formats: ecsv,csv,reg,ldac (ldac: STEM.ldac, FITS_LDAC for SCAMP and PSFEx)")
        ->delimiter(',');
    sub.add_option("--maps", o.maps, "Maps to write: bkg,rms,seg,psf,resid")->delimiter(',');
    addParamFlags(sub, o.params);
    sub.add_flag("--no-tycho2", o.noTycho2,
                 "Without --ref, do not calibrate against Tycho-2 (astrometry-data-tycho2 index files)");
    sub.add_option("--ref", o.reference,
                   "Reference catalog (FITS table or CSV) for crossmatch and zero point");
    sub.add_option("--ref-columns", o.refColumns,
                   "Reference column map, e.g. "
                   "ra=RA,dec=DEC,mag=phot_g_mean_mag,color=phot_bp_mean_mag-phot_rp_mean_mag");
    sub.add_option(
        "--targets", o.targets,
        "Forced photometry at these RA/Dec (FITS table, ECSV or CSV; columns ra, dec in degrees or "
        "sexagesimal, optional name) -> STEM.targets.fits");
    sub.add_flag(
        "--write-solved", o.writeSolved,
        "Write STEM.solved.fits: the frame with the fitted WCS in its header (needs a verified fit)");
    sub.add_flag("--ignore-header-wcs", o.ignoreHeaderWcs,
                 "Solve as if the header had no WCS (blind, from the pointing keywords)");
    sub.add_option(
           "--prefetch", o.prefetch,
           "Frames read ahead while one is in its stages, its predecessor's outputs written meanwhile "
           "(0: one frame at a time)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    sub.add_option(
           "--concurrent", o.concurrent,
           "Frames in their stages at once in this process, each with its own RunContext (CUDA stream "
           "and memory pool; the GPU shared): overlaps the host parts of the stages")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
}

ReduceOptions toReduceOptions(const ReduceCliOptions& o) {
    PipelineConfig config = loadConfig(o.common);
    const bool sexGiven = !o.sex.empty() || !o.sexSettings.empty();
    SextractorMapping sexMap;
    if (sexGiven) {
        SextractorSettings sex = o.sex.empty() ? SextractorSettings{} : readSextractorSettings(o.sex);
        for (const std::string& kv : o.sexSettings) {
            const auto eq = kv.find('=');
            addSextractorOverride(sex, kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
        }
        if (!o.param.empty()) addSextractorOverride(sex, "PARAMETERS_NAME", o.param); // --param wins
        sexMap = applySextractorSettings(sex, config);
        const std::string w = sexMap.warning();
        if (!w.empty() && o.common.verbosity > 0) std::fprintf(stderr, "gpuphot: warning: %s\n", w.c_str());
    }
    applyParamFlags(o.params, config);
    if (!(config.astrometry.scaleLow > 0.0) || !(config.astrometry.scaleHigh >= config.astrometry.scaleLow) ||
        !std::isfinite(config.astrometry.scaleHigh))
        throw InvalidInput("reduce: --scale-low/--scale-high must satisfy 0 < low <= high (arcsec/px), got " +
                           std::to_string(config.astrometry.scaleLow) + " and " +
                           std::to_string(config.astrometry.scaleHigh));
    ReduceOptions ro;
    ro.read.hdu = o.hdu;
    ro.exposure.concurrent = o.ccdsAtOnce;
    ro.exposure.gpus = o.ccdGpus;
    ro.config = config;
    ro.output.outdir = o.common.outdir;
    ro.output.formats = splitList(o.formats);
    ro.output.maps = splitList(o.maps);
    ro.output.writeSolved = o.writeSolved;
    applySextractorOutputs(o, sexGiven, sexMap, ro.output);
    ro.ignoreHeaderWcs = o.ignoreHeaderWcs;
    validateOutputOptions(ro.output);
    PrepareCliOptions prepare = o.prepare;
    if (prepare.weight.empty()) prepare.weight = sexMap.weightImage; // --weight wins over WEIGHT_IMAGE
    applyPrepareOptions(prepare, ro);
    return ro;
}

struct FrameReducer::State {
    // RunContexts beside ctx for the CCDs of a mosaic exposure in flight at once (exposure.hpp), made on
    // first use and kept warm; an exposure takes what it needs and gives them back.
    std::vector<std::unique_ptr<RunContext>> takeContexts(std::size_t n, const FrameReducer& r) {
        std::lock_guard lock(poolMutex);
        fillPool(n, r);
        std::vector<std::unique_ptr<RunContext>> out(
            std::make_move_iterator(pool.end() - static_cast<std::ptrdiff_t>(n)),
            std::make_move_iterator(pool.end()));
        pool.resize(pool.size() - n);
        return out;
    }
    // At least n contexts in the pool: their device states come up (startDeviceWarmUp) while the exposure
    // is read and the frame before it computes, not inside the exposure.
    void reserveContexts(std::size_t n, const FrameReducer& r) {
        std::lock_guard lock(poolMutex);
        fillPool(n, r);
    }
    // The k-th context made is the exposure's context k + 1 (0: the reducer's own): its GPU is
    // ccdContextDevice's, so that the contexts of the CCDs in flight spread over the GPUs.
    void fillPool(std::size_t n, const FrameReducer& r) { // poolMutex held
        const bool cuda = ctx.backend == Backend::Cuda;
        const int visible = cuda ? static_cast<int>(listCudaDevices().size()) : 0;
        while (pool.size() < n)
            pool.push_back(std::make_unique<RunContext>(
                r.makeContext(cuda ? ccdContextDevice(++made, options.exposure.gpus, visible) : -1)));
    }
    void giveContexts(std::vector<std::unique_ptr<RunContext>>& used) {
        std::lock_guard lock(poolMutex);
        for (auto& c : used)
            pool.push_back(std::move(c));
        used.clear();
    }
    std::mutex poolMutex;
    std::vector<std::unique_ptr<RunContext>> pool;
    std::size_t made = 0; // contexts made for the pool
    ReduceOptions options;
    ReferenceCatalog reference;
    TargetList targets;
    std::vector<std::string> tycho2Files;
    RunContext ctx;
    CommonOptions common; // what ctx was made from (makeContext)
    int verbosity = 1;
};

FrameReducer::FrameReducer(const ReduceCliOptions& o) : m_state(std::make_unique<State>()) {
    State& s = *m_state;
    s.verbosity = o.common.verbosity;
    s.options = toReduceOptions(o);
    s.common = o.common;
    // The catalogs are read while the CUDA driver starts (the device list); the device state then comes
    // up while the first frame is read.
    if (parseBackend(o.common.backend) != Backend::Cpu) prefetchCudaDevices();
    applyThreadCount(o.common);
    readCatalogs(o);
    s.ctx = makeRunContext(o.common);
    s.options.read.cfitsioOnly = s.ctx.tuning.cfitsioRead;
    startDeviceWarmUp(s.ctx);
    timelineMark("device warm-up started");
}

void FrameReducer::readCatalogs(const ReduceCliOptions& o) {
    State& s = *m_state;
    if (!o.targets.empty()) {
        s.targets = readTargetList(o.targets);
        s.options.targets = &s.targets;
        if (s.verbosity > 1) std::printf("targets %s: %zu positions\n", o.targets.c_str(), s.targets.size());
    }
    if (o.writeSolved && o.reference.empty() && s.verbosity > 0)
        std::fprintf(stderr, "gpuphot: note: --write-solved needs --ref REFCAT to fit a WCS against\n");
    // Without --ref: Tycho-2 from Debian's astrometry-data-tycho2 index files, cut per frame.
    const char* noTycho2Env = std::getenv("GPUPHOT_NO_TYCHO2");
    if (o.reference.empty() && !o.noTycho2 && !(noTycho2Env && *noTycho2Env))
        s.tycho2Files = findTycho2IndexFiles();
    if (!o.reference.empty()) {
        s.reference = readReferenceCatalog(o.reference, parseRefColumnMap(o.refColumns));
        s.options.reference = &s.reference;
        if (s.verbosity > 1)
            std::printf("reference %s: %zu stars (%zu rows skipped: NaN position or magnitude)\n",
                        o.reference.c_str(), s.reference.size(), s.reference.skippedNonFinite);
    } else if (!s.tycho2Files.empty()) {
        if (s.verbosity > 0)
            std::fprintf(stderr,
                         "gpuphot: note: no --ref: calibrating against Tycho-2 (%zu index files of "
                         "astrometry-data-tycho2; --no-tycho2 to skip)\n",
                         s.tycho2Files.size());
    } else if (s.verbosity > 0) {
        std::fprintf(stderr, "gpuphot: note: no --ref catalog and no Tycho-2 index files (Debian package "
                             "astrometry-data-tycho2): no crossmatch or zero point (mag_cal is NaN)\n");
    }
    timelineMark("reference catalog read");
}

FrameReducer::~FrameReducer() = default;

const ReduceOptions& FrameReducer::options() const {
    return m_state->options;
}
RunContext& FrameReducer::context() {
    return m_state->ctx;
}

RunContext FrameReducer::makeContext(int device) const {
    RunContext ctx = makeRunContext(m_state->common);
    ctx.device = device;
    ctx.progress = m_state->ctx.progress;
    ctx.cancelFlag = m_state->ctx.cancelFlag;
    startDeviceWarmUp(ctx);
    return ctx;
}

struct FrameReducer::Work {
    FrameTask task;
    ReduceOptions options; // the task's (or the reducer's), with this frame's Tycho-2 cut as reference
    ReferenceCatalog tycho2;
    std::optional<LoadedFrame> loaded;
    std::unique_ptr<FrameInFlight> started; // the stages ran; the host-only finish may be left
    std::optional<ComputedFrame> computed;
    std::vector<ExposureExtension> exposure; // a mosaic exposure: its CCDs (reduced and written in compute)
    std::optional<ReduceSummary> exposureSummary;
    std::optional<nlohmann::json> line; // decided: skipped, failed, or written
};

namespace {
// A mosaic's CCDs in their stages at once (ExposureParams::concurrent; 0: 16 on the CUDA backend, 1 on
// the CPU), never more than its CCDs.
int ccdsInFlight(const ReduceOptions& o, const RunContext& ctx, std::size_t ccds) {
    int k = o.exposure.concurrent;
    if (k <= 0) k = ctx.backend == Backend::Cuda ? 16 : 1;
    return std::max(1, std::min<int>(k, static_cast<int>(ccds)));
}

// Runs one phase; any error but Cancelled becomes the frame's "failed" line. An allocation failure names
// the phase, or the stage it happened in, and frees the frame's data before the message is made.
template <class F> void runPhase(FrameReducer::Work& w, const char* phase, F&& body) {
    if (w.line) return;
    takeFailedStage();
    try {
        body();
    } catch (const Cancelled&) {
        throw;
    } catch (const std::bad_alloc& e) {
        w.loaded.reset();
        w.started.reset();
        w.computed.reset();
        std::string step = takeFailedStage();
        if (step.empty()) step = phase;
        w.line = frameStatusFailed(w.task.frame, outOfMemory(e, step + " of " + w.task.frame).what(),
                                   kExitOutOfMemory);
    } catch (const std::exception& e) {
        w.line = frameStatusFailed(w.task.frame, e.what(), exitCodeFor(e));
        w.loaded.reset();
        w.started.reset();
        w.computed.reset();
    }
}
} // namespace

std::unique_ptr<FrameReducer::Work> FrameReducer::load(FrameTask task) {
    State& s = *m_state;
    auto w = std::make_unique<Work>();
    w->task = std::move(task);
    w->line = std::move(w->task.line);
    runPhase(*w, "reading", [&] {
        const std::string& frame = w->task.frame;
        w->options = w->task.options ? *w->task.options : s.options;
        const std::string& hdu = w->options.read.hdu;
        if (!w->task.force && outputsComplete(frame, w->options.output, hdu)) {
            w->line = frameStatusSkipped(frame, reportPath(frame, w->options.output, hdu));
            return;
        }
        w->exposure = exposureExtensions(frame, hdu);
        if (!w->exposure.empty())
            s.reserveContexts(
                static_cast<std::size_t>(ccdsInFlight(w->options, s.ctx, w->exposure.size()) - 1), *this);
        if (!w->task.options && !s.tycho2Files.empty()) {
            w->tycho2 = w->exposure.empty()
                            ? tycho2ForFrame(frame, w->options, s.tycho2Files)
                            : tycho2ForExposure(frame, w->exposure, w->options, s.tycho2Files);
            w->options.reference = w->tycho2.size() ? &w->tycho2 : nullptr;
            if (!w->options.reference && s.verbosity > 0)
                std::fprintf(stderr,
                             "gpuphot: note: %s: no Tycho-2 stars for this frame (no WCS or pointing "
                             "keywords, or none in the field): no calibration\n",
                             frame.c_str());
        }
        if (w->exposure.empty()) w->loaded = readFramePhase(frame, w->options);
    });
    timelineMark("frame read");
    return w;
}

void FrameReducer::compute(Work& w) {
    compute(w, m_state->ctx);
}

void FrameReducer::compute(Work& w, RunContext& ctx) {
    runPhase(w, "reduction", [&] {
        if (!w.exposure.empty()) {
            const int k = ccdsInFlight(w.options, ctx, w.exposure.size());
            auto extra = m_state->takeContexts(static_cast<std::size_t>(k - 1), *this);
            std::vector<RunContext*> contexts{&ctx};
            for (auto& c : extra)
                contexts.push_back(c.get());
            try {
                w.exposureSummary = reduceExposure(w.task.frame, w.exposure, w.options, contexts);
            } catch (...) {
                m_state->giveContexts(extra);
                throw;
            }
            m_state->giveContexts(extra);
            return;
        }
        w.started = startFramePhase(std::move(*w.loaded), w.options, ctx);
        w.loaded.reset();
    });
    timelineMark("frame reduced");
}

void FrameReducer::finish(Work& w) {
    runPhase(w, "calibration", [&] {
        if (w.started) w.computed = finishFramePhase(std::move(w.started), w.options);
    });
}

nlohmann::json FrameReducer::write(Work& w) {
    runPhase(w, "writing the outputs", [&] {
        if (w.exposureSummary) {
            w.line = frameStatusOk(*w.exposureSummary);
            w.exposureSummary.reset();
            return;
        }
        const ReduceSummary summary = writeFramePhase(std::move(*w.computed), w.options);
        timelineMark("outputs written");
        releaseInBackground(std::move(*w.computed));
        w.computed.reset();
        w.line = frameStatusOk(summary);
    });
    timelineMark("frame released");
    return std::move(*w.line);
}

nlohmann::json FrameReducer::process(FrameTask task) {
    const auto w = load(std::move(task));
    compute(*w);
    finish(*w);
    {
        auto t = m_state->ctx.time("write");
        return write(*w);
    }
}

nlohmann::json FrameReducer::process(const std::string& frame, bool force) {
    FrameTask task;
    task.frame = frame;
    task.force = force;
    return process(std::move(task));
}

namespace {
// `-v`: where each frame of a pipelined run is (its ticket and phase), for the timeline.
void markFrame(std::size_t ticket, const char* what) {
    if (!timelineEnabled()) return;
    timelineMark(("frame " + std::to_string(ticket) + " " + what).c_str());
}

// Names the calling thread (15 characters at most) as `top -H` and /proc/PID/task show it. The OpenMP workers
// it starts inherit the name, so a run's CPU time can be told apart by role.
void nameThread(const char* name) {
    ::pthread_setname_np(::pthread_self(), name);
}
} // namespace

struct FramePipeline::Impl {
    struct Item {
        std::size_t ticket = 0;
        FrameTask task;
        std::unique_ptr<FrameReducer::Work> work;
    };
    FrameReducer& reducer;
    int prefetch;
    int concurrent;    // compute threads (K)
    bool threaded;     // false: every frame runs inside submit()
    std::size_t bound; // frames that may wait ahead of the stages: prefetch + K - 1
    Done done;
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> toRead, toCompute, toFinish;
    std::map<std::size_t, Item> toWrite; // finished frames by ticket: the writer takes them in order
    std::size_t ahead = 0; // submitted, not yet taken by the stages
    std::size_t afterStages = 0; // out of the stages, not yet taken by the writer (toFinish .. toWrite)
    std::size_t submitted = 0, delivered = 0;
    std::size_t nextHandOff = 0;   // ticket of the next frame for the writer (frames go to it in order)
    std::size_t computersLeft = 0; // compute threads that have not seen the end of input
    std::size_t finishersLeft = 0; // finishing threads that have not seen the end of the stages
    bool closing = false, readerDone = false, computeDone = false, finishDone = false, stopped = false,
         finished = false;
    bool dropWaiting = false; // finishStarted(): frames not yet in their stages are dropped
    std::exception_ptr error;
    std::vector<RunContext> contexts;  // of compute threads 1..K-1 (thread 0 uses the reducer's)
    std::optional<int> reducerThreads; // the reducer's context's thread count before its share
    std::thread reader, writer;
    std::vector<std::thread> computers, finishers;

    Impl(FrameReducer& r, int p, Done d, int k)
        : reducer(r), prefetch(p), concurrent(k), threaded(p > 0 || k > 1),
          bound(static_cast<std::size_t>(std::max(1, p + k - 1))), done(std::move(d)) {}

    void fail(std::exception_ptr e) {
        std::lock_guard lock(mu);
        if (!error) error = e;
        stopped = true;
        cv.notify_all();
    }
    void readLoop() {
        nameThread("gpuphot-read");
        for (;;) {
            Item item;
            {
                std::unique_lock lock(mu);
                cv.wait(lock, [&] { return stopped || closing || !toRead.empty(); });
                if (stopped) return;
                if (toRead.empty()) {
                    readerDone = true;
                    cv.notify_all();
                    return;
                }
                item = std::move(toRead.front());
                toRead.pop_front();
            }
            try {
                markFrame(item.ticket, "read starts");
                item.work = reducer.load(std::move(item.task));
                markFrame(item.ticket, "read");
            } catch (...) {
                fail(std::current_exception());
                return;
            }
            std::lock_guard lock(mu);
            if (dropWaiting) {
                --ahead;
                cv.notify_all();
                continue;
            }
            toCompute.push_back(std::move(item));
            cv.notify_all();
        }
    }
    // One of the K compute threads. Frames are taken in ticket order, so the writer's next frame is always
    // past the stages or held by a compute thread, which may always hand it on: the order cannot deadlock.
    void computeLoop(RunContext& ctx) {
        nameThread("gpuphot-stages");
        const OmpThreadLimit limit(ctx.threadCount()); // regions that name no count: this context's share
        try {
            startThreadTeam(ctx.threadCount()); // this thread's OpenMP team, while memory allows
        } catch (...) {
            fail(std::current_exception());
            return;
        }
        for (;;) {
            Item item;
            {
                std::unique_lock lock(mu);
                cv.wait(lock, [&] { return stopped || readerDone || !toCompute.empty(); });
                if (stopped) return;
                if (toCompute.empty()) {
                    if (--computersLeft == 0) computeDone = true;
                    cv.notify_all();
                    return;
                }
                item = std::move(toCompute.front());
                toCompute.pop_front();
                --ahead;
                cv.notify_all();
            }
            try {
                markFrame(item.ticket, "stages start");
                reducer.compute(*item.work, ctx);
                markFrame(item.ticket, "stages done");
            } catch (...) {
                fail(std::current_exception());
                return;
            }
            std::unique_lock lock(mu);
            // At most K + 1 frames between the stages and the writer: a slow finish or disk holds the stages,
            // not memory. The writer's next frame always passes (the frames ahead of the writer wait for it).
            cv.wait(lock, [&] {
                return stopped || afterStages <= static_cast<std::size_t>(concurrent) ||
                       item.ticket == nextHandOff;
            });
            if (stopped) return;
            ++afterStages;
            toFinish.push_back(std::move(item));
            cv.notify_all();
        }
    }
    // One of the K finishing threads: the host-only rest of a frame's reduction (FrameReducer::finish), the
    // writer's next frame first. A finished frame waits in toWrite, so no finishing thread waits for order.
    void finishLoop(int threads) {
        nameThread("gpuphot-finish");
        const OmpThreadLimit limit(threads);
        for (;;) {
            Item item;
            {
                std::unique_lock lock(mu);
                cv.wait(lock, [&] { return stopped || computeDone || !toFinish.empty(); });
                if (stopped) return;
                if (toFinish.empty()) {
                    if (--finishersLeft == 0) finishDone = true;
                    cv.notify_all();
                    return;
                }
                const auto first =
                    std::min_element(toFinish.begin(), toFinish.end(),
                                     [](const Item& a, const Item& b) { return a.ticket < b.ticket; });
                item = std::move(*first);
                toFinish.erase(first);
            }
            try {
                markFrame(item.ticket, "finish starts");
                reducer.finish(*item.work);
                markFrame(item.ticket, "finished");
            } catch (...) {
                fail(std::current_exception());
                return;
            }
            std::lock_guard lock(mu);
            const std::size_t ticket = item.ticket;
            toWrite.emplace(ticket, std::move(item));
            cv.notify_all();
        }
    }
    // Frames are written in ticket order: the tickets past the stages are a gapless run (finishStarted drops
    // only frames not yet in their stages, whose tickets are higher).
    void writeLoop() {
        nameThread("gpuphot-write");
        for (;;) {
            Item item;
            {
                std::unique_lock lock(mu);
                cv.wait(lock, [&] { return stopped || finishDone || toWrite.contains(nextHandOff); });
                if (stopped) return;
                const auto next = toWrite.find(nextHandOff);
                if (next == toWrite.end()) return;
                item = std::move(next->second);
                toWrite.erase(next);
                ++nextHandOff;
                --afterStages;
                cv.notify_all();
            }
            try {
                markFrame(item.ticket, "write starts");
                nlohmann::json line = reducer.write(*item.work);
                markFrame(item.ticket, "written");
                item.work.reset();
                done(item.ticket, std::move(line));
            } catch (...) {
                fail(std::current_exception());
                return;
            }
            std::lock_guard lock(mu);
            ++delivered;
            cv.notify_all();
        }
    }
    void join() {
        if (reader.joinable()) reader.join();
        for (std::thread& t : computers)
            if (t.joinable()) t.join();
        for (std::thread& t : finishers)
            if (t.joinable()) t.join();
        if (writer.joinable()) writer.join();
    }
};

FramePipeline::FramePipeline(FrameReducer& reducer, int prefetch, Done done, int concurrent)
    : m(std::make_unique<Impl>(reducer, std::max(0, prefetch), std::move(done), std::max(1, concurrent))) {
    if (m->threaded) {
        // Each extra compute thread gets a context of its own (CUDA: own stream and pool, warming up now).
        m->contexts.reserve(static_cast<std::size_t>(m->concurrent - 1));
        for (int k = 1; k < m->concurrent; ++k)
            m->contexts.push_back(reducer.makeContext());
        // The cores are shared among the K compute threads, as among a mosaic's CCDs in flight: a context
        // left at "all cores" gets its share (the reducer's own count comes back in the destructor).
        m->reducerThreads = reducer.context().threads;
        reducer.context().threads = threadShare(reducer.context(), m->concurrent);
        for (RunContext& c : m->contexts)
            c.threads = threadShare(c, m->concurrent);
        m->computersLeft = static_cast<std::size_t>(m->concurrent);
        m->finishersLeft = static_cast<std::size_t>(m->concurrent);
        m->reader = std::thread([this] { m->readLoop(); });
        m->computers.emplace_back([this] { m->computeLoop(m->reducer.context()); });
        for (RunContext& ctx : m->contexts)
            m->computers.emplace_back([this, &ctx] { m->computeLoop(ctx); });
        for (int k = 0; k < m->concurrent; ++k)
            m->finishers.emplace_back([this, n = m->reducer.context().threadCount()] { m->finishLoop(n); });
        m->writer = std::thread([this] { m->writeLoop(); });
    }
}

FramePipeline::~FramePipeline() {
    {
        std::lock_guard lock(m->mu);
        m->stopped = true;
        m->cv.notify_all();
    }
    m->join();
    if (m->reducerThreads) m->reducer.context().threads = *m->reducerThreads;
}

std::size_t FramePipeline::submit(FrameTask task) {
    if (!m->threaded) {
        const std::size_t ticket = m->submitted++;
        m->done(ticket, m->reducer.process(std::move(task)));
        ++m->delivered;
        return ticket;
    }
    std::unique_lock lock(m->mu);
    m->cv.wait(lock, [&] { return m->stopped || m->ahead < m->bound; });
    if (m->error) std::rethrow_exception(m->error);
    if (m->stopped || m->closing) throw std::logic_error("FramePipeline::submit after finish");
    const std::size_t ticket = m->submitted++;
    ++m->ahead;
    m->toRead.push_back({ticket, std::move(task), nullptr});
    m->cv.notify_all();
    return ticket;
}

bool FramePipeline::full() const {
    if (!m->threaded) return false;
    std::lock_guard lock(m->mu);
    return m->ahead >= m->bound;
}

bool FramePipeline::failed() const {
    std::lock_guard lock(m->mu);
    return m->error != nullptr;
}

std::size_t FramePipeline::inFlight() const {
    std::lock_guard lock(m->mu);
    return m->submitted - m->delivered;
}

void FramePipeline::finish() {
    if (m->threaded) {
        {
            std::lock_guard lock(m->mu);
            m->closing = true;
            m->cv.notify_all();
        }
        m->join();
    }
    if (m->error) std::rethrow_exception(m->error);
}

void FramePipeline::finishStarted() {
    if (m->threaded) {
        std::lock_guard lock(m->mu);
        // Frames in toRead and toCompute have higher tickets than any frame in its stages (the stages take
        // frames in ticket order), so the frames handed on to the writer stay a gapless run.
        m->dropWaiting = true;
        m->ahead -= m->toRead.size() + m->toCompute.size();
        m->toRead.clear();
        m->toCompute.clear();
    }
    finish();
}

std::vector<std::string> expandFrameInputs(const std::vector<std::string>& args,
                                           const std::string& listFile) {
    std::vector<std::string> raw;
    std::vector<std::string> out;
    std::set<std::string> seen;
    auto add = [&](const std::string& p) {
        if (seen.insert(p).second) out.push_back(p);
    };
    std::function<void(const std::string&)> expand = [&](const std::string& a) {
        std::error_code ec;
        if (a.size() > 1 && a[0] == '@') {
            for (const auto& p : readListFile(a.substr(1)))
                expand(p);
        } else if (fs::is_directory(a, ec)) {
            for (const auto& p : directoryFrames(a))
                add(p);
        } else if (!fs::exists(a, ec) && hasGlobChars(a) && a.back() != ']') {
            glob_t g{};
            const int rc = ::glob(a.c_str(), 0, nullptr, &g);
            std::vector<std::string> matches;
            if (rc == 0)
                for (std::size_t i = 0; i < g.gl_pathc; ++i)
                    matches.push_back(g.gl_pathv[i]);
            ::globfree(&g);
            if (matches.empty()) throw InvalidInput("reduce: '" + a + "' matches no file");
            for (const auto& m : matches)
                add(m); // glob(3) sorts
        } else {
            add(a); // a file, or file.fits[EXT]; reduceFrame reports a missing one
        }
    };
    for (const auto& a : args)
        expand(a);
    if (!listFile.empty())
        for (const auto& p : readListFile(listFile))
            expand(p);
    return out;
}

std::vector<std::string> reproduceArgs(const CLI::App& sub, const std::set<std::string>& exclude) {
    std::vector<std::string> out;
    for (const CLI::Option* opt : sub.get_options()) {
        if (!opt->nonpositional() || opt->count() == 0) continue;
        bool skip = false;
        for (const auto& n : opt->get_lnames())
            skip |= exclude.count("--" + n) > 0;
        for (const auto& n : opt->get_snames())
            skip |= exclude.count("-" + n) > 0;
        if (skip || opt->get_name() == "--help" || opt->get_name() == "-h") continue;
        const std::string name =
            opt->get_lnames().empty() ? "-" + opt->get_snames().front() : "--" + opt->get_lnames().front();
        if (opt->get_type_size_max() == 0) {
            for (std::size_t i = 0; i < opt->count(); ++i)
                out.push_back(name);
        } else {
            for (const auto& r : opt->results())
                out.push_back(name + "=" + r);
        }
    }
    return out;
}

std::string describeStatus(const nlohmann::json& j) {
    const std::string frame = j.value("frame", "");
    const std::string status = j.value("status", "");
    if (status == "failed") {
        const std::string error = j.value("error", std::string("failed"));
        return error.find(frame) != std::string::npos ? error : frame + ": " + error;
    }
    if (status == "skipped")
        return frame + ": skipped (outputs complete: " + j.value("report", std::string()) + ")";
    std::string s = frame + ": " + std::to_string(j.value("sources", 0)) + " sources, FWHM " +
                    num(j, "fwhm", "%.2f") + " px";
    if (j.contains("zp") && j["zp"].is_number())
        s += ", zp " + num(j, "zp", "%.4f") + " +- " + num(j, "zp_err", "%.4f") + " (" +
             std::to_string(j.value("matched", 0)) + " matched)";
    if (j.contains("astrometric_rms_arcsec") && j["astrometric_rms_arcsec"].is_number())
        s += ", astrometric rms " + num(j, "astrometric_rms_arcsec", "%.3f") + "\"";
    s += ", " + num(j, "seconds", "%.2f") + " s";
    if (j.contains("outputs") && j["outputs"].is_object() && j["outputs"].contains("catalog"))
        s += " -> " + j["outputs"]["catalog"].get<std::string>();
    return s;
}

void printSummaryTable(std::FILE* out, const std::vector<nlohmann::json>& lines, double wallSeconds) {
    std::size_t width = 5;
    for (const auto& j : lines)
        width = std::max(width, fs::path(j.value("frame", "")).filename().string().size());
    width = std::min<std::size_t>(width, 48);
    std::fprintf(out, "%-*s  %-7s %8s %7s %9s %8s %8s\n", static_cast<int>(width), "frame", "status",
                 "sources", "FWHM", "zp", "rms\"", "seconds");
    std::size_t ok = 0, skipped = 0, failed = 0, uncal = 0, sources = 0;
    double busy = 0.0;
    for (const auto& j : lines) {
        const std::string status = j.value("status", "");
        ok += status == "ok";
        skipped += status == "skipped";
        failed += status == "failed";
        uncal += status == "ok" && j.value("calibration_failed", false);
        if (status == "ok") sources += j.value("sources", std::size_t{0});
        if (j.contains("seconds") && j["seconds"].is_number()) busy += j["seconds"].get<double>();
        std::string name = fs::path(j.value("frame", "")).filename().string();
        if (name.size() > width) name = "..." + name.substr(name.size() - width + 3);
        const bool measured = status == "ok";
        std::fprintf(out, "%-*s  %-7s %8s %7s %9s %8s %8s\n", static_cast<int>(width), name.c_str(),
                     status.c_str(), measured ? std::to_string(j.value("sources", 0)).c_str() : "-",
                     measured ? num(j, "fwhm", "%.2f").c_str() : "-",
                     measured ? num(j, "zp", "%.4f").c_str() : "-",
                     measured ? num(j, "astrometric_rms_arcsec", "%.3f").c_str() : "-",
                     measured ? num(j, "seconds", "%.2f").c_str() : "-");
    }
    std::fprintf(out, "%zu frames: %zu ok, %zu skipped, %zu failed", lines.size(), ok, skipped, failed);
    if (uncal) std::fprintf(out, " (%zu not calibrated)", uncal);
    std::fprintf(out, "; %zu sources; %.2f s reducing, %.2f s wall", sources, busy, wallSeconds);
    if (wallSeconds > 0 && ok) std::fprintf(out, ", %.2f frames/s", ok / wallSeconds);
    std::fprintf(out, "\n");
}

int batchExitStatus(const std::vector<nlohmann::json>& lines) {
    bool uncal = false;
    for (const auto& j : lines) {
        if (j.value("status", "") == "failed") return 1;
        uncal |= j.value("status", "") == "ok" && j.value("calibration_failed", false);
    }
    return uncal ? 4 : 0;
}

int runBatch(const std::vector<std::string>& frames, const ReduceCliOptions& o, const BatchOptions& b) {
    if (frames.empty()) throw InvalidInput("reduce: no frame given (gpuphot reduce FRAME.fits ...)");
    if (o.common.verbosity > 1) enableTimeline();
    timelineMark("reduce starts");
    const ReduceOptions ro = toReduceOptions(o); // validates the options before anything runs
    const std::string jsonl = !b.jsonl.empty()    ? b.jsonl
                              : frames.size() > 1 ? (fs::path(o.common.outdir) / "gpuphot.jsonl").string()
                                                  : std::string();
    const bool tty = stderrIsTty() && o.common.verbosity > 0;
    // Complete frames are skipped in batch use (several frames, or --jsonl as a Slurm array element runs
    // it); a plain `gpuphot reduce FRAME` always reduces (the skip rule does not see changed parameters).
    const bool force = b.force || (frames.size() == 1 && b.jsonl.empty());

    // Workers: -j N, else one per visible GPU with the CUDA backend, else one (in this process). A single
    // frame is reduced here: its reducer resolves the backend while it reads the catalogs.
    Backend backend = Backend::Cpu;
    std::vector<std::string> gpus;
    int jobs = 1;
    bool inProcess = frames.size() == 1;
    if (!inProcess) {
        backend = resolveBackend(parseBackend(o.common.backend));
        if (backend == Backend::Cuda) gpus = visibleGpus();
        jobs = b.jobs > 0 ? b.jobs : std::max<int>(1, static_cast<int>(gpus.size()));
        inProcess = b.jobs <= 0 && jobs == 1;
        if (!inProcess && gpus.size() > 1 && b.jobs > 0 && static_cast<std::size_t>(jobs) < gpus.size())
            gpus.resize(jobs);
    }

    std::vector<nlohmann::json> results(frames.size());
    StatusDatabase db(b.db, o.common.verbosity); // --db: frames stored beside the reduction of the next
    Progress progress(frames.size(), tty && frames.size() > 1, o.common.verbosity);
    progress.start();
    if (inProcess) {
        FrameReducer reducer(o);
        std::mutex progressMutex;
        if (tty && frames.size() == 1)
            reducer.context().progress = [&](const std::string& stage, double fraction) {
                std::lock_guard lock(progressMutex);
                std::fprintf(stderr, "\r  %-12s %3d%%", stage.c_str(),
                             static_cast<int>(fraction * 100 + 0.5));
                std::fflush(stderr);
            };
        // Status lines arrive in input order (on the pipeline's writer thread with --prefetch > 0 or
        // --concurrent > 1).
        FramePipeline pipeline(
            reducer, frames.size() == 1 ? 0 : o.prefetch,
            [&](std::size_t i, nlohmann::json line) {
                results[i] = std::move(line);
                if (tty && frames.size() == 1) std::fprintf(stderr, "\r%40s\r", "");
                if (!jsonl.empty()) appendJsonLine(jsonl, results[i]);
                db.add(results[i]);
                progress.frameDone(results[i]);
            },
            frames.size() == 1 ? 1 : o.concurrent);
        for (const auto& f : frames) {
            FrameTask task;
            task.frame = f;
            task.force = force;
            pipeline.submit(std::move(task));
        }
        pipeline.finish();
        if (frames.size() == 1 && o.common.verbosity > 1 && results[0].value("status", "") == "ok")
            for (const auto& st : reducer.context().records)
                std::printf("  %-24s %8.3f s\n", st.stage.c_str(), st.seconds);
        timelineMark("frames done");
    } else {
        // Skipped frames are decided here; the rest go to the children.
        std::vector<std::size_t> todo;
        for (std::size_t i = 0; i < frames.size(); ++i) {
            if (!force && outputsComplete(frames[i], ro.output, ro.read.hdu)) {
                results[i] = frameStatusSkipped(frames[i], reportPath(frames[i], ro.output, ro.read.hdu));
                if (!jsonl.empty()) appendJsonLine(jsonl, results[i]);
                db.add(results[i]);
                progress.frameDone(results[i]);
            } else {
                todo.push_back(i);
            }
        }
        std::vector<std::string> args = b.childArgs;
        if (!b.threadsGiven && backend == Backend::Cpu) {
            const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
            args.push_back("--threads=" + std::to_string(std::max(1, cores / jobs)));
        }
        args.push_back("-q");
        // Frames a child holds: those it reads ahead and has in its stages, one for its writer.
        const bool pipelined = o.prefetch > 0 || o.concurrent > 1;
        const std::size_t window = pipelined ? static_cast<std::size_t>(o.prefetch + o.concurrent) + 1 : 1;
        if (!todo.empty()) runChildren(frames, todo, jobs, window, gpus, args, results, progress, jsonl, db);
    }
    progress.finish();
    timelineMark("reducer released");
    if (frames.size() > 1 && o.common.verbosity > 0) printSummaryTable(stdout, results, progress.elapsed());
    if (frames.size() == 1 && results[0].value("status", "") == "failed")
        return db.finish(results[0].value("exit_code", 1));
    return db.finish(batchExitStatus(results));
}

int runBatchChild(const ReduceCliOptions& o) {
    // Status lines go to the parent on the original stdout; anything else printed goes to stderr.
    const int protocol = ::dup(STDOUT_FILENO);
    if (protocol < 0) throw IoError(std::string("batch child: dup: ") + std::strerror(errno));
    std::fflush(stdout);
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
    FrameReducer reducer(o);
    if (!writeAll(protocol, "{\"ready\": true}\n")) return 1;
    // Test hook: abort (as a crash would) on a frame whose file name contains this text.
    const std::string& crashOn = cliTestHooks().batchChildAbortOn; // gpuphot-testhooks only
    // Frames are read ahead (--prefetch) as the parent sends them; lines go back in the order received.
    std::atomic<bool> parentGone{false};
    {
        FramePipeline pipeline(
            reducer, o.prefetch,
            [&](std::size_t, nlohmann::json line) {
                std::fflush(stdout);
                if (!parentGone.load() &&
                    !writeAll(protocol,
                              line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"))
                    parentGone.store(true);
            },
            o.concurrent);
        std::string frame;
        while (!parentGone.load() && std::getline(std::cin, frame)) {
            if (frame.empty()) continue;
            if (!crashOn.empty() && fs::path(frame).filename().string().find(crashOn) != std::string::npos)
                std::abort();
            FrameTask task;
            task.frame = frame;
            task.force = true;
            pipeline.submit(std::move(task));
        }
        pipeline.finish();
    }
    ::close(protocol);
    return 0;
}

} // namespace gpuphot::cli
