#include "core/series/series_output.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/io/atomic_file.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

namespace fs = std::filesystem;

std::string fmt(double v, int digits) {
    if (!std::isfinite(v)) return "nan";
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", digits, v);
    return b;
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
    std::ostringstream o;
    o << " \tLabel\tslice\tJD_UTC\tJ.D.-2400000\tBJD_TDB\tHJD_UTC\tAIRMASS\tEXPTIME\trel_flux_T1\trel_flux_"
         "err_T1"
         "\tSource-Sky_T1\tSource_Error_T1\tX(FITS)_T1\tY(FITS)_T1\tSky/Pixel_T1\ttot_C_cnts\tFWHM_Mean\n";
    for (std::size_t k = 0; k < lc.frame.size(); ++k) {
        o << k + 1 << '\t' << fs::path(s.frames[lc.frame[k]].path).filename().string() << '\t' << k + 1
          << '\t' << fmt(lc.jdUtc[k], 7) << '\t' << fmt(lc.jdUtc[k] - 2400000.0, 7) << '\t'
          << fmt(lc.bjdTdb[k], 7) << '\t' << fmt(lc.hjdUtc[k], 7) << '\t' << fmt(lc.airmass[k], 4) << '\t'
          << fmt(lc.exptime[k], 3) << '\t' << fmt(lc.relFlux[k], 7) << '\t' << fmt(lc.relFluxErr[k], 7)
          << '\t' << fmt(lc.flux[k], 3) << '\t' << fmt(lc.fluxErr[k], 3) << '\t' << fmt(lc.x[k], 3) << '\t'
          << fmt(lc.y[k], 3) << '\t' << fmt(lc.sky[k], 3) << '\t' << fmt(lc.ensembleFlux[k], 7) << '\t'
          << fmt(lc.fwhm[k], 3) << '\n';
    }
    return o.str();
}

std::string aavsoReport(const SeriesResult& s, const LightCurve& lc, const std::string& obscode) {
    std::ostringstream o;
    o << "#TYPE=EXTENDED\n#OBSCODE=" << obscode
      << "\n#SOFTWARE=gpuphot " GPUPHOT_VERSION "\n#DELIM=,\n#DATE=JD\n"
      << "#OBSTYPE=CCD\n#NAME,DATE,MAG,MERR,FILT,TRANS,MTYPE,CNAME,CMAG,KNAME,KMAG,AMASS,GROUP,CHART,NOTES\n";
    int used = 0;
    for (const auto& e : lc.ensemble)
        used += e.dropped ? 0 : 1;
    for (std::size_t k = 0; k < lc.frame.size(); ++k) {
        const bool std = std::isfinite(lc.mag[k]);
        const double mag = std ? lc.mag[k] : lc.diffMag[k];
        if (!std::isfinite(mag)) continue;
        o << lc.name << ',' << fmt(lc.jdUtc[k], 5) << ',' << fmt(mag, 4) << ',' << fmt(lc.magErr[k], 4) << ','
          << aavsoFilter(s.filter) << ",NO," << (std ? "STD" : "DIF") << ",ENSEMBLE,na,na,na,"
          << fmt(lc.airmass[k], 4) << ",na,na,ensemble of " << used << " comparison stars\n";
    }
    return o.str();
}

