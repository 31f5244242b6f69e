// reduceExposure: the CCDs of a mosaic exposure through the single-frame phases, several at once, then
// the exposure's calibration and outputs (exposure.hpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "core/catalog/table.hpp"
#include "core/io/atomic_file.hpp"
#include "core/io/fits_table.hpp"
#include "core/model/flags.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/exposure.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/pipeline/sextractor_catalog.hpp"
#include "core/util/errors.hpp"
#include "core/util/json_number.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {
namespace fs = std::filesystem;

namespace {

// What the exposure keeps of one CCD's reduction (its pixels and maps are gone once its own products are
// written).
struct CcdOutcome {
    ExposureExtension ext;
    bool done = false;
    std::string error; // the CCD failed: why
    std::exception_ptr failure;
    Table catalog;
    std::optional<Table> targets;
    nlohmann::json report;
    std::vector<std::string> warnings, written;
    nlohmann::json outputs = nlohmann::json::object();
    CcdZeroPoint zp;
    std::vector<double> magInst, magInstErr;
    std::optional<LdacPart> ldac, sextractor;
    std::optional<SolvedHdu> solvedHdu;
    bool calibrationFailed = false;
    std::size_t sources = 0;
    double seconds = 0.0;
    int gpu = -1; // the GPU of the context that reduced it (-1: the CPU backend)
    // Astrometry: a verified fit, and where the header and the fit put the CCD's centre (deg).
    bool solved = false;
    std::string astrometry; // "own" (its header WCS refined, or its blind solve), "exposure" (the header
                            // moved by the exposure's pointing error, then refined), "none"
    bool headerWcs = false;
    double headerRa = NAN, headerDec = NAN, fitRa = NAN, fitDec = NAN;
};

// The exposure's pointing error: where the fits put the solved CCDs' centres less where their headers do
// (deg: RA times cos Dec, and Dec).
struct PointingShift {
    double east = 0.0, north = 0.0;
};

// The GPU a context's stages run on: the one it names, else the first visible one; -1 on the CPU backend.
int contextGpu(const RunContext& ctx) {
    return ctx.backend == Backend::Cuda ? std::max(ctx.device, 0) : -1;
}

bool wantsLdac(const OutputOptions& o) {
    return std::find(o.formats.begin(), o.formats.end(), "ldac") != o.formats.end();
}

// The header WCS moved by the pointing error (CRVAL shifted; CD and distortion kept).
std::shared_ptr<const Wcs> shifted(const Wcs& wcs, const PointingShift& shift) {
    Header h = wcs.toHeader();
    const double ra = h.getDouble("CRVAL1").value_or(0.0), dec = h.getDouble("CRVAL2").value_or(0.0);
    h.set("CRVAL1", ra + shift.east / std::max(1e-6, std::cos(dec * M_PI / 180.0)));
    h.set("CRVAL2", std::clamp(dec + shift.north, -90.0, 90.0));
    return std::make_shared<const Wcs>(Wcs::fromHeader(h));
}

void noteAstrometry(const Frame& frame, const PipelineResult& r, CcdOutcome& out) {
    out.solved = r.fittedWcs != nullptr;
    out.headerWcs = frame.wcs != nullptr;
    if (!out.solved || !frame.wcs) return;
    const double cx = 0.5 * (frame.width() - 1), cy = 0.5 * (frame.height() - 1);
    std::tie(out.headerRa, out.headerDec) = frame.wcs->pixelToWorld(cx, cy);
    std::tie(out.fitRa, out.fitDec) = r.fittedWcs->pixelToWorld(cx, cy);
}

void reduceCcd(const std::string& path, const ReduceOptions& base, const std::string& stem, CcdOutcome& out,
               RunContext& ctx, const PointingShift* shift) {
    ReduceOptions o = base;
    o.read.hdu = std::to_string(out.ext.hdu);
    o.output.writeSolved = false; // one STEM.solved.fits for the exposure
    useContextDevice(ctx);        // the raw upload of the read on ctx's GPU
    LoadedFrame loaded = readFramePhase(path, o);
    if (shift && loaded.frame.wcs) loaded.frame.wcs = shifted(*loaded.frame.wcs, *shift);
    ComputedFrame c = computeFramePhase(std::move(loaded), o, ctx);
    const PipelineResult& r = c.result;
    CcdOutcome fresh; // a second try replaces the first
    fresh.ext = out.ext;
    out = std::move(fresh);
    noteAstrometry(c.frame, r, out);
    out.astrometry = !out.solved ? "none" : shift ? "exposure" : "own";
    if (o.write) {
        writeImageProducts(c.frame, r, o.output, stem + "." + out.ext.token, out.ext.token + ".", out.outputs,
                           out.written);
        if (wantsLdac(o.output))
            out.ldac = sextractorPart(c.frame, r, c.catalog,
                                      ldacOptions(o.output, static_cast<int>(r.aperture.radii.size())));
        if (o.output.sextractorCatalog)
            out.sextractor = sextractorPart(c.frame, r, c.catalog, o.output.sextractor);
    }
    if (base.output.writeSolved && r.fittedWcs) {
        char history[80];
        std::snprintf(history, sizeof history, "WCS replaced by gpuphot's %s fit: RMS %.3f arcsec, %d stars",
                      r.astrometry.method.c_str(), r.astrometry.rmsArcsec, r.astrometry.nUsed);
        out.solvedHdu = SolvedHdu{out.ext.hdu, r.astrometry.wcs.toHeader(), history};
    }
    out.zp = {r.zeropoint.ok, r.zeropoint.zp, r.zeropoint.zpErr, r.zeropoint.nUsed};
    out.magInst = r.magInst;
    out.magInstErr = r.magInstErr;
    out.catalog = std::move(c.catalog);
    out.targets = std::move(c.targets);
    out.report = std::move(c.summary.report);
    out.warnings = std::move(c.summary.warnings);
    out.sources = c.summary.sources;
    out.calibrationFailed = c.summary.calibrationFailed;
    out.seconds = c.summary.seconds;
    out.gpu = contextGpu(ctx);
    out.done = true;
}

// K threads, each with its own context, take the CCDs in order. A CCD's error is kept with it; Cancelled
// stops every thread and is rethrown.
void reduceCcds(const std::string& path, const ReduceOptions& options, const std::string& stem,
                std::vector<CcdOutcome>& ccds, const std::vector<std::size_t>& which,
                const std::vector<RunContext*>& contexts, const PointingShift* shift = nullptr) {
    std::atomic<std::size_t> next{0}, finished{0};
    std::atomic<bool> cancelled{false};
    std::exception_ptr cancel;
    std::mutex m;
    auto worker = [&](RunContext& ctx) {
        const OmpThreadLimit share(ctx.threadCount());
        for (std::size_t n; !cancelled && (n = next++) < which.size();) {
            const std::size_t i = which[n];
            try {
                reduceCcd(path, options, stem, ccds[i], ctx, shift);
            } catch (const Cancelled&) {
                std::lock_guard lock(m);
                cancelled = true;
                cancel = std::current_exception();
            } catch (const std::exception& e) {
                if (!ccds[i].done) { // a second try that fails keeps the first one's result
                    ccds[i].error = e.what();
                    ccds[i].failure = std::current_exception();
                }
            }
            ctx.report("exposure", static_cast<double>(++finished) / static_cast<double>(which.size()));
        }
    };
    const std::size_t k = std::min(contexts.size(), which.size());
    std::vector<std::thread> threads;
    for (std::size_t t = 1; t < k; ++t)
        threads.emplace_back(worker, std::ref(*contexts[t]));
    worker(*contexts[0]);
    for (auto& t : threads)
        t.join();
    if (cancel) std::rethrow_exception(cancel);
}

std::vector<std::size_t> unsolved(const std::vector<CcdOutcome>& ccds, bool withHeaderWcs) {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < ccds.size(); ++i)
        if (ccds[i].done && !ccds[i].solved && ccds[i].headerWcs == withHeaderWcs) out.push_back(i);
    return out;
}

