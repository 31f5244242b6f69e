// Peer comparison of the whole detection pipeline (acceptance): our background + detection, with
// the pipeline's parameters and the frame's instrument facts, against Debian's source-extractor
// (SExtractor 2.25) run on the same float pixels with matching settings: DETECT_THRESH / ANALYSIS_THRESH,
// DETECT_MINAREA, FILTER Y with our Gaussian kernel written as a CONV NORM file, DEBLEND_NTHRESH /
// DEBLEND_MINCONT, CLEAN / CLEAN_PARAM, BACK_SIZE / BACK_FILTERSIZE, GAIN, SATUR_LEVEL.
// Catalogs are matched one to one (mutual nearest isophotal barycentres within 1.5 px; SExtractor's
// 1-based positions moved to our 0-based convention) and at least 98% of SExtractor's objects must
// have a partner, on simulated frames and on the real frames in tests/data/real. The background maps
// are compared too (CHECKIMAGE_TYPE BACKGROUND, BACKGROUND_RMS). The "[peer]" lines are the figures
// recorded in docs/ACCURACY.md ("Against SExtractor and sep").
// Skipped when source-extractor or a real frame is missing. GPUPHOT_DEBUG_PEER=1 keeps the work
// directory and lists the unmatched objects.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#ifdef GPUPHOT_HAVE_SEP
extern "C" {
#include <sep.h>
}
#endif

#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/convolution.hpp"
#include "core/stages/detection/detection.hpp"

