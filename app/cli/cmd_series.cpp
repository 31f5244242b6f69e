// gpuphot series: light curves of targets from a night of reduced catalogs (core/series/series.hpp).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "app/cli/batch.hpp"
#include "app/cli/commands.hpp"
#include "app/cli/db_cli.hpp"
#include "app/cli/settle.hpp"
#include "core/db/db_writer.hpp"
#include "core/db/results_store.hpp"
#include "core/io/target_list.hpp"
#include "core/pipeline/frame_status.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/series/series.hpp"
#include "core/series/series_output.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {

namespace fs = std::filesystem;

struct SeriesOptions {
    CommonOptions common;
    std::vector<std::string> inputs;
    std::string targets;
    std::string site;
    std::string formats = "ecsv,csv,fits,aij,aavso";
    std::string obscode = "NONE";
    bool fresh = false;
    std::vector<double> radii; // --aper: for frames reduced first
    bool noTycho2 = false;
    std::string db; // --db: the frames reduced first and the light curves into the results store
    bool noForcedSources = false; // --no-forced-sources: frames reduced first measure the targets only
    double transitMinHours = 0.0, transitMaxHours = 0.0; // --transit-min/max-duration (0: the default)
    bool follow = false;  // --follow: keep appending the catalogs that appear in the input directories
    double settle = 1.0;  // --settle: seconds a new catalog's size and time must stay unchanged
    double timeout = 0.0; // --timeout: stop following after this many seconds (0: until a signal)
    SeriesParams params;
};

bool isCatalogName(const std::string& name) {
    return name.size() > 9 && name.compare(name.size() - 9, 9, ".cat.fits") == 0;
}

// The inputs split into catalogs (.cat.fits) and frames to reduce first (any other file; the frames of a
// directory without catalogs). Paths absolute: series.state must find them from any directory.
struct Inputs {
    std::vector<std::string> catalogs, frames;
};

Inputs expandInputs(const std::vector<std::string>& inputs) {
    Inputs out;
    const auto absolute = [](const fs::path& p) { return fs::absolute(p).lexically_normal().string(); };
    for (const auto& in : inputs) {
        std::error_code ec;
        if (!fs::is_directory(in, ec)) {
            (isCatalogName(fs::path(in).filename().string()) ? out.catalogs : out.frames)
                .push_back(absolute(in));
            continue;
        }
        std::vector<std::string> found;
        for (const auto& e : fs::directory_iterator(in, ec))
            if (isCatalogName(e.path().filename().string())) found.push_back(absolute(e.path()));
        std::sort(found.begin(), found.end());
        if (!found.empty())
            out.catalogs.insert(out.catalogs.end(), found.begin(), found.end());
        else
            for (const auto& f : expandFrameInputs({in}))
                out.frames.push_back(absolute(f));
    }
    return out;
}

// Frames given instead of catalogs: reduced first (one warm pipeline, the batch runner's progress and
// skip rule) into DIR/catalogs, with the series' reference catalog, targets (forced photometry) and
// apertures. Returns the catalogs of the frames that were reduced.
// `targets` (default: the series' --targets) is the forced photometry's list; `force` reduces frames whose
// catalogs are complete again.
std::vector<std::string> reduceFrames(const std::vector<std::string>& frames, const SeriesOptions& o,
                                      const std::string& targets, bool force) {
    ReduceCliOptions r;
    r.common = o.common;
    r.common.outdir = (fs::path(o.common.outdir) / "catalogs").string();
    r.reference = o.params.reference;
    r.refColumns = o.params.referenceColumns;
    r.targets = targets.empty() ? o.targets : targets;
    if (!o.radii.empty()) {
        std::string radii;
        for (double v : o.radii)
            radii += (radii.empty() ? "" : ",") + std::to_string(v);
        r.params.byKey["aperture.radii"] = radii; // as reduce's --aper
    }
    r.noTycho2 = o.noTycho2;
    BatchOptions b; // in this process, or one child per GPU with these reduce options
    b.db = o.db;
    b.force = force;
    b.jsonl = (fs::path(r.common.outdir) / "gpuphot.jsonl").string();
    b.threadsGiven = o.common.threads > 0;
    b.childArgs = {"-o", r.common.outdir, "--backend", r.common.backend};
    const auto arg = [&](const char* name, const std::string& v) {
        if (!v.empty()) b.childArgs.insert(b.childArgs.end(), {name, v});
    };
    arg("--ref", r.reference);
    arg("--ref-columns", r.refColumns);
    arg("--targets", r.targets);
    arg("--config", r.common.config);
    arg("--gpu-mem-limit", r.common.gpuMemLimit);
    if (o.common.threads > 0) arg("--threads", std::to_string(o.common.threads));
    if (r.noTycho2) b.childArgs.push_back("--no-tycho2");
    for (const std::string& a : paramFlagArguments(r.params))
        b.childArgs.push_back(a);
    std::error_code ec;
    fs::create_directories(r.common.outdir, ec);
    if (ec) throw IoError(r.common.outdir + ": cannot create the directory: " + ec.message());
    const int rc = runBatch(frames, r, b);
    std::vector<std::string> catalogs;
    for (const auto& f : frames) {
        const fs::path c = fs::path(r.common.outdir) / (frameStem(f) + ".cat.fits");
        if (fs::exists(c, ec))
            catalogs.push_back(fs::absolute(c).lexically_normal().string());
        else
            std::fprintf(stderr, "gpuphot: warning: %s was not reduced: it is not in the series\n",
                         f.c_str());
    }
    if (rc != 0 && o.common.verbosity >= 1)
        std::fprintf(stderr, "gpuphot: warning: reducing the frames exited with status %d\n", rc);
    return catalogs;
}

