// The time-series core (core/series): BJD_TDB and HJD_UTC against astropy (tests/data/series, made by
// tests/series/bjd_reference.py), the site keywords, and light curves from synthetic catalogs with
// known truth: a transit recovered, a variable star vetted out of the ensemble, frames of another
// filter or field, without WCS or unreadable left out with their reasons, a target off the field
// reported, the output files (their state read back for appending), and the target's transit fitted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <random>
#include <sstream>
#include <stdexcept>

#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/target_list.hpp"
#include "core/io/text_catalog.hpp"
#include "core/series/barycentric.hpp"
#include "core/series/series.hpp"
#include "core/series/series_output.hpp"
#include "core/util/errors.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;
using gpuphot::test::TempDir;

TEST(Barycentric, MatchesAstropyWithinAMillisecond) {
    const Table ref = readCsv(std::string(GPUPHOT_TEST_DATA) + "/series/bjd_astropy.csv");
    ASSERT_GE(ref.rows(), 30u);
    const auto mjd = ref.doubles("mjd_utc"), ra = ref.doubles("ra"), dec = ref.doubles("dec"),
               lat = ref.doubles("lat"), lon = ref.doubles("lon"), elev = ref.doubles("elev"),
               tdb = ref.doubles("jd_tdb"), bjd = ref.doubles("bjd_tdb"), hjd = ref.doubles("hjd_utc");
    double worstB = 0.0, worstH = 0.0, worstT = 0.0, spread = 0.0;
    for (std::size_t i = 0; i < ref.rows(); ++i) {
        const ObservingSite site{lat[i], lon[i], elev[i], "test"};
        const ObservationTimes t = observationTimes(mjd[i], ra[i], dec[i], &site);
        worstB = std::max(worstB, std::fabs(t.bjdTdb - bjd[i]) * 86400.0);
        worstH = std::max(worstH, std::fabs(t.hjdUtc - hjd[i]) * 86400.0);
        worstT = std::max(worstT, std::fabs(t.jdTdb - tdb[i]) * 86400.0);
        spread = std::max(spread, std::fabs(t.barycentricDelay));
    }
    RecordProperty("worst_bjd_ms", std::to_string(worstB * 1e3));
    std::printf(
        "[accuracy] BJD_TDB - astropy: worst %.4f ms; HJD_UTC %.4f ms; JD_TDB %.4f ms (%zu triples)\n",
        worstB * 1e3, worstH * 1e3, worstT * 1e3, ref.rows());
    EXPECT_LT(worstB, 1e-3) << "BJD_TDB differs from astropy by " << worstB * 1e3 << " ms";
    EXPECT_LT(worstH, 1e-3) << "HJD_UTC differs from astropy by " << worstH * 1e3 << " ms";
    EXPECT_LT(worstT, 1e-4);
    EXPECT_GT(spread, 400.0); // the delays are real (up to ~500 s), so a zero delay would fail above
}

TEST(Barycentric, TheSiteMattersAtTheMillisecondLevel) {
    const ObservingSite mauna{19.8207, -155.468, 4205.0, "test"};
    const ObservationTimes geo = observationTimes(58849.77, 83.82, -5.39, nullptr);
    const ObservationTimes top = observationTimes(58849.77, 83.82, -5.39, &mauna);
    EXPECT_GT(std::fabs(top.bjdTdb - geo.bjdTdb) * 86400.0, 1e-3); // ~ Earth radius / c on this line of sight
    EXPECT_LT(std::fabs(top.bjdTdb - geo.bjdTdb) * 86400.0, 0.022);
}

