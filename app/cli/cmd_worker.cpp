// gpuphot worker / enqueue / results: long-lived reduction workers fed by a Redis stream with a consumer
// group (docs/CLI.md §Redis workers). One RunContext per worker for its whole life (the CUDA context and
// memory pool stay warm), reference catalogs cached by path and column map.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "app/cli/db_cli.hpp"
#include "core/db/db_writer.hpp"
#include "app/cli/batch.hpp"
#include "app/cli/commands.hpp"
#include "app/cli/redis_client.hpp"
#include "app/cli/test_hooks.hpp"
#include "core/catalog/reference_catalog.hpp"
#include "core/io/atomic_file.hpp"
#include "core/pipeline/frame_status.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Fields = std::vector<std::pair<std::string, std::string>>;

const char* const kGroup = "gpuphot-workers";

struct Streams {
    std::string prefix = "gpuphot";
    std::string frames() const { return prefix + ":frames"; }
    std::string results() const { return prefix + ":results"; }
    std::string dead() const { return prefix + ":dead"; }
    std::string inflight() const { return prefix + ":inflight"; } // hash: job id -> who is reducing it
};

void addRedisOptions(CLI::App& sub, std::string& redis, Streams& s) {
    sub.add_option("--redis", redis, "Redis server HOST:PORT")->required();
    sub.add_option("--stream-prefix", s.prefix,
                   "Key prefix: streams PREFIX:frames, PREFIX:results, PREFIX:dead")
        ->capture_default_str();
}

std::string field(const Fields& f, const std::string& key) {
    for (const auto& [k, v] : f)
        if (k == key) return v;
    return {};
}

// XGROUP CREATE ... 0 MKSTREAM; an existing group is fine.
void ensureGroup(RedisClient& r, const Streams& s) {
    const RedisReply rep = r.commandAllowError({"XGROUP", "CREATE", s.frames(), kGroup, "0", "MKSTREAM"});
    if (rep.isError() && rep.str().rfind("BUSYGROUP", 0) != 0)
        throw IoError("redis " + r.address().str() + ": XGROUP CREATE " + s.frames() + ": " + rep.str());
}

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

std::string absolute(const std::string& p) {
    return p.empty() ? p : fs::absolute(p).lexically_normal().string();
}

// "30s", "500ms", "2m", "1.5" (seconds) -> milliseconds.
std::chrono::milliseconds parseDuration(const std::string& text, const char* option) {
    std::size_t pos = 0;
    double v = 0;
    try {
        v = std::stod(text, &pos);
    } catch (const std::exception&) {
        pos = 0;
    }
    const std::string unit = text.substr(pos);
    double scale = 0;
    if (pos == 0)
        scale = 0;
    else if (unit.empty() || unit == "s")
        scale = 1000;
    else if (unit == "ms")
        scale = 1;
    else if (unit == "m" || unit == "min")
        scale = 60000;
    else if (unit == "h")
        scale = 3600000;
    if (scale == 0 || !(v >= 0))
        throw InvalidInput(std::string(option) + ": '" + text + "' is not a duration (e.g. 30s, 500ms, 2m)");
    return std::chrono::milliseconds(static_cast<long long>(v * scale + 0.5));
}

// ---------------------------------------------------------------------------------------------------
// enqueue

struct EnqueueCli {
    std::string redis;
    Streams streams;
    std::vector<std::string> frames;
    std::string outdir = ".", reference, refColumns, config, hdu;
    std::vector<std::string> formats, maps;
    bool force = false, writeSolved = false, ignoreHeaderWcs = false, quiet = false;
};

