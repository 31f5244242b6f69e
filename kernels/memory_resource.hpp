#pragma once
// The device memory policy of a DeviceContext (docs/ARCHITECTURE.md, GPU memory model), in the manner of
// RMM's device_memory_resource: one interface, a resource that owns the memory and adaptors layered on it,
// each with one job. A DeviceContext allocates through
//   CountingAdaptor -> BudgetAdaptor -> PoolResource
// (allocation count and injected failures; budget ledger and high-water mark; the stream-ordered pool).
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda_check.hpp"

namespace gpuphot {

// An allocation would exceed RunContext::gpuMemLimit, or the device itself is out of memory.
class DeviceOutOfMemory : public CudaError {
public:
    using CudaError::CudaError;
};

namespace cuda {

struct DeviceLedger; // per device: the live budgets and the memory held outside them (memory_resource.cu)

// Stream-ordered device memory. allocate takes bytes > 0 and either returns memory or throws
// (DeviceOutOfMemory when there is no room, CudaError otherwise) with nothing allocated or counted;
// release takes what allocate returned, with the same size.
class DeviceMemoryResource {
public:
    virtual ~DeviceMemoryResource() = default;
    virtual void* allocate(std::size_t bytes) = 0;
    virtual void release(void* p, std::size_t bytes) noexcept = 0;
};

// A stream-ordered memory pool of pinned device memory on `device` (no IPC handles) that keeps up to
// releaseThreshold bytes of freed memory for reuse (~0: all of it) instead of returning it to the driver
// at the next synchronisation. The DeviceContext's pool and the raw upload's (kernels/frame_upload.cu).
cudaMemPool_t createDevicePool(int device, std::uint64_t releaseThreshold);

// Allocation from a pool of its own on `stream` (cudaMallocFromPoolAsync, cudaFreeAsync). The pool keeps
// all freed memory, so that later stages and runs reuse it without going back to the driver; it is
// destroyed with the resource (the caller synchronises the stream first).
class PoolResource final : public DeviceMemoryResource {
public:
    PoolResource(int device, cudaStream_t stream);
    ~PoolResource() override;
    PoolResource(const PoolResource&) = delete;
    PoolResource& operator=(const PoolResource&) = delete;
    // Throws DeviceOutOfMemory when the device has no memory left.
    void* allocate(std::size_t bytes) override;
    void release(void* p, std::size_t bytes) noexcept override;

private:
    cudaMemPool_t m_pool = nullptr;
    cudaStream_t m_stream = nullptr;
};

// The budget ledger: counts what is allocated through it (inUse) against a budget, together with the device
// memory of its device held outside any context (reserveOutside, below), and keeps the peak of (in use +
// held outside) as the high-water mark. Every BudgetAdaptor registers with its device's ledger, so that a
// reservation outside fits every live budget. The budget and the count are written under the ledger's
// lock (reserveOutside reads them on another thread); the owning thread reads them freely.
class BudgetAdaptor final : public DeviceMemoryResource {
public:
    BudgetAdaptor(DeviceMemoryResource& upstream, int device, std::size_t budget, bool explicitBudget);
    ~BudgetAdaptor() override;
    BudgetAdaptor(const BudgetAdaptor&) = delete;
    BudgetAdaptor& operator=(const BudgetAdaptor&) = delete;
    // Throws DeviceOutOfMemory over budget; counted first, so that a concurrent reserveOutside sees it.
    void* allocate(std::size_t bytes) override;
    void release(void* p, std::size_t bytes) noexcept override;
    // Leaves the device's ledger: reservations outside no longer check this budget (the context is ending).
    void detach() noexcept;

    // Counts memory allocated elsewhere (DeviceContext::takeOver); false, nothing counted, over budget.
    bool takeOver(std::size_t bytes);
    // takeOver of memory reserved with reserveOutside: the reservation becomes this budget's.
    bool takeOverOutside(std::size_t bytes);
    // Bytes the budget still allows (0 when over it), less what is held outside any context.
    std::size_t available() const;
    std::size_t inUse() const { return m_inUse; }
    std::size_t budget() const { return m_budget; }
    bool explicitBudget() const { return m_explicitBudget; }
    void setBudget(std::size_t bytes, bool explicitBudget);
    std::size_t highWater() const { return m_highWater; }
    void resetHighWater(); // to what is counted now

private:
    friend bool reserveOutside(int device, std::size_t bytes);
    friend bool explicitBudgetOn(int device);
    DeviceMemoryResource& m_upstream;
    DeviceLedger& m_ledger;
    bool m_attached = false; // registered with m_ledger (until detach)
    std::size_t m_budget = 0;
    std::size_t m_inUse = 0;
    std::atomic<std::size_t> m_highWater{0};
    bool m_explicitBudget = false;
};

// Allocation statistics and fault injection for tests: counts the allocations and, when armed, fails the
// n-th from then on once (DeviceOutOfMemory, before the layers below see it).
class CountingAdaptor final : public DeviceMemoryResource {
public:
    explicit CountingAdaptor(DeviceMemoryResource& upstream) : m_upstream(upstream) {}
    void* allocate(std::size_t bytes) override;
    void release(void* p, std::size_t bytes) noexcept override { m_upstream.release(p, bytes); }
    // n >= 1: the n-th allocation from now throws; 0 disarms.
    void setFailAfter(std::size_t n) { m_failAfter = n; }
    std::size_t failAfter() const { return m_failAfter; }
    // Allocations requested so far, the injected failure included.
    std::size_t allocations() const { return m_allocations; }

private:
    DeviceMemoryResource& m_upstream;
    std::size_t m_failAfter = 0;
    std::size_t m_allocations = 0;
};

// ---- device memory outside the contexts' budgets (the read phase's raw upload, kernels/frame_upload.hpp)
// The raw upload allocates from its own pool, with no RunContext (the read may run beside another frame's
// stages), memory that belongs to the frame cache the stages plan with: the device frame until a context
// adopts it (DeviceContext::takeOverOutside) and the reader slots during the read. It reserves that memory
// first: reserveOutside succeeds only when every live budget on the device still fits with it (in use +
// everything held outside + bytes <= budget), and every budget counts what is held outside in its
// allocations, available() and high-water mark, so that a context's stages plus the upload in flight stay
// within --gpu-mem-limit. false: nothing reserved (the read keeps the host path).
bool reserveOutside(int device, std::size_t bytes);
void releaseOutside(int device, std::size_t bytes) noexcept;
std::size_t heldOutside(int device);
// Some live budget on the device is explicit (--gpu-mem-limit, setBudget).
bool explicitBudgetOn(int device);

} // namespace cuda
} // namespace gpuphot