TEST(Barycentric, SiteFromHeaderKeywords) {
    Header h;
    EXPECT_FALSE(siteFromHeader(h).has_value());
    h.set("SITELAT", "-30:14:24");
    h.set("SITELONG", -70.74);
    h.set("SITEELEV", 2200.0);
    auto s = siteFromHeader(h);
    ASSERT_TRUE(s.has_value());
    EXPECT_NEAR(s->latitude, -30.24, 1e-9);
    EXPECT_NEAR(s->longitude, -70.74, 1e-12);
    EXPECT_EQ(s->elevation, 2200.0);

    // OBSGEO-X/Y/Z written here from the WGS84 ellipsoid's closed form, read back through ERFA.
    const double lat = -24.6275 * M_PI / 180, lon = -70.4044 * M_PI / 180, height = 2635.0;
    const double a = 6378137.0, f = 1 / 298.257223563, e2 = f * (2 - f);
    const double n = a / std::sqrt(1 - e2 * std::sin(lat) * std::sin(lat));
    Header g;
    g.set("OBSGEO-X", (n + height) * std::cos(lat) * std::cos(lon));
    g.set("OBSGEO-Y", (n + height) * std::cos(lat) * std::sin(lon));
    g.set("OBSGEO-Z", (n * (1 - e2) + height) * std::sin(lat));
    s = siteFromHeader(g);
    ASSERT_TRUE(s.has_value());
    EXPECT_NEAR(s->latitude, -24.6275, 1e-7);
    EXPECT_NEAR(s->longitude, -70.4044, 1e-7);
    EXPECT_NEAR(s->elevation, 2635.0, 0.01);

    Header bad;
    bad.set("SITELAT", "north");
    bad.set("SITELONG", 10.0);
    EXPECT_THROW(siteFromHeader(bad), InvalidInput);
    Header far;
    far.set("SITELAT", 95.0);
    far.set("SITELONG", 10.0);
    EXPECT_THROW(siteFromHeader(far), InvalidInput);
}

namespace {

// A synthetic night: stars on a grid around (150, 20) with Gaussian flux noise of known size, one target
// with a box-shaped 2 % dip, one 5 % sinusoidal variable that is not a target.
struct Night {
    TempDir dir{"gpuphot_series"};
    std::vector<std::string> catalogs;
    static constexpr int kFrames = 60, kSide = 8;
    static constexpr double kRa = 150.0, kDec = 20.0, kStep = 30.0 / 3600.0, kNoise = 0.003;
    static constexpr int kTarget = 27,
                         kVariable = 28; // grid indices (neighbours: the variable is a candidate)

    static double dip(int f) { return f >= 25 && f < 40 ? 0.02 : 0.0; }
    // Frames where the target is not in the catalog but in STEM.targets.fits (forced photometry).
    static bool undetected(int f) { return f >= 30 && f < 34; }
    bool hideTarget = false;
    // A star left out of frames 10-12, measured there by forced photometry under the name `hiddenName`
    // (a listed source's, sourceTargetName) when that is given.
    static constexpr int kHidden = 5;
    static bool hiddenIn(int f) { return f >= 10 && f < 13; }
    std::string hiddenName;
    static double sine(int f) { return 0.05 * std::sin(2.0 * 3.14159265358979 * f / 20.0); }
    static void position(int k, double& ra, double& dec) {
        dec = kDec + (k / kSide - kSide / 2) * kStep;
        ra = kRa + (k % kSide - kSide / 2) * kStep / std::cos(kDec * 3.14159265358979 / 180.0);
    }