int runEnqueue(EnqueueCli& o) {
    if (o.frames.empty())
        throw InvalidInput("enqueue: no frame given (gpuphot enqueue --redis HOST:PORT FRAME.fits ...)");
    OutputOptions out;
    out.formats = splitList(o.formats);
    out.maps = splitList(o.maps);
    std::error_code ec;
    fs::create_directories(o.outdir, ec);
    out.outdir = o.outdir;
    validateOutputOptions(out); // unknown format/map names fail here, not on every worker
    for (const auto& f : o.frames) {
        std::string file = f;
        if (const auto b = file.find('['); b != std::string::npos && file.back() == ']') file.resize(b);
        if (!fs::exists(file)) throw InvalidInput("enqueue: " + f + ": no such file");
    }
    if (!o.reference.empty() && !fs::exists(o.reference))
        throw InvalidInput("enqueue: --ref " + o.reference + ": no such file");
    if (!o.config.empty()) (void)loadPipelineConfig(o.config); // a bad config fails here, once
    nlohmann::json options = {{"formats", out.formats}, {"maps", out.maps}, {"force", o.force}};
    if (!o.reference.empty()) options["ref"] = absolute(o.reference);
    if (!o.refColumns.empty()) options["ref_columns"] = o.refColumns;
    if (!o.config.empty()) options["config"] = absolute(o.config);
    if (!o.hdu.empty()) options["hdu"] = o.hdu;
    if (o.writeSolved) options["write_solved"] = true;
    if (o.ignoreHeaderWcs) options["ignore_header_wcs"] = true;
    const std::string optionsText = options.dump();
    const std::string outdir = absolute(o.outdir);

    RedisClient r(parseRedisAddress(o.redis));
    ensureGroup(r, o.streams);
    for (const auto& f : o.frames) {
        std::string frame = f;
        std::string suffix;
        if (const auto b = frame.find('['); b != std::string::npos && frame.back() == ']') {
            suffix = frame.substr(b);
            frame.resize(b);
        }
        frame = absolute(frame) + suffix;
        const RedisReply id = r.command(
            {"XADD", o.streams.frames(), "*", "frame", frame, "outdir", outdir, "options", optionsText});
        if (!o.quiet) std::printf("%s %s\n", id.str().c_str(), frame.c_str());
    }
    std::fflush(stdout);
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// worker

std::atomic<bool> g_stop{false};
void onWorkerStopSignal(int) {
    g_stop.store(true);
}

struct WorkerCli {
    CommonOptions common;
    std::string redis;
    Streams streams;
    int gpu = -1;
    std::string name;
    std::string claimIdle = "30s";
    int maxAttempts = 3;
    long long maxFrames = 0;
    double exitWhenIdle = -1;
    int prefetch = 1;
    int concurrent = 1; // --concurrent K: jobs in their stages at once, each with its own RunContext
    std::string db;     // --db URL: each reduced frame stored there before its job is acknowledged
};

struct Job {
    std::string id;
    Fields fields;
    long long attempt = 1; // delivery count
};

// Acknowledges the job and publishes its result in one atomic step, only when this worker's XACK is the
// one that acknowledges it (a job claimed away from a slow worker is published once, by whichever
// finishes first). KEYS: frames, results, inflight. ARGV: group, id, then the result's field/value pairs.
const char* const kAckAndPublish = R"LUA(
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HDEL', KEYS[3], ARGV[2])
  local f = {}
  for i = 3, #ARGV do f[#f + 1] = ARGV[i] end
  return redis.call('XADD', KEYS[2], '*', unpack(f))
end
return false
)LUA";

// Jobs go through a FramePipeline (--prefetch, --concurrent): the next job's frame is read while the current
// one is in its stages (K jobs at once with --concurrent K) and the previous one's outputs are written; a
// job is acknowledged (and its result published, on a connection of the pipeline's writer thread) only
// once its outputs are complete.
class Worker {
public:
    Worker(WorkerCli& o, FrameReducer& reducer) : m_o(o), m_reducer(reducer) {}

