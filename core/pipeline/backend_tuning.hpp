#pragma once
// The backends' tuning knobs and the test-only fault injection, in one place.
//
// BackendTuning: alternative code paths of the engines, kept to measure them against each other and to
// let the tests run every path. Every default is the path the product runs, and every alternative gives
// the same catalog bytes (tests/kernels and tests/core compare them). A RunContext carries one; the front
// ends fill it once at start-up (BackendTuning::fromEnvironment) and the report records it, so two runs
// that behave differently show why. docs/CONFIG.md §Tuning lists the environment variables.
//
// TestHooks: fault injection for the tests (an allocation that fails, a smaller device limit). Nothing in
// a release build sets them: tests set the fields directly, and only the test build's CLI
// (gpuphot-testhooks) reads them from the environment.
#include <cstddef>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace gpuphot {

struct BackendTuning {
    // Aperture stage engines (core/stages/aperture/aperture.cpp, kernels/aperture/aperture.cu).
    struct Aperture {
        std::size_t batch = 0; // GPUPHOT_APERTURE_BATCH: sources per engine batch; 0: the engine's own
        bool heapSort = false; // GPUPHOT_APERTURE_HEAPSORT: annulus values by a heap sort
        bool skySplit = false; // GPUPHOT_APERTURE_SKY=split: the sky pass split in two kernels
        // GPUPHOT_APERTURE_SKY=block0 (0: one block, no sort), GPUPHOT_APERTURE_SKY_SORT=pairs (1), 2:
        // default
        int skyMode = 2;
        int skyThreads = 64;     // GPUPHOT_APERTURE_SKY_THREADS: threads of the sky kernel (32..1024)
        bool kronThread = false; // GPUPHOT_APERTURE_KRON=thread: one thread per Kron radius
        int circleMode = 0;      // GPUPHOT_APERTURE_CIRCLE: 0 by size, 1 thread, 2 warp
        std::size_t warpItems =
            32768;               // GPUPHOT_APERTURE_WARP_ITEMS: (source, radius) pairs up to which warps sum
        bool sync = false;       // GPUPHOT_APERTURE_SYNC: synchronise after every engine call
        bool keep = true;        // GPUPHOT_APERTURE_KEEP=0: release the batch buffers after each run
        bool chain = true;       // GPUPHOT_APERTURE_CHAIN=0: no chained device passes
        bool twoStreams = false; // GPUPHOT_APERTURE_STREAMS=2: a side stream for pass 3
        bool spatialOrder = false; // GPUPHOT_APERTURE_ORDER=spatial: sources sorted by position on the device
        bool optimalOnHost = false; // GPUPHOT_APERTURE_OPTIMAL=host: optimal radii searched on the host
        bool timing = false;        // GPUPHOT_APERTURE_TIMING: the stage's phases on stderr
    } aperture;
    // Detection stage's CUDA engine (kernels/detection*.cu).
    struct Detection {
        bool frontUnfused = false; // GPUPHOT_DETECTION_FRONT_UNFUSED: filter and threshold in two kernels
        bool tileRows32 = false;   // GPUPHOT_DETECTION_TILE_ROWS=32: 32-row tiles of the fused 7x7 front
        bool hostLabels = false;   // GPUPHOT_DETECTION_HOST_LABELS: runs labelled on the host
        bool hostObjects = false;  // GPUPHOT_DETECTION_HOST_OBJECTS: the per-object half on the host
        bool recycle = true;       // GPUPHOT_DETECTION_RECYCLE=0: no segmentation-buffer reuse
        // GPUPHOT_DETECTION_RELEASE: idle (a thread frees when idle), thread (a thread frees at once), now
        std::string release = "idle";
        bool rasterWindows = false; // GPUPHOT_DETECTION_WINDOW_ORDER=raster: windows in raster order
        bool timing = false;        // GPUPHOT_DETECTION_TIMING: device times of the steps on stderr
    } detection;
    bool psfOnDevice = true;       // GPUPHOT_PSF_DEVICE=0: the PSF fits and ePSF cells on the host
    bool psfTiming = false;        // GPUPHOT_PSF_TIMING: the PSF stage's host laps on stderr
    bool rawUpload = true;         // GPUPHOT_RAW_UPLOAD=0: frames converted on the host, not uploaded raw
    bool rawUploadWait = false;    // GPUPHOT_RAW_UPLOAD=wait: the raw upload finishes before the read returns
    int cudaBlock = 0;             // GPUPHOT_CUDA_BLOCK: threads per block of the generic kernels; 0: 128
    bool cfitsioRead = false;      // GPUPHOT_CFITSIO_READ=1: pixels read by CFITSIO, not the direct reader
    bool calibrationBeside = true; // GPUPHOT_CALIBRATION_BESIDE=0: the crossmatch after the apertures
    // GPUPHOT_PINNED_RESERVE=MiB|auto: host memory the device warm-up pins, once the first frame is
    // prepared, for the stages' buffers (kernels/pinned_reserve.hpp); 0: none; -1 (auto): 2 bytes per pixel
    // of the frame being read, at most 512 MiB.
    int pinnedReserveMiB = 0;
    // GPUPHOT_DETACHED_EXIT=0|1: a single-frame `reduce` hands its exit status to the shell before the
    // process releases the device (app/cli/detached_exit.hpp); auto: where an NVIDIA device node exists.
    std::string detachedExit = "auto";

    // The environment variables above over the defaults. Unknown values keep the default.
    static BackendTuning fromEnvironment();
    // The process-wide parts (the host step laps' switches, the raw upload's wait): once at start-up.
    void applyToProcess() const;
    // Every field, by the environment variable's name without GPUPHOT_ (the report's "tuning").
    nlohmann::json toJson() const;
    // The fields that differ from the defaults, "name=value" joined by spaces; empty: all defaults.
    std::string nonDefault() const;
};

struct TestHooks {
    std::size_t cudaFailAfterAllocs = 0; // the device allocation after this many fails; 0: none
    int detectionRankMax = -1;           // the detection finish's rank-sort limit; -1: the engine's own
    bool apertureCpuChain = false;       // the CPU aperture engine makes the CUDA engine's chained calls
    bool calibrationBeside = false;      // the CPU backend too runs the calibration beside PSF, apertures
};

} // namespace gpuphot
