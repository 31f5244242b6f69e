#pragma once
// The CUDA backend's stage implementations. Core knows nothing of CUDA: gpuphot_kernels fills this table
// when it is linked in (kernels/register.cu), and the public stage functions (estimateBackground,
// detectSources, buildPsfModel, measureApertures, crossmatch) dispatch to an entry when the RunContext's
// backend is Cuda and the entry is set, else to the cpu:: implementation declared beside them. Every entry
// has the exact signature of its cpu:: counterpart and must give the same answer (docs/ARCHITECTURE.md,
// Determinism); tests/kernels compares them.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/model/image.hpp"

namespace gpuphot {

class RunContext;
class RawChunkSink;
class SegmentationMap;
class Wcs;
struct Sources;
struct ReferenceCatalog;
struct BackgroundParams;
struct BackgroundResult;
struct DetectionParams;
struct DetectionResult;
struct PsfParams;
struct PsfResult;
struct ApertureParams;
struct ApertureResult;
struct CrossmatchParams;
struct CrossmatchResult;
struct Instrument;
struct CosmicRayParams;
struct CosmicRayResult;
struct SaltPepperParams;
struct SaltPepperResult;
struct CfaLayout;
enum class CfaOutput;

// The per-pixel calibration of prepareFrame (core/stages/prepare/prepare.cpp, step 4-5), views already aligned
// with the (trimmed) frame; empty views are not applied. Every output pixel is
//   v = p - bias; v = float(v - darkScale * dark); v /= flat when flat is finite and > minFlat,
// and MaskBad is set where a master mask, the bad-pixel mask or the flat guard says so.
struct PrepareCalibration {
    ImageView bias, dark, flat;
    MaskView biasMask, darkMask, flatMask, badPixels;
    double darkScale = 0.0;
    float minFlat = 0.05f;
    // The result may stay on the device as the frame cache for the following stages (false when a later
    // prepare step changes the frame in place, e.g. salt-and-pepper or cosmic rays).
    bool keepOnDevice = true;
};

// Steps 1-5 of prepareFrame on the device, the frame as read (untrimmed): bleed trails and
// saturation growth along the columns (maskBleedTrails), overscan subtraction (the levels computed on the
// host from BIASSEC), trim to the output section, then PrepareCalibration (views aligned with the output).
// The frame is taken from the device frame cache when it is resident there (else uploaded); the result is
// the new frame cache (keepOnDevice) and its host copy is downloaded into the Frame's pixels and mask.
struct PrepareDeviceJob {
    bool bleed = false;            // maskBleedTrails(pixels, mask, saturation, fraction, grow)
    float bleedLevel = 0.0f;       // float(fraction * saturation)
    int bleedGrow = 0;
    bool overscan = false;
    std::vector<double> overscanRows; // per raw row: the value subtracted, float(p - level) (overscan only)
    int outX0 = 0, outY0 = 0, outWidth = 0, outHeight = 0; // the kept section (the whole frame untrimmed)
    bool calibrate = false;        // apply `cal`
    PrepareCalibration cal;        // cal.keepOnDevice: the result stays as the frame cache
};
struct PrepareDeviceResult {
    bool done = false;             // false: the device had no room (plan "cpu" noted); nothing changed
    std::size_t bleedPixels = 0;   // as maskBleedTrails
    std::size_t badPixels = 0;     // as the calibration loop
};

struct CudaStageTable {
    BackgroundResult (*background)(const ImageView& image, const MaskView& mask, const BackgroundParams& params,
                                   RunContext& ctx, const ImageViewT<std::int32_t>* sourceMask) = nullptr;
    DetectionResult (*detection)(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                 const DetectionParams& params, RunContext& ctx) = nullptr;
    PsfResult (*psf)(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                     const Sources& sources, double gain, const PsfParams& params, RunContext& ctx) = nullptr;
    ApertureResult (*aperture)(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                               const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                               double fwhm, double gain, double readNoise, const ApertureParams& params,
                               RunContext& ctx) = nullptr;
    // The same with the detection's shared map (a deferred map's device copy is read where it lies).
    ApertureResult (*apertureMap)(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                  const SegmentationMap& segmentation, const Sources& sources, double fwhm,
                                  double gain, double readNoise, const ApertureParams& params,
                                  RunContext& ctx) = nullptr;
    CrossmatchResult (*crossmatch)(const std::vector<double>& x, const std::vector<double>& y, int width,
                                   int height, const ReferenceCatalog& ref, const Wcs& wcs,
                                   const CrossmatchParams& params, RunContext& ctx) = nullptr;
    // prepareFrame's per-pixel calibration on pixels/mask in place (same size); returns the pixels newly
    // set MaskBad. The CPU version is the loop in prepareFrame.
    std::size_t (*prepare)(Image<float>& pixels, Image<std::uint8_t>& mask, const PrepareCalibration& cal,
                           RunContext& ctx) = nullptr;
    // Steps 1-5 of prepareFrame in one device pass (PrepareDeviceJob); pixels and mask are replaced by
    // the prepared (trimmed) frame when done.
    PrepareDeviceResult (*prepareFrame)(Image<float>& pixels, Image<std::uint8_t>& mask,
                                        const PrepareDeviceJob& job, RunContext& ctx) = nullptr;
    // Frame preparation steps 6-8, each with the signature of its CPU function, which
    // dispatches to the entry after checking its inputs: L.A.Cosmic and the salt-and-pepper prefilter
    // (core/stages/prepare/cosmic_rays.cpp) and the CFA super-pixel image (core/stages/prepare/bayer.cpp).
    CosmicRayResult (*cosmicRays)(const ImageView& pixels, const MaskView& mask, const Instrument& instrument,
                                  const CosmicRayParams& params, RunContext& ctx) = nullptr;
    SaltPepperResult (*saltPepper)(const ImageView& pixels, const MaskView& mask,
                                   const SaltPepperParams& params, RunContext& ctx) = nullptr;
    Image<float> (*cfaSuperPixels)(const ImageView& pixels, const CfaLayout& layout, CfaOutput output,
                                   bool luminanceMean, RunContext& ctx) = nullptr;
    // A new device state for RunContext::deviceState on `device` (any thread; gpuMemLimit and device as
    // RunContext's; device -1: the calling thread's current device).
    std::shared_ptr<void> (*createDeviceState)(std::size_t gpuMemLimit, int device) = nullptr;
    // Makes `device` the calling thread's current device (CUDA's cudaSetDevice), so that what the thread
    // creates without a RunContext (the raw upload of its next read) lives there. Never throws.
    void (*useDevice)(int device) = nullptr;
    // Raw upload at read time (kernels/frame_upload.hpp): a sink for readFrame that uploads the
    // raw chunks as they are read and converts them on the device (any thread, no RunContext: the read
    // phase may run beside another frame's stages); and the hand-over of a finished one to ctx's frame cache
    // as the values of these host views (the mask too when withMask), true when adopted.
    std::shared_ptr<RawChunkSink> (*createRawUpload)() = nullptr;
    bool (*adoptRawUpload)(RawChunkSink& upload, const ImageView& pixels, const MaskView& mask, bool withMask,
                           RunContext& ctx) = nullptr;
    // After the host changed the adopted frame in place: drops what changed from the frame cache while it
    // still holds the adopted frame (see settleRawUpload).
    void (*settleRawUpload)(bool pixelsChanged, bool maskChanged, RunContext& ctx) = nullptr;
    // The raw upload's buffers (pinned reader buffers), allocated by the warm-up thread after it has
    // created the device state, so that the first uploaded read does not wait for cudaHostAlloc; the
    // kernels skip it when a read already began (kernels/frame_upload.hpp, warmUpRawUpload). Never throws.
    void (*prepareRawUpload)(std::size_t gpuMemLimit) = nullptr;
    // Pins host memory ahead of the first frame's stages (kernels/pinned_reserve.hpp), by the warm-up thread
    // after the raw upload's buffers: `mib` MiB, or (mib < 0) as much as the frame being read needs; once per
    // process. Never throws.
    void (*reservePinned)(int mib) = nullptr;
};

// Called once by the kernels library (static initialisation); later calls replace entries that are set.
void registerCudaStages(const CudaStageTable& table);

// With the CUDA backend, starts creating ctx's device state (CUDA context, stream, memory pool: ~0.3 s)
// on another thread, so that it overlaps the read of the first frame; the first stage that needs the
// device waits for it and rethrows its error. Once the state is handed over, the same thread prepares the
// raw upload's buffers (CudaStageTable::prepareRawUpload, when the raw upload is enabled) and, once the
// first frame is prepared (noteFramePrepared), the pinned reserve (CudaStageTable::reservePinned,
// BackendTuning::pinnedReserveMiB) off the first frame's critical path; the process joins it at exit. No-op
// for the CPU backend, without the kernels, or when the state exists. Call before the context is shared with
// other threads.
void startDeviceWarmUp(RunContext& ctx);
// The first frame is prepared on the device: the warm-up may pin its reserve now (CudaStageTable::
// reservePinned), beside the background and detection rather than the preparation's copies.
void noteFramePrepared();
// Makes ctx's GPU (RunContext::device, when set) the calling thread's current device, so that the raw
// upload of the thread's next read lives where ctx's stages run. No-op for the CPU backend.
void useContextDevice(const RunContext& ctx);
const CudaStageTable& cudaStages();

// ---- raw upload at read time -------------------------------------------------------------------------
// The read phase (readFramePhase) uploads an uncompressed frame's raw bytes chunk by chunk as it reads them
// and converts them on the device, so that the first CUDA stage finds the frame there. Armed by
// startDeviceWarmUp for a CUDA context when its tuning has rawUpload (the default; off for A/B
// benchmarks), or by armRawUpload; never without the kernels.
void armRawUpload(bool on);
bool rawUploadEnabled();
// The read returns only once the device has the frame (tuning rawUploadWait; comparisons).
void setRawUploadWait(bool wait);
bool rawUploadWaits();
// A sink for readFrame(path, options, sink) when enabled, else null.
std::shared_ptr<RawChunkSink> createRawUpload();
// Gives a finished upload (from createRawUpload, after readFrame) to ctx's device frame cache as the
// values of these host views (the frame readFrame filled): the pixels, and the mask when withMask (the host
// mask was not changed since the read). CUDA backend only; true when adopted. `upload` is reset either way.
bool adoptRawUpload(std::shared_ptr<RawChunkSink>& upload, const ImageView& pixels, const MaskView& mask,
                    bool withMask, RunContext& ctx);
// computeFramePhase adopts the upload before preparation, whose device path (cudaStages().prepareFrame)
// takes the frame from the cache. When preparation changed the host frame in place instead (host steps),
// this drops the stale part (pixels: the whole frame; mask: the mask) from the cache, unless something
// replaced the adopted frame there since (the device preparation's result): the next stage uploads it.
void settleRawUpload(RunContext& ctx, bool pixelsChanged, bool maskChanged);

} // namespace gpuphot
