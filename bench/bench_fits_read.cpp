// bench_fits_read [WIDTHxHEIGHT] [REPEATS] [DIR]
// Times readFrame on a float32 and an unsigned 16-bit frame (written into DIR when absent; default
// 14208x10656 = 151.4 MP, 3 repeats, $TMPDIR/gpuphot_bench_fits) and prints the best time, the
// throughput and the peak resident memory of the reads, next to what the Frame itself needs (float32
// pixels + uint8 mask): a peak close to that shows the pixels are read without a second full copy.
// The files are written by a child process so that the writer's memory does not count; reads are
// warm (the files are in the page cache after writing).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "core/io/fits_image.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

void writeFrameIfAbsent(const std::string& path, int w, int h, int bitpix) {
    if (fs::exists(path)) return;
    std::printf("writing %s ...\n", path.c_str());
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        std::perror("fork");
        std::exit(1);
    }
    if (pid == 0) {
        try {
            Image<float> img(w, h, Image<float>::NoInit{});
            for (int y = 0; y < h; ++y) {
                float* r = img.row(y);
                for (int x = 0; x < w; ++x)
                    r[x] = 1000.0f + static_cast<float>((x * 7 + y * 13) % 500) + (bitpix < 0 ? 0.25f : 0.0f);
            }
            Header hd;
            hd.set("GAIN", 1.5);
            hd.set("SATURATE", 60000.0);
            writeFitsImage(path, img.view(), hd, bitpix);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "%s\n", e.what());
            _exit(1);
        }
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "writing %s failed\n", path.c_str());
        std::exit(1);
    }
}

// Resets VmHWM (Linux: writing 5 to clear_refs), so each file's reads get their own peak.
bool resetPeak() {
    std::ofstream f("/proc/self/clear_refs");
    f << "5";
    f.flush();
    return static_cast<bool>(f);
}

void bench(const std::string& label, const std::string& path, int repeats) {
    const double mb = 1024.0 * 1024.0;
    const bool reset = resetPeak();
    const std::size_t before = currentResidentBytes();
    double best = 1e30;
    int w = 0, h = 0;
    for (int i = 0; i < repeats; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        Frame fr = readFrame(path);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, s);
        w = fr.width();
        h = fr.height();
    }
    const double px = static_cast<double>(w) * h;
    const double fileBytes = static_cast<double>(fs::file_size(path));
    const double frameBytes = px * (sizeof(float) + 1);
    const std::size_t peak = peakResidentBytes();
    std::printf("%-8s %dx%d (%.1f MP, file %.0f MB): best of %d %.3f s = %.0f MB/s of file, %.0f Mpx/s\n",
                label.c_str(), w, h, px / 1e6, fileBytes / mb, repeats, best, fileBytes / mb / best,
                px / 1e6 / best);
    std::printf("         peak RSS %.0f MB%s (before %.0f MB); Frame pixels+mask %.0f MB; peak - before - "
                "Frame = %.0f MB\n",
                peak / mb, reset ? "" : " (process peak, not reset)", before / mb, frameBytes / mb,
                (static_cast<double>(peak) - before - frameBytes) / mb);
}

} // namespace

int main(int argc, char** argv) {
    int w = 14208, h = 10656, repeats = 3;
    std::string dir = (fs::temp_directory_path() / "gpuphot_bench_fits").string();
    if (argc > 1 && std::sscanf(argv[1], "%dx%d", &w, &h) != 2) {
        std::fprintf(stderr, "usage: %s [WIDTHxHEIGHT] [REPEATS] [DIR]\n", argv[0]);
        return 2;
    }
    if (argc > 2) repeats = std::max(1, std::atoi(argv[2]));
    if (argc > 3) dir = argv[3];
    fs::create_directories(dir);
    const std::string size = std::to_string(w) + "x" + std::to_string(h);
    const std::string f32 = dir + "/f32_" + size + ".fits", u16 = dir + "/u16_" + size + ".fits";
    writeFrameIfAbsent(f32, w, h, -32);
    writeFrameIfAbsent(u16, w, h, kBitpixUInt16);
    try {
        bench("float32", f32, repeats);
        bench("uint16", u16, repeats);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}
