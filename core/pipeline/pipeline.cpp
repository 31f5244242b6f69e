#include "core/pipeline/pipeline.hpp"

#include <algorithm>
#include <cmath>

#include "core/model/frame.hpp"
#include "core/pipeline/run_context.hpp"

namespace gpuphot {

const char* stageName(Stage s) {
    switch (s) {
    case Stage::Background: return "background";
    case Stage::Detection: return "detection";
    case Stage::Psf: return "psf";
    case Stage::Aperture: return "aperture";
    case Stage::Done: return "done";
    }
    return "?";
}

namespace {

// Stage inputs that come from the frame rather than from the user's parameters.
DetectionParams detectionParamsFor(const Frame& frame, DetectionParams p) {
    p.gain = frame.instrument.gain;
    if (std::isfinite(frame.instrument.saturation)) p.saturationLevel = frame.instrument.saturation;
    return p;
}

PsfParams psfParamsFor(const Frame& frame, PsfParams p) {
    if (std::isfinite(frame.instrument.saturation)) p.saturation = frame.instrument.saturation;
    return p;
}

ApertureParams apertureParamsFor(const Frame& frame, ApertureParams p) {
    if (std::isfinite(frame.instrument.saturation)) p.saturation = frame.instrument.saturation;
    return p;
}

// Object mask for the second background pass: the segmentation grown by `dilate` pixels (square).
Image<std::int32_t> dilatedObjectMask(const Image<std::int32_t>& seg, int dilate) {
    const int w = seg.width(), h = seg.height();
    Image<std::int32_t> rows(w, h, 0), out(w, h, 0);
#pragma omp parallel for schedule(static)
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            int v = 0;
            for (int dx = std::max(0, x - dilate); dx <= std::min(w - 1, x + dilate) && !v; ++dx) v = seg(dx, y) != 0;
            rows(x, y) = v;
        }
#pragma omp parallel for schedule(static)
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            int v = 0;
            for (int dy = std::max(0, y - dilate); dy <= std::min(h - 1, y + dilate) && !v; ++dy) v = rows(x, dy);
            out(x, y) = v;
        }
    return out;
}

} // namespace

void runPipeline(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& r,
                 Stage first) {
    if (static_cast<int>(first) > static_cast<int>(r.completed)) first = r.completed;
    const ImageView image = frame.view();
    const MaskView mask = frame.maskView();

    if (first <= Stage::Background) {
        r.warnings.clear();
        ctx.checkCancelled();
        auto t = ctx.time("background");
        r.background = estimateBackground(image, mask, config.background, ctx);
        r.completed = Stage::Detection;
    }
    if (first <= Stage::Detection) {
        ctx.checkCancelled();
        const DetectionParams dp = detectionParamsFor(frame, config.detection);
        {
            auto t = ctx.time("detection");
            r.detection = detectSources(image, mask, r.background, dp, ctx);
        }
        if (config.backgroundSecondPass) {
            ctx.checkCancelled();
            {
                auto t = ctx.time("background (second pass)");
                const Image<std::int32_t> objects = dilatedObjectMask(r.detection.segmentation, config.secondPassDilate);
                const ImageViewT<std::int32_t> objectView = objects.view();
                r.background = estimateBackground(image, mask, config.background, ctx, &objectView);
            }
            auto t = ctx.time("detection (second pass)");
            r.detection = detectSources(image, mask, r.background, dp, ctx);
        }
        if (r.detection.sources.size() == 0)
            r.warnings.push_back("no sources detected above the threshold: the catalog is empty");
        r.completed = Stage::Psf;
    }
    if (first <= Stage::Psf) {
        ctx.checkCancelled();
        auto t = ctx.time("psf");
        r.psf = buildPsfModel(image, mask, r.background, r.detection.sources, frame.instrument.gain,
                              psfParamsFor(frame, config.psf), ctx);
        if (r.psf.hasModel() && r.psf.medianFwhm > 0) {
            r.fwhm = r.psf.medianFwhm;
            r.fwhmSource = "psf";
        } else {
            r.fwhm = config.defaultFwhm;
            r.fwhmSource = "default";
            if (r.detection.sources.size() > 0)
                r.warnings.push_back("no PSF model (too few suitable stars): apertures scaled with the default FWHM");
        }
        r.completed = Stage::Aperture;
    }
    if (first <= Stage::Aperture) {
        ctx.checkCancelled();
        auto t = ctx.time("aperture");
        r.aperture = measureApertures(image, mask, r.background, r.detection.segmentation.view(), r.detection.sources,
                                      r.fwhm, frame.instrument.gain, frame.instrument.readNoise,
                                      apertureParamsFor(frame, config.aperture), ctx);
        if (config.apertureToTotal && r.psf.hasModel() && r.aperture.apCorrRefRadius > 0.0 &&
            !r.aperture.apCorrRatio.empty()) {
            const double R = r.aperture.apCorrRefRadius;
            double fraction = r.psf.encircledEnergy(R);
            const double a1 = r.aperture.skyAnnulusInner, a2 = r.aperture.skyAnnulusOuter;
            if (a2 > a1) // wing light in the annulus raises the local sky and is subtracted over the aperture
                fraction -= R * R / (a2 * a2 - a1 * a1) * (r.psf.encircledEnergy(a2) - r.psf.encircledEnergy(a1));
            if (fraction > 0.5 && fraction <= 1.0) extendApertureCorrectionToTotal(r.aperture, fraction);
            else r.warnings.push_back("PSF model gives an implausible reference-aperture fraction: "
                                      "aperture corrections stop at the reference radius");
        }
        r.completed = Stage::Done;
    }
}

PipelineResult runPipeline(const Frame& frame, const PipelineConfig& config, RunContext& ctx) {
    PipelineResult r;
    runPipeline(frame, config, ctx, r, Stage::Background);
    return r;
}

Stage firstAffectedStage(const PipelineConfig& a, const PipelineConfig& b) {
    const nlohmann::json ja = a, jb = b;
    if (ja.at("keywords") != jb.at("keywords") || ja.at("instrument") != jb.at("instrument") ||
        ja.at("background") != jb.at("background") || ja.at("backgroundSecondPass") != jb.at("backgroundSecondPass") ||
        ja.at("secondPassDilate") != jb.at("secondPassDilate"))
        return Stage::Background;
    if (ja.at("detection") != jb.at("detection")) return Stage::Detection;
    if (ja.at("psf") != jb.at("psf") || ja.at("defaultFwhm") != jb.at("defaultFwhm")) return Stage::Psf;
    if (ja.at("aperture") != jb.at("aperture") || ja.at("apertureToTotal") != jb.at("apertureToTotal"))
        return Stage::Aperture;
    return Stage::Done;
}

} // namespace gpuphot
