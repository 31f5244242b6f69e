#include "core/stages/detection/convolution.hpp"

#include <cmath>
#include <string>

#include "core/util/errors.hpp"

namespace gpuphot {

std::vector<float> gaussianKernel1d(double fwhm, int halfWidth) {
    if (!(fwhm > 0.0) || !std::isfinite(fwhm))
        throw InvalidInput("detection filter: FWHM must be positive and finite (got " + std::to_string(fwhm) +
                           ")");
    const int r = halfWidth > 0 ? halfWidth : std::max(1, static_cast<int>(std::ceil(fwhm)));
    const double sigma = fwhm / std::sqrt(8.0 * std::log(2.0));
    std::vector<double> k(2 * r + 1);
    double sum = 0.0;
    for (int i = -r; i <= r; ++i) {
        k[i + r] = std::exp(-0.5 * (i * i) / (sigma * sigma));
        sum += k[i + r];
    }
    std::vector<float> out(k.size());
    for (std::size_t i = 0; i < k.size(); ++i)
        out[i] = static_cast<float>(k[i] / sum);
    return out;
}

std::vector<float> normalisedKernel(std::vector<float> kernel) {
    double sum = 0.0;
    for (float v : kernel)
        sum += v;
    if (sum != 0.0)
        for (float& v : kernel)
            v = static_cast<float>(v / sum);
    return kernel;
}

std::vector<float> outerProductKernel(const std::vector<float>& k) {
    const std::size_t n = k.size();
    std::vector<float> out(n * n);
    for (std::size_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < n; ++i)
            out[j * n + i] = k[j] * k[i];
    return out;
}

void convolveSeparable(const ImageView& in, const std::vector<float>& k, Image<float>& out, int threads) {
    if (k.empty() || k.size() % 2 == 0)
        throw InvalidInput("detection filter: separable kernel length must be odd");
    const int w = in.width, h = in.height;
    const int r = static_cast<int>(k.size() / 2);
    const int n = static_cast<int>(k.size());
    Image<float> tmp(w, h, Image<float>::NoInit{});
    out = Image<float>(w, h, Image<float>::NoInit{});
    // Horizontal pass: acc = 0; acc += k[j] * in(x + j - r) for j = 0..n-1, skipping taps outside.
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int y = 0; y < h; ++y) {
        const float* src = in.row(y);
        float* dst = tmp.row(y);
        for (int x = 0; x < w; ++x) {
            float acc = 0.0f;
            const int j0 = std::max(0, r - x), j1 = std::min(n, w + r - x);
            for (int j = j0; j < j1; ++j)
                acc += k[j] * src[x + j - r];
            dst[x] = acc;
        }
    }
    // Vertical pass, same order per pixel: rows y - r .. y + r.
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int y = 0; y < h; ++y) {
        float* dst = out.row(y);
        for (int x = 0; x < w; ++x)
            dst[x] = 0.0f;
        const int j0 = std::max(0, r - y), j1 = std::min(n, h + r - y);
        for (int j = j0; j < j1; ++j) {
            const float kj = k[j];
            const float* src = tmp.row(y + j - r);
            for (int x = 0; x < w; ++x)
                dst[x] += kj * src[x];
        }
    }
}

void convolve2d(const ImageView& in, const std::vector<float>& kernel, int kw, int kh, Image<float>& out,
                int threads) {
    if (kw <= 0 || kh <= 0 || kw % 2 == 0 || kh % 2 == 0 ||
        kernel.size() != static_cast<std::size_t>(kw) * static_cast<std::size_t>(kh))
        throw InvalidInput(
            "detection filter: the supplied kernel must be odd x odd and hold width*height values (got " +
            std::to_string(kernel.size()) + " values for " + std::to_string(kw) + "x" + std::to_string(kh) +
            ")");
    const int w = in.width, h = in.height;
    const int rx = kw / 2, ry = kh / 2;
    out = Image<float>(w, h, Image<float>::NoInit{});
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int y = 0; y < h; ++y) {
        float* dst = out.row(y);
        for (int x = 0; x < w; ++x)
            dst[x] = 0.0f;
        for (int j = 0; j < kh; ++j) {
            const int yy = y + j - ry;
            if (yy < 0 || yy >= h) continue;
            const float* src = in.row(yy);
            for (int i = 0; i < kw; ++i) {
                const float kv = kernel[static_cast<std::size_t>(j) * kw + i];
                const int x0 = std::max(0, rx - i), x1 = std::min(w, w + rx - i);
                for (int x = x0; x < x1; ++x)
                    dst[x] += kv * src[x + i - rx];
            }
        }
    }
}

} // namespace gpuphot
