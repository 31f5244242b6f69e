// The DeviceContext's memory policy: the pool resource, the budget ledger and the counting adaptor.
#include "kernels/memory_resource.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace gpuphot::cuda {

// Per device: the live budgets and the memory held outside them (reserveOutside). Never freed (a context
// may be destroyed during static destruction).
struct DeviceLedger {
    std::mutex mu;
    std::atomic<std::size_t> outside{0};
    std::vector<BudgetAdaptor*> budgets;
};

namespace {
DeviceLedger& ledger(int device) {
    static std::mutex mu;
    static std::map<int, DeviceLedger*> all;
    std::lock_guard lock(mu);
    DeviceLedger*& l = all[device];
    if (!l) l = new DeviceLedger;
    return *l;
}
} // namespace

cudaMemPool_t createDevicePool(int device, std::uint64_t releaseThreshold) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    GPUPHOT_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    const cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &releaseThreshold);
    if (e != cudaSuccess) {
        cudaMemPoolDestroy(pool);
        GPUPHOT_CUDA_CHECK(e);
    }
    return pool;
}

// ---- PoolResource ---------------------------------------------------------------------------------------

PoolResource::PoolResource(int device, cudaStream_t stream)
    : m_pool(createDevicePool(device, ~0ull)), m_stream(stream) {}

PoolResource::~PoolResource() {
    if (m_pool) cudaMemPoolDestroy(m_pool);
}

void* PoolResource::allocate(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, m_pool, m_stream);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        throw DeviceOutOfMemory("CUDA backend: the device is out of memory allocating " +
                                std::to_string(bytes) + " bytes");
    }
    GPUPHOT_CUDA_CHECK(e);
    return p;
}

void PoolResource::release(void* p, std::size_t) noexcept {
    cudaFreeAsync(p, m_stream);
}

// ---- BudgetAdaptor --------------------------------------------------------------------------------------

BudgetAdaptor::BudgetAdaptor(DeviceMemoryResource& upstream, int device, std::size_t budget,
                             bool explicitBudget)
    : m_upstream(upstream), m_ledger(ledger(device)), m_budget(budget), m_explicitBudget(explicitBudget) {
    std::lock_guard lock(m_ledger.mu);
    m_ledger.budgets.push_back(this);
    m_highWater = m_ledger.outside.load();
    m_attached = true;
}

BudgetAdaptor::~BudgetAdaptor() {
    detach();
}

void BudgetAdaptor::detach() noexcept {
    std::lock_guard lock(m_ledger.mu);
    if (!m_attached) return;
    auto& b = m_ledger.budgets;
    b.erase(std::remove(b.begin(), b.end(), this), b.end());
    m_attached = false;
}

void* BudgetAdaptor::allocate(std::size_t bytes) {
    {
        std::lock_guard lock(m_ledger.mu);
        const std::size_t outside = m_ledger.outside.load(), used = m_inUse + outside + bytes;
        if (used > m_budget)
            throw DeviceOutOfMemory(
                "CUDA backend: allocating " + std::to_string(bytes) + " bytes with " +
                std::to_string(m_inUse) + " in use" +
                (outside ? " (and " + std::to_string(outside) + " held by the raw upload)" : std::string()) +
                " exceeds the GPU memory budget of " + std::to_string(m_budget) + " bytes (--gpu-mem-limit)");
        m_inUse += bytes;
        if (used > m_highWater) m_highWater = used;
    }
    auto uncount = [&] {
        std::lock_guard lock(m_ledger.mu);
        m_inUse -= bytes;
    };
    try {
        return m_upstream.allocate(bytes);
    } catch (const DeviceOutOfMemory& e) {
        uncount();
        throw DeviceOutOfMemory(std::string(e.what()) + " (" + std::to_string(m_inUse) +
                                " bytes in use by this context)");
    } catch (...) {
        uncount();
        throw;
    }
}

void BudgetAdaptor::release(void* p, std::size_t bytes) noexcept {
    m_upstream.release(p, bytes);
    std::lock_guard lock(m_ledger.mu);
    m_inUse -= bytes;
}

bool BudgetAdaptor::takeOver(std::size_t bytes) {
    std::lock_guard lock(m_ledger.mu);
    const std::size_t used = m_inUse + m_ledger.outside.load() + bytes;
    if (used > m_budget) return false;
    m_inUse += bytes;
    if (used > m_highWater) m_highWater = used;
    return true;
}

bool BudgetAdaptor::takeOverOutside(std::size_t bytes) {
    std::lock_guard lock(m_ledger.mu);
    const std::size_t outside = m_ledger.outside.load(), moved = std::min(bytes, outside);
    if (m_inUse + bytes + (outside - moved) > m_budget) return false;
    m_ledger.outside = outside - moved;
    m_inUse += bytes;
    if (m_inUse + m_ledger.outside.load() > m_highWater) m_highWater = m_inUse + m_ledger.outside.load();
    return true;
}

std::size_t BudgetAdaptor::available() const {
    const std::size_t used = m_inUse + m_ledger.outside.load();
    return m_budget > used ? m_budget - used : 0;
}

void BudgetAdaptor::setBudget(std::size_t bytes, bool explicitBudget) {
    std::lock_guard lock(m_ledger.mu);
    m_budget = bytes;
    m_explicitBudget = explicitBudget;
}

void BudgetAdaptor::resetHighWater() {
    std::lock_guard lock(m_ledger.mu);
    m_highWater = m_inUse + m_ledger.outside.load();
}

// ---- CountingAdaptor ------------------------------------------------------------------------------------

void* CountingAdaptor::allocate(std::size_t bytes) {
    ++m_allocations;
    if (m_failAfter > 0 && --m_failAfter == 0)
        throw DeviceOutOfMemory("CUDA backend: injected allocation failure (" + std::to_string(bytes) +
                                " bytes, allocation " + std::to_string(m_allocations) + ")");
    return m_upstream.allocate(bytes);
}

// ---- memory outside the contexts ------------------------------------------------------------------------

bool reserveOutside(int device, std::size_t bytes) {
    if (bytes == 0) return true;
    DeviceLedger& l = ledger(device);
    std::lock_guard lock(l.mu);
    const std::size_t held = l.outside.load() + bytes;
    for (const BudgetAdaptor* b : l.budgets)
        if (b->m_inUse + held > b->m_budget) return false;
    l.outside = held;
    for (BudgetAdaptor* b : l.budgets)
        if (b->m_inUse + held > b->m_highWater) b->m_highWater = b->m_inUse + held;
    return true;
}

void releaseOutside(int device, std::size_t bytes) noexcept {
    if (bytes == 0) return;
    DeviceLedger& l = ledger(device);
    std::lock_guard lock(l.mu);
    l.outside -= std::min(bytes, l.outside.load());
}

std::size_t heldOutside(int device) {
    return ledger(device).outside.load();
}

bool explicitBudgetOn(int device) {
    DeviceLedger& l = ledger(device);
    std::lock_guard lock(l.mu);
    for (const BudgetAdaptor* b : l.budgets)
        if (b->m_explicitBudget) return true;
    return false;
}

} // namespace gpuphot::cuda
