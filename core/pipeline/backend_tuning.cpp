#include "core/pipeline/backend_tuning.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/util/step_timer.hpp"

namespace gpuphot {

namespace {

const char* env(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? v : nullptr;
}
bool is(const char* name, const char* value) {
    const char* v = env(name);
    return v && std::strcmp(v, value) == 0;
}
// Set and not "0".
bool on(const char* name) {
    const char* v = env(name);
    return v && std::strcmp(v, "0") != 0;
}
bool notOff(const char* name, bool def) {
    return env(name) ? !is(name, "0") : def;
}

} // namespace

BackendTuning BackendTuning::fromEnvironment() {
    BackendTuning t;
    auto& a = t.aperture;
    if (const char* b = env("GPUPHOT_APERTURE_BATCH"))
        a.batch = std::max<std::size_t>(1, std::strtoull(b, nullptr, 10));
    a.heapSort = on("GPUPHOT_APERTURE_HEAPSORT");
    a.skySplit = is("GPUPHOT_APERTURE_SKY", "split");
    a.skyMode = is("GPUPHOT_APERTURE_SKY", "block0") ? 0 : is("GPUPHOT_APERTURE_SKY_SORT", "pairs") ? 1 : 2;
    if (const char* v = env("GPUPHOT_APERTURE_SKY_THREADS"))
        a.skyThreads = std::clamp(std::atoi(v) / 32 * 32, 32, 1024);
    a.kronThread = is("GPUPHOT_APERTURE_KRON", "thread");
    a.circleMode = is("GPUPHOT_APERTURE_CIRCLE", "warp")     ? 2
                   : is("GPUPHOT_APERTURE_CIRCLE", "thread") ? 1
                                                             : 0;
    if (const char* v = env("GPUPHOT_APERTURE_WARP_ITEMS")) a.warpItems = std::strtoull(v, nullptr, 10);
    a.sync = on("GPUPHOT_APERTURE_SYNC");
    a.keep = notOff("GPUPHOT_APERTURE_KEEP", true);
    a.chain = notOff("GPUPHOT_APERTURE_CHAIN", true);
    a.twoStreams = is("GPUPHOT_APERTURE_STREAMS", "2");
    a.spatialOrder = is("GPUPHOT_APERTURE_ORDER", "spatial");
    a.optimalOnHost = is("GPUPHOT_APERTURE_OPTIMAL", "host");
    a.timing = on("GPUPHOT_APERTURE_TIMING");
    auto& d = t.detection;
    d.frontUnfused = on("GPUPHOT_DETECTION_FRONT_UNFUSED");
    d.tileRows32 = is("GPUPHOT_DETECTION_TILE_ROWS", "32");
    d.hostLabels = env("GPUPHOT_DETECTION_HOST_LABELS") != nullptr;
    d.hostObjects = env("GPUPHOT_DETECTION_HOST_OBJECTS") != nullptr;
    d.recycle = notOff("GPUPHOT_DETECTION_RECYCLE", true);
    if (is("GPUPHOT_DETECTION_RELEASE", "thread") || is("GPUPHOT_DETECTION_RELEASE", "now"))
        d.release = env("GPUPHOT_DETECTION_RELEASE");
    d.rasterWindows = is("GPUPHOT_DETECTION_WINDOW_ORDER", "raster");
    d.timing = env("GPUPHOT_DETECTION_TIMING") != nullptr;
    t.psfOnDevice = notOff("GPUPHOT_PSF_DEVICE", true);
    t.psfTiming = on("GPUPHOT_PSF_TIMING");
    t.rawUpload = notOff("GPUPHOT_RAW_UPLOAD", true);
    t.rawUploadWait = is("GPUPHOT_RAW_UPLOAD", "wait");
    if (const char* v = env("GPUPHOT_CUDA_BLOCK")) t.cudaBlock = std::atoi(v);
    t.cfitsioRead = is("GPUPHOT_CFITSIO_READ", "1");
    t.calibrationBeside = notOff("GPUPHOT_CALIBRATION_BESIDE", true);
    if (const char* v = env("GPUPHOT_PINNED_RESERVE")) {
        if (std::strcmp(v, "auto") == 0)
            t.pinnedReserveMiB = -1;
        else if (std::strspn(v, "0123456789") == std::strlen(v))
            t.pinnedReserveMiB = static_cast<int>(std::min(std::strtol(v, nullptr, 10), 1L << 20)); // MiB
    }
    if (is("GPUPHOT_DETACHED_EXIT", "0") || is("GPUPHOT_DETACHED_EXIT", "1"))
        t.detachedExit = env("GPUPHOT_DETACHED_EXIT");
    return t;
}

nlohmann::json BackendTuning::toJson() const {
    const auto& a = aperture;
    const auto& d = detection;
    return {{"APERTURE_BATCH", a.batch},
            {"APERTURE_HEAPSORT", a.heapSort},
            {"APERTURE_SKY_SPLIT", a.skySplit},
            {"APERTURE_SKY_MODE", a.skyMode},
            {"APERTURE_SKY_THREADS", a.skyThreads},
            {"APERTURE_KRON_THREAD", a.kronThread},
            {"APERTURE_CIRCLE", a.circleMode},
            {"APERTURE_WARP_ITEMS", a.warpItems},
            {"APERTURE_SYNC", a.sync},
            {"APERTURE_KEEP", a.keep},
            {"APERTURE_CHAIN", a.chain},
            {"APERTURE_STREAMS", a.twoStreams ? 2 : 1},
            {"APERTURE_ORDER_SPATIAL", a.spatialOrder},
            {"APERTURE_OPTIMAL_HOST", a.optimalOnHost},
            {"APERTURE_TIMING", a.timing},
            {"DETECTION_FRONT_UNFUSED", d.frontUnfused},
            {"DETECTION_TILE_ROWS_32", d.tileRows32},
            {"DETECTION_HOST_LABELS", d.hostLabels},
            {"DETECTION_HOST_OBJECTS", d.hostObjects},
            {"DETECTION_RECYCLE", d.recycle},
            {"DETECTION_RELEASE", d.release},
            {"DETECTION_WINDOW_ORDER_RASTER", d.rasterWindows},
            {"DETECTION_TIMING", d.timing},
            {"PSF_DEVICE", psfOnDevice},
            {"PSF_TIMING", psfTiming},
            {"RAW_UPLOAD", rawUpload},
            {"RAW_UPLOAD_WAIT", rawUploadWait},
            {"CUDA_BLOCK", cudaBlock},
            {"CFITSIO_READ", cfitsioRead},
            {"CALIBRATION_BESIDE", calibrationBeside},
            {"PINNED_RESERVE", pinnedReserveMiB},
            {"DETACHED_EXIT", detachedExit}};
}

void BackendTuning::applyToProcess() const {
    setStepTimings(detection.timing, psfTiming);
}

std::string BackendTuning::nonDefault() const {
    const nlohmann::json mine = toJson(), defaults = BackendTuning{}.toJson();
    std::string out;
    for (const auto& [key, value] : mine.items()) {
        if (defaults.at(key) == value) continue;
        if (!out.empty()) out += ' ';
        out += key + "=" + (value.is_string() ? value.get<std::string>() : value.dump());
    }
    return out;
}

} // namespace gpuphot
