// gpuphot reduce's calibration options end to end through the binary: --targets (forced photometry at
// RA/Dec positions), --write-solved (a copy of the frame with the fitted WCS, checked with astropy),
// --ignore-header-wcs and --scale-low/--scale-high (a frame with a deliberately wrong header WCS still
// solves), and the mid-exposure MJD and airmass in the catalog header and the report.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/catalog/table.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

// A simulated 400x400 frame with a correct header WCS, its truth and reference catalog (made once).
struct Sim {
    TempDir dir{"gpuphot_calib_sim"};
    std::string frame, truth, ref;
};
const Sim& sim() {
    static const std::unique_ptr<Sim> s = [] {
        auto owned = std::make_unique<Sim>();
        Sim& g = *owned;
        const CliResult r =
            runCli("simulate --size 400x400 --stars 200 --seed 17 --set magFaint=18.5 -q -o " + g.dir.str() +
                   " --name field");
        EXPECT_EQ(r.exitCode, 0) << r.err;
        g.frame = g.dir / "field.fits";
        g.truth = g.dir / "field.truth.fits";
        g.ref = g.dir / "field.ref.fits";
        return owned;
    }();
    return *s;
}

std::string sexagesimal(double deg, bool hours) {
    double v = hours ? deg / 15.0 : std::fabs(deg);
    const int a = static_cast<int>(v);
    v = (v - a) * 60.0;
    const int b = static_cast<int>(v);
    const double c = (v - b) * 60.0;
    char buf[64];
    if (hours)
        std::snprintf(buf, sizeof buf, "%02d:%02d:%08.5f", a, b, c);
    else
        std::snprintf(buf, sizeof buf, "%c%02d:%02d:%07.4f", deg < 0 ? '-' : '+', a, b, c);
    return buf;
}

// Python snippet: the pixel (1-based) that a FITS file's WCS gives for truth RA/Dec, against the truth x, y.
std::string wcsCheckScript(const std::string& solved, const std::string& truth, const std::string& original,
                           const std::string& fitted) {
    return "import numpy as np\n"
           "from astropy.io import fits\n"
           "from astropy.wcs import WCS\n"
           "import warnings\nwarnings.simplefilter('ignore')\n"
           "h = fits.open('" +
           solved +
           "')\n"
           "o = fits.open('" +
           original +
           "')\n"
           "print('HDUS', len(h), len(o))\n"
           "print('SAME_DATA', int(np.array_equal(h[0].data, o[0].data)))\n"
           "keys = [k for k in h[0].header.keys() if k and k not in ('COMMENT', 'HISTORY')]\n"
           "print('DUPLICATES', len(keys) - len(set(keys)))\n"
           "w = WCS(h[0].header)\n"
           "t = fits.getdata('" +
           truth +
           "')\n"
           "nx, ny = h[0].header['NAXIS1'], h[0].header['NAXIS2']\n"
           "sel = (t['x'] > 0.5) & (t['x'] < nx + 0.5) & (t['y'] > 0.5) & (t['y'] < ny + 0.5)\n"
           "x, y = w.all_world2pix(t['ra'][sel], t['dec'][sel], 1)\n"
           "d = np.hypot(x - t['x'][sel], y - t['y'][sel])\n"
           "print('N', int(sel.sum()))\n"
           "print('RMSDEV', float(np.sqrt(np.mean(d ** 2))))\n"
           "print('P95DEV', float(np.percentile(d, 95)))\n"
           "print('MAXDEV', float(d.max()))\n"
           "f = WCS(fits.getheader('" +
           fitted +
           "'))\n"
           "fx, fy = f.all_world2pix(t['ra'][sel], t['dec'][sel], 1)\n"
           "print('VSFIT', float(np.hypot(fx - x, fy - y).max()))\n"
           "print('SIP', int(w.sip is not None))\n";
}

double valueAfter(const std::string& out, const std::string& key) {
    const auto p = out.find(key + " ");
    if (p == std::string::npos) return std::nan("");
    return std::stod(out.substr(p + key.size() + 1));
}

