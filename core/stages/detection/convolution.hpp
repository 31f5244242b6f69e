#pragma once
// Matched filter for detection (SExtractor FILTER / FILTER_NAME): a sampled Gaussian computed once on
// the host, applied as a separable convolution, or a supplied 2-D kernel applied directly.
// Deterministic: every output pixel is the sum of its taps in a fixed order (kernel row-major, left to
// right), in float, one multiply then one add per tap (the build uses -ffp-contract=off), so a CUDA
// kernel that keeps this order reproduces the numbers bit for bit. Pixels outside the image count as 0;
// the caller zeroes masked / non-finite pixels beforehand.
#include <vector>

#include "core/model/image.hpp"

namespace gpuphot {

// Sampled Gaussian exp(-x^2 / (2 sigma^2)), sigma = fwhm / sqrt(8 ln 2), over [-r, r] with
// r = halfWidth, or ceil(fwhm) (at least 1) when halfWidth <= 0 (FWHM 3 -> 7 taps, as SExtractor's
// gauss_3.0_7x7.conv), normalised to a sum of 1. Throws InvalidInput for fwhm <= 0 or non-finite.
std::vector<float> gaussianKernel1d(double fwhm, int halfWidth = 0);

// A supplied kernel (FILTER_NAME) scaled to a sum of 1: the sum in double, each tap divided by it and
// rounded to float; a kernel that sums to 0 is kept as given. The taps both engines filter with.
std::vector<float> normalisedKernel(std::vector<float> kernel);

// The normalised 2-D kernel equal to the outer product of kernel1d with itself (row-major, n x n).
std::vector<float> outerProductKernel(const std::vector<float>& kernel1d);

// out = in convolved with kernel1d along x, then along y (odd kernel length). out is (re)allocated.
void convolveSeparable(const ImageView& in, const std::vector<float>& kernel1d, Image<float>& out,
                       int threads);

// out = in convolved with a kernelWidth x kernelHeight kernel (row-major, odd sizes, centred).
// Throws InvalidInput when the sizes do not match the kernel or are even.
void convolve2d(const ImageView& in, const std::vector<float>& kernel, int kernelWidth, int kernelHeight,
                Image<float>& out, int threads);

} // namespace gpuphot