    int run();

private:
    bool claimAbandoned(Job& job);
    bool readNew(Job& job, std::chrono::milliseconds block);
    void submit(const Job& job);
    FrameTask makeTask(const Job& job);
    void finished(std::size_t ticket, nlohmann::json result);
    void storeInDatabase(nlohmann::json& result, bool onlyIfMissing);
    void deadLetter(const Job& job);
    bool publish(RedisClient& redis, const Job& job, const std::string& stream, const nlohmann::json& result,
                 const std::string& status);
    long long pendingCount();
    bool holds(const std::string& id);
    const ReferenceCatalog* reference(const std::string& path, const std::string& columns);
    PipelineConfig config(const std::string& path);

    WorkerCli& m_o;
    FrameReducer& m_reducer;
    std::unique_ptr<RedisClient> m_redis;     // this thread's connection
    std::unique_ptr<RedisClient> m_publisher; // the pipeline writer thread's connection
    std::string m_claimCursor = "0-0";
    std::map<std::string, ReferenceCatalog> m_references; // entries stay put: jobs in flight point at them
    std::map<std::string, PipelineConfig> m_configs;
    std::mutex m_jobsMutex;
    std::map<std::size_t, Job> m_jobs; // pipeline ticket -> job in flight
    std::atomic<long long> m_done{0};
    std::size_t m_nextTicket = 0;
    std::unique_ptr<ResultsStore> m_store; // --db: the pipeline writer thread's connection
    int m_dbExitCode = 0;                  // the first database failure's exit status
    std::unique_ptr<FramePipeline> m_pipeline; // last: its threads end before the members above go
};

bool Worker::holds(const std::string& id) {
    std::lock_guard lock(m_jobsMutex);
    for (const auto& [ticket, job] : m_jobs)
        if (job.id == id) return true;
    return false;
}

long long Worker::pendingCount() {
    const RedisReply rep = m_redis->command({"XPENDING", m_o.streams.frames(), kGroup});
    return rep.size() > 0 ? rep[0].integer() : 0;
}

bool Worker::claimAbandoned(Job& job) {
    const auto idle = parseDuration(m_o.claimIdle, "--claim-idle");
    const RedisReply rep = m_redis->command({"XAUTOCLAIM", m_o.streams.frames(), kGroup, m_o.name,
                                             std::to_string(idle.count()), m_claimCursor, "COUNT", "1"});
    if (rep.size() < 2) return false;
    m_claimCursor = rep[0].str().empty() ? "0-0" : rep[0].str();
    const RedisReply entries = rep[1];
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const RedisReply e = entries[i];
        if (e.size() < 2) continue;
        job.id = e[0].str();
        if (e[1].isNil()) { // the entry was deleted from the stream (XDEL/XTRIM): nothing to do
            m_redis->command({"XACK", m_o.streams.frames(), kGroup, job.id});
            continue;
        }
        job.fields = e[1].pairs();
        const RedisReply p =
            m_redis->command({"XPENDING", m_o.streams.frames(), kGroup, job.id, job.id, "1"});
        job.attempt = p.size() > 0 && p[0].size() >= 4 ? p[0][3].integer() : 2;
        return true;
    }
    return false;
}

bool Worker::readNew(Job& job, std::chrono::milliseconds block) {
    const RedisReply rep =
        m_redis->command({"XREADGROUP", "GROUP", kGroup, m_o.name, "COUNT", "1", "BLOCK",
                          std::to_string(block.count()), "STREAMS", m_o.streams.frames(), ">"});
    if (rep.isNil() || rep.size() == 0) return false;
    const RedisReply entries = rep[0][1];
    if (entries.size() == 0) return false;
    job.id = entries[0][0].str();
    job.fields = entries[0][1].pairs();
    job.attempt = 1;
    return true;
}

