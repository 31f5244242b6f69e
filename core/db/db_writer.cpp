#include "core/db/db_writer.hpp"

#include <filesystem>
#include <fstream>

#include "core/io/fits_table.hpp"

namespace gpuphot {

namespace {

// The catalog columns the store keeps (db_records.cpp sourceColumns); the others are not read.
std::vector<std::string> storedColumns(const std::vector<std::string>& available) {
    static const char* const fixed[] = {"id",         "ra",           "dec",      "x",           "y",
                                        "flux_auto",  "fluxerr_auto", "flux_psf", "fluxerr_psf", "mag_cal",
                                        "magerr_cal", "fwhm",         "flags",    "ref_id"};
    std::vector<std::string> out;
    for (const std::string& name : available) {
        bool keep = name.rfind("flux_aper_", 0) == 0 || name.rfind("fluxerr_aper_", 0) == 0;
        for (const char* f : fixed)
            keep = keep || name == f;
        if (keep) out.push_back(name);
    }
    return out;
}

nlohmann::json readReport(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw IoError("cannot read " + path);
    try {
        return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        throw InvalidInput(path + ": not a report (" + e.what() + ")");
    }
}

// A frame as the store records it: by absolute path when the file is there, so that one frame is one row
// whichever directory the run started in.
std::string storedPath(const std::string& frame) {
    return std::filesystem::is_regular_file(frame)
               ? std::filesystem::absolute(frame).lexically_normal().string()
               : frame;
}

std::string framePathOf(const nlohmann::json& report) {
    const auto& frame = report.value("frame", nlohmann::json::object());
    return frame.value("path", std::string{});
}

} // namespace

DatabaseWriter::DatabaseWriter(std::string url, StoreOptions options, OnError onError, std::size_t queueLimit)
    : m_url(std::move(url)), m_options(options), m_onError(std::move(onError)),
      m_limit(std::max<std::size_t>(1, queueLimit)), m_thread([this] { run(); }) {}

DatabaseWriter::~DatabaseWriter() {
    finish();
    {
        std::lock_guard lock(m_mutex);
        m_stop = true;
    }
    m_cv.notify_all();
    m_thread.join();
}

void DatabaseWriter::enqueue(Job job) {
    std::unique_lock lock(m_mutex);
    m_cv.wait(lock, [&] { return m_queue.size() < m_limit; });
    m_queue.push_back(std::move(job));
    m_cv.notify_all();
}

void DatabaseWriter::submitFiles(const std::string& reportPath, const std::string& catalogPath,
                                 bool onlyIfMissing) {
    Job job;
    job.reportPath = reportPath;
    job.catalogPath = catalogPath;
    job.onlyIfMissing = onlyIfMissing;
    enqueue(std::move(job));
}

void DatabaseWriter::submit(nlohmann::json report, std::shared_ptr<const Table> catalog) {
    Job job;
    job.report = std::move(report);
    job.catalog = std::move(catalog);
    enqueue(std::move(job));
}

DatabaseWriterResult DatabaseWriter::finish() {
    std::unique_lock lock(m_mutex);
    m_cv.wait(lock, [&] { return m_queue.empty() && !m_busy; });
    return m_result;
}

void DatabaseWriter::run() {
    std::unique_lock lock(m_mutex);
    for (;;) {
        m_cv.wait(lock, [&] { return m_stop || !m_queue.empty(); });
        if (m_queue.empty()) return; // m_stop
        Job job = std::move(m_queue.front());
        m_queue.pop_front();
        m_busy = true;
        m_cv.notify_all();
        lock.unlock();
        write(job);
        lock.lock();
        m_busy = false;
        m_cv.notify_all();
    }
}

std::optional<std::pair<std::string, int>> frameOfCatalog(const std::string& catalogPath) {
    std::string report = catalogPath;
    const std::string suffix = ".cat.fits";
    if (report.size() <= suffix.size() ||
        report.compare(report.size() - suffix.size(), suffix.size(), suffix) != 0)
        return std::nullopt;
    report.replace(report.size() - suffix.size(), suffix.size(), ".report.json");
    try {
        const nlohmann::json j = readReport(report);
        const std::string frame = framePathOf(j);
        if (frame.empty()) return std::nullopt;
        return std::pair{storedPath(frame), j.value("frame", nlohmann::json::object()).value("hdu", 0)};
    } catch (const Error&) {
        return std::nullopt;
    }
}

bool storeReducedFrame(ResultsStore& store, const std::string& reportPath, std::string catalogPath,
                       bool onlyIfMissing, const nlohmann::json* reportInMemory,
                       const Table* catalogInMemory) {
    nlohmann::json report = reportInMemory ? *reportInMemory : readReport(reportPath);
    if (framePathOf(report).empty())
        throw InvalidInput((reportPath.empty() ? "report" : reportPath) + ": no frame.path");
    const bool onDisk = std::filesystem::is_regular_file(framePathOf(report));
    const std::string frame = storedPath(framePathOf(report));
    const int hdu = report.value("frame", nlohmann::json::object()).value("hdu", 0);
    if (onlyIfMissing && store.frameChecksum(frame, hdu)) return false;
    std::shared_ptr<Table> read;
    if (!catalogInMemory) {
        if (catalogPath.empty() && report.contains("outputs") && report["outputs"].is_object())
            catalogPath = report["outputs"].value("catalog", std::string{});
        if (catalogPath.empty()) throw InvalidInput(reportPath + ": the report names no catalog");
        read = std::make_shared<Table>(readFitsTable(catalogPath, {}, storedColumns));
    }
    FrameRecord record;
    record.report = std::move(report);
    record.report["frame"]["path"] = frame;
    record.catalog = catalogInMemory ? catalogInMemory : read.get();
    if (onDisk) record.checksum = fileChecksum(frame);
    record.status = record.report.value("zp", nlohmann::json()).is_number() ? "ok" : "uncalibrated";
    store.putFrame(record);
    return true;
}

// One frame: open the store when needed, write. Every failure is recorded against the frame; a
// DatabaseError closes the store so that the next frame reconnects.
void DatabaseWriter::write(Job& job) {
    const std::string frame = job.reportPath.empty() ? framePathOf(job.report) : job.reportPath;
    try {
        if (!m_store) m_store = openResultsStore(m_url, m_options);
        const bool wrote =
            storeReducedFrame(*m_store, job.reportPath, job.catalogPath, job.onlyIfMissing,
                              job.reportPath.empty() ? &job.report : nullptr, job.catalog.get());
        std::lock_guard lock(m_mutex);
        ++(wrote ? m_result.stored : m_result.alreadyStored);
    } catch (const std::exception& e) {
        const auto* dbe = dynamic_cast<const DatabaseError*>(&e);
        const DatabaseError error = dbe ? *dbe : DatabaseError(DatabaseError::Kind::Other, e.what());
        if (dbe) m_store.reset();
        if (m_onError) m_onError(frame, error);
        std::lock_guard lock(m_mutex);
        m_result.notStored.push_back(frame);
        if (!m_result.firstError) m_result.firstError = error;
    }
}

} // namespace gpuphot
