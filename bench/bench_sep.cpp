// bench_sep FRAME [--repeat N] [--catalog OUT.tsv]
// sep's C core (Debian libsep-dev) on a FITS frame with the settings bench/peers.py gives python3-sep (the
// same numbers as gpuphot's defaults): sep_background (mesh 64, 3x3 median filter) with the RMS map and the
// subtracted image (sep_bkg_rmsarray, sep_bkg_subarray), sep_extract (1.5 sigma of the RMS map, minarea 5,
// 7x7 Gaussian kernel of FWHM 3 px as convolution, 32 levels, contrast 0.005, cleaning 1.0, sub-object
// limit 4096, pixel stack grown from 300000 by doubling before timing) and sep_sum_circle at r = 2, 3, 4, 6
// px with a local annulus of 4..6 x SIMFWHM (3 px when absent), subpix 5 (annulus subpix 1), as
// sep.sum_circle(bkgann=...). Single-threaded (sep is). Prints JSON: each part's best wall time of N
// (read, background, extract, apertures; total = background + extract + apertures), the object count,
// the pixel stack used and the peak resident memory of the process. --catalog writes one line per object:
// x y (1-based) and flux, fluxerr, flag per radius, for the agreement test (bench/bench_sep_test.py).
// Bench-only: gpuphot never links sep.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/resource.h>

#include <fitsio.h>
#include <nlohmann/json.hpp>

extern "C" {
#include <sep.h>
}

