// Calibration benchmark (docs/BENCHMARKS.md, "Calibration"): wall times of stage 5 (crossmatch), 6 (zero
// point) and 7 (astrometric refinement of a header WCS close to right) for 300 .. 130,000 detections
// against synthetic reference catalogs of 1e4 .. 1e6 stars, and of blind solves of the 20 simulated
// fields of tests/core/astrometry_test.cpp (same generation: core/sim, the same seeds and ranges).
//
// Usage: bench_calibration [--quick] [--skip-blind] [--skip-grid] [--repeat N] [--threads N] [--refs N]
//                          [--dets N] [--dump] [--wide] [--index grid|kdtree|auto]
// (--refs / --dets: only the grid cases of that catalog / detection count; --dump: every result of a grid
// case to full precision, with fingerprints, to check that two builds give identical results; --wide: a
// 1e6-star catalog over 10x the frame's area, with and without the per-frame cut, --dets detections;
// --index: the crossmatch's spatial index, CrossmatchParams::index, default auto.)
// Prints one line per case; each time is the fastest of N repeats (default 3); xm_cpu: the crossmatch's
// CPU seconds in that repeat.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/flags.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/astrometry/astrometry.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/stages/zeropoint/zeropoint.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"

using namespace gpuphot;

namespace {

constexpr double kDeg = std::numbers::pi / 180.0;

// Process CPU time (user + system, all threads), seconds.
double cpuSeconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU seconds of the fastest (wall) repeat of the last bestOf call: on a loaded machine the wall time
// includes waiting for a core, the CPU time does not.
double g_lastCpu = 0.0;

template <typename F> double bestOf(int repeat, F&& f) {
    double best = 1e30;
    for (int i = 0; i < repeat; ++i) {
        const double c0 = cpuSeconds();
        const auto t0 = std::chrono::steady_clock::now();
        f();
        const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (wall < best) {
            best = wall;
            g_lastCpu = cpuSeconds() - c0;
        }
    }
    return best;
}

// A TAN WCS (with a mild SIP distortion) for a size x size frame at `scale` arcsec/px.
TanSip frameWcs(int size, double scale, double ra, double dec) {
    TanSip w;
    w.crpix[0] = 0.5 * (size + 1);
    w.crpix[1] = 0.5 * (size + 1);
    w.crval[0] = ra;
    w.crval[1] = dec;
    const double s = scale / 3600.0, rot = 12.0 * kDeg;
    w.cd[0][0] = -s * std::cos(rot);
    w.cd[0][1] = s * std::sin(rot);
    w.cd[1][0] = s * std::sin(rot);
    w.cd[1][1] = s * std::cos(rot);
    return w;
}

struct GridCase {
    ReferenceCatalog ref;
    std::vector<double> x, y, flux, magInst, magInstErr;
    std::vector<std::uint32_t> flags;
};

// nRef stars uniform over the frame's circumscribed circle plus 10 %; detections: the reference stars
// that fall on the frame (positions + 0.05 px noise, up to nDet of them, brightest first) topped up
// with unmatched random sources.
// areaFactor > 0: the catalog covers areaFactor times the frame's area instead (a wide catalog).
GridCase makeGrid(const Wcs& wcs, int size, double scale, double ra, double dec, std::size_t nRef,
                  std::size_t nDet, std::uint64_t seed, double areaFactor = 0.0) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::normal_distribution<double> g(0.0, 1.0);
    GridCase c;
    const double radius =
        (areaFactor > 0.0 ? std::sqrt(areaFactor / std::numbers::pi) : 1.1 * std::sqrt(0.5)) * size * scale /
        3600.0 * kDeg;
    const double cosR = std::cos(radius);
    const double zp = 25.0;
    for (std::size_t i = 0; i < nRef; ++i) {
        // uniform on the spherical cap around the pole, rotated to (ra, dec)
        const double cz = 1.0 - u(rng) * (1.0 - cosR), phi = 2.0 * std::numbers::pi * u(rng);
        const double sz = std::sqrt(1.0 - cz * cz);
        const double px = sz * std::cos(phi), py = sz * std::sin(phi), pz = cz;
        const double d0 = dec * kDeg, r0 = ra * kDeg;
        // rotate pole -> (ra, dec): about y by (90 - dec), then about z by ra
        const double x1 = px * std::sin(d0) + pz * std::cos(d0), z1 = -px * std::cos(d0) + pz * std::sin(d0);
        const double x2 = x1 * std::cos(r0) - py * std::sin(r0), y2 = x1 * std::sin(r0) + py * std::cos(r0);
        double a = std::atan2(y2, x2) / kDeg;
        if (a < 0) a += 360.0;
        c.ref.ra.push_back(a);
        c.ref.dec.push_back(std::asin(std::clamp(z1, -1.0, 1.0)) / kDeg);
        c.ref.mag.push_back(12.0 + 8.0 * std::pow(u(rng), 0.4));
        c.ref.id.push_back(static_cast<std::int64_t>(i + 1));
    }
    const std::size_t n = c.ref.size();
    c.ref.magErr.assign(n, 0.01);
    c.ref.color.assign(n, NAN);
    c.ref.pmRa.assign(n, NAN);
    c.ref.pmDec.assign(n, NAN);
    std::vector<double> px(n), py(n);
    wcs.worldToPixel(c.ref.ra, c.ref.dec, px, py);
    std::vector<std::size_t> on;
    for (std::size_t i = 0; i < n; ++i)
        if (px[i] >= 0 && py[i] >= 0 && px[i] <= size - 1 && py[i] <= size - 1) on.push_back(i);
    std::stable_sort(on.begin(), on.end(),
                     [&](std::size_t a, std::size_t b) { return c.ref.mag[a] < c.ref.mag[b]; });
    if (on.size() > nDet) on.resize(nDet);
    for (std::size_t i : on) {
        const double m = c.ref.mag[i] - zp + 0.02 * g(rng);
        c.x.push_back(px[i] + 0.05 * g(rng));
        c.y.push_back(py[i] + 0.05 * g(rng));
        c.flux.push_back(std::pow(10.0, -0.4 * m));
        c.magInst.push_back(m);
        c.magInstErr.push_back(0.005 + 0.02 * u(rng));
    }
    while (c.x.size() < nDet) {
        const double m = -5.0 + 13.0 * u(rng);
        c.x.push_back((size - 1) * u(rng));
        c.y.push_back((size - 1) * u(rng));
        c.flux.push_back(std::pow(10.0, -0.4 * m));
        c.magInst.push_back(m);
        c.magInstErr.push_back(0.005 + 0.05 * u(rng));
    }
    c.flags.assign(c.x.size(), 0u);
    return c;
}