ObservingSite parseSite(const std::string& s) {
    ObservingSite site;
    char extra = 0;
    if (std::sscanf(s.c_str(), "%lf,%lf,%lf%c", &site.latitude, &site.longitude, &site.elevation, &extra) !=
            3 ||
        std::fabs(site.latitude) > 90.0 || std::fabs(site.longitude) > 360.0)
        throw InvalidInput("--site '" + s + "': expected LAT,LON,ELEV (degrees, east positive; metres)");
    site.source = "--site";
    return site;
}

std::set<std::string> parseFormats(const std::string& s) {
    static const std::set<std::string> known{"ecsv", "csv", "fits", "aij", "aavso"};
    std::set<std::string> out;
    std::stringstream in(s);
    for (std::string f; std::getline(in, f, ',');) {
        if (!known.count(f))
            throw InvalidInput("--formats: unknown format '" + f + "' (ecsv, csv, fits, aij, aavso)");
        out.insert(f);
    }
    return out;
}

// Appends to the series recorded in DIR when it can (same parameters and targets), else builds it
// from every catalog recorded there and those given.
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// Seconds spent per phase, printed with -v.
struct Phases {
    double state = 0, series = 0, files = 0;
};

// The state is the last file written (with --follow, in the background after the others): a process
// stopped in between leaves series.json newer than the state and listing catalogs the state lacks. Those
// catalogs, to append again; none when the state is the newer file.
std::vector<std::string> catalogsMissingFromState(const SeriesState& state, const std::string& dir) {
    std::error_code e1, e2;
    const auto json = fs::last_write_time(fs::path(dir) / "series.json", e1),
               st = fs::last_write_time(fs::path(dir) / "series.state", e2);
    if (e1 || e2 || json <= st) return {};
    std::set<std::string> known;
    for (const auto& f : state.frames)
        known.insert(f.path);
    std::vector<std::string> missing;
    for (const auto& c : seriesCatalogsIn(dir))
        if (!known.count(c)) missing.push_back(c);
    return missing;
}