// The median of (fit - header) over the CCDs solved from their header WCS; nullopt when none was.
std::optional<PointingShift> pointingShift(const std::vector<CcdOutcome>& ccds) {
    std::vector<double> east, north;
    for (const CcdOutcome& c : ccds)
        if (c.done && c.solved && std::isfinite(c.headerRa) && std::isfinite(c.fitRa)) {
            double dra = c.fitRa - c.headerRa;
            dra -= 360.0 * std::round(dra / 360.0);
            east.push_back(dra * std::cos(c.fitDec * M_PI / 180.0));
            north.push_back(c.fitDec - c.headerDec);
        }
    if (east.empty()) return std::nullopt;
    for (auto* v : {&east, &north})
        std::nth_element(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(v->size() / 2), v->end());
    return PointingShift{east[east.size() / 2], north[north.size() / 2]};
}

// Astrometry across the exposure when the blind solve is automatic: every CCD is first refined from its
// header only. When some fail (the headers are wrong), the failed CCD with the most sources is solved
// blind unless another already solved, the exposure's pointing error is measured from the solved CCDs,
// the failed CCDs' headers are moved by it and refined again; a CCD still unsolved, or without any header
// WCS, gets its own blind solve. Good headers cost nothing more; wrong ones cost one blind solve instead of
// one per CCD. Returns the pointing shift applied (nullopt: none).
std::optional<PointingShift> solveExposure(const std::string& path, const ReduceOptions& options,
                                           const std::string& stem, std::vector<CcdOutcome>& ccds,
                                           const std::vector<RunContext*>& contexts) {
    std::vector<std::size_t> all(ccds.size());
    std::iota(all.begin(), all.end(), std::size_t{0});
    const bool common = options.reference && options.config.fitAstrometry &&
                        options.config.astrometry.blind < 0 && ccds.size() > 1;
    if (!common) {
        reduceCcds(path, options, stem, ccds, all, contexts);
        return std::nullopt;
    }
    ReduceOptions refineOnly = options;
    refineOnly.config.astrometry.blind = 0;
    reduceCcds(path, refineOnly, stem, ccds, all, contexts);
    std::vector<std::size_t> failed = unsolved(ccds, true);
    std::optional<PointingShift> shift;
    if (!failed.empty()) {
        if (!pointingShift(ccds)) {
            const auto most =
                std::max_element(failed.begin(), failed.end(), [&](std::size_t a, std::size_t b) {
                    return ccds[a].sources < ccds[b].sources;
                });
            reduceCcds(path, options, stem, ccds, {*most}, contexts);
        }
        shift = pointingShift(ccds);
        if (shift) reduceCcds(path, refineOnly, stem, ccds, unsolved(ccds, true), contexts, &*shift);
    }
    std::vector<std::size_t> rest = unsolved(ccds, true), bare = unsolved(ccds, false);
    rest.insert(rest.end(), bare.begin(), bare.end());
    if (!rest.empty()) reduceCcds(path, options, stem, ccds, rest, contexts);
    return shift;
}