// FNV-1a over the bytes of a vector: a fingerprint of a result, to compare builds (--dump).
template <typename T>
std::uint64_t fingerprint(const std::vector<T>& v, std::uint64_t h = 1469598103934665603ull) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size() * sizeof(T); ++i)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

// Every result of a grid case to full precision (crossmatch, zero point, fitted WCS, astrometric matches),
// so that two builds can be checked for identical results.
void dumpCase(const CrossmatchResult& m, const ZeroPointResult& z, const AstrometryResult& a) {
    std::uint64_t h = fingerprint(m.refIndex);
    h = fingerprint(m.separationArcsec, h);
    h = fingerprint(m.refSelected, h);
    h = fingerprint(m.refX, fingerprint(m.refY, h));
    std::printf("#   crossmatch %016llx n_in_frame %zu radius_px %.17g\n", static_cast<unsigned long long>(h),
                m.nRefInFrame, m.radiusPx);
    std::printf("#   zeropoint %.17g +- %.17g scatter %.17g sint %.17g used %d residuals %016llx\n", z.zp,
                z.zpErr, z.scatter, z.intrinsicScatter, z.nUsed,
                static_cast<unsigned long long>(fingerprint(z.residual)));
    std::vector<double> w = {a.wcs.crval[0], a.wcs.crval[1], a.wcs.cd[0][0],
                             a.wcs.cd[0][1], a.wcs.cd[1][0], a.wcs.cd[1][1]};
    w.insert(w.end(), a.wcs.a.begin(), a.wcs.a.end());
    w.insert(w.end(), a.wcs.b.begin(), a.wcs.b.end());
    std::vector<char> used(a.used.begin(), a.used.end());
    const std::uint64_t ha =
        fingerprint(used, fingerprint(a.dxArcsec, fingerprint(a.refIndex, fingerprint(a.sourceIndex))));
    std::printf("#   astrometry wcs %016llx crval %.17g %.17g sip %d matches %016llx rms %.17g\n",
                static_cast<unsigned long long>(fingerprint(w)), a.wcs.crval[0], a.wcs.crval[1], a.sipOrder,
                static_cast<unsigned long long>(ha), a.rmsArcsec);
}