SeriesResult runBuild(SeriesOptions& o, const SeriesOutputOptions& out, const std::vector<std::string>& given,
                      std::size_t& fresh, Phases& phases) {
    auto t = Clock::now();
    std::optional<SeriesState> state = o.fresh ? std::nullopt : loadSeriesState(out.dir);
    phases.state = since(t);
    t = Clock::now();
    struct Stop {
        Clock::time_point t;
        double& into;
        ~Stop() { into = since(t); }
    } stop{t, phases.series};
    std::vector<std::string> catalogs;
    if (state)
        for (const auto& f : state->frames)
            catalogs.push_back(f.path);
    else if (!o.fresh)
        catalogs = seriesCatalogsIn(out.dir);
    const std::size_t before = catalogs.size();
    std::vector<std::string> add =
        state ? catalogsMissingFromState(*state, out.dir) : std::vector<std::string>{};
    add.insert(add.end(), given.begin(), given.end());
    for (const auto& c : add) // a catalog seen before is not counted twice
        if (std::find(catalogs.begin(), catalogs.end(), c) == catalogs.end()) catalogs.push_back(c);
    fresh = catalogs.size() - before;
    const std::vector<std::string> toAppend(catalogs.begin() + static_cast<std::ptrdiff_t>(before),
                                            catalogs.end());
    if (catalogs.empty()) throw InvalidInput("series: no catalogs given");
    const TargetList targets = readTargetList(o.targets);
    const bool tty = o.common.verbosity >= 1 && stderrIsTty();
    const auto progress = [&](std::size_t done, std::size_t n) {
        if (tty && (done == n || done % 25 == 0))
            std::fprintf(stderr, "\rseries: read %zu / %zu catalogs", done, n);
        if (tty && done == n) std::fprintf(stderr, "\n");
    };
    if (state) {
        if (auto r = appendSeries(std::move(*state), toAppend, targets, o.params, progress))
            return std::move(*r);
        if (o.common.verbosity >= 1)
            std::printf(
                "series: parameters, targets or all-stars mode changed: rebuilding from %zu catalogs\n",
                catalogs.size());
    }
    return buildSeries(catalogs, targets, o.params, progress);
}

// --db: the targets' light curves into the results store, each point tied to its frame's row (the frame
// must be stored: reduced with --db, or given as a frame to this command). Returns the database error's
// exit code, or 0.
int storeSeries(const SeriesResult& r, const SeriesOptions& o) {
    std::vector<std::optional<std::pair<std::string, int>>> frameOf(r.frames.size());
    for (std::size_t i = 0; i < r.frames.size(); ++i)
        frameOf[i] = frameOfCatalog(r.frames[i].path);
    std::vector<SeriesObjectRecord> objects;
    for (const LightCurve& lc : r.curves) {
        if (!lc.problem.empty()) continue;
        SeriesObjectRecord obj;
        obj.name = lc.name, obj.ra = lc.ra, obj.dec = lc.dec;
        for (std::size_t k = 0; k < lc.frame.size(); ++k) {
            const auto& f = frameOf[lc.frame[k]];
            if (!f) continue;
            SeriesPointRecord p;
            p.framePath = f->first, p.hdu = f->second, p.bjdTdb = lc.bjdTdb[k];
            p.relFlux = lc.relFlux[k], p.relFluxErr = lc.relFluxErr[k], p.mag = lc.mag[k],
            p.magErr = lc.magErr[k];
            obj.points.push_back(p);
        }
        objects.push_back(std::move(obj));
    }
    try {
        const SeriesWriteResult w = openResultsStore(o.db, cliStoreOptions())->putSeries(objects);
        if (o.common.verbosity >= 1 || w.pointsWithoutFrame > 0)
            std::fprintf(stderr, "database %s: %zu light curves, %zu points stored%s\n", o.db.c_str(),
                         w.objects, w.points,
                         w.pointsWithoutFrame
                             ? (", " + std::to_string(w.pointsWithoutFrame) +
                                " points of frames not in the database left out (reduce them with --db)")
                                   .c_str()
                             : "");
        return 0;
    } catch (const DatabaseError& e) {
        std::fprintf(stderr, "gpuphot: database error: %s (the series files are written)\n", e.what());
        return databaseExitCode(e.kind());
    }
}

// Frames given: reduced into DIR/catalogs with forced photometry at the targets and at every source of
// the series' list (named sourceTargetName): the list of the state when there is one, else the list the
// frames' own catalogs give, which takes a second reduction (unless --no-forced-sources).
std::vector<std::string> reduceWithForcedSources(const std::vector<std::string>& frames, SeriesOptions& o,
                                                 const std::vector<std::string>& catalogs) {
    const std::string list = (fs::path(o.common.outdir) / "series.sources.csv").string();
    const TargetList targets = readTargetList(o.targets);
    std::optional<SeriesState> state =
        o.fresh || o.noForcedSources ? std::nullopt : loadSeriesState(o.common.outdir);
    if (state) {
        writeSourceTargets(*state, targets, list);
        return reduceFrames(frames, o, list, false);
    }
    std::vector<std::string> reduced = reduceFrames(frames, o, "", false);
    if (o.noForcedSources || reduced.empty()) return reduced;
    std::vector<std::string> all = catalogs;
    all.insert(all.end(), reduced.begin(), reduced.end());
    SeriesResult first;
    try {
        first = buildSeries(all, targets, o.params);
    } catch (const InvalidInput&) {
        return reduced; // no usable catalog: the build says why
    }
    if (o.common.verbosity >= 1)
        std::printf("series: %zu sources listed: the frames again, with forced photometry at each\n",
                    first.sources.size());
    writeSourceTargets(first.state, targets, list);
    return reduceFrames(frames, o, list, true);
}