bool Worker::publish(RedisClient& redis, const Job& job, const std::string& stream, const nlohmann::json& result,
                     const std::string& status) {
    std::vector<std::string> argv = {
        "EVAL",   kAckAndPublish,
        "3",      m_o.streams.frames(),
        stream,   m_o.streams.inflight(),
        kGroup,   job.id,
        "frame",  result.value("frame", field(job.fields, "frame")),
        "status", status,
        "job",    job.id,
        "worker", m_o.name,
        "json",   result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
    const RedisReply rep = redis.command(argv);
    return !rep.isNil();
}

void Worker::deadLetter(const Job& job) {
    std::string last = "unknown";
    const RedisReply who = m_redis->command({"HGET", m_o.streams.inflight(), job.id});
    if (who.isString()) last = who.str();
    const std::string frame = field(job.fields, "frame");
    nlohmann::json j = {
        {"frame", frame},
        {"status", "dead"},
        {"job", job.id},
        {"attempts", job.attempt - 1},
        {"max_attempts", m_o.maxAttempts},
        {"error", "delivered " + std::to_string(job.attempt - 1) +
                      " times without an acknowledgement: every worker that took it crashed or "
                      "was killed while reducing it (last: " +
                      last + ")"},
        {"outdir", field(job.fields, "outdir")},
        {"options", field(job.fields, "options")},
        {"dead_lettered_by", m_o.name}};
    if (publish(*m_redis, job, m_o.streams.dead(), j, "dead") && m_o.common.verbosity > 0) {
        std::printf("%s %s: dead-lettered after %lld attempts\n", job.id.c_str(), frame.c_str(),
                    job.attempt - 1);
        std::fflush(stdout);
    }
}

const ReferenceCatalog* Worker::reference(const std::string& path, const std::string& columns) {
    if (path.empty()) return nullptr;
    const std::string key = path + '\n' + columns;
    auto it = m_references.find(key);
    if (it == m_references.end())
        it = m_references.emplace(key, readReferenceCatalog(path, parseRefColumnMap(columns))).first;
    return &it->second;
}

PipelineConfig Worker::config(const std::string& path) {
    if (path.empty()) return loadConfig(m_o.common);
    auto it = m_configs.find(path);
    if (it == m_configs.end()) it = m_configs.emplace(path, loadPipelineConfig(path)).first;
    return it->second;
}

// Test hooks (gpuphot-testhooks only, app/cli/test_hooks.hpp): a sleep inside each frame, so that a test's
// SIGKILL lands mid-frame; an abort on a frame whose path contains the crash text.
void testHooks(const std::string& frame) {
    const CliTestHooks& h = cliTestHooks();
    if (h.slowFrameMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(h.slowFrameMs));
    if (!h.crashFrame.empty() && frame.find(h.crashFrame) != std::string::npos) std::abort();
}

// The job's reduce options, or its status line when it is decided here (a bad job, outputs complete).
FrameTask Worker::makeTask(const Job& job) {
    FrameTask task;
    task.frame = field(job.fields, "frame");
    task.force = true; // the skip rule (with the recovery of a dead attempt) is applied here
    const std::string& frame = task.frame;
    try {
        if (frame.empty()) throw InvalidInput("job " + job.id + ": no 'frame' field");
        nlohmann::json options = nlohmann::json::object();
        if (const std::string text = field(job.fields, "options"); !text.empty()) {
            try {
                options = nlohmann::json::parse(text);
            } catch (const std::exception& e) {
                throw InvalidInput("job " + job.id + ": 'options' is not JSON: " + e.what());
            }
        }
        auto ro = std::make_shared<ReduceOptions>();
        ro->config = config(options.value("config", std::string()));
        ro->read.hdu = options.value("hdu", std::string());
        ro->output.outdir =
            field(job.fields, "outdir").empty() ? m_o.common.outdir : field(job.fields, "outdir");
        ro->output.formats = options.value("formats", std::vector<std::string>{});
        ro->output.maps = options.value("maps", std::vector<std::string>{});
        ro->output.writeSolved = options.value("write_solved", false);
        ro->ignoreHeaderWcs = options.value("ignore_header_wcs", false);
        std::error_code ec;
        fs::create_directories(ro->output.outdir, ec);
        // A claimed job: the worker that died with it may have left temporaries (this host's only).
        if (job.attempt > 1) removeStaleTemporaries(ro->output.outdir);
        const std::string refPath = options.value("ref", std::string());
        testHooks(frame);
        if (!options.value("force", false) && outputsComplete(frame, ro->output, ro->read.hdu)) {
            nlohmann::json report;
            try {
                std::ifstream in(reportPath(frame, ro->output, ro->read.hdu));
                report = nlohmann::json::parse(in);
            } catch (const std::exception&) {
                report = nlohmann::json::object();
            }
            if (job.attempt > 1) {
                // An earlier attempt of this very job wrote the outputs and died before acknowledging:
                // publish its result now (the one and only "ok" of this job).
                ReduceSummary s;
                s.frame = frame;
                s.report = report;
                s.sources = report.contains("counts") ? report["counts"].value("sources", std::size_t{0}) : 0;
                s.calibrationFailed = !refPath.empty() && !report.value("zp", nlohmann::json()).is_number();
                task.line = frameStatusOk(s);
                (*task.line)["recovered"] = true;
            } else {
                task.line = frameStatusSkipped(frame, reportPath(frame, ro->output, ro->read.hdu));
            }
        } else {
            ro->reference = reference(refPath, options.value("ref_columns", std::string()));
            task.options = std::move(ro);
        }
    } catch (const InvalidInput& e) {
        task.line = frameStatusFailed(frame, e.what(), 2);
    } catch (const IoError& e) {
        task.line = frameStatusFailed(frame, e.what(), 3);
    } catch (const std::exception& e) {
        task.line = frameStatusFailed(frame, e.what(), 1);
    }
    return task;
}

void Worker::submit(const Job& job) {
    // Who holds the job, for the dead-letter message should this worker die with it.
    m_redis->command({"HSET", m_o.streams.inflight(), job.id,
                      m_o.name + " (pid " + std::to_string(::getpid()) + ", attempt " +
                          std::to_string(job.attempt) + ")"});
    FrameTask task = makeTask(job);
    std::unique_lock lock(m_jobsMutex);
    // The ticket is the next in order: register the job before the pipeline can deliver it.
    const std::size_t ticket = m_nextTicket++;
    m_jobs[ticket] = job;
    lock.unlock();
    const std::size_t got = m_pipeline->submit(std::move(task));
    if (got != ticket) throw std::logic_error("worker: pipeline ticket out of order");
}

// On the pipeline's writer thread (or this one with --prefetch 0): the job's outputs are complete.
void Worker::finished(std::size_t ticket, nlohmann::json result) {
    Job job;
    {
        std::lock_guard lock(m_jobsMutex);
        job = m_jobs.at(ticket);
    }
    const std::string frame = field(job.fields, "frame");
    const std::string status = result.value("status", std::string("failed"));
    result["worker"] = m_o.name;
    result["job"] = job.id;
    result["attempt"] = job.attempt;
    if (!m_o.db.empty() && (status == "ok" || status == "skipped")) storeInDatabase(result, status == "skipped");
    const bool published = publish(*m_publisher, job, m_o.streams.results(), result, status);
    {
        std::lock_guard lock(m_jobsMutex);
        m_jobs.erase(ticket);
    }
    ++m_done;
    if (m_o.common.verbosity > 0) {
        if (!published)
            std::printf("%s %s: %s, but another worker acknowledged the job first (it was claimed from this "
                        "one): result dropped\n",
                        job.id.c_str(), frame.c_str(), status.c_str());
        else if (status == "failed")
            std::printf("%s %s: failed: %s\n", job.id.c_str(), frame.c_str(),
                        result.value("error", std::string()).c_str());
        else
            std::printf("%s %s: %s, %zu sources, %.2f s\n", job.id.c_str(), frame.c_str(), status.c_str(),
                        result.value("sources", std::size_t{0}), result.value("seconds", 0.0));
        std::fflush(stdout);
    }
}

// --db: the frame goes into the database before its job is acknowledged, so a worker killed inside the
// write leaves the job pending; it is claimed again and the retry replaces the frame (never half of it).
// A failure is recorded in the result (database_error) and in the worker's exit status.
void Worker::storeInDatabase(nlohmann::json& result, bool onlyIfMissing) {
    try {
        if (!m_store) m_store = openResultsStore(m_o.db, cliStoreOptions());
        const bool wrote = storeReducedFrame(*m_store, result.value("report", std::string{}), {}, onlyIfMissing);
        result["database"] = wrote ? "stored" : "already stored";
    } catch (const std::exception& e) {
        const auto* dbe = dynamic_cast<const DatabaseError*>(&e);
        if (dbe) m_store.reset(); // reconnect for the next frame
        result["database_error"] = e.what();
        const int code = dbe ? databaseExitCode(dbe->kind()) : databaseExitCode(DatabaseError::Kind::Other);
        if (m_dbExitCode == 0) m_dbExitCode = code;
        std::fprintf(stderr, "gpuphot: database error: %s\n", e.what());
    }
}

int Worker::run() {
    const auto claimIdle = parseDuration(m_o.claimIdle, "--claim-idle");
    if (m_o.maxAttempts < 1) throw InvalidInput("worker: --max-attempts must be >= 1");
    if (m_o.prefetch < 0) throw InvalidInput("worker: --prefetch must be >= 0");
    if (m_o.concurrent < 1) throw InvalidInput("worker: --concurrent must be >= 1");
    const auto block =
        std::clamp(claimIdle / 2, std::chrono::milliseconds(100), std::chrono::milliseconds(1000));
    // Command timeout: well beyond the XREADGROUP block.
    m_redis = std::make_unique<RedisClient>(parseRedisAddress(m_o.redis), std::chrono::milliseconds(5000),
                                            block + std::chrono::milliseconds(30000));
    m_publisher = std::make_unique<RedisClient>(parseRedisAddress(m_o.redis), std::chrono::milliseconds(5000),
                                                std::chrono::milliseconds(30000));
    ensureGroup(*m_redis, m_o.streams);
    if (m_o.common.verbosity > 0) {
        std::printf("worker %s: %s backend, stream %s on %s, group %s\n", m_o.name.c_str(),
                    backendName(m_reducer.context().backend), m_o.streams.frames().c_str(),
                    m_redis->address().str().c_str(), kGroup);
        std::fflush(stdout);
    }
    m_pipeline = std::make_unique<FramePipeline>(
        m_reducer, m_o.prefetch,
        [this](std::size_t ticket, nlohmann::json line) { finished(ticket, std::move(line)); },
        m_o.concurrent);
    auto lastWork = Clock::now();
    while (!g_stop.load()) {
        if (m_pipeline->failed()) break; // finish() below rethrows its error
        const long long inFlight = static_cast<long long>(m_pipeline->inFlight());
        if (m_o.maxFrames > 0 && m_done.load() + inFlight >= m_o.maxFrames) {
            if (inFlight == 0) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            continue;
        }
        if (m_pipeline->full()) { // take the next job only when the pipeline can start reading it
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            continue;
        }
        Job job;
        bool got = claimAbandoned(job);
        if (got && holds(job.id)) continue; // our own job, idle in the pipeline: it is being reduced
        if (got && job.attempt > m_o.maxAttempts) {
            deadLetter(job);
            lastWork = Clock::now();
            continue;
        }
        if (!got) got = readNew(job, inFlight > 0 ? std::chrono::milliseconds(100) : block);
        if (!got) {
            const double idle = std::chrono::duration<double>(Clock::now() - lastWork).count();
            if (m_o.exitWhenIdle >= 0 && inFlight == 0 && idle >= m_o.exitWhenIdle && pendingCount() == 0) break;
            continue;
        }
        submit(job);
        lastWork = Clock::now();
    }
    m_pipeline->finish(); // jobs taken are completed and acknowledged, also on SIGTERM
    m_pipeline.reset();
    const long long done = m_done.load();
    if (m_o.common.verbosity > 0) {
        std::printf("worker %s: %lld frame%s, exiting%s\n", m_o.name.c_str(), done, done == 1 ? "" : "s",
                    g_stop.load() ? " (signal)" : "");
        std::fflush(stdout);
    }
    return m_dbExitCode;
}

// --gpu N: the Nth visible device (of CUDA_VISIBLE_DEVICES when set), before CUDA is first touched.
void selectGpu(int gpu) {
    if (gpu < 0) return;
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::string pick = std::to_string(gpu);
    if (visible && *visible) {
        std::vector<std::string> ids = splitList({visible});
        if (gpu >= static_cast<int>(ids.size()))
            throw InvalidInput("worker: --gpu " + std::to_string(gpu) + ": CUDA_VISIBLE_DEVICES=" + visible +
                               " lists " + std::to_string(ids.size()) + " device(s)");
        pick = ids[static_cast<std::size_t>(gpu)];
    }
    ::setenv("CUDA_VISIBLE_DEVICES", pick.c_str(), 1);
}

int runWorker(WorkerCli& o) {
    (void)parseRedisAddress(o.redis); // a malformed address fails before anything starts
    if (!redisSupported())
        throw IoError("worker: this build of gpuphot has no Redis support (built without hiredis: install "
                      "libhiredis-dev and rebuild)");
    if (o.name.empty()) {
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        o.name = std::string(host) + "-" + std::to_string(::getpid());
    }
    selectGpu(o.gpu);
    // One reducer (one RunContext) for the worker's life: the pool stays warm. Jobs bring their own
    // reduce options; the reducer's are the defaults of --config.
    ReduceCliOptions ro;
    ro.common = o.common;
    ro.common.verbosity = 0; // no --ref/Tycho-2 notes: jobs name their reference
    ro.noTycho2 = true;
    FrameReducer reducer(ro);
    struct sigaction sa {};
    sa.sa_handler = onWorkerStopSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    Worker w(o, reducer);
    return w.run();
}

// ---------------------------------------------------------------------------------------------------
// results

struct ResultsCli {
    std::string redis;
    Streams streams;
    bool dead = false, summary = false;
};

int runResults(ResultsCli& o) {
    RedisClient r(parseRedisAddress(o.redis));
    if (o.summary) {
        nlohmann::json j;
        j["frames"] = r.command({"XLEN", o.streams.frames()}).integer();
        j["results"] = r.command({"XLEN", o.streams.results()}).integer();
        j["dead"] = r.command({"XLEN", o.streams.dead()}).integer();
        const RedisReply p = r.commandAllowError({"XPENDING", o.streams.frames(), kGroup});
        j["pending"] = p.isError() || p.size() == 0 ? 0 : p[0].integer();
        nlohmann::json consumers = nlohmann::json::object();
        if (p.size() >= 4)
            for (std::size_t i = 0; i < p[3].size(); ++i)
                consumers[p[3][i][0].str()] = p[3][i][1].integer();
        j["pending_by_worker"] = consumers;
        std::printf("%s\n", j.dump().c_str());
        return 0;
    }
    const std::string stream = o.dead ? o.streams.dead() : o.streams.results();
    std::string start = "-";
    for (;;) {
        const RedisReply rep = r.command({"XRANGE", stream, start, "+", "COUNT", "1000"});
        if (rep.size() == 0) break;
        for (std::size_t i = 0; i < rep.size(); ++i) {
            const Fields f = rep[i][1].pairs();
            std::printf("%s\n", field(f, "json").c_str());
        }
        start = "(" + rep[rep.size() - 1][0].str();
    }
    std::fflush(stdout);
    return 0;
}

} // namespace