void runGrid(int repeat, bool quick, RunContext& ctx, std::size_t onlyRefs, std::size_t onlyDets, bool dump,
             const std::string& index) {
    const int size = 8192;
    const double scale = 0.6, ra = 150.0, dec = 30.0;
    const TanSip truth = frameWcs(size, scale, ra, dec);
    const Wcs wcs = Wcs::fromTanSip(truth);
    // The header the refinement starts from: 3 px off, 0.05 deg rotated.
    TanSip off = truth;
    off.crval[0] += 3.0 * scale / 3600.0 / std::cos(dec * kDeg);
    const double r = 0.05 * kDeg;
    for (int k = 0; k < 2; ++k) {
        const double a = off.cd[k][0], b = off.cd[k][1];
        off.cd[k][0] = a * std::cos(r) - b * std::sin(r);
        off.cd[k][1] = a * std::sin(r) + b * std::cos(r);
    }
    const Wcs header = Wcs::fromTanSip(off);
    std::printf("# frame %dx%d at %.2f\"/px; crossmatch index %s; times: best of %d, seconds\n", size, size,
                scale, index.c_str(), repeat);
    std::printf("%8s %9s %9s %10s %10s %10s %10s %9s %8s %8s %8s\n", "n_det", "n_ref", "matched", "crossmatch",
                "zeropoint", "astrometry", "total", "total_cpu", "ast_used", "ast_rms\"", "xm_cpu");
    const std::vector<std::size_t> refs =
        quick ? std::vector<std::size_t>{10000, 100000} : std::vector<std::size_t>{10000, 100000, 1000000};
    const std::vector<std::size_t> dets =
        quick ? std::vector<std::size_t>{300, 3000} : std::vector<std::size_t>{300, 3000, 30000, 130000};
    for (std::size_t nRef : refs) {
        if (onlyRefs && nRef != onlyRefs) continue;
        for (std::size_t nDet : dets) {
            if (onlyDets && nDet != onlyDets) continue;
            const GridCase c = makeGrid(wcs, size, scale, ra, dec, nRef, nDet, 42 + nRef + nDet);
            CrossmatchParams cp;
            cp.index = index;
            CrossmatchResult m;
            const double tMatch =
                bestOf(repeat, [&] { m = crossmatch(c.x, c.y, size, size, c.ref, wcs, cp, ctx); });
            const double cpuMatch = g_lastCpu;
            double cpu = g_lastCpu;
            ZeroPointParams zp;
            zp.minSnr = 5.0;
            ZeroPointResult z;
            const double tZp = bestOf(
                repeat, [&] { z = fitZeroPoint(c.magInst, c.magInstErr, c.flags, m, c.ref, zp, ctx); });
            cpu += g_lastCpu;
            AstrometryParams ap;
            ap.blind = 0;
            AstrometryResult a;
            const double tAst = bestOf(repeat, [&] {
                a = solveAstrometry(c.x, c.y, c.flux, size, size, c.ref, &header, std::nullopt, ap, ctx);
            });
            cpu += g_lastCpu;
            std::printf("%8zu %9zu %9zu %10.4f %10.4f %10.4f %10.4f %9.4f %8d %8.4f %8.4f%s\n", nDet, nRef,
                        m.nMatched, tMatch, tZp, tAst, tMatch + tZp + tAst, cpu, a.nUsed, a.rmsArcsec, cpuMatch,
                        a.ok && z.ok ? "" : (a.ok ? "  (zp failed)" : "  (astrometry failed)"));
            if (dump) dumpCase(m, z, a);
            std::fflush(stdout);
        }
    }
}

