#pragma once
// Internals of `series` shared by the driver (series.cpp) and the ensemble arithmetic
// (series_ensemble.cpp). Not a public header.
#include <atomic>
#include <cstddef>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "core/series/series.hpp"

namespace gpuphot::series_detail {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kDeg = 3.14159265358979323846 / 180.0, kArcsec = 1.0 / 206264.80624709636;

using Meas = SeriesMeasurement;

// A star's flux normalised to its median over the frames (c ~ 1) and its error, per used frame (NaN
// where it is not comparable).
struct Normalised {
    std::vector<float> c, e;
};
Normalised normalise(const std::vector<Meas>& perFrame);

// RMS about the median of the finite values, leaving out those beyond clip MAD-sigmas.
double clippedRms(const std::vector<double>& v, double clip);

// Vets the ensemble (`norm[k]` for `ens[k]`) in place: weights, scatters, dropped variables.
void vet(const std::vector<const Normalised*>& norm, std::vector<EnsembleStar>& ens,
         const std::vector<double>& scint, const SeriesParams& p);

struct EnsembleFlux {
    std::vector<double> flux, err; // weighted mean normalised flux and its error per frame
    std::vector<int> n;            // comparison stars measured
};
EnsembleFlux combine(const std::vector<const Normalised*>& norm, const std::vector<EnsembleStar>& ens,
                     const std::vector<double>& scint);

// Target flux over the ensemble per frame, normalised to a median of 1, with its error.
struct Relative {
    std::vector<double> ratio, err;
    double rms = kNan, medianErr = kNan, chi2 = kNan;
    int points = 0;
};
Relative relativeFlux(const std::vector<Meas>& target, const EnsembleFlux& ens,
                      const std::vector<double>& scint);

// Field-wide vetting before the ensembles are chosen: `eligible[s]` is cleared for sources whose
// curve against the field's median scatters more than vetRatio times that of stars of their magnitude.
// `norm[s]` may be empty for sources that are not eligible. Returns the sources cleared.
std::size_t prevet(const std::vector<Normalised>& norm, const std::vector<double>& magnitude,
                   std::vector<char>& eligible, const std::vector<double>& scint, const SeriesParams& p);

// Runs body(i) for every i in [0, n), `threads` at a time: the calling thread and threads - 1 std::threads
// taking the next i in turn. Unlike an OpenMP team, whose idle threads spin for milliseconds, a thread
// that runs out of work ends, leaving its core to the others (an append's short parallel steps on a
// 2-core machine). The first exception is rethrown on the calling thread once all have ended.
template <class Body> void forEachShared(std::size_t n, int threads, const Body& body) {
    std::atomic<std::size_t> next{0};
    std::exception_ptr failure;
    std::mutex failureMutex;
    const auto work = [&] {
        for (std::size_t i; (i = next.fetch_add(1)) < n;) {
            try {
                body(i);
            } catch (...) {
                const std::lock_guard<std::mutex> lock(failureMutex);
                if (!failure) failure = std::current_exception();
                next = n;
            }
        }
    };
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads && static_cast<std::size_t>(t) < n; ++t)
        helpers.emplace_back(work);
    work();
    for (auto& h : helpers)
        h.join();
    if (failure) std::rethrow_exception(failure);
}

} // namespace gpuphot::series_detail