Command registerEnqueue(CLI::App& app) {
    auto o = std::make_shared<EnqueueCli>();
    auto* sub = app.add_subcommand("enqueue", "Add frames to the Redis stream that `gpuphot worker` reduces");
    addRedisOptions(*sub, o->redis, o->streams);
    sub->add_option("frames", o->frames, "FITS frames (paths are made absolute)");
    sub->add_option("-o,--outdir", o->outdir, "Output directory the workers write to")->capture_default_str();
    sub->add_option("--ref", o->reference,
                    "Reference catalog (FITS table or CSV) for crossmatch and zero point");
    sub->add_option("--ref-columns", o->refColumns, "Reference column map (as reduce --ref-columns)");
    sub->add_option("--config", o->config, "JSON file with stage parameters (see docs/CONFIG.md)");
    sub->add_option("--hdu", o->hdu, "HDU by 0-based number or EXTNAME");
    sub->add_option("--formats", o->formats, "Extra catalog formats: ecsv,csv,reg")->delimiter(',');
    sub->add_option("--maps", o->maps, "Maps to write: bkg,rms,seg,psf,resid")->delimiter(',');
    sub->add_flag("--force", o->force, "Reduce even when the outputs are complete");
    sub->add_flag("--write-solved", o->writeSolved, "Write STEM.solved.fits (as reduce --write-solved)");
    sub->add_flag("--ignore-header-wcs", o->ignoreHeaderWcs, "Solve as if the header had no WCS");
    sub->add_flag("-q,--quiet", o->quiet, "Do not print the entry ids");
    return {sub, [o] { return runEnqueue(*o); }};
}