// A 1e6-star catalog over 10x the frame's area (--wide): crossmatch + zero point on the whole catalog vs
// on the catalog cut once to the frame (cutReferenceToFrame, what runPipeline does per frame), and the
// astrometric refinement (which cuts internally). The results of the two paths are checked to agree.
void runWide(int repeat, RunContext& ctx, std::size_t nDet, const std::string& index) {
    const int size = 8192;
    const double scale = 0.6, ra = 150.0, dec = 30.0;
    const TanSip truth = frameWcs(size, scale, ra, dec);
    const Wcs wcs = Wcs::fromTanSip(truth);
    TanSip off = truth;
    off.crval[0] += 3.0 * scale / 3600.0 / std::cos(dec * kDeg);
    const Wcs header = Wcs::fromTanSip(off);
    const std::size_t nRef = 1000000;
    const GridCase c = makeGrid(wcs, size, scale, ra, dec, nRef, nDet, 4242 + nDet, 10.0);
    CrossmatchParams cp;
    cp.index = index;
    ZeroPointParams zp;
    zp.minSnr = 5.0;
    CrossmatchResult mFull, mCut;
    ZeroPointResult zFull, zCut;
    ReferenceCatalog cut;
    std::vector<std::int32_t> rows;
    const double tFull = bestOf(repeat, [&] {
        mFull = crossmatch(c.x, c.y, size, size, c.ref, wcs, cp, ctx);
        zFull = fitZeroPoint(c.magInst, c.magInstErr, c.flags, mFull, c.ref, zp, ctx);
    });
    const double tCutOnly =
        bestOf(repeat, [&] { cut = cutReferenceToFrame(c.ref, wcs, size, size, 60.0, &rows); });
    const double tCut = bestOf(repeat, [&] {
        cut = cutReferenceToFrame(c.ref, wcs, size, size, 60.0, &rows);
        mCut = crossmatch(c.x, c.y, size, size, cut, wcs, cp, ctx);
        zCut = fitZeroPoint(c.magInst, c.magInstErr, c.flags, mCut, cut, zp, ctx);
    });
    std::size_t same = 0;
    for (std::size_t i = 0; i < mFull.refIndex.size(); ++i)
        same += mFull.refIndex[i] == (mCut.refIndex[i] >= 0 ? rows[mCut.refIndex[i]] : -1);
    AstrometryParams ap;
    ap.blind = 0;
    AstrometryResult a;
    const double tAst = bestOf(repeat, [&] {
        a = solveAstrometry(c.x, c.y, c.flux, size, size, c.ref, &header, std::nullopt, ap, ctx);
    });
    std::printf("# wide catalog: %zu stars over 10x the frame's area (%zu kept by the cut), %zu detections\n",
                nRef, cut.size(), nDet);
    std::printf("#   crossmatch+zp on the whole catalog %.4f s; cut %.4f s; cut+crossmatch+zp %.4f s; "
                "same matches %zu/%zu, zp %.6f vs %.6f\n",
                tFull, tCutOnly, tCut, same, mFull.refIndex.size(), zFull.zp, zCut.zp);
    std::printf("#   astrometry (refine) %.4f s: %d used, RMS %.4f arcsec%s\n", tAst, a.nUsed, a.rmsArcsec,
                a.ok ? "" : "  (failed)");
    std::fflush(stdout);
}

// Field i of tests/core/astrometry_test.cpp's blind-solving benchmark (benchField + makeField there):
// the same parameters and seeds.
struct BlindCase {
    SimParams p;
    ReferenceCatalog ref;
    std::vector<double> x, y, flux;
    std::optional<Wcs> header;
    std::optional<std::pair<double, double>> pointing;
    TanSip truth;
};

BlindCase blindField(int i, int size, int stars) {
    std::mt19937_64 rng(1000 + i);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    SimParams p;
    p.width = size;
    p.height = size;
    p.stars = stars;
    p.refMagLimit = 19.0;
    p.refMargin = 0.05;
    p.sipOrder = 3;
    p.sipStrength = 1.5;
    p.seed = 5000 + i;
    p.pixelScale = 0.5 * std::pow(40.0, u(rng));
    p.rotation = 360.0 * u(rng);
    p.flipParity = u(rng) < 0.5;
    p.ra = 360.0 * u(rng);
    p.dec = -80.0 + 160.0 * u(rng);
    p.refMargin = 0.02 * p.pixelScale;
    const bool withHeader = i % 2 == 0;
    const double offset = u(rng), angle = 360.0 * u(rng), rot = 20.0 * u(rng) - 10.0, sc = 0.2 * u(rng) - 0.1;
    if (withHeader) {
        p.wcsOffset = 60.0 * offset;
        p.wcsOffsetAngle = angle;
        p.wcsRotation = rot;
        p.wcsScaleError = sc;
    } else {
        p.writeWcs = false;
    }
    BlindCase c;
    c.p = p;
    const SimResult sim = simulateField(p);
    c.truth = sim.trueWcs;
    const Table& t = sim.reference;
    c.ref.ra = t.doubles("ra");
    c.ref.dec = t.doubles("dec");
    c.ref.mag = t.doubles("mag");
    const std::size_t n = c.ref.ra.size();
    c.ref.magErr.assign(n, NAN);
    c.ref.color.assign(n, NAN);
    c.ref.pmRa.assign(n, NAN);
    c.ref.pmDec.assign(n, NAN);
    for (double id : t.doubles("id"))
        c.ref.id.push_back(static_cast<std::int64_t>(id));
    const auto tx = sim.truth.doubles("x"), ty = sim.truth.doubles("y"), tf = sim.truth.doubles("flux");
    std::mt19937_64 noise(77 + i);
    std::normal_distribution<double> g(0.0, 1.0);
    for (std::size_t k = 0; k < tx.size(); ++k) {
        const double x = tx[k] - 1.0, y = ty[k] - 1.0;
        if (x < 0 || y < 0 || x > p.width - 1 || y > p.height - 1 || !(tf[k] > 0)) continue;
        const double sigma = std::min(0.5, 0.01 + 2.0 / std::sqrt(tf[k]));
        c.x.push_back(x + sigma * g(noise));
        c.y.push_back(y + sigma * g(noise));
        c.flux.push_back(tf[k]);
    }
    if (withHeader) c.header = Wcs::fromHeader(sim.header);
    if (!withHeader && i % 4 != 3) {
        double pra = 0, pdec = 0;
        offsetPosition(p.ra, p.dec, 180.0 * offset, angle, pra, pdec);
        c.pointing = std::make_pair(pra, pdec);
    }
    return c;
}

