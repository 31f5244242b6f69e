#pragma once
// Host side of kernels/detection_finish.cu (OpenMP): the objects packed into one upload buffer as CSR, and
// the Sources columns filled from the downloaded order and windowed positions.
#include <cstddef>
#include <cstdint>

#include "core/stages/detection_internal.hpp"

namespace gpuphot::cuda {

// One upload buffer: runStart[n + 1] and pixStart[n + 1] (int64 CSR offsets of each object's runs and
// pixels), the window inputs WindowObject[n], the runs Run[nRuns]; objects in found's order.
struct FinishLayout {
    std::size_t n = 0, nRuns = 0;
    std::int64_t nPix = 0;
    std::size_t runStart = 0, pixStart = 0, objects = 0, runs = 0, bytes = 0; // byte offsets, total
};
// pixStart is computed here (written into `pixStart`, n + 1 entries).
FinishLayout finishLayout(const detail::DetectedObjects& found, std::int64_t* pixStart, int threads);
// Fills dst (layout.bytes) from found; pixStart as finishLayout gave it.
void packFinish(const detail::DetectedObjects& found, const FinishLayout& layout, const std::int64_t* pixStart,
                unsigned char* dst, int threads);
// result.sources row k from found.iso[order[k]], found.objects[order[k]].flags and win[k].
void fillFinishSources(const detail::DetectedObjects& found, const std::int32_t* order,
                       const detail::WindowResult* win, DetectionResult& result, int threads);

} // namespace gpuphot::cuda
