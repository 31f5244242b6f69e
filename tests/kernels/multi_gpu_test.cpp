// Contexts on several GPUs of one host (RunContext::device): a context's device state lives on the GPU it
// names, whether the warm-up or the first stage creates it, and a mosaic exposure whose CCD contexts are
// spread over every visible GPU (ccdContextDevice, `reduce --ccd-gpus`) writes the bytes of one spread over
// one GPU. On a host with one GPU the spread is that GPU alone (the scaling itself: bench/gpu_scaling.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/exposure.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_mosaic.hpp"
#include "core/stages/background/background.hpp"
#include "kernels/device_context.hpp"
#include "tests/kernels/cuda_test_util.hpp"
#include "tests/mosaic_support.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;
using namespace gpuphot::cudatest;

namespace {

int visibleGpus() {
    return static_cast<int>(listCudaDevices().size());
}

std::string fileBytes(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

} // namespace

TEST(MultiGpu, ContextRunsOnTheGpuItNames) {
    REQUIRE_DEVICE();
    const SimResult sim = simulateSmall(500, 400, 200, 5);
    BackgroundParams p;
    RunContext ref = cudaContext();
    const BackgroundResult want = estimateBackground(sim.image.view(), sim.defects.view(), p, ref);
    for (int d = 0; d < visibleGpus(); ++d)
        for (bool warmUp : {false, true}) {
            RunContext g = cudaContext();
            g.device = d;
            if (warmUp) startDeviceWarmUp(g); // created on the warm-up thread
            expectSameBackground(want, estimateBackground(sim.image.view(), sim.defects.view(), p, g));
            EXPECT_EQ(cuda::DeviceContext::of(g).device(), d) << "warm-up " << warmUp;
        }
}

TEST(MultiGpu, ExposureSpreadOverEveryGpuEqualsOneGpu) {
    REQUIRE_DEVICE();
    test::TempDir dir("gpuphot_multigpu");
    const MosaicSimParams m = test::smallMosaic(384, 768, 450, 11, 60.0);
    writeSimulatedMosaic(m, dir.str(), "mos", 16);
    const ReferenceCatalog reference = readReferenceCatalog(dir / "mos.ref.fits");
    const std::string path = dir / "mos.fits";
    const std::vector<ExposureExtension> exts = exposureExtensions(path, "");
    ASSERT_EQ(exts.size(), 4u);
    const int visible = visibleGpus();
    auto reduceOver = [&](int gpus, const std::string& out) {
        ReduceOptions o;
        o.reference = &reference;
        o.output.outdir = dir / out;
        o.output.formats = {"csv"};
        std::vector<std::unique_ptr<RunContext>> owned;
        std::vector<RunContext*> contexts;
        for (std::size_t k = 0; k < exts.size(); ++k) {
            owned.push_back(std::make_unique<RunContext>(cudaContext()));
            owned.back()->device = ccdContextDevice(k, gpus, visible);
            startDeviceWarmUp(*owned.back());
            contexts.push_back(owned.back().get());
        }
        reduceExposure(path, exts, o, contexts);
        return nlohmann::json::parse(std::ifstream(dir / (out + "/mos.report.json"))).at("exposure");
    };
    const auto one = reduceOver(1, "one"), all = reduceOver(0, "all");
    EXPECT_EQ(one.at("params").at("gpus"), 1);
    EXPECT_EQ(all.at("params").at("gpus"), std::min(visible, 4));
    for (std::size_t k = 0; k < exts.size(); ++k) {
        EXPECT_EQ(one.at("extensions")[k].at("gpu"), 0) << k;
        // Which context takes which CCD is the threads' race: any of the GPUs in use.
        const int gpu = all.at("extensions")[k].at("gpu").get<int>();
        EXPECT_TRUE(gpu >= 0 && gpu < std::min(visible, 4)) << k << ": GPU " << gpu;
    }
    for (const char* file : {"mos.cat.fits", "mos.cat.csv"}) {
        const std::string a = fileBytes(dir / ("one/" + std::string(file))),
                          b = fileBytes(dir / ("all/" + std::string(file)));
        EXPECT_FALSE(a.empty()) << file;
        EXPECT_TRUE(a == b) << file << ": the spread exposure's bytes differ from one GPU's";
    }
}