Table starsTable(const SeriesResult& s) {
    Table t;
    t.name = "STARS";
    std::vector<int> id;
    std::vector<double> ra, dec, mag, rms, err, chi2;
    std::vector<int> points, comps;
    for (const auto& c : s.stars) {
        const SeriesSource& src = s.sources[c.source];
        id.push_back(static_cast<int>(c.source));
        ra.push_back(src.ra);
        dec.push_back(src.dec);
        mag.push_back(src.medianMagCal);
        rms.push_back(c.rms);
        err.push_back(c.medianErr);
        chi2.push_back(c.chi2);
        points.push_back(c.points);
        comps.push_back(c.comparisons);
    }
    t.add("source", id, "", "row of the series' source list");
    t.add("ra", ra, "deg", "mean position of the matched detections (ICRS)");
    t.add("dec", dec, "deg", "");
    t.add("mag_cal", mag, "mag", "median calibrated magnitude (NaN: not calibrated)");
    t.add("rms", rms, "", "RMS of rel_flux about 1");
    t.add("median_err", err, "", "median rel_flux_err");
    t.add("chi2", chi2, "", "reduced chi^2 of rel_flux about 1 (variability)");
    t.add("points", points, "", "frames with a measurement");
    t.add("n_comparison", comps, "", "comparison stars of its ensemble");
    t.meta.set("FILTER", s.filter);
    t.meta.set("FLUXCOL", s.params.flux, "catalog flux used");
    return t;
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
        e["mjd_mid"] = std::isfinite(f.mjdMid) ? nlohmann::json(f.mjdMid) : nlohmann::json();
        e["airmass"] = std::isfinite(f.airmass) ? nlohmann::json(f.airmass) : nlohmann::json();
        if (!f.problem.empty()) e["problem"] = f.problem;
        j["frames"].push_back(e);
        used += f.used ? 1 : 0;
    }
    j["frames_used"] = used;
    for (const auto& lc : s.curves) {
        nlohmann::json t = {{"name", lc.name}, {"ra", lc.ra}, {"dec", lc.dec}, {"source", lc.source}};
        if (!lc.problem.empty()) t["problem"] = lc.problem;
        if (lc.source >= 0 && std::isfinite(s.sources[lc.source].colour))
            t["colour"] = s.sources[lc.source].colour;
        t["rms"] = std::isfinite(lc.rms) ? nlohmann::json(lc.rms) : nlohmann::json();
        t["median_err"] = std::isfinite(lc.medianErr) ? nlohmann::json(lc.medianErr) : nlohmann::json();
        t["ensemble"] = nlohmann::json::array();
        for (const auto& e : lc.ensemble) {
            const SeriesSource& src = s.sources[e.source];
            nlohmann::json c = {{"source", e.source},
                                {"ra", src.ra},
                                {"dec", src.dec},
                                {"weight", e.weight},
                                {"dropped", e.dropped}};
            c["colour"] = std::isfinite(src.colour) ? nlohmann::json(src.colour) : nlohmann::json();
            c["scatter"] = std::isfinite(e.scatter) ? nlohmann::json(e.scatter) : nlohmann::json();
            c["expected"] = std::isfinite(e.expected) ? nlohmann::json(e.expected) : nlohmann::json();
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
    std::vector<std::string> written;
    auto out = [&](const std::string& stem, const char* ext) {
        return written.emplace_back((dir / (stem + ext)).string());
    };
    for (const auto& lc : s.curves) {
        if (!lc.problem.empty()) continue;
        const std::string stem = curveStem(lc.name);
        const Table t = lightCurveTable(s, lc);
        if (o.formats.count("ecsv")) writeEcsv(out(stem, ".lc.ecsv"), t);
        if (o.formats.count("csv")) writeCsv(out(stem, ".lc.csv"), t);
        if (o.formats.count("fits")) writeFitsTable(out(stem, ".lc.fits"), t);
        if (o.formats.count("aij")) writeTextFileAtomic(out(stem, ".aij.tbl"), aijTable(s, lc));
        if (o.formats.count("aavso"))
            writeTextFileAtomic(out(stem, ".aavso.txt"), aavsoReport(s, lc, o.obscode));
    }
    if (s.params.allStars) {
        writeFitsTable(out("series", ".stars.fits"), starsTable(s));
        writeFitsTable(out("series", ".curves.fits"), curvesTable(s));
    }
    writeTextFileAtomic(out("series", ".json"), seriesReport(s).dump(1) + "\n");
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

namespace gpuphot {
namespace {

constexpr int kStateVersion = 1;

nlohmann::json frameJson(const SeriesFrame& f) {
    nlohmann::json j = {{"path", f.path},       {"mjd", f.mjdMid},    {"exptime", f.exptime},
                        {"airmass", f.airmass}, {"fwhm", f.fwhm},     {"zp", f.zeroPoint},
                        {"filter", f.filter},   {"object", f.object}, {"det", f.detections},
                        {"matched", f.matched}, {"used", f.used},     {"problem", f.problem}};
    if (f.site) j["site"] = {f.site->latitude, f.site->longitude, f.site->elevation, f.site->source};
    return j;
}

// NaN goes into CBOR as a float and comes back; JSON null (from a NaN dumped as text) reads as NaN.
double num(const nlohmann::json& j) {
    return j.is_number() ? j.get<double>() : std::nan("");
}

SeriesFrame frameFrom(const nlohmann::json& j) {
    SeriesFrame f;
    f.path = j.at("path").get<std::string>();
    f.mjdMid = num(j.at("mjd"));
    f.exptime = num(j.at("exptime"));
    f.airmass = num(j.at("airmass"));
    f.fwhm = num(j.at("fwhm"));
    f.zeroPoint = num(j.at("zp"));
    f.filter = j.at("filter").get<std::string>();
    f.object = j.at("object").get<std::string>();
    f.detections = j.at("det").get<std::size_t>();
    f.matched = j.at("matched").get<std::size_t>();
    f.used = j.at("used").get<bool>();
    f.problem = j.at("problem").get<std::string>();
    if (j.contains("site")) {
        const auto& s = j["site"];
        f.site = ObservingSite{num(s.at(0)), num(s.at(1)), num(s.at(2)), s.at(3).get<std::string>()};
    }
    return f;
}

// Measurements as one flat float array (flux, err, x, y, sky, magCal, flags) per target.
std::vector<float> packMeas(const std::vector<std::vector<SeriesMeasurement>>& meas) {
    std::vector<float> v;
    for (const auto& row : meas)
        for (const auto& m : row)
            v.insert(v.end(), {m.flux, m.err, m.x, m.y, m.sky, m.magCal, static_cast<float>(m.flags)});
    return v;
}

} // namespace

void saveSeriesState(const SeriesState& st, const std::string& dir) {
    nlohmann::json j = {{"version", kStateVersion}, {"fingerprint", st.fingerprint},
                        {"filter", st.filter},      {"ra0", st.ra0},
                        {"dec0", st.dec0},          {"xi", st.xiSum},
                        {"eta", st.etaSum},         {"matched", st.matched},
                        {"flux", st.medianFlux},    {"magcal", st.medianMagCal},
                        {"used", st.used}};
    for (const auto& f : st.frames)
        j["frames"].push_back(frameJson(f));
    for (const auto& o : st.observers)
        j["observers"].push_back({o.utc1, o.utc2, o.tdb1, o.tdb2, o.bary[0], o.bary[1], o.bary[2], o.helio[0],
                                  o.helio[1], o.helio[2]});
    j["targets"] = nlohmann::json::array();
    for (const auto& t : st.targets)
        j["targets"].push_back({{"sources", t.sources}, {"notes", t.notes}, {"meas", packMeas(t.meas)}});
    const std::vector<std::uint8_t> bytes = nlohmann::json::to_cbor(j);
    const fs::path p = fs::path(dir.empty() ? "." : dir) / "series.state";
    writeTextFileAtomic(p.string(), std::string(bytes.begin(), bytes.end()));
}

std::optional<SeriesState> loadSeriesState(const std::string& dir) {
    const fs::path p = fs::path(dir.empty() ? "." : dir) / "series.state";
    std::ifstream in(p, std::ios::binary);
    if (!in) return std::nullopt;
    const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                          std::istreambuf_iterator<char>());
    try {
        const nlohmann::json j = nlohmann::json::from_cbor(bytes);
        if (j.at("version").get<int>() != kStateVersion)
            throw InvalidInput(p.string() + ": a series state of another version (run with --fresh)");
        SeriesState st;
        st.fingerprint = j.at("fingerprint").get<std::string>();
        st.filter = j.at("filter").get<std::string>();
        st.ra0 = j.at("ra0").get<double>();
        st.dec0 = j.at("dec0").get<double>();
        st.xiSum = j.at("xi").get<std::vector<double>>();
        st.etaSum = j.at("eta").get<std::vector<double>>();
        st.matched = j.at("matched").get<std::vector<int>>();
        for (const auto& v : j.at("flux"))
            st.medianFlux.push_back(num(v));
        for (const auto& v : j.at("magcal"))
            st.medianMagCal.push_back(num(v));
        st.used = j.at("used").get<std::vector<std::size_t>>();
        for (const auto& f : j.at("frames"))
            st.frames.push_back(frameFrom(f));
        for (const auto& o : j.at("observers")) {
            ObserverEphemeris e;
            e.utc1 = o.at(0);
            e.utc2 = o.at(1);
            e.tdb1 = o.at(2);
            e.tdb2 = o.at(3);
            for (int k = 0; k < 3; ++k) {
                e.bary[k] = o.at(4 + k);
                e.helio[k] = o.at(7 + k);
            }
            st.observers.push_back(e);
        }
        for (const auto& t : j.at("targets")) {
            SeriesState::Target tg;
            tg.sources = t.at("sources").get<std::vector<std::size_t>>();
            tg.notes = t.at("notes").get<std::vector<std::string>>();
            const auto& m = t.at("meas");
            const std::size_t nk = tg.sources.size();
            if (m.size() != nk * 7 * st.used.size())
                throw InvalidInput(p.string() + ": measurements do not fit");
            tg.meas.assign(st.used.size(), std::vector<SeriesMeasurement>(nk));
            std::size_t i = 0;
            for (auto& row : tg.meas)
                for (auto& x : row) {
                    float v[7];
                    for (float& f : v)
                        f = static_cast<float>(num(m[i++]));
                    x = {v[0], v[1], v[2], v[3], v[4], v[5], static_cast<std::int32_t>(v[6])};
                }
            st.targets.push_back(std::move(tg));
        }
        const std::size_t ns = st.xiSum.size();
        if (st.etaSum.size() != ns || st.matched.size() != ns || st.observers.size() != st.used.size())
            throw InvalidInput(p.string() + ": inconsistent series state (run with --fresh)");
        for (std::size_t u : st.used)
            if (u >= st.frames.size())
                throw InvalidInput(p.string() + ": inconsistent series state (run with --fresh)");
        return st;
    } catch (const nlohmann::json::exception& e) {
        throw InvalidInput(p.string() + ": not a series state (" + e.what() + "); run with --fresh");
    }
}

} // namespace gpuphot