namespace gpuphot {
namespace {

namespace fs = std::filesystem;

constexpr double kMatchRadius = 1.5; // px
constexpr double kRequiredFraction = 0.98;

bool haveSourceExtractor() {
    return std::system("command -v source-extractor > /dev/null 2>&1") == 0;
}

bool debugPeer() {
    return std::getenv("GPUPHOT_DEBUG_PEER") != nullptr;
}

double median(std::vector<double> v) {
    if (v.empty()) return std::nan("");
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A work directory removed at the end of the test (kept with GPUPHOT_DEBUG_PEER).
class WorkDir {
public:
    explicit WorkDir(const std::string& name)
        : m_path(fs::temp_directory_path() / ("gpuphot_peer_" + name + "_" + std::to_string(::getpid()))) {
        fs::remove_all(m_path);
        fs::create_directories(m_path);
    }
    ~WorkDir() {
        std::error_code ec;
        if (!debugPeer()) fs::remove_all(m_path, ec);
    }
    const fs::path& path() const { return m_path; }

private:
    fs::path m_path;
};

// One SExtractor object, positions moved to 0-based pixel coordinates.
struct PeerObject {
    double x = 0, y = 0;       // X_IMAGE, Y_IMAGE - 1 (isophotal barycentre)
    double xwin = 0, ywin = 0; // XWIN_IMAGE, YWIN_IMAGE - 1
    double fluxIso = 0;        // FLUX_ISO
    int area = 0;              // ISOAREA_IMAGE (unfiltered pixels above the analysis threshold)
    int areaFiltered = 0;      // ISOAREAF_IMAGE (the detection isophote on the filtered image, as ours)
    int flags = 0;             // FLAGS
};

struct PeerRun {
    std::vector<PeerObject> objects;
    Image<float> level, rms; // CHECKIMAGE BACKGROUND, BACKGROUND_RMS
};

// The settings both sides use.
struct PeerSetup {
    BackgroundParams background;
    DetectionParams detection; // gain and saturation already taken from the frame
};

// The detection kernel our stage uses, row-major, and its width.
std::vector<float> detectionKernel(const DetectionParams& p, int& width) {
    if (!p.filterKernel.empty()) {
        width = p.filterKernelWidth;
        return p.filterKernel;
    }
    const std::vector<float> k1 = gaussianKernel1d(p.filterFwhm);
    width = static_cast<int>(k1.size());
    return outerProductKernel(k1);
}

PeerRun runSourceExtractor(const Image<float>& pixels, const PeerSetup& s, const fs::path& dir) {
    writeFitsImage((dir / "frame.fits").string(), pixels.view(), Header{}, -32);
    const DetectionParams& d = s.detection;
    int kw = 0;
    const std::vector<float> kernel = detectionKernel(d, kw);
    {
        std::ofstream conv(dir / "peer.conv");
        conv << "CONV NORM\n# the detection stage's kernel, " << kw << "x" << kernel.size() / kw << "\n";
        conv.precision(9);
        for (std::size_t i = 0; i < kernel.size(); ++i)
            conv << double(kernel[i]) << ((i + 1) % static_cast<std::size_t>(kw) ? " " : "\n");
        std::ofstream param(dir / "peer.param");
        param << "X_IMAGE\nY_IMAGE\nXWIN_IMAGE\nYWIN_IMAGE\nFLUX_ISO\nISOAREA_IMAGE\nISOAREAF_IMAGE\nFLAGS\n";
        std::ofstream cfg(dir / "peer.sex");
        cfg.precision(10);
        cfg << "CATALOG_NAME peer.cat\nCATALOG_TYPE ASCII_HEAD\nPARAMETERS_NAME peer.param\n"
            << "DETECT_TYPE CCD\nDETECT_MINAREA " << d.minArea << "\n"
            << "THRESH_TYPE " << (d.thresholdIsAbsolute ? "ABSOLUTE" : "RELATIVE") << "\n"
            << "DETECT_THRESH " << d.threshold << "\nANALYSIS_THRESH " << d.threshold << "\n"
            << "FILTER " << (d.filter ? "Y" : "N") << "\nFILTER_NAME peer.conv\n"
            << "DEBLEND_NTHRESH " << d.deblendLevels << "\nDEBLEND_MINCONT " << d.deblendContrast
            << "\n"
            // The same number: both sides use CLEAN_PARAM as the Moffat wing exponent.
            << "CLEAN " << (d.clean ? "Y" : "N") << "\nCLEAN_PARAM " << d.cleanParam << "\n"
            << "MASK_TYPE NONE\n"
            // Our threshold is relative to the local RMS map: SExtractor follows the RMS map per pixel
            // when the background RMS map is its detection weight (without a weight: the global RMS).
            << "WEIGHT_TYPE BACKGROUND\nWEIGHT_GAIN N\n"
            << "SATUR_LEVEL " << (std::isfinite(d.saturationLevel) ? d.saturationLevel : 1e20) << "\n"
            << "GAIN " << d.gain << "\nPIXEL_SCALE 1\nSEEING_FWHM 3\n"
            << "BACK_TYPE AUTO\nBACK_SIZE " << s.background.meshW() << "," << s.background.meshH() << "\n"
            << "BACK_FILTERSIZE " << s.background.filterW() << "," << s.background.filterH() << "\n"
            << "BACK_FILTTHRESH " << s.background.filterThreshold << "\nBACKPHOTO_TYPE GLOBAL\n"
            << "CHECKIMAGE_TYPE BACKGROUND,BACKGROUND_RMS\nCHECKIMAGE_NAME bkg.fits,rms.fits\n"
            << "MEMORY_OBJSTACK 30000\nMEMORY_PIXSTACK 3000000\nMEMORY_BUFSIZE 4096\n"
            << "VERBOSE_TYPE NORMAL\nWRITE_XML N\nNTHREADS 1\n";
    }
    const std::string cmd =
        "cd '" + dir.string() + "' && source-extractor frame.fits -c peer.sex > sex.log 2>&1";
    PeerRun run;
    if (std::system(cmd.c_str()) != 0) {
        ADD_FAILURE() << "source-extractor failed, see " << (dir / "sex.log")
                      << " (GPUPHOT_DEBUG_PEER keeps it)";
        return run;
    }
    std::ifstream cat(dir / "peer.cat");
    std::string line;
    while (std::getline(cat, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream is(line);
        PeerObject o;
        is >> o.x >> o.y >> o.xwin >> o.ywin >> o.fluxIso >> o.area >> o.areaFiltered >> o.flags;
        if (!is) {
            ADD_FAILURE() << "unreadable line in " << (dir / "peer.cat") << ": " << line;
            continue;
        }
        o.x -= 1; // 1-based -> 0-based
        o.y -= 1;
        o.xwin -= 1;
        o.ywin -= 1;
        run.objects.push_back(o);
    }
    run.level = readFrame((dir / "bkg.fits").string()).pixels;
    run.rms = readFrame((dir / "rms.fits").string()).pixels;
    return run;
}

struct Ours {
    BackgroundResult background;
    DetectionResult detection;
};

// Background and detection as runPipeline runs them (single pass; gain and saturation from the frame).
Ours runOurs(const Frame& frame, const PeerSetup& s) {
    RunContext ctx;
    ctx.threads = 2;
    Ours o;
    o.background = estimateBackground(frame.view(), frame.maskView(), s.background, ctx);
    o.detection = detectSources(frame.view(), frame.maskView(), o.background, s.detection, ctx);
    return o;
}

#ifdef GPUPHOT_HAVE_SEP
// sep's extraction (SExtractor's algorithm as a library) on our background-subtracted pixels with our
// RMS map as the per-pixel noise: the same threshold, kernel (convolution), minarea, deblending, clean.
std::vector<PeerObject> runSep(const Frame& frame, const BackgroundResult& bkg, const PeerSetup& s) {
    const int w = frame.width(), h = frame.height();
    std::vector<float> data(static_cast<std::size_t>(w) * h), noise(data.size());
    for (std::size_t i = 0; i < data.size(); ++i) {
        data[i] = frame.pixels.data()[i] - bkg.level.data()[i];
        noise[i] = bkg.rms.data()[i];
    }
    sep_image im{};
    im.data = data.data();
    im.noise = noise.data();
    im.dtype = SEP_TFLOAT;
    im.ndtype = SEP_TFLOAT;
    im.w = w;
    im.h = h;
    im.noise_type = SEP_NOISE_STDDEV;
    const DetectionParams& d = s.detection;
    int kw = 0;
    const std::vector<float> kernel = detectionKernel(d, kw);
    sep_set_extract_pixstack(5000000);
    sep_set_sub_object_limit(4096);
    sep_catalog* cat = nullptr;
    const int status =
        sep_extract(&im, static_cast<float>(d.threshold), SEP_THRESH_REL, d.minArea,
                    d.filter ? kernel.data() : nullptr, kw, static_cast<int>(kernel.size()) / kw,
                    SEP_FILTER_CONV, d.deblendLevels, d.deblendContrast, d.clean ? 1 : 0, d.cleanParam, &cat);
    std::vector<PeerObject> out;
    if (status != 0) {
        char msg[128];
        sep_get_errmsg(status, msg);
        ADD_FAILURE() << "sep_extract: " << msg;
        return out;
    }
    for (int k = 0; k < cat->nobj; ++k) {
        PeerObject o;
        o.x = cat->x[k]; // sep: 0-based
        o.y = cat->y[k];
        o.xwin = o.ywin = std::nan(""); // no windowed positions from sep_extract
        o.fluxIso = cat->flux[k];
        o.area = cat->tnpix[k];
        o.areaFiltered = cat->npix[k];
        o.flags = cat->flag[k];
        out.push_back(o);
    }
    sep_catalog_free(cat);
    return out;
}
#endif

PeerSetup setupFor(const Frame& frame, const PipelineConfig& config) {
    PeerSetup s;
    s.background = config.background;
    s.detection = config.detection;
    s.detection.gain = frame.instrument.gain; // as runPipeline does
    if (std::isfinite(frame.instrument.saturation)) s.detection.saturationLevel = frame.instrument.saturation;
    return s;
}

struct Comparison {
    std::size_t nPeer = 0, nOurs = 0, matched = 0;
    double fracPeer = 0, fracOurs = 0;
    double medianFluxRatio = 0;   // ours / SExtractor, FLUX_ISO
    double medianIsoOffset = 0;   // px, isophotal barycentres
    double medianWinOffset = 0;   // px, windowed centroids
    double medianAreaRatio = 0;   // ours / SExtractor, detection isophote area (ISOAREAF_IMAGE)
    std::vector<int> peerPartner; // index into ours, -1: unmatched
    std::vector<int> oursPartner; // index into peer, -1: unmatched
};

// Nearest index in (xs, ys) to (x, y) within kMatchRadius, -1 if none.
int nearestWithin(double x, double y, const std::vector<double>& xs, const std::vector<double>& ys) {
    int best = -1;
    double bestD2 = kMatchRadius * kMatchRadius;
    for (std::size_t i = 0; i < xs.size(); ++i) {
        const double dx = xs[i] - x;
        if (std::fabs(dx) > kMatchRadius) continue;
        const double d2 = dx * dx + (ys[i] - y) * (ys[i] - y);
        if (d2 <= bestD2) {
            bestD2 = d2;
            best = static_cast<int>(i);
        }
    }
    return best;
}

Comparison compareCatalogs(const std::vector<PeerObject>& peer, const Sources& s) {
    Comparison c;
    c.nPeer = peer.size();
    c.nOurs = s.size();
    std::vector<double> px, py;
    for (const PeerObject& o : peer) {
        px.push_back(o.x);
        py.push_back(o.y);
    }
    std::vector<int> peerNearest(peer.size()), oursNearest(s.size());
    for (std::size_t k = 0; k < peer.size(); ++k)
        peerNearest[k] = nearestWithin(peer[k].x, peer[k].y, s.xIso, s.yIso);
    for (std::size_t i = 0; i < s.size(); ++i)
        oursNearest[i] = nearestWithin(s.xIso[i], s.yIso[i], px, py);
    c.peerPartner.assign(peer.size(), -1);
    c.oursPartner.assign(s.size(), -1);
    std::vector<double> flux, iso, win, area;
    for (std::size_t k = 0; k < peer.size(); ++k) {
        const int i = peerNearest[k];
        if (i < 0 || oursNearest[i] != static_cast<int>(k)) continue; // mutual nearest only
        c.peerPartner[k] = i;
        c.oursPartner[i] = static_cast<int>(k);
        ++c.matched;
        if (peer[k].fluxIso > 0) flux.push_back(s.fluxIso[i] / peer[k].fluxIso);
        iso.push_back(std::hypot(s.xIso[i] - peer[k].x, s.yIso[i] - peer[k].y));
        if (std::isfinite(peer[k].xwin))
            win.push_back(std::hypot(s.x[i] - peer[k].xwin, s.y[i] - peer[k].ywin));
        if (peer[k].areaFiltered > 0) area.push_back(double(s.areaIso[i]) / peer[k].areaFiltered);
    }
    c.fracPeer = c.nPeer ? double(c.matched) / c.nPeer : 0.0;
    c.fracOurs = c.nOurs ? double(c.matched) / c.nOurs : 0.0;
    c.medianFluxRatio = median(flux);
    c.medianIsoOffset = median(iso);
    c.medianWinOffset = median(win);
    c.medianAreaRatio = median(area);
    return c;
}

void printComparison(const std::string& name, const char* peerName, const Comparison& c,
                     const std::vector<PeerObject>& peer, const DetectionResult& ours) {
    const Sources& s = ours.sources;
    char win[64] = "";
    if (std::isfinite(c.medianWinOffset))
        std::snprintf(win, sizeof win, ", windowed %.4f px", c.medianWinOffset);
    std::printf(
        "[peer] %s: %s %zu objects, ours %zu; one-to-one matched %zu = %.2f%% of %s's, %.2f%% of ours; "
        "median isophotal flux ratio (ours/%s) %.4f, area ratio %.3f; median offset: isophotal %.4f px%s\n",
        name.c_str(), peerName, c.nPeer, c.nOurs, c.matched, 100 * c.fracPeer, peerName, 100 * c.fracOurs,
        peerName, c.medianFluxRatio, c.medianAreaRatio, c.medianIsoOffset, win);
    if (!debugPeer()) return;
    for (std::size_t k = 0; k < peer.size(); ++k) {
        if (c.peerPartner[k] >= 0) continue;
        // Which of our objects owns that pixel, and how far its barycentre is.
        const int px = std::clamp(static_cast<int>(std::lround(peer[k].x)), 0, ours.segmentation.width() - 1);
        const int py =
            std::clamp(static_cast<int>(std::lround(peer[k].y)), 0, ours.segmentation.height() - 1);
        const int seg = ours.segmentation(px, py);
        const double dist =
            seg > 0 ? std::hypot(s.xIso[seg - 1] - peer[k].x, s.yIso[seg - 1] - peer[k].y) : -1;
        std::printf(
            "  %s only: x %8.2f y %8.2f area %5d flux %10.1f flags %2d; our segment %d (%.1f px away, "
            "flux %.1f)\n",
            peerName, peer[k].x, peer[k].y, peer[k].area, peer[k].fluxIso, peer[k].flags, seg, dist,
            seg > 0 ? s.fluxIso[seg - 1] : 0.0);
    }
    for (std::size_t i = 0; i < s.size(); ++i)
        if (c.oursPartner[i] < 0)
            std::printf("  ours only: x %8.2f y %8.2f area %5d flux %10.1f flags %u\n", s.xIso[i], s.yIso[i],
                        s.areaIso[i], s.fluxIso[i], s.flags[i]);
}

// Largest |ours - SExtractor| over the frame, relative to SExtractor's global RMS (the median of its
// RMS map) and, for the level, also relative to the level itself.
struct MapDifference {
    double levelOverRms = 0, levelRelative = 0, rmsRelative = 0;
};

MapDifference compareBackground(const BackgroundResult& ours, const PeerRun& peer) {
    MapDifference m;
    if (peer.level.width() != ours.level.width() || peer.level.height() != ours.level.height()) {
        ADD_FAILURE() << "background check images have another size";
        return m;
    }
    std::vector<double> rmsValues(peer.rms.data(), peer.rms.data() + peer.rms.pixelCount());
    const double globalRms = median(rmsValues);
    for (std::size_t i = 0; i < ours.level.pixelCount(); ++i) {
        const double dl = std::fabs(double(ours.level.data()[i]) - peer.level.data()[i]);
        const double dr = std::fabs(double(ours.rms.data()[i]) - peer.rms.data()[i]);
        m.levelOverRms = std::max(m.levelOverRms, dl / globalRms);
        m.levelRelative = std::max(m.levelRelative, dl / std::fabs(double(peer.level.data()[i])));
        m.rmsRelative = std::max(m.rmsRelative, dr / peer.rms.data()[i]);
    }
    return m;
}

// The two ways the frames are compared.
enum class Settings {
    // Our pipeline's defaults (CLEAN Y, CLEAN_PARAM 1, our natural-spline background interpolation);
    // SExtractor gets the same threshold, minarea, kernel, deblending, CLEAN, mesh and filter.
    PipelineDefaults,
    // The same, but with the background interpolated as SExtractor does (BackgroundParams::
    // sextractorSpline) and CLEAN N on both sides: our CLEAN criterion differs from SExtractor's
    // (docs/ACCURACY.md), so this is the like-for-like comparison of detection and deblending.
    SextractorEquivalent,
};

PipelineConfig configFor(Settings settings) {
    PipelineConfig config; // background mesh 64, filter 3; threshold 1.5, minarea 5, FWHM 3 kernel, 32/0.005
    if (settings == Settings::SextractorEquivalent) {
        config.background.sextractorSpline = true;
        config.detection.clean = false;
    }
    return config;
}

struct PeerFigures {
    Comparison sextractor; // ours vs SExtractor
    Comparison sep;        // ours vs sep (when built with sep)
    MapDifference background;
    bool haveSep = false;
};

// Runs both sides on one frame, prints the figures and checks the acceptance bar.
PeerFigures comparePeers(const std::string& name, const Frame& frame, Settings settings) {
    const PeerSetup setup = setupFor(frame, configFor(settings));
    const std::string label =
        name +
        (settings == Settings::PipelineDefaults ? " [defaults, CLEAN Y]" : " [SExtractor spline, CLEAN N]");
    WorkDir dir(name + (settings == Settings::PipelineDefaults ? "_defaults" : "_equivalent"));
    const PeerRun peer = runSourceExtractor(frame.pixels, setup, dir.path());
    const Ours ours = runOurs(frame, setup);
    PeerFigures f;
    f.sextractor = compareCatalogs(peer.objects, ours.detection.sources);
    printComparison(label, "SExtractor", f.sextractor, peer.objects, ours.detection);
    if (!peer.level.empty()) {
        f.background = compareBackground(ours.background, peer);
        std::printf(
            "[peer] %s: background (mesh %d, filter %d) vs SExtractor's BACKGROUND: max |diff| %.2e x "
            "global RMS (%.2e of the level); BACKGROUND_RMS max relative diff %.2e\n",
            label.c_str(), setup.background.meshW(), setup.background.filterW(), f.background.levelOverRms,
            f.background.levelRelative, f.background.rmsRelative);
    }
#ifdef GPUPHOT_HAVE_SEP
    {
        const std::vector<PeerObject> sepObjects = runSep(frame, ours.background, setup);
        f.sep = compareCatalogs(sepObjects, ours.detection.sources);
        f.haveSep = true;
        printComparison(label, "sep", f.sep, sepObjects, ours.detection);
    }
#endif
    EXPECT_GT(f.sextractor.nPeer, 0u);
    EXPECT_GE(f.sextractor.fracPeer, kRequiredFraction)
        << label << ": only " << f.sextractor.matched << " of SExtractor's " << f.sextractor.nPeer
        << " objects matched one to one";
    if (settings == Settings::SextractorEquivalent) {
        // The same mesh statistics, filter and interpolation: the maps agree to float rounding.
        EXPECT_LT(f.background.levelOverRms, 1e-3) << label;
        EXPECT_LT(f.background.rmsRelative, 1e-3) << label;
        EXPECT_GE(f.sextractor.fracOurs, 0.95) << label;
        if (f.haveSep) {
            EXPECT_GE(f.sep.fracPeer, kRequiredFraction) << label;
            EXPECT_GE(f.sep.fracOurs, 0.95) << label;
        }
    }
    // Matched isophotes are the same isophotes: their fluxes and areas agree.
    EXPECT_NEAR(f.sextractor.medianFluxRatio, 1.0, 0.01) << label;
    EXPECT_NEAR(f.sextractor.medianAreaRatio, 1.0, 0.02) << label;
    return f;
}

// CLEAN against sep's CLEAN (SExtractor's algorithm) on one synthetic frame where the background is known
// exactly (level 0, RMS 10 everywhere, so both sides threshold the same filtered pixels): a bright
// galaxy with an extended exponential profile, faint stars in its wing and far from it, a bright star
// with close faint companions, noise. Both sides get the same pixels, kernel, threshold, minarea and
// deblending; the objects each keeps with CLEAN Y must be the same ones.
struct CleanCase {
    Image<float> pixels;
    BackgroundResult bkg;
};

CleanCase cleanCase() {
    const int w = 256, h = 256;
    CleanCase c;
    c.pixels = Image<float>(w, h, 0.0f);
    std::mt19937_64 rng(7);
    std::normal_distribution<double> noise(0.0, 10.0);
    auto addStar = [&](double x0, double y0, double amp, double sigma) {
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) {
                const double r2 = ((x - x0) * (x - x0) + (y - y0) * (y - y0)) / (sigma * sigma);
                if (r2 < 60.0) c.pixels.row(y)[x] += static_cast<float>(amp * std::exp(-0.5 * r2));
            }
    };
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const double dx = x - 100.3, dy = y - 120.6;
            const double r = std::sqrt(dx * dx / 1.0 + dy * dy / 0.55); // elongated exponential galaxy
            c.pixels.row(y)[x] = static_cast<float>(900.0 * std::exp(-r / 9.0) + noise(rng));
        }
    addStar(100.3, 120.6, 4000.0, 1.3); // its nucleus
    // Faint stars in its wing and far from it.
    const double faint[][3] = {{145, 121, 80}, {100, 160, 70}, {55, 108, 100}, {150, 165, 60},
                               {40, 40, 120},  {200, 60, 60},  {70, 150, 50},  {135, 90, 60}};
    for (const auto& f : faint)
        addStar(f[0], f[1], f[2], 1.4);
    // Bright Moffat stars (alpha 2 px, beta 2.5) with six faint stars each at 12-22 px in their wings.
    const double bright[][3] = {{190, 200, 30000}, {60, 200, 20000}, {205, 125, 40000}};
    for (const auto& b : bright) {
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) {
                const double r2 = ((x - b[0]) * (x - b[0]) + (y - b[1]) * (y - b[1])) / 4.0;
                c.pixels.row(y)[x] += static_cast<float>(b[2] * std::pow(1.0 + r2, -2.5));
            }
        for (int k = 0; k < 6; ++k) {
            const double angle = k * 2.0 * 3.14159265358979 / 6.0, r = 12.0 + 2.0 * k;
            addStar(b[0] + r * std::cos(angle), b[1] + r * std::sin(angle), 30.0 + 6.0 * k, 1.4);
        }
    }
    c.bkg.width = w;
    c.bkg.height = h;
    c.bkg.level = Image<float>(w, h, 0.0f);
    c.bkg.rms = Image<float>(w, h, 10.0f);
    c.bkg.globalRms = 10.0;
    return c;
}

#ifdef GPUPHOT_HAVE_SEP
// sep with an absolute threshold on the same pixels (no noise map: its per-object threshold is then
// the absolute one, as ours).
std::vector<PeerObject> sepOn(const CleanCase& c, const DetectionParams& d) {
    std::vector<float> data(c.pixels.data(), c.pixels.data() + c.pixels.width() * c.pixels.height());
    sep_image im{};
    im.data = data.data();
    im.dtype = SEP_TFLOAT;
    im.w = c.pixels.width();
    im.h = c.pixels.height();
    im.noise_type = SEP_NOISE_NONE;
    int kw = 0;
    const std::vector<float> kernel = detectionKernel(d, kw);
    sep_catalog* cat = nullptr;
    const int status = sep_extract(&im, static_cast<float>(d.threshold), SEP_THRESH_ABS, d.minArea,
                                   kernel.data(), kw, static_cast<int>(kernel.size()) / kw, SEP_FILTER_CONV,
                                   d.deblendLevels, d.deblendContrast, d.clean ? 1 : 0, d.cleanParam, &cat);
    std::vector<PeerObject> out;
    EXPECT_EQ(status, 0) << "sep_extract";
    if (status != 0) return out;
    for (int k = 0; k < cat->nobj; ++k) {
        PeerObject o;
        o.x = cat->x[k];
        o.y = cat->y[k];
        o.xwin = o.ywin = std::nan("");
        o.fluxIso = cat->flux[k];
        o.area = cat->tnpix[k];
        o.areaFiltered = cat->npix[k];
        o.flags = cat->flag[k];
        out.push_back(o);
    }
    sep_catalog_free(cat);
    return out;
}

TEST(PeerSextractor, CleanKeepsWhatSepKeeps) {
    const CleanCase c = cleanCase();
    DetectionParams d;
    d.threshold = 15.0; // ADU: 1.5 x the RMS
    d.thresholdIsAbsolute = true;
    RunContext ctx;
    ctx.threads = 2;
    d.clean = false;
    const DetectionResult noClean = detectSources(c.pixels.view(), MaskView{}, c.bkg, d, ctx);
    const std::vector<PeerObject> sepNoClean = sepOn(c, d);
    d.clean = true;
    const DetectionResult ours = detectSources(c.pixels.view(), MaskView{}, c.bkg, d, ctx);
    const std::vector<PeerObject> sepClean = sepOn(c, d);
    // The frame exercises CLEAN: without it both sides find the same objects, and CLEAN removes some.
    const Comparison before = compareCatalogs(sepNoClean, noClean.sources);
    printComparison("clean-case [CLEAN N]", "sep", before, sepNoClean, noClean);
    ASSERT_EQ(before.matched, sepNoClean.size());
    ASSERT_EQ(before.matched, noClean.sources.size());
    ASSERT_LT(sepClean.size(), sepNoClean.size()) << "sep's CLEAN removes nothing on this frame";
    const Comparison after = compareCatalogs(sepClean, ours.sources);
    printComparison("clean-case [CLEAN Y]", "sep", after, sepClean, ours);
    EXPECT_EQ(ours.nCleaned, sepNoClean.size() - sepClean.size());
    EXPECT_EQ(after.matched, sepClean.size());
    EXPECT_EQ(after.matched, ours.sources.size());
    // Bitwise independent of the thread count.
    ctx.threads = 1;
    const DetectionResult one = detectSources(c.pixels.view(), MaskView{}, c.bkg, d, ctx);
    ASSERT_EQ(one.sources.size(), ours.sources.size());
    for (std::size_t k = 0; k < one.sources.size(); ++k) {
        EXPECT_EQ(one.sources.xIso[k], ours.sources.xIso[k]);
        EXPECT_EQ(one.sources.fluxIso[k], ours.sources.fluxIso[k]);
    }
}
#endif

SimParams simulatedField(std::uint64_t seed) {
    SimParams p;
    p.width = 1024;
    p.height = 1024;
    p.stars = 1500;
    p.seed = seed;
    p.magBright = 12.0;
    p.magFaint = 21.0;
    p.sky = 400.0;
    p.skyGradientX = 60.0;
    p.skyGradientY = -40.0;
    p.fwhm = 3.0;
    p.fwhmCornerFactor = 1.3;
    return p;
}

// 1024 x 1024, 1500 stars (mag 12-21), sky with gradients, FWHM 3 px growing to 3.9 px in the corners.
const Frame& simulatedStars() {
    static const Frame frame = frameFromSimulation(simulateField(simulatedField(11)));
    return frame;
}

// The same with 4000 stars, 30% of them in two Plummer clusters (r = 50 px), and 300 galaxies.
const Frame& simulatedCrowded() {
    static const Frame frame = [] {
        SimParams p = simulatedField(12);
        p.stars = 4000;
        p.clusters = 2;
        p.clusterRadius = 50.0;
        p.clusterFraction = 0.3;
        p.galaxies = 300;
        return frameFromSimulation(simulateField(p));
    }();
    return frame;
}

std::string testData(const std::string& rel) {
    return std::string(GPUPHOT_TEST_DATA) + "/" + rel;
}

#define REQUIRE_SEXTRACTOR()                                                                                 \
    if (!haveSourceExtractor()) GTEST_SKIP() << "source-extractor not installed"

#define REQUIRE_FILE(path)                                                                                   \
    if (!fs::exists(path)) FAIL() << "test data missing: " << (path)

TEST(PeerSextractor, SimulatedStarFieldEquivalentSettings) {
    REQUIRE_SEXTRACTOR();
    comparePeers("simulated-stars", simulatedStars(), Settings::SextractorEquivalent);
}

TEST(PeerSextractor, SimulatedStarFieldPipelineDefaults) {
    REQUIRE_SEXTRACTOR();
    comparePeers("simulated-stars", simulatedStars(), Settings::PipelineDefaults);
}

TEST(PeerSextractor, SimulatedCrowdedFieldEquivalentSettings) {
    REQUIRE_SEXTRACTOR();
    comparePeers("simulated-crowded", simulatedCrowded(), Settings::SextractorEquivalent);
}

TEST(PeerSextractor, SimulatedCrowdedFieldPipelineDefaults) {
    REQUIRE_SEXTRACTOR();
    comparePeers("simulated-crowded", simulatedCrowded(), Settings::PipelineDefaults);
}

// The PANOPTES frame as it is: the raw RGGB colour-filter mosaic, read from the tile-compressed file
// with readFrame and handed to SExtractor as plain float FITS.
TEST(PeerSextractor, PanoptesRawBayerEquivalentSettings) {
    REQUIRE_SEXTRACTOR();
    const std::string path = testData("real/panoptes_solved.fits.fz");
    REQUIRE_FILE(path);
    comparePeers("panoptes-raw-bayer", readFrame(path), Settings::SextractorEquivalent);
}

TEST(PeerSextractor, PanoptesRawBayerPipelineDefaults) {
    REQUIRE_SEXTRACTOR();
    const std::string path = testData("real/panoptes_solved.fits.fz");
    REQUIRE_FILE(path);
    comparePeers("panoptes-raw-bayer", readFrame(path), Settings::PipelineDefaults);
}

TEST(PeerSextractor, DecamCutoutEquivalentSettings) {
    REQUIRE_SEXTRACTOR();
    const std::string path = testData("real/decam_ls9_N6_cutout.fits");
    REQUIRE_FILE(path);
    comparePeers("decam-cutout", readFrame(path), Settings::SextractorEquivalent);
}

// The pipeline defaults on the real DECam cutout (280 x 375, dominated by a galaxy of ~13,000 isophotal
// pixels with faint detections far out in its wing): CLEAN must keep what SExtractor's CLEAN keeps.
TEST(PeerSextractor, DecamCutoutPipelineDefaults) {
    REQUIRE_SEXTRACTOR();
    const std::string path = testData("real/decam_ls9_N6_cutout.fits");
    REQUIRE_FILE(path);
    comparePeers("decam-cutout", readFrame(path), Settings::PipelineDefaults);
}

} // namespace
} // namespace gpuphot