Command registerWorker(CLI::App& app) {
    auto o = std::make_shared<WorkerCli>();
    auto* sub = app.add_subcommand("worker", "Long-lived worker: reduce frames taken from a Redis stream");
    addRedisOptions(*sub, o->redis, o->streams);
    addCommonOptions(*sub, o->common);
    sub->add_option("--gpu", o->gpu, "Use the Nth visible GPU (default: CUDA_VISIBLE_DEVICES as set)");
    sub->add_option("--name", o->name, "Consumer name (default: HOST-PID)");
    sub->add_option("--claim-idle", o->claimIdle,
                    "Claim jobs another worker has held this long without acknowledging (e.g. 30s, 500ms)")
        ->capture_default_str();
    sub->add_option("--max-attempts", o->maxAttempts,
                    "Deliveries of a job before it goes to the dead-letter stream")
        ->capture_default_str();
    sub->add_option("--max-frames", o->maxFrames, "Exit after this many frames (0: no limit)");
    addDbOption(*sub, o->db);
    sub->add_option("--prefetch", o->prefetch,
                    "Jobs read ahead while one is in its stages, the previous one's outputs written meanwhile "
                    "(0: one job at a time)")
        ->capture_default_str();
    sub->add_option("--concurrent", o->concurrent,
                    "Jobs in their stages at once in this worker, each with its own RunContext (CUDA stream "
                    "and memory pool; the GPU shared): overlaps the host parts of the stages")
        ->capture_default_str();
    sub->add_option(
        "--exit-when-idle", o->exitWhenIdle,
        "Exit after this many seconds without work once no job is pending (default: run forever)");
    return {sub, [o] { return runWorker(*o); }};
}

Command registerResults(CLI::App& app) {
    auto o = std::make_shared<ResultsCli>();
    auto* sub = app.add_subcommand("results", "Print the Redis workers' results (JSON lines) or a summary");
    addRedisOptions(*sub, o->redis, o->streams);
    sub->add_flag("--dead", o->dead, "Print the dead-letter stream instead");
    sub->add_flag("--summary", o->summary,
                  "Print one JSON object: queued, results, dead, pending per worker");
    return {sub, [o] { return runResults(*o); }};
}

} // namespace gpuphot::cli