namespace {

// bench/peers.py's settings (keep in step with it and with core/stages/*/*.hpp).
constexpr int kBackSize = 64;
constexpr int kBackFilterSize = 3;
constexpr float kDetectThresh = 1.5f;
constexpr int kMinArea = 5;
constexpr double kFilterFwhm = 3.0;
constexpr int kDeblendLevels = 32;
constexpr double kDeblendContrast = 0.005;
constexpr double kCleanParam = 1.0;
constexpr int kSubObjectLimit = 4096;
constexpr std::size_t kFirstPixstack = 300000;
constexpr double kRadii[] = {2.0, 3.0, 4.0, 6.0};
constexpr double kAnnulusFwhm[2] = {4.0, 6.0};
constexpr int kSubpix = 5;        // sep.sum_circle's default
constexpr int kAnnulusSubpix = 1; // what sep.sum_circle uses for bkgann

struct FrameData {
    int w = 0, h = 0;
    std::vector<float> pix;
    double gain = 0.0;
    double fwhm = kFilterFwhm;
};

std::string fitsMessage(const std::string& path, const char* what, int status) {
    char text[FLEN_STATUS] = {0};
    fits_get_errstatus(status, text);
    return path + ": " + what + ": " + text;
}

double readKey(fitsfile* f, const char* key, double fallback) {
    double v = 0.0;
    int status = 0;
    fits_read_key(f, TDOUBLE, key, &v, nullptr, &status);
    return status == 0 && std::isfinite(v) ? v : fallback;
}

// The first HDU holding a 2-d image (as peers.py's astropy read), as float.
FrameData readFrame(const std::string& path) {
    fitsfile* f = nullptr;
    int status = 0;
    if (fits_open_file(&f, path.c_str(), READONLY, &status))
        throw std::runtime_error(fitsMessage(path, "cannot open", status));
    std::unique_ptr<fitsfile, void (*)(fitsfile*)> guard(f, [](fitsfile* p) {
        int s = 0;
        fits_close_file(p, &s);
    });
    int nhdu = 0;
    fits_get_num_hdus(f, &nhdu, &status);
    for (int hdu = 1; hdu <= nhdu && status == 0; ++hdu) {
        int type = 0;
        if (fits_movabs_hdu(f, hdu, &type, &status)) break;
        if (type != IMAGE_HDU) continue;
        int naxis = 0;
        long naxes[2] = {0, 0};
        fits_get_img_dim(f, &naxis, &status);
        if (naxis != 2) continue;
        fits_get_img_size(f, 2, naxes, &status);
        if (status || naxes[0] <= 0 || naxes[1] <= 0) continue;
        FrameData d;
        d.w = static_cast<int>(naxes[0]);
        d.h = static_cast<int>(naxes[1]);
        d.pix.resize(static_cast<std::size_t>(d.w) * static_cast<std::size_t>(d.h));
        long first[2] = {1, 1};
        int anynul = 0;
        if (fits_read_pix(f, TFLOAT, first, static_cast<LONGLONG>(d.pix.size()), nullptr, d.pix.data(),
                          &anynul, &status))
            throw std::runtime_error(fitsMessage(path, "cannot read the pixels", status));
        d.gain = readKey(f, "GAIN", 0.0);
        d.fwhm = readKey(f, "SIMFWHM", kFilterFwhm);
        return d;
    }
    if (status) throw std::runtime_error(fitsMessage(path, "cannot read", status));
    throw std::runtime_error(path + ": no 2-d image HDU");
}

// The outer product of gpuphot's gaussianKernel1d(3.0) (peers.py's gauss_kernel), float32.
std::vector<float> gaussKernel(double fwhm, int& size) {
    const int r = std::max(1, static_cast<int>(std::ceil(fwhm)));
    const double sigma = fwhm / std::sqrt(8.0 * std::log(2.0));
    std::vector<double> k;
    double sum = 0.0;
    for (int i = -r; i <= r; ++i) {
        k.push_back(std::exp(-0.5 * i * i / (sigma * sigma)));
        sum += k.back();
    }
    std::vector<float> k1;
    for (double v : k)
        k1.push_back(static_cast<float>(v / sum));
    size = static_cast<int>(k1.size());
    std::vector<float> out;
    for (float a : k1)
        for (float b : k1)
            out.push_back(a * b);
    return out;
}

void check(int status, const char* what) {
    if (status == 0) return;
    char msg[128] = {0}, detail[512] = {0};
    sep_get_errmsg(status, msg);
    sep_get_errdetail(detail);
    throw std::runtime_error(std::string(what) + ": " + msg +
                             (detail[0] ? std::string(" (") + detail + ")" : ""));
}

double bestOf(int repeat, const std::function<void()>& fn) {
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < std::max(1, repeat); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

struct CatalogDeleter {
    void operator()(sep_catalog* c) const { sep_catalog_free(c); }
};
using CatalogPtr = std::unique_ptr<sep_catalog, CatalogDeleter>;

int run(const std::string& path, int repeat, const std::string& catalogPath) {
    FrameData frame;
    const double tRead = bestOf(repeat, [&] { frame = readFrame(path); });
    const std::size_t n = frame.pix.size();

    // Background: the model, the RMS map and the subtracted image (peers.py: Background, rms(), data -
    // back()).
    std::vector<float> rms(n), sub(n);
    float globalRms = 0.0f, global = 0.0f;
    const double tBackground = bestOf(repeat, [&] {
        sep_image im{};
        im.data = frame.pix.data();
        im.dtype = SEP_TFLOAT;
        im.w = frame.w;
        im.h = frame.h;
        im.noise_type = SEP_NOISE_NONE;
        sep_bkg* bkg = nullptr;
        check(sep_background(&im, kBackSize, kBackSize, kBackFilterSize, kBackFilterSize, 0.0, &bkg),
              "sep_background");
        std::unique_ptr<sep_bkg, void (*)(sep_bkg*)> guard(bkg, sep_bkg_free);
        check(sep_bkg_rmsarray(bkg, rms.data(), SEP_TFLOAT), "sep_bkg_rmsarray");
        std::memcpy(sub.data(), frame.pix.data(), n * sizeof(float));
        check(sep_bkg_subarray(bkg, sub.data(), SEP_TFLOAT), "sep_bkg_subarray");
        global = sep_bkg_global(bkg);
        globalRms = sep_bkg_globalrms(bkg);
    });

    // Detection on the subtracted image with the RMS map as the noise (relative threshold).
    int ksize = 0;
    const std::vector<float> kernel = gaussKernel(kFilterFwhm, ksize);
    sep_image det{};
    det.data = sub.data();
    det.noise = rms.data();
    det.dtype = SEP_TFLOAT;
    det.ndtype = SEP_TFLOAT;
    det.w = frame.w;
    det.h = frame.h;
    det.noise_type = SEP_NOISE_STDDEV;
    sep_set_sub_object_limit(kSubObjectLimit);
    auto extract = [&](CatalogPtr& out) {
        sep_catalog* c = nullptr;
        const int status =
            sep_extract(&det, kDetectThresh, SEP_THRESH_REL, kMinArea, kernel.data(), ksize, ksize,
                        SEP_FILTER_CONV, kDeblendLevels, kDeblendContrast, 1, kCleanParam, &c);
        out.reset(c);
        return status;
    };
    // Grow the pixel stack until the frame fits (untimed), as peers.py.
    std::size_t pixstack = kFirstPixstack;
    CatalogPtr cat;
    for (;;) {
        sep_set_extract_pixstack(pixstack);
        const int status = extract(cat);
        if (status == 0) break;
        char msg[128] = {0};
        sep_get_errmsg(status, msg);
        if (!std::strstr(msg, "pixel buffer full") || pixstack > (std::size_t(1) << 30))
            check(status, "sep_extract");
        pixstack *= 2;
    }
    const double tExtract = bestOf(repeat, [&] { check(extract(cat), "sep_extract"); });
    const int nobj = cat->nobj;

    // Apertures at every radius with the local annulus (sep.sum_circle(..., bkgann=(rin, rout))).
    sep_image ph = det;
    ph.data = sub.data();
    ph.gain = frame.gain > 0 ? frame.gain : 0.0;
    const double rin = kAnnulusFwhm[0] * frame.fwhm, rout = kAnnulusFwhm[1] * frame.fwhm;
    constexpr int nr = static_cast<int>(std::size(kRadii));
    std::vector<double> flux(static_cast<std::size_t>(nobj) * nr), fluxErr(flux.size());
    std::vector<short> flags(flux.size());
    const double tApertures = bestOf(repeat, [&] {
        for (int k = 0; k < nr; ++k) {
            for (int i = 0; i < nobj; ++i) {
                double f = 0, fe = 0, area = 0, bf = 0, bfe = 0, barea = 0;
                short fl = 0, bfl = 0;
                check(
                    sep_sum_circle(&ph, cat->x[i], cat->y[i], kRadii[k], 0, kSubpix, 0, &f, &fe, &area, &fl),
                    "sep_sum_circle");
                check(sep_sum_circann(&ph, cat->x[i], cat->y[i], rin, rout, 0, kAnnulusSubpix,
                                      SEP_MASK_IGNORE, &bf, &bfe, &barea, &bfl),
                      "sep_sum_circann");
                f -= bf / barea * area;
                bfe = bfe / barea * area;
                const std::size_t j = static_cast<std::size_t>(i) * nr + k;
                flux[j] = f;
                fluxErr[j] = std::sqrt(fe * fe + bfe * bfe);
                flags[j] = fl;
            }
        }
    });

    if (!catalogPath.empty()) {
        FILE* out = std::fopen(catalogPath.c_str(), "w");
        if (!out) throw std::runtime_error(catalogPath + ": cannot write the catalog");
        std::fprintf(out, "# x y (1-based), then flux fluxerr flag at r =");
        for (double r : kRadii)
            std::fprintf(out, " %g", r);
        std::fprintf(out, " px, annulus %.9g..%.9g px\n", rin, rout);
        for (int i = 0; i < nobj; ++i) {
            std::fprintf(out, "%.17g %.17g", cat->x[i] + 1.0, cat->y[i] + 1.0);
            for (int k = 0; k < nr; ++k) {
                const std::size_t j = static_cast<std::size_t>(i) * nr + k;
                std::fprintf(out, " %.17g %.17g %d", flux[j], fluxErr[j], flags[j]);
            }
            std::fprintf(out, "\n");
        }
        if (std::fclose(out) != 0) throw std::runtime_error(catalogPath + ": cannot write the catalog");
    }

    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    nlohmann::ordered_json j;
    j["tool"] = std::string("sep C core ") + sep_version_string;
    j["frame"] = path;
    j["width"] = frame.w;
    j["height"] = frame.h;
    j["repeat"] = repeat;
    j["threads"] = 1;
    j["sources"] = nobj;
    j["pixstack"] = pixstack;
    j["global"] = global;
    j["globalrms"] = globalRms;
    j["annulus_px"] = {rin, rout};
    j["seconds"] = {{"read", tRead},
                    {"background", tBackground},
                    {"extract", tExtract},
                    {"apertures", tApertures},
                    {"total", tBackground + tExtract + tApertures}};
    j["peak_rss_bytes"] = static_cast<long long>(ru.ru_maxrss) * 1024;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    std::string path, catalog;
    int repeat = 3;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--repeat" && i + 1 < argc) {
            repeat = std::max(1, std::atoi(argv[++i]));
        } else if (a == "--catalog" && i + 1 < argc) {
            catalog = argv[++i];
        } else if (a == "-h" || a == "--help") {
            std::printf("usage: bench_sep FRAME [--repeat N] [--catalog OUT.tsv]\n");
            return 0;
        } else if (path.empty() && !a.empty() && a[0] != '-') {
            path = a;
        } else {
            std::fprintf(stderr,
                         "bench_sep: unexpected argument '%s' (usage: bench_sep FRAME [--repeat N] "
                         "[--catalog OUT.tsv])\n",
                         a.c_str());
            return 2;
        }
    }
    if (path.empty()) {
        std::fprintf(stderr, "usage: bench_sep FRAME [--repeat N] [--catalog OUT.tsv]\n");
        return 2;
    }
    try {
        return run(path, repeat, catalog);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_sep: %s\n", e.what());
        return 1;
    }
}
