// The DeviceContext's pieces on their own: the memory resource's adaptors over a host stand-in for the pool
// (budget ledger, high-water mark, memory reserved outside, allocation count, injected failure), the typed
// scratch store, GrowingPinned's growth rule, the pinned reserve, and a stage scratch that holds device
// memory, released with the context before its frame cache.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "core/model/image.hpp"
#include "kernels/device_context.hpp"
#include "kernels/memory_resource.hpp"
#include "kernels/pinned_buffer.hpp"
#include "kernels/pinned_reserve.hpp"
#include "kernels/scratch_store.hpp"
#include "tests/kernels/cuda_test_util.hpp"

using namespace gpuphot;

namespace {

// The pool's stand-in: host memory, or DeviceOutOfMemory as the pool throws it when the device is full.
class HostResource final : public cuda::DeviceMemoryResource {
public:
    bool full = false;
    std::size_t held = 0;
    void* allocate(std::size_t bytes) override {
        if (full)
            throw DeviceOutOfMemory("CUDA backend: the device is out of memory allocating " +
                                    std::to_string(bytes) + " bytes");
        held += bytes;
        return ::operator new(bytes);
    }
    void release(void* p, std::size_t bytes) noexcept override {
        held -= bytes;
        ::operator delete(p);
    }
};

// Ledgers no device has (the ledger is per device id and lives for the process).
constexpr int kLedgerBudget = -101;
constexpr int kLedgerOutside = -102;
constexpr int kLedgerPool = -103;

} // namespace

TEST(MemoryResource, BudgetAdaptorCountsAndKeepsTheHighWaterMark) {
    HostResource host;
    cuda::BudgetAdaptor budget(host, kLedgerBudget, 1000, true);
    void* a = budget.allocate(600);
    EXPECT_EQ(budget.inUse(), 600u);
    EXPECT_EQ(budget.available(), 400u);
    EXPECT_THROW(budget.allocate(500), DeviceOutOfMemory);
    EXPECT_EQ(budget.inUse(), 600u); // the refused allocation is not counted
    EXPECT_EQ(host.held, 600u);      // nor asked of the pool
    budget.release(a, 600);
    EXPECT_EQ(budget.inUse(), 0u);
    EXPECT_EQ(budget.highWater(), 600u);
    budget.resetHighWater();
    EXPECT_EQ(budget.highWater(), 0u);
    EXPECT_TRUE(budget.takeOver(900));
    EXPECT_FALSE(budget.takeOver(200));
    EXPECT_EQ(budget.inUse(), 900u);
}

TEST(MemoryResource, BudgetAdaptorUncountsWhatThePoolRefuses) {
    HostResource host;
    cuda::BudgetAdaptor budget(host, kLedgerPool, 1000, false);
    host.full = true;
    try {
        budget.allocate(100);
        FAIL() << "no error";
    } catch (const DeviceOutOfMemory& e) {
        EXPECT_EQ(std::string(e.what()), "CUDA backend: the device is out of memory allocating 100 bytes (0 "
                                         "bytes in use by this context)");
    }
    EXPECT_EQ(budget.inUse(), 0u);
    EXPECT_EQ(budget.highWater(), 100u); // counted while it was asked for
}

TEST(MemoryResource, ReservationsOutsideFitEveryBudgetOnTheDevice) {
    HostResource host;
    {
        cuda::BudgetAdaptor budget(host, kLedgerOutside, 1000, true);
        EXPECT_TRUE(cuda::explicitBudgetOn(kLedgerOutside));
        void* a = budget.allocate(400);
        EXPECT_FALSE(cuda::reserveOutside(kLedgerOutside, 700)); // 400 + 700 > 1000
        EXPECT_EQ(cuda::heldOutside(kLedgerOutside), 0u);
        EXPECT_TRUE(cuda::reserveOutside(kLedgerOutside, 500));
        EXPECT_EQ(budget.available(), 100u);
        EXPECT_EQ(budget.highWater(), 900u);
        EXPECT_THROW(budget.allocate(200), DeviceOutOfMemory); // the reservation counts
        EXPECT_TRUE(budget.takeOverOutside(300));              // now this budget's
        EXPECT_EQ(budget.inUse(), 700u);
        EXPECT_EQ(cuda::heldOutside(kLedgerOutside), 200u);
        cuda::releaseOutside(kLedgerOutside, 200);
        EXPECT_EQ(cuda::heldOutside(kLedgerOutside), 0u);
        budget.release(a, 400);
        budget.detach(); // no longer checked
        EXPECT_FALSE(cuda::explicitBudgetOn(kLedgerOutside));
        EXPECT_TRUE(cuda::reserveOutside(kLedgerOutside, 5000));
        cuda::releaseOutside(kLedgerOutside, 5000);
    }
    EXPECT_EQ(cuda::heldOutside(kLedgerOutside), 0u);
}

TEST(MemoryResource, CountingAdaptorFailsTheNthAllocationOnce) {
    HostResource host;
    cuda::CountingAdaptor counting(host);
    counting.setFailAfter(2);
    void* a = counting.allocate(16);
    try {
        counting.allocate(32);
        FAIL() << "no error";
    } catch (const DeviceOutOfMemory& e) {
        EXPECT_EQ(std::string(e.what()),
                  "CUDA backend: injected allocation failure (32 bytes, allocation 2)");
    }
    void* b = counting.allocate(64); // once
    EXPECT_EQ(counting.allocations(), 3u);
    EXPECT_EQ(counting.failAfter(), 0u);
    EXPECT_EQ(host.held, 80u); // the injected failure never reached the pool
    counting.release(a, 16);
    counting.release(b, 64);
    EXPECT_EQ(host.held, 0u);
}