// One line per target's curve (verbosity >= 1), with its periodogram's peak and its transit when made.
void printCurves(const SeriesResult& r) {
    for (const auto& lc : r.curves) {
        if (!lc.problem.empty()) continue;
        int n = 0;
        for (const auto& e : lc.ensemble)
            n += e.dropped ? 0 : 1;
        std::printf("  %-20s %zu points, %d comparison stars, RMS %.5f (median error %.5f), J %.2f%s\n",
                    lc.name.c_str(), lc.frame.size(), n, lc.rms, lc.medianErr, lc.stetsonJ,
                    lc.variable ? " variable" : "");
        if (std::isfinite(lc.bestPeriod))
            std::printf("  %-20s periodogram peak %.6f d (power %.3f, false alarm %.2g)\n", "", lc.bestPeriod,
                        lc.bestPower, lc.falseAlarm);
        const TransitFit& tr = lc.transit;
        if (r.params.fitTransits && std::isfinite(tr.depth))
            std::printf("  %-20s transit%s: depth %.5f +- %.5f, mid BJD_TDB %.6f +- %.2f min, %.2f h, S/N "
                        "%.1f\n",
                        "", tr.found ? "" : " (not found)", tr.depth, tr.depthErr, tr.mid, tr.midErr * 1440.0,
                        tr.duration * 24.0, tr.snr);
    }
}

// --follow: the catalogs that appear in the input directories after the first call are appended to the
// series held in memory, the files rewritten after each, until SIGINT/SIGTERM or --timeout.
std::atomic<bool> g_stopFollowing{false};
void stopFollowing(int) {
    g_stopFollowing.store(true);
}

// New catalogs of `dirs` whose size and time have not changed for --settle seconds and that are complete
// FITS files (a catalog still being written is not taken), in name order.
class CatalogFollower {
public:
    CatalogFollower(const std::vector<std::string>& dirs, const std::vector<SeriesFrame>& known,
                    double settle)
        : m_settle(settle) {
        for (const auto& d : dirs) {
            std::string dir = fs::absolute(d).lexically_normal().string();
            if (dir.size() > 1 && dir.back() == '/') dir.pop_back(); // "DIR/" as "DIR"
            m_dirs.push_back(std::move(dir));
        }
        for (const auto& f : known)
            m_known.insert(f.path);
    }
    std::vector<std::string> ready() {
        std::vector<std::string> out;
        const auto now = Clock::now();
        for (const auto& d : m_dirs) {
            std::error_code ec;
            for (const auto& e : fs::directory_iterator(d, ec)) {
                const std::string& full = e.path().native();
                const std::string name = full.substr(full.find_last_of('/') + 1);
                if (name.empty() || name.front() == '.' || !isCatalogName(name)) continue;
                const std::string path = d + "/" + name;
                if (!m_known.count(path) && settled(path, now)) out.push_back(path);
            }
        }
        std::sort(out.begin(), out.end());
        for (const auto& p : out) {
            m_known.insert(p);
            m_clock.forget(p);
        }
        return out;
    }

private:
    bool settled(const std::string& path, SettleClock::Clock::time_point now) {
        const auto look = m_clock.look(path, now);
        return look && look->stableSeconds >= m_settle && fitsFileComplete(path);
    }
    std::vector<std::string> m_dirs; // absolute, normalised: the form the series records
    double m_settle;
    std::unordered_set<std::string> m_known;
    SettleClock m_clock;
};

