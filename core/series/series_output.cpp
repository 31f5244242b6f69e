#include "core/series/series_output.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <type_traits>

#include <fitsio.h>

#include "core/io/atomic_file.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/series/series_internal.hpp"
#include "core/util/errors.hpp"
#include "core/util/json_number.hpp"

namespace gpuphot {
namespace {

namespace fs = std::filesystem;

// `v` with `digits` decimals ("nan" when not finite), appended.
void put(std::string& out, double v, int digits) {
    if (!std::isfinite(v)) {
        out += "nan";
        return;
    }
    char b[64];
    const auto r = std::to_chars(b, b + sizeof b, v, std::chars_format::fixed, digits);
    out.append(b, r.ptr);
}

void put(std::string& out, std::size_t v) {
    char b[24];
    const auto r = std::to_chars(b, b + sizeof b, v);
    out.append(b, r.ptr);
}

// AAVSO filter codes for the common names (docs: AAVSO extended file format).
std::string aavsoFilter(const std::string& f) {
    static const std::pair<const char*, const char*> map[] = {
        {"U", "U"},      {"B", "B"},      {"V", "V"},  {"R", "R"},  {"I", "I"},  {"Rc", "R"},
        {"Ic", "I"},     {"u", "SU"},     {"g", "SG"}, {"r", "SR"}, {"i", "SI"}, {"z", "SZ"},
        {"clear", "CV"}, {"CLEAR", "CV"}, {"C", "CV"}, {"L", "CV"}};
    for (const auto& [from, to] : map)
        if (f == from) return to;
    return f.empty() ? "na" : f;
}

std::string aijTable(const SeriesResult& s, const LightCurve& lc) {
    std::string o =
        " \tLabel\tslice\tJD_UTC\tJ.D.-2400000\tBJD_TDB\tHJD_UTC\tAIRMASS\tEXPTIME\trel_flux_T1\trel_flux_"
        "err_T1"
        "\tSource-Sky_T1\tSource_Error_T1\tX(FITS)_T1\tY(FITS)_T1\tSky/Pixel_T1\ttot_C_cnts\tFWHM_Mean\n";
    o.reserve(lc.frame.size() * 200);
    for (std::size_t k = 0; k < lc.frame.size(); ++k) {
        put(o, k + 1);
        o += '\t';
        const std::string& path = s.frames[lc.frame[k]].path;
        o.append(path, path.find_last_of('/') + 1); // the file name (npos + 1 = 0: no directory)
        o += '\t';
        put(o, k + 1);
        const std::pair<double, int> cells[] = {
            {lc.jdUtc[k], 7},   {lc.jdUtc[k] - 2400000.0, 7}, {lc.bjdTdb[k], 7},  {lc.hjdUtc[k], 7},
            {lc.airmass[k], 4}, {lc.exptime[k], 3},           {lc.relFlux[k], 7}, {lc.relFluxErr[k], 7},
            {lc.flux[k], 3},    {lc.fluxErr[k], 3},           {lc.x[k], 3},       {lc.y[k], 3},
            {lc.sky[k], 3},     {lc.ensembleFlux[k], 7},      {lc.fwhm[k], 3}};
        for (const auto& [v, digits] : cells) {
            o += '\t';
            put(o, v, digits);
        }
        o += '\n';
    }
    return o;
}

std::string aavsoReport(const SeriesResult& s, const LightCurve& lc, const std::string& obscode) {
    std::string o =
        "#TYPE=EXTENDED\n#OBSCODE=" + obscode +
        "\n#SOFTWARE=gpuphot " GPUPHOT_VERSION "\n#DELIM=,\n#DATE=JD\n"
        "#OBSTYPE=CCD\n#NAME,DATE,MAG,MERR,FILT,TRANS,MTYPE,CNAME,CMAG,KNAME,KMAG,AMASS,GROUP,CHART,"
        "NOTES\n";
    int used = 0;
    for (const auto& e : lc.ensemble)
        used += e.dropped ? 0 : 1;
    const std::string filter = aavsoFilter(s.filter),
                      notes = "ensemble of " + std::to_string(used) + " comparison stars\n";
    o.reserve(lc.frame.size() * 120);
    for (std::size_t k = 0; k < lc.frame.size(); ++k) {
        const bool std = std::isfinite(lc.mag[k]);
        const double mag = std ? lc.mag[k] : lc.diffMag[k];
        if (!std::isfinite(mag)) continue;
        o += lc.name;
        o += ',';
        put(o, lc.jdUtc[k], 5);
        o += ',';
        put(o, mag, 4);
        o += ',';
        put(o, lc.magErr[k], 4);
        o += ',';
        o += filter;
        o += std ? ",NO,STD,ENSEMBLE,na,na,na," : ",NO,DIF,ENSEMBLE,na,na,na,";
        put(o, lc.airmass[k], 4);
        o += ",na,na,";
        o += notes;
    }
    return o;
}

// The per-star columns of the all-stars outputs (series.stars.fits, series.variables.csv), of every
// star or of the flagged ones only.
struct StarColumns {
    std::vector<int> id, variable, points, comparisons;
    std::vector<double> ra, dec, mag, rms, medianErr, chi2, stetson, period, falseAlarm;
};

StarColumns gatherStars(const SeriesResult& s, bool variablesOnly) {
    StarColumns g;
    for (const auto& c : s.stars) {
        if (variablesOnly && !c.variable) continue;
        const SeriesSource& src = s.sources[c.source];
        g.id.push_back(static_cast<int>(c.source));
        g.ra.push_back(src.ra);
        g.dec.push_back(src.dec);
        g.mag.push_back(src.medianMagCal);
        g.rms.push_back(c.rms);
        g.medianErr.push_back(c.medianErr);
        g.chi2.push_back(c.chi2);
        g.stetson.push_back(c.stetsonJ);
        g.variable.push_back(c.variable ? 1 : 0);
        g.points.push_back(c.points);
        g.comparisons.push_back(c.comparisons);
        g.period.push_back(c.bestPeriod);
        g.falseAlarm.push_back(c.falseAlarm);
    }
    return g;
}

Table starsTable(const SeriesResult& s) {
    StarColumns g = gatherStars(s, false);
    Table t;
    t.name = "STARS";
    t.add("source", std::move(g.id), "", "row of the series' source list");
    t.add("ra", std::move(g.ra), "deg", "mean position of the matched detections (ICRS)");
    t.add("dec", std::move(g.dec), "deg", "");
    t.add("mag_cal", std::move(g.mag), "mag", "median calibrated magnitude (NaN: not calibrated)");
    t.add("rms", std::move(g.rms), "", "RMS of rel_flux about 1");
    t.add("median_err", std::move(g.medianErr), "", "median rel_flux_err");
    t.add("chi2", std::move(g.chi2), "", "reduced chi^2 of rel_flux about 1 (variability)");
    t.add("stetson_j", std::move(g.stetson), "", "Stetson J of rel_flux (variability)");
    t.add("variable", std::move(g.variable), "",
          "1: flagged variable (J or chi2 above its bar), no comparison star");
    t.add("points", std::move(g.points), "", "frames with a measurement");
    t.add("n_comparison", std::move(g.comparisons), "", "comparison stars of its ensemble");
    t.meta.set("FILTER", s.filter);
    t.meta.set("FLUXCOL", s.params.flux, "catalog flux used");
    return t;
}

// The flagged stars of the all-stars table, one row each.
Table variablesTable(const SeriesResult& s) {
    StarColumns g = gatherStars(s, true);
    Table t;
    t.add("source", std::move(g.id), "", "row of the series' source list");
    t.add("ra", std::move(g.ra), "deg");
    t.add("dec", std::move(g.dec), "deg");
    t.add("mag_cal", std::move(g.mag), "mag", "median calibrated magnitude");
    t.add("rms", std::move(g.rms), "", "RMS of rel_flux about 1");
    t.add("chi2", std::move(g.chi2), "", "reduced chi^2 of rel_flux about 1");
    t.add("stetson_j", std::move(g.stetson), "", "Stetson J of rel_flux");
    t.add("best_period", std::move(g.period), "d", "Lomb-Scargle periodogram's peak");
    t.add("false_alarm", std::move(g.falseAlarm), "", "false-alarm probability of that peak (Baluev 2008)");
    return t;
}

// A target's fitted transit in series.json: times as BJD_TDB, the mid-time's error in minutes, the
// duration in hours.
nlohmann::json transitJson(const TransitFit& f) {
    return {{"found", f.found},
            {"covered", f.covered},
            {"depth", finiteOrNull(f.depth)},
            {"depth_err", finiteOrNull(f.depthErr)},
            {"mid_bjd_tdb", finiteOrNull(f.mid)},
            {"mid_err_min", finiteOrNull(f.midErr * 1440.0)},
            {"duration_h", finiteOrNull(f.duration * 24.0)},
            {"ingress", finiteOrNull(f.ingress)},
            {"baseline", finiteOrNull(f.baseline)},
            {"snr", finiteOrNull(f.snr)},
            {"chi2", finiteOrNull(f.chi2)},
            {"points", f.points},
            {"in_transit", f.inTransit}};
}

// A target's variability indices, periodogram peak, transit and detrending in series.json.
void addAnalysis(nlohmann::json& t, const LightCurve& lc, const SeriesParams& p) {
    t["variability"] = {
        {"stetson_j", finiteOrNull(lc.stetsonJ)}, {"chi2", finiteOrNull(lc.chi2)}, {"variable", lc.variable}};
    if (p.findVariables) {
        t["variability"]["best_period"] = finiteOrNull(lc.bestPeriod);
        t["variability"]["best_power"] = finiteOrNull(lc.bestPower);
        t["variability"]["false_alarm"] = finiteOrNull(lc.falseAlarm);
    }
    if (p.fitTransits) t["transit"] = transitJson(lc.transit);
    if (lc.detrendFit.terms.empty()) return;
    const Detrend& d = lc.detrendFit;
    nlohmann::json coef = nlohmann::json::array(), err = nlohmann::json::array();
    for (std::size_t k = 0; k < d.coef.size(); ++k) {
        coef.push_back(finiteOrNull(d.coef[k]));
        err.push_back(finiteOrNull(d.coefErr[k]));
    }
    t["detrend"] = {{"terms", d.terms},
                    {"coef", coef},
                    {"coef_err", err},
                    {"rms_before", finiteOrNull(d.rmsBefore)},
                    {"rms_after", finiteOrNull(d.rmsAfter)},
                    {"points", d.points}};
}

// One row per star and used frame, star by star.
Table curvesTable(const SeriesResult& s) {
    const std::size_t nu = s.used.size();
    std::size_t rows = 0;
    for (const auto& c : s.stars)
        rows += c.relFlux.empty() ? 0 : nu;
    std::vector<int> id;
    std::vector<int> frame;
    std::vector<double> bjd;
    std::vector<float> flux, err;
    id.reserve(rows);
    frame.reserve(rows);
    bjd.reserve(rows);
    flux.reserve(rows);
    err.reserve(rows);
    for (const auto& c : s.stars) {
        if (c.relFlux.empty()) continue;
        const SeriesSource& src = s.sources[c.source];
        for (std::size_t u = 0; u < nu; ++u) {
            id.push_back(static_cast<int>(c.source));
            frame.push_back(static_cast<int>(s.used[u]));
            bjd.push_back(towards(s.observers[u], src.ra, src.dec).bjdTdb);
            flux.push_back(c.relFlux[u]);
            err.push_back(c.relFluxErr[u]);
        }
    }
    Table t;
    t.name = "CURVES";
    t.add("source", id, "", "row of the series' source list (series.stars.fits)");
    t.add("frame", frame, "", "index of the frame in series.json's frames");
    t.add("bjd_tdb", bjd, "d", "barycentric Julian date (TDB) of the star's light");
    t.add("rel_flux", flux, "", "flux / its ensemble's, normalised to a median of 1 (NaN: not measured)");
    t.add("rel_flux_err", err, "", "error of rel_flux");
    return t;
}

} // namespace

std::string curveStem(const std::string& name) {
    std::string s = name.empty() ? std::string("target") : name;
    for (char& c : s)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '+' || c == '-'))
            c = '_';
    if (s[0] == '.') s[0] = '_';
    return s;
}

