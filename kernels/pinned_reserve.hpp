#pragma once
// Page-locked host memory pinned ahead of need. Pinning is paid page by page (the pages are faulted in,
// locked and mapped for the device, about 0.3 ms per MiB): a cold process's first frame pins its stages'
// download and upload buffers on the critical path, about 360 MiB and 0.11 s on a 151 MP / 154k frame.
// With BackendTuning::pinnedReserveMiB the device warm-up thread pins a reserve once the first frame is
// prepared (reservePinned); every PinnedBuffer takes its memory from the reserve while a slab has room
// (pinnedAllocate), else from cudaMallocHost. A slab whose pieces are all released is reused from its start.
#include <cstddef>

namespace gpuphot::cuda {

// Pins `bytes` more, in slabs of at most 64 MiB, each usable as soon as it is pinned. Any thread; never
// throws (a failed cudaMallocHost ends the reservation).
void reservePinned(std::size_t bytes) noexcept;

// `bytes` (> 0) of page-locked memory: a piece of a reserve slab with room, else cudaMallocHost. Throws
// DeviceOutOfMemory when neither can give it.
void* pinnedAllocate(std::size_t bytes);

// Gives back what pinnedAllocate returned. The release of a slab's last piece synchronises the device before
// the slab is handed out again, as cudaFreeHost does, so that no copy still queued into it can reach the
// next user of the memory.
void pinnedRelease(void* p) noexcept;

struct PinnedStats {
    std::size_t reserved = 0; // bytes pinned into the reserve
    std::size_t served = 0;   // bytes handed out from it
    std::size_t fresh = 0;    // bytes pinned on demand (cudaMallocHost), beside the reserve
};
PinnedStats pinnedStats();

// The warm-up's reservation (CudaStageTable::reservePinned): once per process, pinnedReserveBytes for the
// latest read that began (nothing when none has).
void warmUpPinned(int mib) noexcept;

// The reserve for a frame of `pixels` pixels when `mib` < 0 (auto: 2 bytes per pixel, at most 512 MiB),
// else `mib` MiB (0: none).
std::size_t pinnedReserveBytes(std::size_t pixels, int mib);

} // namespace gpuphot::cuda
