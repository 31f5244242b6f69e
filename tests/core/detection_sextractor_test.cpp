// Detection against Debian's source-extractor (SExtractor 2.25) on the same pixels: a simulated star
// field written to FITS with CFITSIO, the same threshold, filter kernel, minimum area, deblending and
// cleaning settings, and the known background (BACK_TYPE MANUAL). Skipped when source-extractor is absent.
#include <gtest/gtest.h>

#include <fitsio.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/convolution.hpp"
#include "core/stages/detection/detection.hpp"

namespace gpuphot {
namespace {

constexpr double kPi = 3.14159265358979323846;

bool haveSourceExtractor() {
    return std::system("command -v source-extractor > /dev/null 2>&1") == 0;
}

void writeFits(const std::string& path, const Image<float>& img) {
    fitsfile* f = nullptr;
    int status = 0;
    long naxes[2] = {img.width(), img.height()};
    fits_create_file(&f, ("!" + path).c_str(), &status);
    fits_create_img(f, FLOAT_IMG, 2, naxes, &status);
    fits_write_img(f, TFLOAT, 1, static_cast<LONGLONG>(img.pixelCount()), const_cast<float*>(img.data()),
                   &status);
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0) << "CFITSIO error writing " << path;
}

struct SexObject {
    double x, y, xwin, ywin, fluxIso;
    int area;
};

Image<float> starField(int w, int h, int nStars, double sky, double noise, std::uint32_t seed,
                       std::vector<double>& tx, std::vector<double>& ty) {
    Image<float> img(w, h, static_cast<float>(sky));
    std::mt19937 rng(seed);
    auto uni = [&](double a, double b) { return a + (b - a) * (static_cast<double>(rng()) / 4294967296.0); };
    for (int k = 0; k < nStars; ++k) {
        const double x0 = uni(5, w - 5), y0 = uni(5, h - 5);
        const double flux = std::exp(uni(std::log(300.0), std::log(3e5)));
        tx.push_back(x0);
        ty.push_back(y0);
        const double s = 1.6;
        const double amp = flux / (2 * kPi * s * s);
        for (int y = std::max(0, int(y0) - 16); y <= std::min(h - 1, int(y0) + 16); ++y)
            for (int x = std::max(0, int(x0) - 16); x <= std::min(w - 1, int(x0) + 16); ++x)
                img(x, y) += static_cast<float>(
                    amp * std::exp(-0.5 * ((x - x0) * (x - x0) + (y - y0) * (y - y0)) / (s * s)));
    }
    std::uint32_t st = seed * 2654435761u + 1;
    std::mt19937 nrng(st);
    for (std::size_t i = 0; i < img.pixelCount(); ++i) {
        const double u1 = (nrng() + 0.5) / 4294967296.0, u2 = (nrng() + 0.5) / 4294967296.0;
        img.data()[i] += static_cast<float>(noise * std::sqrt(-2 * std::log(u1)) * std::cos(2 * kPi * u2));
    }
    return img;
}

TEST(DetectionSextractor, MatchesSourceExtractorCatalog) {
    if (!haveSourceExtractor()) GTEST_SKIP() << "source-extractor not installed";
    const int w = 600, h = 500;
    const double sky = 1000.0, noise = 10.0;
    std::vector<double> tx, ty; // the true star positions
    const Image<float> img = starField(w, h, 400, sky, noise, 2024, tx, ty);

    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("gpuphot_det_sex_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    writeFits((dir / "field.fits").string(), img);

    // The same 7x7 Gaussian kernel (FWHM 3) that the stage uses, as a SExtractor convolution file.
    const std::vector<float> k1 = gaussianKernel1d(3.0);
    {
        std::ofstream conv(dir / "gauss.conv");
        conv << "CONV NORM\n# 7x7 Gaussian, FWHM 3 px\n";
        conv.precision(9);
        for (std::size_t j = 0; j < k1.size(); ++j) {
            for (std::size_t i = 0; i < k1.size(); ++i)
                conv << double(k1[j]) * double(k1[i]) << (i + 1 < k1.size() ? " " : "\n");
        }
        std::ofstream param(dir / "det.param");
        param << "X_IMAGE\nY_IMAGE\nXWIN_IMAGE\nYWIN_IMAGE\nFLUX_ISO\nISOAREA_IMAGE\n";
        std::ofstream cfg(dir / "det.sex");
        cfg << "CATALOG_NAME det.cat\nCATALOG_TYPE ASCII\nPARAMETERS_NAME det.param\n"
            << "DETECT_TYPE CCD\nDETECT_MINAREA 5\nTHRESH_TYPE ABSOLUTE\n"
            << "DETECT_THRESH " << 1.5 * noise << "\nANALYSIS_THRESH " << 1.5 * noise << "\n"
            << "FILTER Y\nFILTER_NAME gauss.conv\nDEBLEND_NTHRESH 32\nDEBLEND_MINCONT 0.005\n"
            << "CLEAN Y\nCLEAN_PARAM 1.0\nMASK_TYPE NONE\nSATUR_LEVEL 1e20\nGAIN 0\nPIXEL_SCALE 1\n"
            << "BACK_TYPE MANUAL\nBACK_VALUE " << sky << "\nCHECKIMAGE_TYPE NONE\nVERBOSE_TYPE QUIET\n"
            << "WRITE_XML N\nNTHREADS 1\n";
    }
    const std::string cmd =
        "cd '" + dir.string() + "' && source-extractor field.fits -c det.sex > sex.log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "source-extractor failed, see " << (dir / "sex.log");

    std::vector<SexObject> sex;
    {
        std::ifstream cat(dir / "det.cat");
        std::string line;
        while (std::getline(cat, line)) {
            if (line.empty() || line[0] == '#') continue;
            std::istringstream is(line);
            SexObject o{};
            is >> o.x >> o.y >> o.xwin >> o.ywin >> o.fluxIso >> o.area;
            o.x -= 1; // 1-based -> 0-based
            o.y -= 1;
            o.xwin -= 1;
            o.ywin -= 1;
            sex.push_back(o);
        }
    }
    ASSERT_GT(sex.size(), 200u);

    DetectionParams p; // threshold 1.5 rms, minArea 5, FWHM 3 filter, 32 levels, 0.005, clean 1.0
    BackgroundResult bkg;
    bkg.level = Image<float>(w, h, static_cast<float>(sky));
    bkg.rms = Image<float>(w, h, static_cast<float>(noise));
    RunContext ctx;
    ctx.threads = 2;
    const DetectionResult r = detectSources(img.view(), {}, bkg, p, ctx);
    const Sources& s = r.sources;

    auto nearest = [](double x, double y, const std::vector<double>& xs, const std::vector<double>& ys) {
        std::size_t best = xs.size();
        double bestD2 = 1.0; // 1 px
        for (std::size_t i = 0; i < xs.size(); ++i) {
            const double d2 = (xs[i] - x) * (xs[i] - x) + (ys[i] - y) * (ys[i] - y);
            if (d2 < bestD2) {
                bestD2 = d2;
                best = i;
            }
        }
        return best;
    };
    std::size_t matched = 0;
    std::vector<double> fluxRatio, dWin;
    for (const SexObject& o : sex) {
        const std::size_t i = nearest(o.x, o.y, s.xIso, s.yIso);
        if (i == s.size()) continue;
        ++matched;
        fluxRatio.push_back(s.fluxIso[i] / o.fluxIso);
        if (o.fluxIso > 50 * noise * std::sqrt(o.area))
            dWin.push_back(std::hypot(s.x[i] - o.xwin, s.y[i] - o.ywin));
    }
    std::vector<double> sxs, sys;
    for (const SexObject& o : sex) {
        sxs.push_back(o.x);
        sys.push_back(o.y);
    }
    std::size_t mineMatched = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const bool m = nearest(s.xIso[i], s.yIso[i], sxs, sys) != sxs.size();
        mineMatched += m;
        if (!m && std::getenv("GPUPHOT_DEBUG_SEX"))
            std::printf("unmatched: %.2f %.2f area %d flux %.1f peak %.1f flags %u\n", s.xIso[i], s.yIso[i],
                        s.areaIso[i], s.fluxIso[i], s.peak[i], s.flags[i]);
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? std::nan("") : v[v.size() / 2];
    };
    // Purity against the truth: detections within 1 px of a true star.
    std::size_t sexReal = 0, mineReal = 0;
    for (const SexObject& o : sex)
        sexReal += nearest(o.x, o.y, tx, ty) != tx.size();
    for (std::size_t i = 0; i < s.size(); ++i)
        mineReal += nearest(s.xIso[i], s.yIso[i], tx, ty) != tx.size();
    std::printf("true stars recovered within 1 px: source-extractor %zu of %zu detections, ours %zu of %zu\n",
                sexReal, sex.size(), mineReal, s.size());
    EXPECT_GE(double(mineReal) / s.size(), double(sexReal) / sex.size() - 0.01);
    EXPECT_GE(mineReal, sexReal);
    const double fracSex = double(matched) / sex.size(), fracMine = double(mineMatched) / s.size();
    std::printf("source-extractor: %zu objects, ours: %zu; matched %.4f of theirs, %.4f of ours; "
                "median flux_iso ratio %.5f; bright XWIN median offset %.4f px (%zu)\n",
                sex.size(), s.size(), fracSex, fracMine, median(fluxRatio), median(dWin), dWin.size());
    EXPECT_GE(fracSex, 0.98);
    EXPECT_GE(fracMine, 0.95);
    EXPECT_NEAR(median(fluxRatio), 1.0, 0.01);
    EXPECT_LT(median(dWin), 0.02);
    if (!std::getenv("GPUPHOT_DEBUG_SEX")) fs::remove_all(dir);
}

} // namespace
} // namespace gpuphot