// With --follow the state is written after the light curves, on a thread of its own: an append's points
// are on disk without waiting for it. It is joined before the next append changes the state, and at exit.
class BackgroundStateWriter {
public:
    ~BackgroundStateWriter() { // an exception is on its way: the writer's own error is dropped
        if (m_thread.joinable()) m_thread.join();
    }
    void start(const SeriesState& state, const std::string& dir) {
        join();
        m_thread = std::thread([this, &state, dir] {
            try {
                saveSeriesState(state, dir);
            } catch (...) {
                m_error = std::current_exception();
            }
        });
    }
    void join() { // rethrows the writer's error
        if (m_thread.joinable()) m_thread.join();
        if (m_error) std::rethrow_exception(std::exchange(m_error, nullptr));
    }

private:
    std::thread m_thread;
    std::exception_ptr m_error;
};

// One appended batch: the series from the state in `r` and `catalogs` (rebuilt from every catalog when
// the state cannot serve, as with --all-stars), its files written. Prints one line with the times.
void appendFollowed(SeriesOptions& o, const SeriesOutputOptions& out, const TargetList& targets,
                    SeriesResult& r, const std::vector<std::string>& catalogs, BackgroundStateWriter& state) {
    state.join();
    const auto t0 = Clock::now();
    std::optional<SeriesResult> next = appendSeries(std::move(r.state), catalogs, targets, o.params);
    if (next) {
        r = std::move(*next);
    } else { // the state cannot serve: every catalog again (r.frames still lists the earlier ones)
        std::vector<std::string> all;
        for (const auto& f : r.frames)
            all.push_back(f.path);
        all.insert(all.end(), catalogs.begin(), catalogs.end());
        r = buildSeries(all, targets, o.params);
    }
    const double append = since(t0);
    const auto t1 = Clock::now();
    SeriesOutputOptions curves = out;
    curves.state = false;
    writeSeriesOutputs(r, curves);
    const double files = since(t1);
    state.start(r.state, out.dir);
    for (const auto& f : r.frames)
        if (!f.used && std::find(catalogs.begin(), catalogs.end(), f.path) != catalogs.end())
            std::fprintf(stderr, "gpuphot: warning: %s left out: %s\n", f.path.c_str(), f.problem.c_str());
    if (o.common.verbosity >= 1)
        std::printf("series: +%zu (%s), %zu frames, %.3f s (%s %.3f, files %.3f)\n", catalogs.size(),
                    fs::path(catalogs.back()).filename().c_str(), r.frames.size(), append + files,
                    next ? "append" : "build", append, files);
    std::fflush(stdout);
    if (!o.db.empty()) storeSeries(r, o);
}

int followSeries(SeriesOptions& o, const SeriesOutputOptions& out, SeriesResult& r) {
    std::vector<std::string> dirs;
    std::error_code ec;
    for (const auto& in : o.inputs)
        if (fs::is_directory(in, ec)) dirs.push_back(in);
    if (dirs.empty()) throw InvalidInput("series --follow: give a directory of catalogs to follow");
    const TargetList targets = readTargetList(o.targets);
    CatalogFollower follower(dirs, r.frames, o.settle);
    std::fflush(stdout); // the first call's summary, before the wait
    std::signal(SIGINT, stopFollowing);
    std::signal(SIGTERM, stopFollowing);
    if (o.common.verbosity >= 1)
        std::fprintf(stderr, "gpuphot: following %zu director%s for new catalogs (Ctrl+C stops)\n",
                     dirs.size(), dirs.size() == 1 ? "y" : "ies");
    const auto start = Clock::now();
    BackgroundStateWriter state;
    while (!g_stopFollowing.load() && (o.timeout <= 0 || since(start) < o.timeout)) {
        const std::vector<std::string> ready = follower.ready();
        if (ready.empty())
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        else
            appendFollowed(o, out, targets, r, ready, state);
    }
    state.join();
    return 0;
}