namespace {
std::vector<std::string> g_destroyed;
struct FirstScratch {
    int value;
    ~FirstScratch() { g_destroyed.push_back("first"); }
};
struct SecondScratch {
    std::vector<int> values;
    ~SecondScratch() { g_destroyed.push_back("second"); }
};
} // namespace

TEST(MemoryResource, ScratchStoreHoldsOneObjectPerType) {
    g_destroyed.clear();
    {
        cuda::ScratchStore store;
        FirstScratch& first = store.get<FirstScratch>();
        EXPECT_EQ(first.value, 0); // value-initialised
        first.value = 7;
        store.get<SecondScratch>().values.push_back(1);
        EXPECT_EQ(&store.get<FirstScratch>(), &first);
        EXPECT_EQ(store.get<FirstScratch>().value, 7);
        EXPECT_EQ(store.get<SecondScratch>().values.size(), 1u);
        EXPECT_EQ(store.size(), 2u);
    }
    EXPECT_EQ(g_destroyed, (std::vector<std::string>{"second", "first"})); // the last made first
}

TEST(MemoryResource, GrowingPinnedGrowsWithRoom) {
    REQUIRE_DEVICE();
    cuda::GrowingPinned pinned;
    EXPECT_EQ(pinned.get(0), nullptr);
    void* p = pinned.get(100);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(pinned.capacity(), 150u); // half as much again
    EXPECT_EQ(pinned.get(150), p);      // no growth within the room
    pinned.get(151);
    EXPECT_EQ(pinned.capacity(), 226u);
    const std::size_t large = std::size_t(80) << 20;
    pinned.get(large);
    EXPECT_EQ(pinned.capacity(), large + (std::size_t(32) << 20)); // at most 32 MiB more
}

namespace {
// A stage's scratch with device memory; records what the frame cache still held when it was released.
struct DeviceScratch {
    cuda::DeviceContext* dc = nullptr;
    cuda::DeviceBuffer<float> buffer;
    ~DeviceScratch();
};
std::size_t g_frameBytesAtRelease = 0;
DeviceScratch::~DeviceScratch() {
    if (dc) g_frameBytesAtRelease = dc->cachedFrameBytes();
}
} // namespace

TEST(MemoryResource, StageScratchIsReleasedBeforeTheFrameCacheAndThePool) {
    REQUIRE_DEVICE();
    g_frameBytesAtRelease = 0;
    const Image<float> frame(64, 32, 1.0f);
    {
        cuda::DeviceContext dc(std::size_t(64) << 20);
        dc.frame(frame.view(), MaskView{});
        DeviceScratch& s = dc.scratch<DeviceScratch>();
        s.dc = &dc;
        s.buffer = cuda::DeviceBuffer<float>(dc, 1024);
        EXPECT_EQ(&dc.scratch<DeviceScratch>(), &s);
        EXPECT_EQ(dc.inUse(), dc.cachedFrameBytes() + 1024 * sizeof(float));
        dc.synchronize();
    }
    EXPECT_EQ(g_frameBytesAtRelease, 64u * 32u * sizeof(float));
}

// The pinned reserve (kernels/pinned_reserve.hpp): pieces come from the reserve, are page-locked and carry a
// copy to the device and back; a slab whose pieces are all released is handed out again, so allocating and
// releasing far more than everything reserved pins nothing on demand; a request larger than any slab is
// pinned on demand.
TEST(PinnedReserve, ServesPinnedPiecesAndReusesASlabOnceReleased) {
    REQUIRE_DEVICE();
    const cuda::PinnedStats before = cuda::pinnedStats();
    cuda::reservePinned(std::size_t(1) << 20);
    EXPECT_EQ(cuda::pinnedStats().reserved, before.reserved + (std::size_t(1) << 20));

    auto* a = static_cast<float*>(cuda::pinnedAllocate(1000 * sizeof(float)));
    auto* b = static_cast<float*>(cuda::pinnedAllocate(1000 * sizeof(float)));
    ASSERT_NE(a, b);
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, a), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeHost); // page-locked, known to the runtime
    for (int i = 0; i < 1000; ++i)
        a[i] = static_cast<float>(i) * 0.5f;
    float* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 1000 * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(d, a, 1000 * sizeof(float), cudaMemcpyHostToDevice, nullptr), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(b, d, 1000 * sizeof(float), cudaMemcpyDeviceToHost, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(d);
    for (int i = 0; i < 1000; ++i)
        ASSERT_EQ(b[i], a[i]);
    cuda::pinnedRelease(a);
    cuda::pinnedRelease(b);
    EXPECT_EQ(cuda::pinnedStats().fresh, before.fresh);

    // 1100 MiB through a reserve of at most 512 + 64 + 1 MiB: only reuse keeps it off cudaMallocHost.
    for (int i = 0; i < 1100; ++i) {
        cuda::PinnedBuffer<unsigned char> piece(std::size_t(1) << 20);
        piece.get()[0] = 1;
    }
    EXPECT_EQ(cuda::pinnedStats().fresh, before.fresh);
    EXPECT_GE(cuda::pinnedStats().served, before.served + (std::size_t(1100) << 20));

    const std::size_t large = std::size_t(65) << 20; // more than a slab
    void* big = cuda::pinnedAllocate(large);
    EXPECT_EQ(cuda::pinnedStats().fresh, before.fresh + large);
    cuda::pinnedRelease(big);
}