    std::string write(int f, const std::string& filter, const std::string& wcs, double shiftDeg) {
        std::mt19937_64 rng(1000 + f);
        std::normal_distribution<double> n(0.0, 1.0);
        const double transparency = 1.0 - 0.1 * (0.5 + 0.5 * std::sin(f / 7.0));
        std::vector<double> ra, dec, flux, err, x, y, sky, magCal;
        std::vector<std::int32_t> flags;
        for (int k = 0; k < kSide * kSide; ++k) {
            double r, d;
            position(k, r, d);
            ra.push_back(r + shiftDeg + n(rng) * 0.1 / 3600.0);
            dec.push_back(d + n(rng) * 0.1 / 3600.0);
            double f0 = 1.0e5 * std::pow(10.0, -0.4 * 0.05 * (k % 9)) * transparency;
            if (k == kTarget) f0 *= 1.0 - dip(f);
            if (k == kVariable) f0 *= std::pow(10.0, -0.4 * sine(f));
            flux.push_back(f0 * (1.0 + kNoise * n(rng)));
            err.push_back(f0 * kNoise);
            x.push_back(100 + k % kSide * 30);
            y.push_back(100 + k / kSide * 30);
            sky.push_back(300.0);
            magCal.push_back(-2.5 * std::log10(f0) + 25.0);
            flags.push_back(0);
        }
        char name[32];
        // Star k left out of the catalog, measured only by forced photometry (STEM.targets.fits, one row
        // named `who` at (r, d)).
        const auto hide = [&](int k, const std::string& who, double r, double d) {
            Table forced;
            forced.add("name", std::vector<std::string>{who});
            forced.add("ra", std::vector<double>{r}, "deg");
            forced.add("dec", std::vector<double>{d}, "deg");
            forced.add("x", std::vector<double>{x[k]}, "pix");
            forced.add("y", std::vector<double>{y[k]}, "pix");
            forced.add("flux_aper_2", std::vector<double>{flux[k]}, "adu");
            forced.add("fluxerr_aper_2", std::vector<double>{err[k]}, "adu");
            forced.add("sky", std::vector<double>{300.0}, "adu");
            forced.add("flags", std::vector<std::int32_t>{0});
            std::snprintf(name, sizeof name, "f%03d.targets.fits", f);
            writeFitsTable(dir / name, forced);
            for (auto* v : {&ra, &dec, &flux, &err, &x, &y, &sky, &magCal})
                v->erase(v->begin() + k);
            flags.erase(flags.begin() + k);
        };
        if (hideTarget && undetected(f)) { // the target below the detection limit
            double r, d;
            position(kTarget, r, d);
            hide(kTarget, "planet", r, d);
        }
        if (!hiddenName.empty() && hiddenIn(f)) hide(kHidden, hiddenName, ra[kHidden], dec[kHidden]);
        std::snprintf(name, sizeof name, "f%03d.cat.fits", f);
        Table t;
        t.add("ra", ra, "deg");
        t.add("dec", dec, "deg");
        t.add("x", x, "pix");
        t.add("y", y, "pix");
        t.add("flux_aper_2", flux, "adu");
        t.add("fluxerr_aper_2", err, "adu");
        t.add("flux_opt", flux, "adu");
        t.add("fluxerr_opt", err, "adu");
        t.add("sky", sky, "adu");
        t.add("mag_cal", magCal, "mag");
        t.add("flags", flags);
        t.meta.set("MJD-MID", 60000.0 + f * 60.0 / 86400.0);
        t.meta.set("EXPTIME", 60.0);
        t.meta.set("AIRMASS", 1.0 + f / 60.0);
        t.meta.set("FILTER", filter);
        t.meta.set("WCSSRC", wcs);
        t.meta.set("FWHM", 3.0);
        t.meta.set("SITELAT", -30.24);
        t.meta.set("SITELONG", -70.74);
        t.meta.set("SRCFILE", "/raw/" + std::string(name, std::strlen(name) - 9) + ".fits");
        writeFitsTable(dir / name, t);
        return dir / name;
    }

    explicit Night(bool hide = false, std::string hidden = {})
        : hideTarget(hide), hiddenName(std::move(hidden)) {
        for (int f = 0; f < kFrames; ++f)
            catalogs.push_back(write(f, "V", "fitted (tycho2)", 0.0));
        catalogs.push_back(write(kFrames, "R", "fitted", 0.0));     // another filter
        catalogs.push_back(write(kFrames + 1, "V", "none", 0.0));   // no WCS
        catalogs.push_back(write(kFrames + 2, "V", "fitted", 1.0)); // another field
        std::ofstream(dir / "broken.cat.fits") << "not a FITS file";
        catalogs.push_back(dir / "broken.cat.fits");
    }

    TargetList targets() const {
        TargetList t;
        double r, d;
        position(kTarget, r, d);
        t.name = {"planet", "nowhere"};
        t.ra = {r, r + 2.0};
        t.dec = {d, d};
        return t;
    }
};

const SeriesFrame* frameNamed(const SeriesResult& r, const std::string& file) {
    for (const auto& f : r.frames)
        if (f.path.find(file) != std::string::npos) return &f;
    return nullptr;
}

} // namespace