void runBlind(int n, int size, int stars, RunContext& ctx) {
    std::printf("# blind solves: %d fields %dx%d, %d stars (tests/core/astrometry_test.cpp fields)\n", n,
                size, size, stars);
    std::printf("%5s %-8s %8s %7s %7s %9s %9s %10s %6s\n", "field", "start", "scale\"", "rot", "parity",
                "total_s", "search_s", "truth_rms", "ok");
    double worst = 0.0, sum = 0.0;
    int solved = 0;
    for (int i = 0; i < n; ++i) {
        const BlindCase c = blindField(i, size, stars);
        const auto t0 = std::chrono::steady_clock::now();
        const AstrometryResult r = solveAstrometry(c.x, c.y, c.flux, size, size, c.ref,
                                                   c.header ? &*c.header : nullptr, c.pointing, {}, ctx);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double rms = r.ok ? wcsDifferencePx(c.truth, r.wcs, size, size) : NAN;
        solved += r.ok && r.method == "blind";
        worst = std::max(worst, sec);
        sum += sec;
        std::printf("%5d %-8s %8.3f %7.1f %7d %9.3f %9.3f %10.4f %6s\n", i,
                    c.header ? "header" : (c.pointing ? "pointing" : "none"), c.p.pixelScale, c.p.rotation,
                    c.p.flipParity ? 1 : 0, sec, r.solveSeconds, rms, r.ok ? r.method.c_str() : "FAIL");
        std::fflush(stdout);
    }
    std::printf("# %d/%d solved blind; mean %.3f s, slowest %.3f s\n", solved, n, sum / n, worst);
}

} // namespace

int main(int argc, char** argv) {
    bool quick = false, blind = true, grid = true, dump = false, wide = false;
    int repeat = 3, threads = 0;
    std::size_t onlyRefs = 0, onlyDets = 0; // --refs / --dets: run only the grid cases of that size
    std::string index = "auto";              // --index: CrossmatchParams::index
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--quick")
            quick = true;
        else if (a == "--skip-blind")
            blind = false;
        else if (a == "--skip-grid")
            grid = false;
        else if (a == "--dump")
            dump = true;
        else if (a == "--wide")
            wide = true;
        else if (a == "--repeat" && i + 1 < argc)
            repeat = std::max(1, std::atoi(argv[++i]));
        else if (a == "--threads" && i + 1 < argc)
            threads = std::atoi(argv[++i]);
        else if (a == "--refs" && i + 1 < argc)
            onlyRefs = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--dets" && i + 1 < argc)
            onlyDets = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--index" && i + 1 < argc)
            index = argv[++i];
        else {
            std::fprintf(stderr,
                         "usage: %s [--quick] [--skip-blind] [--skip-grid] [--repeat N] [--threads N] "
                         "[--refs N] [--dets N] [--dump] [--wide] [--index grid|kdtree|auto]\n",
                         argv[0]);
            return 2;
        }
    }
    try {
        resolveCrossmatchIndex(index);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
    }
    RunContext ctx;
    ctx.threads = threads;
    if (grid) runGrid(repeat, quick, ctx, onlyRefs, onlyDets, dump, index);
    if (wide) runWide(repeat, ctx, onlyDets ? onlyDets : 130000, index);
    if (blind) runBlind(quick ? 4 : 20, quick ? 1024 : 2048, quick ? 1200 : 3000, ctx);
    return 0;
}