Table lightCurveTable(const SeriesResult& s, const LightCurve& lc) {
    Table t;
    t.name = "LIGHTCURVE";
    std::vector<std::string> file;
    std::vector<double> mjd;
    for (std::size_t i : lc.frame) {
        file.push_back(fs::path(s.frames[i].path).filename().string());
        mjd.push_back(s.frames[i].mjdMid);
    }
    t.add("frame", file, "", "catalog of the exposure");
    t.add("mjd_mid", mjd, "d", "mid-exposure MJD (UTC)");
    t.add("jd_utc", lc.jdUtc, "d", "mid-exposure Julian date (UTC)");
    t.add("bjd_tdb", lc.bjdTdb, "d", "barycentric Julian date (TDB) of the target's light");
    t.add("hjd_utc", lc.hjdUtc, "d", "heliocentric Julian date (UTC)");
    t.add("airmass", lc.airmass, "", "airmass of the exposure");
    t.add("exptime", lc.exptime, "s", "exposure time");
    t.add("rel_flux", lc.relFlux, "", "target flux / ensemble flux, normalised to a median of 1");
    t.add("rel_flux_err", lc.relFluxErr, "",
          "error of rel_flux (photon, sky, read noise, ensemble, scintillation)");
    t.add("diff_mag", lc.diffMag, "mag", "-2.5 log10(rel_flux)");
    t.add("diff_mag_err", lc.diffMagErr, "mag", "error of diff_mag");
    t.add("mag", lc.mag, "mag", "median calibrated magnitude of the target + diff_mag (NaN: not calibrated)");
    t.add("mag_err", lc.magErr, "mag",
          "error of mag relative to the series (the zero point's error left out)");
    t.add("flux", lc.flux, "adu", "target flux (" + s.params.flux + ")");
    t.add("flux_err", lc.fluxErr, "adu", "error of flux");
    t.add("ensemble_flux", lc.ensembleFlux, "", "weighted mean normalised flux of the comparison stars");
    t.add("ensemble_err", lc.ensembleErr, "", "error of ensemble_flux");
    t.add("n_comparison", lc.nComparison, "", "comparison stars measured in the exposure");
    t.add("x", lc.x, "pix", "target x (FITS 1-based)");
    t.add("y", lc.y, "pix", "target y (FITS 1-based)");
    t.add("sky", lc.sky, "adu", "local sky per pixel at the target");
    t.add("fwhm", lc.fwhm, "pix", "median FWHM of the exposure");
    t.add("flags", lc.flags, "",
          "the target's catalog flags (docs/FLAGS.md); 2^27: forced photometry (STEM.targets.fits)");
    t.add("detected", lc.detected, "",
          "1: the target was detected in the exposure; 0: forced photometry or none");
    t.meta.set("OBJECT", lc.name, "target");
    t.meta.set("RA", lc.ra, "[deg] target right ascension (ICRS)");
    t.meta.set("DEC", lc.dec, "[deg] target declination (ICRS)");
    t.meta.set("FILTER", s.filter);
    t.meta.set("FLUXCOL", s.params.flux, "catalog flux used");
    int used = 0;
    for (const auto& e : lc.ensemble)
        used += e.dropped ? 0 : 1;
    t.meta.set("NCOMP", used, "comparison stars in the ensemble");
    t.meta.set("RMS", lc.rms, "RMS of rel_flux about 1");
    t.meta.set("MEDERR", lc.medianErr, "median rel_flux_err");
    t.meta.set("SWVERSN", "gpuphot " GPUPHOT_VERSION, "software version");
    return t;
}