TEST(Series, RecoversADipAndLeavesOutWhatDoesNotBelong) {
    Night night;
    const SeriesResult r = buildSeries(night.catalogs, night.targets(), SeriesParams{});
    ASSERT_EQ(r.frames.size(), night.catalogs.size());
    EXPECT_NE(frameNamed(r, "f060")->problem.find("filter"), std::string::npos);
    EXPECT_NE(frameNamed(r, "f061")->problem.find("no WCS"), std::string::npos);
    EXPECT_NE(frameNamed(r, "f062")->problem.find("another field"), std::string::npos);
    EXPECT_NE(frameNamed(r, "broken")->problem.find("unreadable"), std::string::npos);
    EXPECT_TRUE(frameNamed(r, "f000")->used);
    EXPECT_EQ(r.sources.size(), std::size_t(Night::kSide * Night::kSide));

    ASSERT_EQ(r.curves.size(), 2u);
    const LightCurve& lc = r.curves[0];
    ASSERT_TRUE(lc.problem.empty()) << lc.problem;
    EXPECT_FALSE(r.curves[1].problem.empty()); // "nowhere" is off the field
    ASSERT_EQ(lc.relFlux.size(), std::size_t(Night::kFrames));
    double in = 0.0, out = 0.0;
    int nIn = 0, nOut = 0;
    for (int f = 0; f < Night::kFrames; ++f) {
        (Night::dip(f) > 0 ? in : out) += lc.relFlux[f];
        (Night::dip(f) > 0 ? nIn : nOut) += 1;
    }
    const double depth = 1.0 - (in / nIn) / (out / nOut);
    EXPECT_NEAR(depth, 0.02, 0.002) << "transparency and airmass must cancel in the differential curve";
    // Errors: the target's 0.3 % and the ensemble's, so between 0.3 % and 0.4 %.
    EXPECT_GT(lc.medianErr, 0.0029);
    EXPECT_LT(lc.medianErr, 0.0040);
    // The variable star, the target's neighbour, is not an active comparison (left out by the field-wide
    // vetting or dropped from the ensemble); no constant star is dropped.
    int active = 0;
    for (const auto& e : lc.ensemble) {
        double vr, vd;
        Night::position(Night::kVariable, vr, vd);
        const bool isVariable =
            std::fabs(r.sources[e.source].dec - vd) < 1e-4 && std::fabs(r.sources[e.source].ra - vr) < 1e-4;
        EXPECT_EQ(e.dropped, isVariable) << "source " << e.source << ": " << e.why;
        active += e.dropped ? 0 : 1;
    }
    EXPECT_EQ(active, SeriesParams{}.ensembleSize);
    // BJD_TDB of the series: the delay towards RA 150 in this season, the site from the catalogs.
    EXPECT_GT(std::fabs(lc.bjdTdb[0] - lc.jdUtc[0]) * 86400.0, 60.0);
    EXPECT_TRUE(r.warnings.size() == 1u) << "only the off-field target warns";
}

TEST(Series, WritesItsFilesAndRemembersItsCatalogs) {
    Night night;
    const SeriesResult r = buildSeries(night.catalogs, night.targets(), SeriesParams{});
    TempDir out("gpuphot_series_out");
    SeriesOutputOptions o;
    o.dir = out / "new/dir";
    const auto files = writeSeriesOutputs(r, o);
    EXPECT_EQ(files.size(), 7u); // five of "planet" (none of "nowhere"), series.json and series.state
    EXPECT_TRUE(loadSeriesState(o.dir).has_value());
    const Table t = readFitsTable(o.dir + "/planet.lc.fits");
    EXPECT_EQ(t.rows(), std::size_t(Night::kFrames));
    EXPECT_NE(t.find("bjd_tdb"), nullptr);
    EXPECT_EQ(readCsv(o.dir + "/planet.lc.csv").rows(), std::size_t(Night::kFrames));
    std::ifstream aavso(o.dir + "/planet.aavso.txt");
    std::string first;
    std::getline(aavso, first);
    EXPECT_EQ(first, "#TYPE=EXTENDED");
    std::stringstream all;
    all << aavso.rdbuf();
    EXPECT_NE(all.str().find("planet,"), std::string::npos);
    EXPECT_NE(all.str().find(",V,NO,STD,ENSEMBLE,"), std::string::npos);
    const Table aij = readCsv(o.dir + "/planet.aij.tbl");
    EXPECT_EQ(aij.rows(), std::size_t(Night::kFrames));
    EXPECT_NE(aij.find("rel_flux_T1"), nullptr);
    // Stored in time order, every catalog given (the unusable ones too, so that an append skips none).
    auto stored = seriesCatalogsIn(o.dir), given = night.catalogs;
    std::sort(stored.begin(), stored.end());
    std::sort(given.begin(), given.end());
    EXPECT_EQ(stored, given);
    EXPECT_TRUE(seriesCatalogsIn(out / "nothing").empty());
    std::ofstream(out / "series.json") << "{\"catalogs\": 3}";
    EXPECT_THROW(seriesCatalogsIn(out.str()), InvalidInput);
}