// Appends column `from` to `to` (same type; the other's length of NaN / -1 / "" when absent).
void appendColumn(ColumnData& to, const Column* from, std::size_t rows) {
    std::visit(
        [&](auto& dst) {
            using V = std::decay_t<decltype(dst)>;
            if (from && std::holds_alternative<V>(from->data)) {
                const V& src = std::get<V>(from->data);
                dst.insert(dst.end(), src.begin(), src.end());
                return;
            }
            using T = typename V::value_type;
            if constexpr (std::is_same_v<T, std::string>)
                dst.insert(dst.end(), rows, std::string());
            else if constexpr (std::is_floating_point_v<T>)
                dst.insert(dst.end(), rows, std::numeric_limits<T>::quiet_NaN());
            else
                dst.insert(dst.end(), rows, T(-1));
        },
        to);
}

// The CCDs' tables one after another, `ccd` and `extname` first; `keep` picks a CCD's rows (null: all).
Table concatenate(const std::vector<CcdOutcome>& ccds, const std::vector<const Table*>& tables,
                  const std::vector<std::vector<bool>>* keep = nullptr) {
    Table out;
    const Table* first = nullptr;
    for (const Table* t : tables)
        if (t && !first) first = t;
    if (!first) return out;
    out.name = first->name;
    out.meta = first->meta;
    std::vector<std::int16_t> ccd;
    std::vector<std::string> extname;
    std::vector<Column> cols;
    for (const Column& c : first->columns()) {
        Column e{c.name, c.unit, c.description, {}};
        std::visit([&](const auto& v) { e.data = std::decay_t<decltype(v)>{}; }, c.data);
        cols.push_back(std::move(e));
    }
    for (std::size_t k = 0; k < ccds.size(); ++k) {
        const Table* t = tables[k];
        if (!t) continue;
        Table picked;
        const Table* src = t;
        if (keep) { // the rows this CCD keeps
            for (const Column& c : t->columns()) {
                Column e{c.name, c.unit, c.description, {}};
                std::visit(
                    [&](const auto& v) {
                        std::decay_t<decltype(v)> sub;
                        for (std::size_t i = 0; i < v.size(); ++i)
                            if ((*keep)[k][i]) sub.push_back(v[i]);
                        e.data = std::move(sub);
                    },
                    c.data);
                picked.columns().push_back(std::move(e));
            }
            src = &picked;
        }
        const std::size_t rows = src->rows();
        ccd.insert(ccd.end(), rows, static_cast<std::int16_t>(ccds[k].ext.hdu));
        extname.insert(extname.end(), rows, ccds[k].ext.extname);
        for (Column& c : cols)
            appendColumn(c.data, src->find(c.name), rows);
    }
    out.add("ccd", ccd, "", "HDU number of the CCD (0-based, as --hdu takes it)");
    out.add("extname", extname, "", "EXTNAME of the CCD");
    for (Column& c : cols)
        out.columns().push_back(std::move(c));
    return out;
}

