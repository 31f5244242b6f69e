// The results store (core/db): the time to store one frame of N sources, and cone searches once the store
// holds many frames. Each frame is a catalog of the reduce catalog's stored columns (3 apertures) written
// once as FITS with its report, then stored through storeReducedFrame (what `reduce --db` runs on its
// writer thread: read the catalog's stored columns, checksum the frame file, one transaction); then
// random cone searches of --radius arcsec at the positions of stored sources.
//   bench_db --db URL [--sources 134000] [--frames 75] [--fields 25] [--radius 10] [--cones 200]
//            [--json FILE]
// --fields F: the frames are spread over F one-degree fields (frames / F epochs each); F = 1 puts every
// frame on one field (the densest store: every cone finds frames x density sources).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/db/db_writer.hpp"
#include "core/db/results_store.hpp"
#include "core/io/fits_table.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Table catalog(std::size_t n, double ra0, double dec0, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(-0.5, 0.5);
    std::vector<double> ra(n), dec(n), x(n), y(n), f(n), fe(n), m(n), me(n), fw(n);
    std::vector<std::int64_t> id(n), ref(n, -1);
    std::vector<std::int32_t> flags(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
        dec[i] = dec0 + u(rng);
        ra[i] = ra0 + u(rng) / std::cos(dec0 * M_PI / 180);
        x[i] = 6000 * (u(rng) + 0.5) + 1, y[i] = 6000 * (u(rng) + 0.5) + 1;
        f[i] = std::exp(6 + 8 * (u(rng) + 0.5)), fe[i] = std::sqrt(f[i] + 400);
        m[i] = 25 - 2.5 * std::log10(f[i]), me[i] = 1.0857 * fe[i] / f[i];
        fw[i] = 3 + u(rng);
        id[i] = static_cast<std::int64_t>(i + 1);
        if (i % 10 == 0) ref[i] = static_cast<std::int64_t>(i);
    }
    Table t;
    t.add("id", id), t.add("x", x), t.add("y", y), t.add("ra", ra), t.add("dec", dec);
    for (int k = 1; k <= 3; ++k) {
        std::vector<double> fk(f), ek(fe);
        for (double& v : fk)
            v *= 0.6 + 0.15 * k;
        t.add("flux_aper_" + std::to_string(k), fk), t.add("fluxerr_aper_" + std::to_string(k), ek);
    }
    t.add("flux_auto", f), t.add("fluxerr_auto", fe), t.add("flux_psf", f), t.add("fluxerr_psf", fe);
    t.add("mag_cal", m), t.add("magerr_cal", me), t.add("fwhm", fw), t.add("flags", flags),
        t.add("ref_id", ref);
    return t;
}

double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : v[std::min(v.size() - 1, static_cast<std::size_t>(p * (v.size() - 1) + 0.5))];
}

} // namespace

int main(int argc, char** argv) {
    std::string url, jsonOut;
    std::size_t sources = 134000, frames = 75, fields = 25, cones = 200;
    double radius = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--db")
            url = v;
        else if (a == "--sources")
            sources = std::stoul(v);
        else if (a == "--frames")
            frames = std::stoul(v);
        else if (a == "--fields")
            fields = std::max<std::size_t>(1, std::stoul(v));
        else if (a == "--radius")
            radius = std::stod(v);
        else if (a == "--cones")
            cones = std::stoul(v);
        else if (a == "--json")
            jsonOut = v;
    }
    if (url.empty()) {
        std::fprintf(stderr, "usage: bench_db --db URL [--sources N] [--frames N] [--fields F] ...\n");
        return 2;
    }
    try {
        const fs::path work = fs::temp_directory_path() / ("gpuphot_bench_db_" + std::to_string(::getpid()));
        fs::create_directories(work);
        auto store = openResultsStore(url);
        std::vector<double> put;
        std::vector<std::pair<double, double>> centres;
        for (std::size_t k = 0; k < frames; ++k) {
            const double ra0 = 10.0 + 2.0 * static_cast<double>(k % fields), dec0 = 20.0;
            centres.emplace_back(ra0, dec0);
            // The same file names each time: the previous frame's files are replaced, the store's rows not.
            const fs::path cat = work / "f.cat.fits", frame = work / ("f" + std::to_string(k) + ".fits");
            writeFitsTable(cat.string(), catalog(sources, ra0, dec0, static_cast<unsigned>(k)));
            std::ofstream(frame) << std::string(1 << 20, 'x'); // a 1 MiB stand-in frame file for the checksum
            nlohmann::json report = {{"frame", {{"path", frame.string()}, {"hdu", 0}}},
                                     {"instrument", {{"mjd_mid", 60000.0 + 0.01 * k}, {"filter", "r"}}},
                                     {"counts", {{"sources", sources}}},
                                     {"zp", 25.0},
                                     {"outputs", {{"catalog", cat.string()}}}};
            std::ofstream(work / "f.report.json") << report.dump();
            const double t0 = now();
            storeReducedFrame(*store, (work / "f.report.json").string());
            put.push_back(now() - t0);
            std::fprintf(stderr, "\rframe %zu/%zu: %.3f s", k + 1, frames, put.back());
        }
        std::fprintf(stderr, "\n");
        fs::remove_all(work);
        // Cones at stored sources' positions (a random frame's field, random offset within it).
        std::mt19937 rng(7);
        std::uniform_real_distribution<double> u(-0.45, 0.45);
        std::vector<double> coneTimes, hits;
        for (std::size_t c = 0; c < cones; ++c) {
            const auto [ra0, dec0] = centres[rng() % centres.size()];
            const double ra = ra0 + u(rng) / std::cos(dec0 * M_PI / 180), dec = dec0 + u(rng);
            const double t0 = now();
            const Table t = store->cone(ra, dec, radius);
            coneTimes.push_back(now() - t0);
            hits.push_back(static_cast<double>(t.rows()));
        }
        nlohmann::json out = {{"backend", store->backend()},
                              {"sources_per_frame", sources},
                              {"frames", frames},
                              {"fields", fields},
                              {"stored_sources", sources * frames},
                              {"put_first_s", put.front()},
                              {"put_median_s", percentile(put, 0.5)},
                              {"put_max_s", percentile(put, 1.0)},
                              {"put_last_s", put.back()},
                              {"put_s", put},
                              {"cone_radius_arcsec", radius},
                              {"cone_median_ms", 1e3 * percentile(coneTimes, 0.5)},
                              {"cone_p95_ms", 1e3 * percentile(coneTimes, 0.95)},
                              {"cone_max_ms", 1e3 * percentile(coneTimes, 1.0)},
                              {"cone_median_rows", percentile(hits, 0.5)}};
        std::printf("%s\n", out.dump(1).c_str());
        if (!jsonOut.empty()) std::ofstream(jsonOut) << out.dump(1) << "\n";
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_db: %s\n", e.what());
        return 1;
    }
}
