// The background RMS from an external weight map (background.hpp, applyWeightVariance).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/util/errors.hpp"
#include "core/util/robust_stats.hpp"

namespace gpuphot {

namespace {

// The rescale factor: the median over meshes of the background's mesh RMS over the square root of the mean
// usable variance of the mesh (what the RMS of a mesh of pixels of those variances is), positive ratios
// only; 1 when there is none. SExtractor takes its mode estimator of the variance instead, which picks one
// of the levels of a mesh whose variance is not uniform.
double weightScaleOf(const BackgroundResult& bkg, const Image<float>& variance, const MaskView& mask) {
    const int mw = bkg.meshWidth, mh = bkg.meshHeight, nx = bkg.meshRms.width(), ny = bkg.meshRms.height();
    std::vector<double> ratio;
    for (int my = 0; my < ny; ++my)
        for (int mx = 0; mx < nx; ++mx) {
            double sum = 0.0;
            std::size_t n = 0;
            for (int y = my * mh; y < std::min(bkg.height, (my + 1) * mh); ++y) {
                const float* v = variance.row(y);
                const std::uint8_t* m = mask.empty() ? nullptr : mask.row(y);
                for (int x = mx * mw; x < std::min(bkg.width, (mx + 1) * mw); ++x)
                    if (std::isfinite(v[x]) && !(m && m[x])) {
                        sum += v[x];
                        ++n;
                    }
            }
            const double s = bkg.meshRms(mx, my);
            if (n > 0 && sum > 0.0 && s > 0.0) ratio.push_back(s / std::sqrt(sum / static_cast<double>(n)));
        }
    return ratio.empty() ? 1.0 : robustMedian(std::move(ratio));
}

} // namespace

void applyWeightVariance(BackgroundResult& bkg, const Image<float>& variance, bool rescale,
                         const MaskView& mask, RunContext& ctx) {
    if (variance.width() != bkg.width || variance.height() != bkg.height)
        throw InvalidInput("weight map: its variance is " + std::to_string(variance.width()) + "x" +
                           std::to_string(variance.height()) + " px, the background " +
                           std::to_string(bkg.width) + "x" + std::to_string(bkg.height));
    const double scale = rescale ? weightScaleOf(bkg, variance, mask) : 1.0;
    if (!bkg.hasFullMaps()) materializeBackgroundMaps(bkg, ctx);
    bkg.sampler.reset();
    for (int y = 0; y < bkg.height; ++y) {
        const float* v = variance.row(y);
        float* r = bkg.rms.row(y);
        for (int x = 0; x < bkg.width; ++x)
            if (std::isfinite(v[x])) r[x] = static_cast<float>(scale * std::sqrt(static_cast<double>(v[x])));
    }
    bkg.weightScale = scale;
    ctx.checkCancelled();
}

} // namespace gpuphot