// A CCD without a zero point of its own is calibrated with the exposure's.
void applyExposureZeroPoint(CcdOutcome& c, const ExposureCalibration& cal) {
    if (c.zp.ok || !cal.ok || !c.catalog.find("mag_cal")) return;
    auto& mag = c.catalog.find("mag_cal")->as<double>();
    auto& err = c.catalog.find("magerr_cal")->as<double>();
    for (std::size_t i = 0; i < mag.size() && i < c.magInst.size(); ++i) {
        if (!std::isfinite(c.magInst[i])) continue;
        mag[i] = c.magInst[i] + cal.zp;
        err[i] = std::hypot(i < c.magInstErr.size() ? c.magInstErr[i] : 0.0, cal.zpErr);
    }
}

nlohmann::json ccdEntry(const CcdOutcome& c, const ExposureCalibration& cal, std::size_t k) {
    ExposureCcdSummary e;
    e.hdu = c.ext.hdu;
    e.extname = c.ext.extname;
    e.token = c.ext.token;
    e.width = c.ext.width;
    e.height = c.ext.height;
    e.status = c.done ? "ok" : "failed";
    e.error = c.error;
    if (c.done) {
        e.sources = static_cast<long long>(c.sources);
        e.seconds = c.seconds;
        e.fwhm = numberOrNaN(c.report, "fwhm");
        e.rms = numberOrNaN(c.report, "astrometric_rms_arcsec");
        e.zp = c.zp.ok ? c.zp.zp : std::nan("");
        e.zpErr = c.zp.ok ? c.zp.zpErr : std::nan("");
        e.calibrators = c.zp.calibrators;
        e.gpu = c.gpu;
        e.zpOffset = cal.offset[k];
        e.zpOffsetErr = cal.offsetErr[k];
        e.outlier = cal.outlier[k];
        e.zpUsed = c.zp.ok ? "own" : cal.ok ? "exposure" : "none";
        e.astrometry = c.astrometry;
        e.warnings = c.warnings;
    }
    nlohmann::json j = e;
    if (c.done) j["report"] = c.report;
    return j;
}

