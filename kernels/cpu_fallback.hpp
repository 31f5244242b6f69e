#pragma once
// The CPU fallback of the CUDA implementations that are reached through their CPU function's dispatch
// (the preparation steps of kernels/prepare/cosmic_rays.cu and kernels/prepare/bayer.cu): when the device has no room
// (DeviceOutOfMemory), the stage notes the "cpu" plan and calls its public function again with the
// context's backend set to CPU for the call, i.e. the CPU implementation.
#include <string>
#include <utility>

#include "core/pipeline/run_context.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {

template <class Device, class Cpu>
auto withCpuFallback(RunContext& ctx, const char* stage, Device&& onDevice, Cpu&& onCpu) {
    try {
        return onDevice();
    } catch (const DeviceOutOfMemory& e) {
        DeviceContext& dc = DeviceContext::of(ctx);
        dc.drain();
        dc.dropFrame();
        dc.notePlan("cpu", 0, cpuFallbackNote(stage, dc.budget(), e.what()));
        struct Restore {
            RunContext& c;
            Backend b;
            ~Restore() { c.backend = b; }
        } restore{ctx, ctx.backend};
        ctx.backend = Backend::Cpu;
        return onCpu();
    }
}

} // namespace gpuphot::cuda