nlohmann::json seriesReport(const SeriesResult& s) {
    nlohmann::json j;
    j["software"] = "gpuphot " GPUPHOT_VERSION;
    j["params"] = toJson(s.params);
    j["appended"] = s.appended;
    j["filter"] = s.filter;
    j["flux"] = s.params.flux;
    j["sources"] = s.sources.size();
    j["warnings"] = s.warnings;
    j["catalogs"] = nlohmann::json::array();
    std::size_t used = 0;
    for (const auto& f : s.frames) {
        j["catalogs"].push_back(f.path);
        nlohmann::json e = {{"path", f.path},
                            {"used", f.used},
                            {"detections", f.detections},
                            {"matched", f.matched},
                            {"filter", f.filter}};
        e["mjd_mid"] = finiteOrNull(f.mjdMid);
        e["airmass"] = finiteOrNull(f.airmass);
        if (!f.problem.empty()) e["problem"] = f.problem;
        j["frames"].push_back(e);
        used += f.used ? 1 : 0;
    }
    j["frames_used"] = used;
    if (s.params.allStars)
        j["variables"] =
            std::count_if(s.stars.begin(), s.stars.end(), [](const StarCurve& c) { return c.variable; });
    for (const auto& lc : s.curves) {
        nlohmann::json t = {{"name", lc.name}, {"ra", lc.ra}, {"dec", lc.dec}, {"source", lc.source}};
        if (!lc.problem.empty()) t["problem"] = lc.problem;
        if (lc.source >= 0 && std::isfinite(s.sources[lc.source].colour))
            t["colour"] = s.sources[lc.source].colour;
        t["rms"] = finiteOrNull(lc.rms);
        t["median_err"] = finiteOrNull(lc.medianErr);
        if (lc.problem.empty()) addAnalysis(t, lc, s.params);
        t["ensemble"] = nlohmann::json::array();
        for (const auto& e : lc.ensemble) {
            const SeriesSource& src = s.sources[e.source];
            nlohmann::json c = {{"source", e.source},
                                {"ra", src.ra},
                                {"dec", src.dec},
                                {"weight", e.weight},
                                {"dropped", e.dropped}};
            c["colour"] = finiteOrNull(src.colour);
            c["scatter"] = finiteOrNull(e.scatter);
            c["expected"] = finiteOrNull(e.expected);
            if (!e.why.empty()) c["note"] = e.why;
            t["ensemble"].push_back(c);
        }
        j["targets"].push_back(t);
    }
    return j;
}