// The GPUs the first n contexts run on (0 on the CPU backend).
int gpusUsed(const std::vector<RunContext*>& contexts, std::size_t n) {
    std::vector<int> devices;
    for (std::size_t k = 0; k < n && k < contexts.size(); ++k)
        if (const int gpu = contextGpu(*contexts[k]); gpu >= 0) devices.push_back(gpu);
    std::sort(devices.begin(), devices.end());
    return static_cast<int>(std::unique(devices.begin(), devices.end()) - devices.begin());
}

nlohmann::json exposureSection(const std::string& path, const std::vector<CcdOutcome>& ccds,
                               const ExposureCalibration& cal, const ExposureParams& p, int concurrent,
                               int gpus) {
    nlohmann::json list = nlohmann::json::array(), outliers = nlohmann::json::array(),
                   failed = nlohmann::json::array();
    for (std::size_t k = 0; k < ccds.size(); ++k) {
        list.push_back(ccdEntry(ccds[k], cal, k));
        if (cal.outlier[k])
            outliers.push_back(ccds[k].ext.extname.empty() ? ccds[k].ext.token : ccds[k].ext.extname);
        if (!ccds[k].done) failed.push_back(ccds[k].ext.token);
    }
    return {{"file", path},
            {"ccds", ccds.size()},
            {"failed", failed},
            {"zp", cal.ok ? finiteOrNull(cal.zp) : nlohmann::json(nullptr)},
            {"zp_err", cal.ok ? finiteOrNull(cal.zpErr) : nlohmann::json(nullptr)},
            {"zp_method", "median of the CCDs' own zero points"},
            {"zp_ccds_used", cal.ccdsUsed},
            {"zp_offset_scatter", cal.ok ? finiteOrNull(cal.scatter) : nlohmann::json(nullptr)},
            {"zp_outliers", outliers},
            {"params",
             {{"concurrent", concurrent},
              {"gpus", gpus},
              {"outlier_sigma", p.outlierSigma},
              {"outlier_min_mag", p.outlierMinMag}}},
            {"extensions", list}};
}