TEST(Series, AppendsFramesToItsStateAsAFullBuildWould) {
    Night night;
    const SeriesResult full = buildSeries(night.catalogs, night.targets(), SeriesParams{});
    std::vector<std::string> first(night.catalogs.begin(), night.catalogs.begin() + 40),
        rest(night.catalogs.begin() + 40, night.catalogs.end());
    const SeriesResult early = buildSeries(first, night.targets(), SeriesParams{});
    TempDir out("gpuphot_series_state");
    saveSeriesState(early.state, out.str());
    std::optional<SeriesState> st = loadSeriesState(out.str());
    ASSERT_TRUE(st.has_value());
    EXPECT_FALSE(loadSeriesState((out / "none").c_str()).has_value());

    SeriesParams other;
    other.ensembleSize = 5;
    EXPECT_FALSE(appendSeries(*st, rest, night.targets(), other).has_value()) << "other parameters: rebuild";
    rest.push_back(first[3]); // seen before: not appended twice
    const auto r = appendSeries(*st, rest, night.targets(), SeriesParams{});
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE(r->appended);
    EXPECT_EQ(r->frames.size(), full.frames.size());
    EXPECT_NE(frameNamed(*r, "f062")->problem.find("another field"), std::string::npos);
    EXPECT_NE(frameNamed(*r, "f060")->problem.find("filter"), std::string::npos);
    const LightCurve &a = r->curves[0], &b = full.curves[0];
    ASSERT_EQ(a.relFlux.size(), b.relFlux.size());
    // The same comparison stars but one; weights from 40 or 60 frames differ a little: a third of the noise.
    auto activeOf = [](const LightCurve& lc) {
        std::vector<std::size_t> s;
        for (const auto& e : lc.ensemble)
            if (!e.dropped) s.push_back(e.source);
        std::sort(s.begin(), s.end());
        return s;
    };
    // (The grid's equidistant neighbours may swap one place with the mean positions of 40 or 60 frames.)
    std::vector<std::size_t> common;
    const auto sa = activeOf(a), sb = activeOf(b);
    std::set_intersection(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(common));
    EXPECT_GE(common.size() + 1, sb.size());
    for (std::size_t u = 0; u < a.relFlux.size(); ++u) {
        EXPECT_NEAR(a.relFlux[u], b.relFlux[u], Night::kNoise / 3) << u;
        EXPECT_DOUBLE_EQ(a.bjdTdb[u], b.bjdTdb[u]);
    }
    EXPECT_EQ(st->used.size(), std::size_t(Night::kFrames)) << "the state grew";
    EXPECT_EQ(frameNamed(*r, "f050")->sourceFrame, "/raw/f050.fits") << "SRCFILE of an appended catalog";
    EXPECT_EQ(frameNamed(*r, "f010")->sourceFrame, "/raw/f010.fits") << "SRCFILE kept in the state";

    std::ofstream(out / "series.state") << "garbage";
    EXPECT_THROW(loadSeriesState(out.str()), InvalidInput);
}

TEST(Series, EveryStarsCurveShowsWhichAreVariable) {
    Night night;
    SeriesParams p;
    p.allStars = true;
    const SeriesResult r = buildSeries(night.catalogs, night.targets(), p);
    ASSERT_EQ(r.stars.size(), std::size_t(Night::kSide * Night::kSide));
    std::vector<double> chi2;
    double variableChi2 = 0.0, targetChi2 = 0.0;
    for (const auto& c : r.stars) {
        ASSERT_EQ(c.relFlux.size(), std::size_t(Night::kFrames));
        double vr, vd, tr, td;
        Night::position(Night::kVariable, vr, vd);
        Night::position(Night::kTarget, tr, td);
        const SeriesSource& s = r.sources[c.source];
        if (std::fabs(s.dec - vd) < 1e-4 && std::fabs(s.ra - vr) < 1e-4)
            variableChi2 = c.chi2;
        else if (std::fabs(s.dec - td) < 1e-4 && std::fabs(s.ra - tr) < 1e-4)
            targetChi2 = c.chi2;
        else
            chi2.push_back(c.chi2);
    }
    std::sort(chi2.begin(), chi2.end());
    EXPECT_GT(chi2[chi2.size() / 2], 0.7);
    EXPECT_LT(chi2.back(), 2.0) << "constant stars' curves are consistent with their errors";
    EXPECT_GT(variableChi2, 50.0);
    EXPECT_GT(targetChi2, 5.0);
    TempDir out("gpuphot_series_all");
    SeriesOutputOptions o;
    o.dir = out.str();
    o.formats = {};
    writeSeriesOutputs(r, o);
    EXPECT_EQ(readFitsTable(o.dir + "/series.stars.fits").rows(), r.stars.size());
    EXPECT_EQ(readFitsTable(o.dir + "/series.curves.fits").rows(), r.stars.size() * Night::kFrames);
}

namespace {

bool isSourceAt(const SeriesResult& r, std::size_t source, int gridIndex) {
    double ra, dec;
    Night::position(gridIndex, ra, dec);
    return std::fabs(r.sources[source].dec - dec) < 1e-4 && std::fabs(r.sources[source].ra - ra) < 1e-4;
}

} // namespace