// The solved frame's WCS (read by astropy) is the fitted one (STEM.wcs) to 1e-6 px, and maps the truth
// RA/Dec onto the true positions: RMS and 95th percentile within 0.05 px; the worst star, in a corner of
// a small field where the SIP fit extrapolates, within 0.1 px (measured: 0.056 and 0.075 px).
void expectTruthMapped(const std::string& py) {
    EXPECT_LT(valueAfter(py, "VSFIT"), 1e-6) << py;
    EXPECT_LT(valueAfter(py, "RMSDEV"), 0.05) << py;
    EXPECT_LT(valueAfter(py, "P95DEV"), 0.05) << py;
    EXPECT_LT(valueAfter(py, "MAXDEV"), 0.1) << py;
}

} // namespace

TEST(CliReduceCalib, TargetsGetForcedPhotometryAndWriteSolvedAFrameAstropyReads) {
    const Sim& s = sim();
    TempDir out("gpuphot_calib_targets");
    // First pass: the catalog, to place targets exactly on detections.
    CliResult r = runCli("reduce " + s.frame + " --ref " + s.ref + " -q -o " + out.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const Table cat = readFitsTable(out / "field.cat.fits");
    const Table truth = readFitsTable(s.truth);
    const auto cra = cat.doubles("ra"), cdec = cat.doubles("dec"), cid = cat.doubles("id");
    const auto tra = truth.doubles("ra"), tdec = truth.doubles("dec"), tmag = truth.doubles("mag");
    const auto tx = truth.doubles("x"), ty = truth.doubles("y"), gal = truth.doubles("is_galaxy");
    const auto sat = truth.doubles("saturated");
    ASSERT_GT(cat.rows(), 100u);
    // Targets: 15 catalog detections (decimal degrees, full precision), 15 isolated true stars
    // (sexagesimal), one position off the frame.
    std::ofstream csv(out / "targets.csv");
    csv << "name,ra,dec\n";
    char line[160];
    std::vector<std::size_t> catRows, truthRows;
    for (std::size_t i = 0; i < cat.rows() && catRows.size() < 15; i += cat.rows() / 15) {
        std::snprintf(line, sizeof line, "det%zu,%.17g,%.17g\n", i, cra[i], cdec[i]);
        csv << line;
        catRows.push_back(i);
    }
    for (std::size_t k = 0; k < tx.size() && truthRows.size() < 15; ++k) {
        if (gal[k] != 0 || sat[k] != 0 || tx[k] < 20 || ty[k] < 20 || tx[k] > 380 || ty[k] > 380) continue;
        bool isolated = true;
        for (std::size_t j = 0; j < tx.size() && isolated; ++j)
            isolated = j == k || std::hypot(tx[j] - tx[k], ty[j] - ty[k]) > 15.0;
        if (!isolated) continue;
        csv << "true" << k << "," << sexagesimal(tra[k], true) << "," << sexagesimal(tdec[k], false) << "\n";
        truthRows.push_back(k);
    }
    csv << "faraway,10.0,-60.0\n";
    csv.close();
    ASSERT_GE(truthRows.size(), 10u);

    r = runCli("reduce " + s.frame + " --ref " + s.ref + " --targets " + (out / "targets.csv") +
               " --write-solved --formats ecsv -o " + out.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    ASSERT_TRUE(fs::exists(out.path / "field.targets.fits"));
    ASSERT_TRUE(fs::exists(out.path / "field.targets.ecsv"));
    ASSERT_TRUE(fs::exists(out.path / "field.solved.fits"));
    const Table t = readFitsTable(out / "field.targets.fits");
    const std::size_t nt = catRows.size() + truthRows.size() + 1;
    ASSERT_EQ(t.rows(), nt);
    for (const char* c : {"name", "ra", "dec", "x", "y", "flux_aper_1", "fluxerr_aper_1", "mag_aper_1",
                          "magerr_aper_1", "mag_cal", "magerr_cal", "sky", "flags", "det_id", "det_sep"})
        EXPECT_NE(t.find(c), nullptr) << c;
    const auto detId = t.doubles("det_id"), flags = t.doubles("flags"), magCal = t.doubles("mag_cal");
    const auto magCalErr = t.doubles("magerr_cal");
    const Table cat2 = readFitsTable(out / "field.cat.fits");
    // 1) On detections: that detection's id and its aperture fluxes (the positions round-trip through
    //    the WCS to ~1e-9 px, so equal to 1e-6 relative rather than bitwise; bitwise is in core_tests).
    for (std::size_t m = 0; m < catRows.size(); ++m) {
        const std::size_t i = catRows[m];
        EXPECT_EQ(detId[m], cid[i]) << "target " << m;
        for (int k = 1; k <= 4; ++k) {
            const std::string col = "flux_aper_" + std::to_string(k);
            const double a = t.doubles(col)[m], b = cat2.doubles(col)[i];
            EXPECT_NEAR(a, b, 1e-6 * std::fabs(b) + 1e-9) << col << " target " << m;
        }
    }
    // 2) On true positions: calibrated magnitudes against the true magnitudes within their errors
    //    (plus the small field's zero-point uncertainty).
    std::size_t good = 0;
    for (std::size_t m = 0; m < truthRows.size(); ++m) {
        const std::size_t row = catRows.size() + m;
        ASSERT_TRUE(std::isfinite(magCal[row])) << "target " << row;
        good += std::fabs(magCal[row] - tmag[truthRows[m]]) < 3.0 * magCalErr[row] + 0.02;
    }
    EXPECT_GE(good, truthRows.size() * 8 / 10);
    // 3) Off the frame: flagged (bit 24), not measured.
    EXPECT_TRUE(static_cast<std::int64_t>(flags[nt - 1]) & (1 << 24));
    EXPECT_TRUE(std::isnan(t.doubles("flux_aper_1")[nt - 1]));
    EXPECT_EQ(detId[nt - 1], -1);
    EXPECT_NE(r.err.find("outside the frame"), std::string::npos) << r.err;
    // Header: mid-exposure MJD and airmass of the simulated exposure (MJD 60390.1234 + 60 s / 2, 1.2).
    EXPECT_NEAR(*t.meta.getDouble("MJD-MID"), 60390.1234 + 30.0 / 86400.0, 1e-8);
    EXPECT_NEAR(*cat2.meta.getDouble("MJD-MID"), 60390.1234 + 30.0 / 86400.0, 1e-8);
    EXPECT_NEAR(*cat2.meta.getDouble("AIRMASS"), 1.2, 1e-9);
    const auto report = nlohmann::json::parse(slurp(out.path / "field.report.json"));
    EXPECT_NEAR(report["instrument"]["mjd_mid"].get<double>(), 60390.1234 + 30.0 / 86400.0, 1e-8);
    EXPECT_NEAR(report["instrument"]["airmass"].get<double>(), 1.2, 1e-9);
    EXPECT_EQ(report["outputs"]["targets"].get<std::string>(), out / "field.targets.fits");
    EXPECT_EQ(report["outputs"]["solved"].get<std::string>(), out / "field.solved.fits");

    // The solved frame: the data untouched, the fitted WCS maps the truth to within 0.05 px.
    const Header solved = readHeader(out / "field.solved.fits");
    EXPECT_NE(solved.getString("CTYPE1")->find("SIP"), std::string::npos);
    if (!havePython()) GTEST_SKIP() << "no /usr/bin/python3 with astropy";
    const std::string py =
        runPython(wcsCheckScript(out / "field.solved.fits", s.truth, s.frame, out / "field.wcs"));
    EXPECT_NE(py.find("HDUS 1 1"), std::string::npos) << py;
    EXPECT_NE(py.find("SAME_DATA 1"), std::string::npos) << py;
    EXPECT_NE(py.find("DUPLICATES 0"), std::string::npos) << py;
    EXPECT_NE(py.find("SIP 1"), std::string::npos) << py;
    EXPECT_GT(valueAfter(py, "N"), 100) << py;
    expectTruthMapped(py);
}

TEST(CliReduceCalib, IgnoreHeaderWcsSolvesAFrameWithAWrongHeader) {
    TempDir dir("gpuphot_calib_blind");
    // Header WCS 20' off and rotated by 4 deg: refined it would fail; ignored, the blind solve finds it.
    ASSERT_EQ(runCli("simulate --size 512x512 --stars 400 --seed 5 --wcs-offset 20 --wcs-rotation 4 -q -o " +
                     dir.str() + " --name wrong")
                  .exitCode,
              0);
    const CliResult r =
        runCli("reduce " + (dir / "wrong.fits") + " --ref " + (dir / "wrong.ref.fits") +
               " --ignore-header-wcs --scale-low 0.8 --scale-high 1.25 --write-solved -o " + dir.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const auto report = nlohmann::json::parse(slurp(dir.path / "wrong.report.json"));
    EXPECT_TRUE(report["astrometry"]["ok"].get<bool>());
    EXPECT_EQ(report["astrometry"]["method"].get<std::string>(), "blind");
    EXPECT_EQ(report["config"]["astrometry"]["scaleLow"].get<double>(), 0.8);
    EXPECT_EQ(report["config"]["astrometry"]["scaleHigh"].get<double>(), 1.25);
    EXPECT_NE(report["frame"]["wcs_problem"].get<std::string>().find("ignore"), std::string::npos);
    const Table cat = readFitsTable(dir / "wrong.cat.fits");
    EXPECT_EQ(*cat.meta.getString("WCSSRC"), "fitted (blind)");
    if (!havePython()) GTEST_SKIP() << "no /usr/bin/python3 with astropy";
    const std::string py = runPython(wcsCheckScript(dir / "wrong.solved.fits", dir / "wrong.truth.fits",
                                                    dir / "wrong.fits", dir / "wrong.wcs"));
    EXPECT_NE(py.find("SAME_DATA 1"), std::string::npos) << py;
    EXPECT_NE(py.find("DUPLICATES 0"), std::string::npos) << py;
    expectTruthMapped(py);
}

TEST(CliReduceCalib, TargetsWithoutAnyWcsAreAClearError) {
    TempDir dir("gpuphot_calib_nowcs");
    ASSERT_EQ(runCli("simulate --size 128x128 --stars 20 --seed 2 --no-wcs -q -o " + dir.str() + " --name n")
                  .exitCode,
              0);
    std::ofstream(dir / "t.csv") << "ra,dec\n150.0,20.0\n";
    CliResult r = runCli("reduce " + (dir / "n.fits") + " --targets " + (dir / "t.csv") + " -o " + dir.str());
    EXPECT_EQ(r.exitCode, 2) << r.err;
    EXPECT_NE(r.err.find("--targets"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir.path / "n.cat.fits")) << "an input error writes nothing";
    // The same with a good header WCS ignored.
    ASSERT_EQ(runCli("simulate --size 128x128 --stars 20 --seed 2 -q -o " + dir.str() + " --name w").exitCode,
              0);
    r = runCli("reduce " + (dir / "w.fits") + " --ignore-header-wcs --targets " + (dir / "t.csv") + " -o " +
               dir.str());
    EXPECT_EQ(r.exitCode, 2) << r.err;
    EXPECT_NE(r.err.find("--targets"), std::string::npos) << r.err;
    // A target file with no position columns: exit 2 naming the file.
    std::ofstream(dir / "bad.csv") << "x,y\n1,2\n";
    r = runCli("reduce " + (dir / "w.fits") + " --targets " + (dir / "bad.csv") + " -o " + dir.str());
    EXPECT_EQ(r.exitCode, 2) << r.err;
    EXPECT_NE(r.err.find("bad.csv"), std::string::npos) << r.err;
}

TEST(CliReduceCalib, WriteSolvedWithoutAVerifiedFitWarnsAndWritesNoFile) {
    TempDir dir("gpuphot_calib_nosolve");
    ASSERT_EQ(runCli("simulate --size 128x128 --stars 30 --seed 9 -q -o " + dir.str() + " --name f").exitCode,
              0);
    const CliResult r = runCli("reduce " + (dir / "f.fits") + " --write-solved -o " + dir.str());
    EXPECT_EQ(r.exitCode, 0) << r.err;
    EXPECT_NE(r.err.find("--write-solved"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir.path / "f.solved.fits"));
    EXPECT_TRUE(fs::exists(dir.path / "f.cat.fits"));
}

TEST(CliReduceCalib, BadScaleRangeIsAnInputError) {
    const CliResult r =
        runCli("reduce " + sim().frame + " --scale-low 2 --scale-high 1 -o " + sim().dir.str());
    EXPECT_EQ(r.exitCode, 2) << r.err;
    EXPECT_NE(r.err.find("--scale-low"), std::string::npos) << r.err;
}