double medianOf(std::vector<double> v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
    if (v.empty()) return std::nan("");
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The exposure's summary numbers at the report's top level, where the status line reads them.
void summarise(nlohmann::json& report, const std::vector<CcdOutcome>& ccds, const ExposureCalibration& cal,
               Table& catalog) {
    std::vector<double> fwhm, rms;
    int matched = 0;
    for (const CcdOutcome& c : ccds) {
        if (!c.done) continue;
        if (c.report.contains("fwhm") && c.report["fwhm"].is_number()) fwhm.push_back(c.report["fwhm"]);
        if (c.report.contains("astrometric_rms_arcsec") && c.report["astrometric_rms_arcsec"].is_number())
            rms.push_back(c.report["astrometric_rms_arcsec"]);
        if (c.report.contains("calibration") && c.report["calibration"].is_object())
            matched += c.report["calibration"].value("matched", 0);
    }
    report["fwhm"] = finiteOrNull(medianOf(fwhm));
    report["astrometric_rms_arcsec"] = finiteOrNull(medianOf(rms));
    report["zp"] = cal.ok ? finiteOrNull(cal.zp) : nlohmann::json(nullptr);
    report["zp_err"] = cal.ok ? finiteOrNull(cal.zpErr) : nlohmann::json(nullptr);
    report["calibration"] = {{"matched", matched}};
    Header& h = catalog.meta;
    h.set("ZP", cal.ok ? cal.zp : std::nan(""), "[mag] exposure zero point (median of the CCDs')");
    h.set("ZPERR", cal.ok ? cal.zpErr : std::nan(""), "[mag] error of ZP");
    h.set("FWHM", medianOf(fwhm), "[pix] median of the CCDs' FWHM");
    h.set("NCCD", static_cast<long long>(ccds.size()), "CCDs of the exposure");
    for (const char* per : {"NCALIB", "NMATCH", "MAGLIM", "BKGLEVEL", "BKGRMS", "GAIN", "RDNOISE", "NPSFSTAR",
                            "ELLIPTIC", "ZPCOLTRM", "ZPEXPT", "NAPCSTAR"})
        h.remove(per); // per CCD: in the report's extensions
}

// STEM.cat.fits and its formats, STEM.ldac / the SExtractor catalog (one part per CCD), STEM.targets.fits,
// STEM.solved.fits (every CCD's fitted WCS), and the report last.
void writeExposureOutputs(const std::string& path, const std::string& stem,
                          const std::vector<CcdOutcome>& ccds, const Table& catalog,
                          const std::optional<Table>& targets, const OutputOptions& o, ReduceSummary& s) {
    const fs::path dir(o.outdir);
    auto at = [&](const std::string& suffix) { return (dir / (stem + suffix)).string(); };
    nlohmann::json outputs = nlohmann::json::object();
    std::vector<LdacPart> ldac, sex;
    std::vector<SolvedHdu> solved;
    for (const CcdOutcome& c : ccds) {
        outputs.update(c.outputs);
        s.outputs.insert(s.outputs.end(), c.written.begin(), c.written.end());
        if (c.ldac) ldac.push_back(*c.ldac);
        if (c.sextractor) sex.push_back(*c.sextractor);
        if (c.solvedHdu) solved.push_back(*c.solvedHdu);
    }
    auto record = [&](const std::string& key, const std::string& p) {
        outputs[key] = p;
        s.outputs.push_back(p);
    };
    if (!solved.empty()) {
        writeSolvedFrame(path, solved, at(".solved.fits"));
        record("solved", at(".solved.fits"));
    }
    if (targets) writeTargetTables(*targets, o, stem, outputs, s.outputs);
    writeFitsTable(at(".cat.fits"), catalog);
    record("catalog", at(".cat.fits"));
    writeCatalogFormats(catalog, o, stem, outputs, s.outputs);
    if (wantsLdac(o)) {
        writeFitsLdac(at(".ldac"), ldac);
        record("ldac", at(".ldac"));
    }
    if (o.sextractorCatalog) {
        const std::string p =
            (dir / (o.sextractor.prefixStem ? stem + "." + o.sextractor.name : o.sextractor.name)).string();
        writeSextractorCatalog(p, sex, o.sextractor);
        record("sextractor", p);
    }
    outputs["report"] = at(".report.json");
    s.report["outputs"] = outputs;
    writeTextFileAtomic(at(".report.json"), s.report.dump(2) + "\n");
    s.outputs.push_back(at(".report.json"));
}

} // namespace