TEST(Series, FlaggedVariablesAreNoComparisonsAndGetAPeriod) {
    Night night;
    SeriesParams p;
    p.allStars = true;
    p.findVariables = true;
    p.detrend = {"airmass"};
    const SeriesResult r = buildSeries(night.catalogs, night.targets(), p);
    int flagged = 0;
    for (const auto& c : r.stars) {
        flagged += c.variable ? 1 : 0;
        if (isSourceAt(r, c.source, Night::kVariable)) {
            EXPECT_TRUE(c.variable);
            EXPECT_GT(c.stetsonJ, 3.0);
            // The sine's period: 20 frames of 60 s.
            EXPECT_NEAR(c.bestPeriod * 86400.0, 1200.0, 12.0);
            EXPECT_LT(c.falseAlarm, 1e-6);
        } else if (!isSourceAt(r, c.source, Night::kTarget)) {
            EXPECT_FALSE(c.variable) << "source " << c.source << " J " << c.stetsonJ << " chi2 " << c.chi2;
            EXPECT_LT(c.stetsonJ, 0.3);
        }
    }
    EXPECT_EQ(flagged, 2); // the sine and the dip
    const LightCurve& lc = r.curves[0];
    ASSERT_TRUE(lc.problem.empty());
    EXPECT_TRUE(lc.variable) << "a 2 % dip at 0.3 % noise";
    EXPECT_TRUE(std::isfinite(lc.bestPeriod));
    for (const auto& e : lc.ensemble)
        EXPECT_FALSE(isSourceAt(r, e.source, Night::kVariable)) << "the flagged star is no candidate";
    ASSERT_EQ(lc.detrendFit.terms, std::vector<std::string>{"airmass"});
    EXPECT_EQ(lc.detrendFit.points, Night::kFrames);
    EXPECT_TRUE(std::isfinite(lc.detrendFit.coef[0]));
    TempDir out("gpuphot_series_variables");
    SeriesOutputOptions o;
    o.dir = out.str();
    o.formats = {};
    writeSeriesOutputs(r, o);
    EXPECT_EQ(readCsv(o.dir + "/series.variables.csv").rows(), 2u);
    EXPECT_NE(readFitsTable(o.dir + "/series.stars.fits").find("stetson_j"), nullptr);
    std::ifstream in(o.dir + "/series.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["variables"], 2);
    EXPECT_TRUE(j["targets"][0]["variability"]["variable"].get<bool>());
    EXPECT_EQ(j["targets"][0]["detrend"]["terms"][0], "airmass");
    EXPECT_EQ(j["targets"][0]["detrend"]["coef"].size(), 1u);
}

TEST(Series, AnAppendDetrendsAndFlagsAsTheBuildDoes) {
    Night night;
    SeriesParams p;
    p.findVariables = true;
    p.detrend = {"airmass", "time"};
    const SeriesResult full = buildSeries(night.catalogs, night.targets(), p);
    std::vector<std::string> first(night.catalogs.begin(), night.catalogs.begin() + 40),
        rest(night.catalogs.begin() + 40, night.catalogs.end());
    SeriesResult early = buildSeries(first, night.targets(), p);
    const auto r = appendSeries(early.state, rest, night.targets(), p);
    ASSERT_TRUE(r.has_value());
    const LightCurve &a = r->curves[0], &b = full.curves[0];
    EXPECT_EQ(a.detrendFit.terms, b.detrendFit.terms);
    EXPECT_EQ(a.detrendFit.points, b.detrendFit.points);
    EXPECT_NEAR(a.detrendFit.coef[0], b.detrendFit.coef[0], 2.0 * b.detrendFit.coefErr[0]);
    EXPECT_EQ(a.variable, b.variable);
    EXPECT_NEAR(a.stetsonJ, b.stetsonJ, 0.1 * std::fabs(b.stetsonJ));
    EXPECT_TRUE(std::isfinite(a.bestPeriod));
    for (const auto& e : a.ensemble)
        EXPECT_FALSE(isSourceAt(*r, e.source, Night::kVariable)) << "flagged against the field: no candidate";
}

// fitTransits: the target's 2 % box dip (frames 25-39 of 60) found by the blind fitter, in the build, in
// an append of the last frames (the same fit), and in series.json.
TEST(Series, FitsTheTargetsTransitInTheBuildAndTheAppend) {
    Night night;
    SeriesParams p;
    p.fitTransits = true;
    p.transit.minDuration = 0.005; // d: the dip lasts 15 min of the hour
    const SeriesResult full = buildSeries(night.catalogs, night.targets(), p);
    const LightCurve& lc = full.curves[0];
    ASSERT_TRUE(lc.problem.empty());
    const TransitFit& t = lc.transit;
    ASSERT_TRUE(t.found) << "snr " << t.snr;
    EXPECT_NEAR(t.depth, 0.02, 0.002);
    const double mid = 0.5 * (lc.bjdTdb[24] + lc.bjdTdb[40]); // between the last and first frames outside
    EXPECT_NEAR((t.mid - mid) * 1440.0, 0.0, 1.0);
    EXPECT_NEAR(t.duration * 1440.0, 15.0, 2.0);
    EXPECT_EQ(t.points, Night::kFrames);
    EXPECT_EQ(full.curves[1].transit.points, 0) << "no curve, no fit";

    std::vector<std::string> first(night.catalogs.begin(), night.catalogs.begin() + 45),
        rest(night.catalogs.begin() + 45, night.catalogs.end());
    SeriesResult early = buildSeries(first, night.targets(), p);
    const auto r = appendSeries(early.state, rest, night.targets(), p);
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE(r->curves[0].transit.found);
    EXPECT_NEAR(r->curves[0].transit.depth, t.depth, 2.0 * t.depthErr);
    EXPECT_NEAR(r->curves[0].transit.mid, t.mid, 2.0 * t.midErr);

    TempDir out("gpuphot_series_transit");
    SeriesOutputOptions o;
    o.dir = out.str();
    o.formats = {};
    writeSeriesOutputs(full, o);
    std::ifstream in(o.dir + "/series.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    const nlohmann::json& tj = j["targets"][0]["transit"];
    EXPECT_TRUE(tj["found"].get<bool>());
    EXPECT_DOUBLE_EQ(tj["depth"].get<double>(), t.depth);
    EXPECT_DOUBLE_EQ(tj["mid_bjd_tdb"].get<double>(), t.mid);
    EXPECT_NEAR(tj["mid_err_min"].get<double>(), t.midErr * 1440.0, 1e-9);
    EXPECT_NEAR(tj["duration_h"].get<double>(), t.duration * 24.0, 1e-12);
    for (const char* k : {"depth_err", "ingress", "snr", "chi2"})
        EXPECT_TRUE(tj[k].is_number()) << k;
    EXPECT_TRUE(j["params"]["fitTransits"].get<bool>());
}

TEST(Series, ForcedPhotometryWhereTheTargetWasNotDetected) {
    Night night(true);
    SeriesParams p;
    p.flux = "aper_2"; // forced photometry has the catalog's apertures only
    const SeriesResult r = buildSeries(night.catalogs, night.targets(), p);
    const LightCurve& lc = r.curves[0];
    ASSERT_TRUE(lc.problem.empty()) << lc.problem;
    int forced = 0;
    for (int f = 0; f < Night::kFrames; ++f) {
        EXPECT_EQ(lc.detected[f], Night::undetected(f) ? 0 : 1) << f;
        EXPECT_TRUE(std::isfinite(lc.relFlux[f])) << f;
        if (Night::undetected(f)) {
            ++forced;
            EXPECT_NEAR(lc.relFlux[f], 0.98, 0.015) << "in the dip";
        }
    }
    EXPECT_EQ(forced, 4);
    // With opt photometry (not in the targets table) those frames have no point.
    const SeriesResult o = buildSeries(night.catalogs, night.targets(), SeriesParams{});
    for (int f = 30; f < 34; ++f)
        EXPECT_FALSE(std::isfinite(o.curves[0].relFlux[f])) << f;
}

// Forced photometry at every listed source: a star missing from a frame's catalog takes the
// STEM.targets.fits row named after its list entry (what `series` asks reduce --targets for).
TEST(Series, ForcedPhotometryAtEveryListedSource) {
    SeriesParams p;
    p.flux = "aper_2";
    p.allStars = true;
    double ra, dec;
    Night::position(Night::kHidden, ra, dec);
    const auto indexOf = [&](const SeriesResult& r) {
        for (std::size_t s = 0; s < r.sources.size(); ++s)
            if (std::fabs(r.sources[s].dec - dec) < 1e-4 && std::fabs(r.sources[s].ra - ra) < 1e-4) return s;
        return r.sources.size();
    };
    Night plain;
    const std::size_t idx = indexOf(buildSeries(plain.catalogs, plain.targets(), p));
    ASSERT_LT(idx, std::size_t(Night::kSide * Night::kSide));
    EXPECT_EQ(sourceTargetName(idx), "series_src" + std::to_string(idx + 1));

    const auto curveOf = [&](const SeriesResult& r) -> const StarCurve& {
        for (const auto& c : r.stars)
            if (c.source == idx) return c;
        throw std::runtime_error("no curve");
    };
    Night unnamed(false, sourceTargetName(idx + 1)); // another source's name: not at this one's position
    Night named(false, sourceTargetName(idx));       // rows named after it are
    const SeriesResult a = buildSeries(unnamed.catalogs, unnamed.targets(), p);
    const SeriesResult b = buildSeries(named.catalogs, named.targets(), p);
    ASSERT_EQ(indexOf(a), idx);
    ASSERT_EQ(indexOf(b), idx);
    EXPECT_EQ(a.sources[idx].frames, Night::kFrames - 3);
    EXPECT_EQ(b.sources[idx].frames, Night::kFrames - 3) << "forced points are not detections";
    EXPECT_EQ(curveOf(a).points, Night::kFrames - 3);
    EXPECT_EQ(curveOf(b).points, Night::kFrames);
    for (int f = 0; f < Night::kFrames; ++f) {
        EXPECT_EQ(std::isfinite(curveOf(a).relFlux[f]), !Night::hiddenIn(f)) << f;
        EXPECT_TRUE(std::isfinite(curveOf(b).relFlux[f])) << f;
        if (Night::hiddenIn(f)) EXPECT_NEAR(curveOf(b).relFlux[f], 1.0, 0.02) << f;
    }

    // The targets file `series` writes for reduce --targets: the targets, then every listed source.
    TempDir out("gpuphot_series_list");
    const std::string list = out / "series.sources.csv";
    writeSourceTargets(b.state, named.targets(), list);
    const TargetList t = readTargetList(list);
    ASSERT_EQ(t.size(), 2 + b.sources.size());
    EXPECT_EQ(t.name[0], "planet");
    EXPECT_EQ(t.name[2 + idx], sourceTargetName(idx));
    EXPECT_NEAR(t.ra[2 + idx], b.sources[idx].ra, 1e-9);
    EXPECT_NEAR(t.dec[2 + idx], b.sources[idx].dec, 1e-9);
}

TEST(Series, ComparisonsOfTheTargetsColourFirst) {
    Night night;
    // A reference with colours: 0.3 for even grid rows, 1.2 for odd ones (the target's row is odd).
    std::ofstream ref(night.dir / "ref.csv");
    ref << "ra,dec,mag,bp_rp\n";
    for (int k = 0; k < Night::kSide * Night::kSide; ++k) {
        double r, d;
        Night::position(k, r, d);
        ref << std::setprecision(12) << r << ',' << d << ",15," << ((k / Night::kSide) % 2 ? 1.2 : 0.3)
            << '\n';
    }
    ref.close();
    SeriesParams p;
    p.reference = night.dir / "ref.csv";
    p.referenceColumns = "color=bp_rp";
    const SeriesResult r = buildSeries(night.catalogs, night.targets(), p);
    const LightCurve& lc = r.curves[0];
    ASSERT_TRUE(lc.problem.empty());
    EXPECT_DOUBLE_EQ(r.sources[lc.source].colour, 1.2);
    ASSERT_EQ(lc.ensemble.size(), std::size_t(p.ensembleSize));
    for (const auto& e : lc.ensemble)
        EXPECT_DOUBLE_EQ(r.sources[e.source].colour, 1.2) << e.source;
    // Without colours the nearest stars of both rows are taken.
    const SeriesResult plain = buildSeries(night.catalogs, night.targets(), SeriesParams{});
    int other = 0;
    for (const auto& e : plain.curves[0].ensemble) {
        double rr, dd;
        for (int k = 0; k < Night::kSide * Night::kSide; ++k) {
            Night::position(k, rr, dd);
            if (std::fabs(plain.sources[e.source].dec - dd) < 1e-4 &&
                std::fabs(plain.sources[e.source].ra - rr) < 1e-4)
                other += (k / Night::kSide) % 2 ? 0 : 1;
        }
    }
    EXPECT_GT(other, 0);
}

TEST(Series, RefusesBadParametersAndAllUnusableInput) {
    SeriesParams p;
    p.flux = "aper_x";
    EXPECT_THROW(validate(p), InvalidInput);
    p = {};
    p.minEnsemble = 20;
    EXPECT_THROW(validate(p), InvalidInput);
    TempDir d("gpuphot_series_bad");
    std::ofstream(d / "a.cat.fits") << "junk";
    try {
        buildSeries({d / "a.cat.fits"}, TargetList{}, SeriesParams{});
        FAIL() << "no usable catalog must throw";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("a.cat.fits"), std::string::npos);
    }
}
