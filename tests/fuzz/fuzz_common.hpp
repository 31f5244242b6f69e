#pragma once
// Shared by the libFuzzer targets: the input as a scratch file (the readers take paths), and the rule
// that only gpuphot's typed errors are an acceptable way to refuse an input. Anything else (a crash, a
// sanitizer report, std::out_of_range from a stray stoi, an untyped exception) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#include "core/io/fits_image.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::fuzz {

// A per-process scratch file in /dev/shm (else /tmp) with the given suffix, rewritten for every input.
inline std::string writeScratch(const std::uint8_t* data, std::size_t size, const char* suffix) {
    static const std::string base = [] {
        const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        return std::string(dir) + "/gpuphot_fuzz_" + std::to_string(::getpid());
    }();
    const std::string path = base + suffix;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) std::abort();
    if (size && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
    return path;
}

// Runs fn; gpuphot::Error is the documented refusal, everything else propagates (libFuzzer reports an
// uncaught exception as a crash).
template <class Fn> void expectTypedErrorsOnly(Fn&& fn) {
    try {
        fn();
    } catch (const gpuphot::Error&) {
    }
}

// readFrame under expectTypedErrorsOnly, then a read of the last pixel and mask byte, so that a buffer
// shorter than the frame says it is would be reported by ASan.
inline void readFrameAndTouch(const std::string& path) {
    expectTypedErrorsOnly([&] {
        const Frame f = readFrame(path);
        volatile float sink = 0.0f;
        if (!f.pixels.empty()) sink = f.pixels.data()[f.pixels.pixelCount() - 1];
        if (!f.mask.empty()) sink = sink + static_cast<float>(f.mask.data()[f.mask.pixelCount() - 1]);
        (void)sink;
    });
}

} // namespace gpuphot::fuzz