ReduceSummary reduceExposure(const std::string& path, const std::vector<ExposureExtension>& extensions,
                             const ReduceOptions& options, const std::vector<RunContext*>& contexts) {
    const auto start = std::chrono::steady_clock::now();
    if (extensions.empty()) throw InvalidInput(path + ": no image extension to reduce");
    if (contexts.empty() || !contexts.front()) throw std::logic_error("reduceExposure: no RunContext");
    if (options.write) validateOutputOptions(options.output);
    const std::string stem = frameStem(path);
    std::vector<CcdOutcome> ccds(extensions.size());
    for (std::size_t k = 0; k < ccds.size(); ++k)
        ccds[k].ext = extensions[k];
    // The cores are shared among the CCDs in flight: a context that would take them all gets its share.
    const std::size_t inFlight = std::min(contexts.size(), ccds.size());
    std::vector<int> threads;
    for (std::size_t k = 0; k < inFlight; ++k) {
        threads.push_back(contexts[k]->threads);
        contexts[k]->threads = threadShare(*contexts[k], static_cast<int>(inFlight));
    }
    struct Restore {
        const std::vector<RunContext*>& contexts;
        const std::vector<int>& threads;
        ~Restore() {
            for (std::size_t k = 0; k < threads.size(); ++k)
                contexts[k]->threads = threads[k];
        }
    } restore{contexts, threads};
    const std::optional<PointingShift> shift = solveExposure(path, options, stem, ccds, contexts);
    const auto ok = std::count_if(ccds.begin(), ccds.end(), [](const CcdOutcome& c) { return c.done; });
    if (ok == 0) std::rethrow_exception(ccds.front().failure);

    std::vector<CcdZeroPoint> zps;
    for (const CcdOutcome& c : ccds)
        zps.push_back(c.done ? c.zp : CcdZeroPoint{});
    const ExposureCalibration cal = calibrateExposure(zps, options.exposure);
    ReduceSummary s;
    s.frame = path;
    std::vector<const Table*> catalogs, targets;
    std::vector<std::vector<bool>> onCcd;
    for (std::size_t k = 0; k < ccds.size(); ++k) {
        CcdOutcome& c = ccds[k];
        if (!c.done) {
            s.warnings.push_back(c.ext.token + ": not reduced: " + c.error);
            catalogs.push_back(nullptr);
            targets.push_back(nullptr);
            onCcd.emplace_back();
            continue;
        }
        applyExposureZeroPoint(c, cal);
        for (const std::string& w : c.warnings)
            s.warnings.push_back(c.ext.token + ": " + w);
        if (cal.outlier[k])
            s.warnings.push_back(c.ext.token + ": zero point " + std::to_string(cal.offset[k]) +
                                 " mag from the exposure's (an outlier)");
        s.sources += c.sources;
        s.calibrationFailed = s.calibrationFailed || (c.calibrationFailed && !cal.ok);
        catalogs.push_back(&c.catalog);
        targets.push_back(c.targets ? &*c.targets : nullptr);
        std::vector<bool> keep;
        if (c.targets)
            for (double f : c.targets->doubles("flags"))
                keep.push_back((static_cast<std::uint32_t>(f) & FlagTargetOffFrame) == 0);
        onCcd.push_back(std::move(keep));
    }
    Table catalog = concatenate(ccds, catalogs);
    s.report = {{"frame", path}, {"sources", s.sources}};
    summarise(s.report, ccds, cal, catalog);
    const int concurrent = static_cast<int>(std::min(contexts.size(), ccds.size()));
    s.report["exposure"] = exposureSection(path, ccds, cal, options.exposure, concurrent,
                                           gpusUsed(contexts, static_cast<std::size_t>(concurrent)));
    if (shift)
        s.report["exposure"]["pointing_shift_arcsec"] = {{"east", shift->east * 3600.0},
                                                         {"north", shift->north * 3600.0}};
    std::optional<Table> targetTable;
    if (options.targets) {
        targetTable = concatenate(ccds, targets, &onCcd);
        const std::size_t placed =
            std::count_if(onCcd.begin(), onCcd.end(), [](const auto& v) { return !v.empty(); });
        std::size_t none = 0;
        for (std::size_t i = 0; placed && i < options.targets->size(); ++i)
            none +=
                std::none_of(onCcd.begin(), onCcd.end(), [&](const auto& v) { return i < v.size() && v[i]; });
        if (none)
            s.warnings.push_back("--targets: " + std::to_string(none) + " of " +
                                 std::to_string(options.targets->size()) + " targets fall on no CCD");
    }
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    s.report["seconds"] = s.seconds;
    s.report["warnings"] = s.warnings;
    if (options.write) writeExposureOutputs(path, stem, ccds, catalog, targetTable, options.output, s);
    return s;
}

} // namespace gpuphot
