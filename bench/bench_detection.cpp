// Detection stage benchmark: a simulated frame (default 4096 x 4096, 20000 Gaussian stars, Gaussian
// noise) detected with 1 and 2 threads; optionally the same pixels through source-extractor.
//   bench_detection [--size N] [--stars N] [--repeat N] [--threads 1,2] [--sex]
#include <fitsio.h>

#include <algorithm>
#include <chrono>
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

using namespace gpuphot;

namespace {

constexpr double kPi = 3.14159265358979323846;

Image<float> simulate(int n, int nStars, double sky, double noise, std::uint32_t seed) {
    Image<float> img(n, n, static_cast<float>(sky));
    std::mt19937 rng(seed);
    auto uni = [&](double a, double b) { return a + (b - a) * (static_cast<double>(rng()) / 4294967296.0); };
    for (int k = 0; k < nStars; ++k) {
        const double x0 = uni(-5, n + 5), y0 = uni(-5, n + 5);
        const double flux = std::exp(uni(std::log(200.0), std::log(2e6))); // ~ 4 decades
        const double s = 1.7;
        const double amp = flux / (2 * kPi * s * s);
        for (int y = std::max(0, int(y0) - 18); y <= std::min(n - 1, int(y0) + 18); ++y)
            for (int x = std::max(0, int(x0) - 18); x <= std::min(n - 1, int(x0) + 18); ++x)
                img(x, y) += static_cast<float>(
                    amp * std::exp(-0.5 * ((x - x0) * (x - x0) + (y - y0) * (y - y0)) / (s * s)));
    }
    std::mt19937 nrng(seed + 17);
    for (std::size_t i = 0; i < img.pixelCount(); ++i) {
        const double u1 = (nrng() + 0.5) / 4294967296.0, u2 = (nrng() + 0.5) / 4294967296.0;
        img.data()[i] += static_cast<float>(noise * std::sqrt(-2 * std::log(u1)) * std::cos(2 * kPi * u2));
    }
    return img;
}

double seconds(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

int main(int argc, char** argv) {
    int n = 4096, nStars = 20000, repeat = 3;
    std::vector<int> threadCounts{1, 2};
    bool sex = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
        if (a == "--size")
            n = std::stoi(next());
        else if (a == "--stars")
            nStars = std::stoi(next());
        else if (a == "--repeat")
            repeat = std::stoi(next());
        else if (a == "--sex")
            sex = true;
        else if (a == "--threads") {
            threadCounts.clear();
            std::stringstream ss(next());
            std::string t;
            while (std::getline(ss, t, ','))
                threadCounts.push_back(std::stoi(t));
        } else {
            std::fprintf(stderr, "usage: %s [--size N] [--stars N] [--repeat N] [--threads 1,2] [--sex]\n",
                         argv[0]);
            return 2;
        }
    }
    const double sky = 1000.0, noise = 10.0;
    std::printf("frame %dx%d, %d stars, sky %.0f, noise %.0f ADU\n", n, n, nStars, sky, noise);
    const Image<float> img = simulate(n, nStars, sky, noise, 42);
    BackgroundResult bkg;
    bkg.level = Image<float>(n, n, static_cast<float>(sky));
    bkg.rms = Image<float>(n, n, static_cast<float>(noise));
    const DetectionParams p;
    for (int t : threadCounts) {
        double best = 1e30;
        DetectionResult r;
        for (int k = 0; k < repeat; ++k) {
            RunContext ctx;
            ctx.threads = t;
            const auto t0 = std::chrono::steady_clock::now();
            r = detectSources(img.view(), {}, bkg, p, ctx);
            best = std::min(best, seconds(t0));
        }
        std::printf(
            "gpuphot detection, %d thread(s): %.3f s (best of %d); %zu objects (%zu regions, %zu after "
            "deblending, %zu cleaned)\n",
            t, best, repeat, r.sources.size(), r.nBeforeDeblend, r.nDeblended, r.nCleaned);
    }
    if (sex) {
        namespace fs = std::filesystem;
        const fs::path dir = fs::temp_directory_path() / "gpuphot_bench_detection";
        fs::create_directories(dir);
        fitsfile* f = nullptr;
        int status = 0;
        long naxes[2] = {n, n};
        fits_create_file(&f, ("!" + (dir / "frame.fits").string()).c_str(), &status);
        fits_create_img(f, FLOAT_IMG, 2, naxes, &status);
        fits_write_img(f, TFLOAT, 1, static_cast<LONGLONG>(img.pixelCount()), const_cast<float*>(img.data()),
                       &status);
        fits_close_file(f, &status);
        if (status) {
            std::fprintf(stderr, "CFITSIO error %d writing %s\n", status, (dir / "frame.fits").c_str());
            return 1;
        }
        const std::vector<float> k = gaussianKernel1d(p.filterFwhm);
        std::ofstream conv(dir / "gauss.conv");
        conv << "CONV NORM\n";
        conv.precision(9);
        for (std::size_t j = 0; j < k.size(); ++j)
            for (std::size_t i = 0; i < k.size(); ++i)
                conv << double(k[j]) * k[i] << (i + 1 < k.size() ? " " : "\n");
        conv.close();
        std::ofstream(dir / "det.param")
            << "X_IMAGE\nY_IMAGE\nXWIN_IMAGE\nYWIN_IMAGE\nFLUX_ISO\nISOAREA_IMAGE\n";
        for (int t : threadCounts) {
            std::ofstream cfg(dir / "det.sex");
            cfg << "CATALOG_NAME det.cat\nCATALOG_TYPE ASCII\nPARAMETERS_NAME det.param\nDETECT_MINAREA 5\n"
                << "THRESH_TYPE ABSOLUTE\nDETECT_THRESH " << 1.5 * noise << "\nANALYSIS_THRESH "
                << 1.5 * noise
                << "\nFILTER Y\nFILTER_NAME gauss.conv\nDEBLEND_NTHRESH 32\nDEBLEND_MINCONT 0.005\nCLEAN Y\n"
                << "CLEAN_PARAM 1.0\nMASK_TYPE NONE\nSATUR_LEVEL 1e20\nGAIN 0\nBACK_TYPE MANUAL\nBACK_VALUE "
                << sky << "\nCHECKIMAGE_TYPE NONE\nVERBOSE_TYPE QUIET\nWRITE_XML N\nNTHREADS " << t << "\n";
            cfg.close();
            const std::string cmd =
                "cd '" + dir.string() + "' && source-extractor frame.fits -c det.sex > sex.log 2>&1";
            double best = 1e30;
            for (int k2 = 0; k2 < repeat; ++k2) {
                const auto t0 = std::chrono::steady_clock::now();
                if (std::system(cmd.c_str()) != 0) {
                    std::fprintf(stderr, "source-extractor failed (see %s/sex.log)\n", dir.c_str());
                    return 1;
                }
                best = std::min(best, seconds(t0));
            }
            std::ifstream cat(dir / "det.cat");
            std::string line;
            std::size_t count = 0;
            while (std::getline(cat, line))
                count += !line.empty() && line[0] != '#';
            std::printf(
                "source-extractor (FITS read + detection + catalog), NTHREADS %d: %.3f s (best of %d); "
                "%zu objects\n",
                t, best, repeat, count);
        }
        fs::remove_all(dir);
    }
    return 0;
}