int runSeries(SeriesOptions& o) {
    if (!o.site.empty()) o.params.site = parseSite(o.site);
    if (o.transitMinHours != 0.0) o.params.transit.minDuration = o.transitMinHours / 24.0;
    if (o.transitMaxHours != 0.0) o.params.transit.maxDuration = o.transitMaxHours / 24.0;
    validate(o.params); // before any frame is reduced
    SeriesOutputOptions out{o.common.outdir, parseFormats(o.formats), o.obscode, true};
    const auto t0 = Clock::now();
    std::size_t fresh = 0;
    Phases phases;
    Inputs in = expandInputs(o.inputs);
    if (!in.frames.empty()) {
        const std::vector<std::string> reduced = reduceWithForcedSources(in.frames, o, in.catalogs);
        in.catalogs.insert(in.catalogs.end(), reduced.begin(), reduced.end());
    }
    SeriesResult r = runBuild(o, out, in.catalogs, fresh, phases);
    const auto tf = Clock::now();
    const std::vector<std::string> written = writeSeriesOutputs(r, out);
    phases.files = since(tf);
    const double secs = since(t0);

    std::size_t used = 0, curves = 0;
    for (const auto& f : r.frames) {
        used += f.used ? 1 : 0;
        if (!f.used)
            std::fprintf(stderr, "gpuphot: warning: %s left out: %s\n", f.path.c_str(), f.problem.c_str());
    }
    for (const auto& w : r.warnings)
        std::fprintf(stderr, "gpuphot: warning: %s\n", w.c_str());
    for (const auto& lc : r.curves)
        curves += lc.problem.empty() ? 1 : 0;
    if (o.common.verbosity >= 1) {
        std::printf(
            "series: %zu frames (%zu new, %zu used), %zu sources, %zu of %zu targets with light curves, "
            "%.3f s (state %.3f, %s %.3f, files %.3f)\n",
            r.frames.size(), fresh, used, r.sources.size(), curves, r.curves.size(), secs, phases.state,
            r.appended ? "append" : "build", phases.series, phases.files);
        printCurves(r);
        std::printf("wrote %zu files into %s\n", written.size(), out.dir.c_str());
    }
    const int dbStatus = o.db.empty() ? 0 : storeSeries(r, o);
    if (dbStatus != 0) return dbStatus;
    const int status = used == r.frames.size() && curves == r.curves.size() ? 0 : 1;
    return o.follow ? followSeries(o, out, r) : status;
}

// Detrending, variability and transit options.
void addAnalysisOptions(CLI::App& sub, SeriesOptions& o) {
    SeriesParams& p = o.params;
    sub.add_option("--detrend", p.detrend,
                   "Decorrelate each target's curve against these terms: airmass, fwhm, sky, x, y, time")
        ->delimiter(',');
    sub.add_flag("--variability", p.findVariables,
                 "Keep stars flagged variable (--stetson-j, --max-chi2) out of every ensemble; a "
                 "Lomb-Scargle periodogram of each target and flagged star");
    sub.add_option("--stetson-j", p.variability.stetsonJ, "Flag a star whose Stetson J exceeds this")
        ->capture_default_str();
    sub.add_option("--max-chi2", p.variability.chi2,
                   "Flag a star whose reduced chi^2 about a constant exceeds this")
        ->capture_default_str();
    sub.add_option("--min-period", p.variability.minPeriod, "Periodogram: shortest period (d)")
        ->capture_default_str();
    sub.add_option("--max-period", p.variability.maxPeriod,
                   "Periodogram: longest period (d; 0: half the series' time span)")
        ->capture_default_str();
    sub.add_option("--oversample", p.variability.oversample, "Periodogram: frequencies per 1/(time span)")
        ->capture_default_str();
    sub.add_flag("--transit", p.fitTransits,
                 "Fit a transit (a trapezoid dip, searched blind) on each target's curve: series.json "
                 "\"transit\"");
    sub.add_option("--transit-min-duration", o.transitMinHours,
                   "Transit search: shortest duration (h; default 0.48)");
    sub.add_option("--transit-max-duration", o.transitMaxHours,
                   "Transit search: longest duration (h; default: half the series' time span)");
    sub.add_option("--transit-min-snr", p.transit.minSnr,
                   "Transit search: depth / its error to count as found")
        ->capture_default_str();
}

} // namespace