std::vector<std::string> writeSeriesOutputs(const SeriesResult& s, const SeriesOutputOptions& o) {
    const fs::path dir = o.dir.empty() ? fs::path(".") : fs::path(o.dir);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(dir.string() + ": cannot create the output directory: " + ec.message());
    // One job per file; the files are independent, so they are written two at a time.
    struct Job {
        std::string path;
        std::function<void(const std::string&)> write;
        std::string alsoWritten = {}; // a second file the job writes
    };
    std::vector<Job> jobs;
    // The report first: the largest job, so that the two threads end together.
    jobs.push_back({(dir / "series.json").string(),
                    [&s](const std::string& p) { writeTextFileAtomic(p, seriesReport(s).dump(1) + "\n"); }});
    std::set<std::string> stems;
    for (const auto& lc : s.curves) {
        if (!lc.problem.empty()) continue;
        std::string stem = curveStem(lc.name);
        for (int k = 2; !stems.insert(stem).second; ++k)
            stem = curveStem(lc.name) + "_" + std::to_string(k);
        const auto table = std::make_shared<Table>(lightCurveTable(s, lc));
        const auto add = [&](const char* format, const char* ext, std::function<void(const std::string&)> w) {
            if (o.formats.count(format)) jobs.push_back({(dir / (stem + ext)).string(), std::move(w)});
        };
        // ECSV and CSV hold the same numbers: one job formats them once for both files.
        const std::string ecsv = o.formats.count("ecsv") ? (dir / (stem + ".lc.ecsv")).string() : "",
                          csv = o.formats.count("csv") ? (dir / (stem + ".lc.csv")).string() : "";
        if (!ecsv.empty() || !csv.empty())
            jobs.push_back({ecsv.empty() ? csv : ecsv,
                            [table, ecsv, csv](const std::string&) { writeTextTables(ecsv, csv, *table); },
                            ecsv.empty() ? "" : csv});
        add("fits", ".lc.fits", [table](const std::string& p) { writeFitsTable(p, *table); });
        add("aij", ".aij.tbl", [&s, &lc](const std::string& p) { writeTextFileAtomic(p, aijTable(s, lc)); });
        add("aavso", ".aavso.txt",
            [&s, &lc, &o](const std::string& p) { writeTextFileAtomic(p, aavsoReport(s, lc, o.obscode)); });
    }
    if (s.params.allStars) {
        jobs.push_back({(dir / "series.stars.fits").string(),
                        [&s](const std::string& p) { writeFitsTable(p, starsTable(s)); }});
        jobs.push_back({(dir / "series.curves.fits").string(),
                        [&s](const std::string& p) { writeFitsTable(p, curvesTable(s)); }});
        jobs.push_back({(dir / "series.variables.csv").string(),
                        [&s](const std::string& p) { writeCsv(p, variablesTable(s)); }});
    }
    // Only the state is flushed to disk, and renamed last: the other files derive from it and the
    // catalogs, and every call rewrites them. Its flush waits on the disk, not on a core: it has a thread
    // of its own beside the two that write the other files.
    AtomicBatch batch;
    std::exception_ptr failure;
    std::mutex failureMutex;
    const auto attempt = [&](const std::function<void()>& write) {
        try {
            AtomicBatch::Join join(batch);
            write();
        } catch (...) {
            const std::lock_guard<std::mutex> lock(failureMutex);
            if (!failure) failure = std::current_exception();
        }
    };
    const std::string statePath = (dir / "series.state").string();
    std::thread stateWriter;
    if (o.state) {
        batch.durable(statePath);
        stateWriter = std::thread([&] { attempt([&] { saveSeriesState(s.state, dir.string()); }); });
    }
    series_detail::forEachShared(jobs.size(), fits_is_reentrant() ? 2 : 1,
                                 [&](std::size_t k) { attempt([&] { jobs[k].write(jobs[k].path); }); });
    if (stateWriter.joinable()) stateWriter.join();
    if (failure) std::rethrow_exception(failure);
    batch.finish();
    std::vector<std::string> written;
    if (o.state) written.push_back(statePath);
    for (const auto& j : jobs) {
        written.push_back(j.path);
        if (!j.alsoWritten.empty()) written.push_back(j.alsoWritten);
    }
    return written;
}

std::vector<std::string> seriesCatalogsIn(const std::string& dir) {
    const fs::path p = fs::path(dir.empty() ? "." : dir) / "series.json";
    std::ifstream in(p);
    if (!in) return {};
    try {
        const nlohmann::json j = nlohmann::json::parse(in);
        return j.at("catalogs").get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
        throw InvalidInput(p.string() + ": not a series report (" + e.what() + ")");
    }
}

} // namespace gpuphot