Command registerSeries(CLI::App& app) {
    auto o = std::make_shared<SeriesOptions>();
    auto* sub =
        app.add_subcommand("series", "Light curves of targets over a night of reduced catalogs (.cat.fits)");
    sub->footer(
        "A later call with the same -o appends its catalogs to the series recorded in DIR/series.state\n"
        "(--fresh starts anew). Files: NAME.lc.{ecsv,csv,fits}, NAME.aij.tbl, NAME.aavso.txt, series.json,\n"
        "series.state; with --all-stars also series.stars.fits, series.curves.fits and "
        "series.variables.csv.");
    addCommonOptions(*sub, o->common);
    SeriesParams& p = o->params;
    sub->add_option("inputs", o->inputs,
                    "Catalogs (gpuphot reduce's .cat.fits), frames (reduced first into DIR/catalogs), or "
                    "directories of either")
        ->required();
    sub->add_option("--targets", o->targets,
                    "Targets: FITS, ECSV or CSV with ra, dec and a name (as reduce --targets)")
        ->required();
    sub->add_option("--flux", p.flux, "Catalog flux: opt, aper_K, psf or auto")->capture_default_str();
    sub->add_option("--match-radius", p.matchRadius, "Cross-identification radius (arcsec)")
        ->capture_default_str();
    sub->add_option("--filter", p.filter, "Keep frames of this FILTER (default: the first frame's)");
    sub->add_option("--ensemble-size", p.ensembleSize, "Comparison stars per target")->capture_default_str();
    sub->add_option("--min-ensemble", p.minEnsemble, "Fewest comparison stars for a light curve")
        ->capture_default_str();
    sub->add_option("--max-mag-diff", p.maxMagDiff, "Comparison stars within this of the target (mag)")
        ->capture_default_str();
    sub->add_option("--ref", p.reference,
                    "Reference catalog with colours: comparisons of the target's colour first");
    sub->add_option("--ref-columns", p.referenceColumns,
                    "Its columns, as reduce --ref-columns (color=A-B, ...)");
    sub->add_option("--max-colour-diff", p.maxColourDiff, "With --ref: comparisons within this colour (mag)")
        ->capture_default_str();
    sub->add_option("--isolation", p.isolation, "No brighter-than-1/10 neighbour closer than this (arcsec)")
        ->capture_default_str();
    sub->add_option("--min-coverage", p.minCoverage,
                    "Comparison stars measured in this fraction of the frames")
        ->capture_default_str();
    sub->add_option("--vet-ratio", p.vetRatio,
                    "Drop comparisons scattering this many times the ensemble's median")
        ->capture_default_str();
    sub->add_option("--telescope-diameter", p.telescopeDiameter,
                    "Aperture (m) for the scintillation error (0: none)")
        ->capture_default_str();
    sub->add_option("--site", o->site,
                    "Observatory LAT,LON,ELEV (deg, east positive; m) when headers lack it");
    sub->add_option("--pin", p.pinned, "Always use this target-list star as a comparison (repeatable)");
    sub->add_option("--exclude", p.excluded, "Never use this target-list star as a comparison (repeatable)");
    sub->add_option("--formats", o->formats, "Outputs: ecsv,csv,fits,aij,aavso")->capture_default_str();
    sub->add_option("--obscode", o->obscode, "AAVSO observer code")->capture_default_str();
    sub->add_option("--aper", o->radii,
                    "Frames given instead of catalogs: aperture radii for their reduction (px)")
        ->delimiter(',');
    sub->add_flag("--no-tycho2", o->noTycho2,
                  "Frames given instead of catalogs: no Tycho-2 fallback without --ref");
    sub->add_flag("--no-forced-sources", o->noForcedSources,
                  "Frames given instead of catalogs: forced photometry at the targets only, not at every "
                  "listed source (which takes a second reduction when DIR holds no series yet)");
    sub->add_flag("--all-stars", p.allStars,
                  "Also every star's light curve: DIR/series.stars.fits, series.curves.fits and "
                  "series.variables.csv");
    addAnalysisOptions(*sub, *o);
    addDbOption(*sub, o->db);
    sub->add_flag("--fresh", o->fresh, "Ignore the series recorded in DIR: only the catalogs given");
    sub->add_flag("--follow", o->follow,
                  "Then keep following the input directories: each new catalog is appended to the series "
                  "held in memory and the files rewritten, until Ctrl+C / SIGTERM");
    sub->add_option("--settle", o->settle,
                    "--follow: seconds a new catalog must stay unchanged (and be a complete FITS file)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    sub->add_option("--timeout", o->timeout, "--follow: stop after this many seconds (0: never)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    return {sub, [o] { return runSeries(*o); }};
}

} // namespace gpuphot::cli
