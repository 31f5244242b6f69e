#pragma once
// Transparent huge pages for large fresh buffers: a vector of megabytes is faulted in with a few faults
// instead of thousands. A hint only: no effect where the kernel does not use them (transparent_hugepage
// "never"), nothing to do under "always". On the virtual machines measured, the kernel's zeroing of fresh
// 2 MiB pages cost more system time than the 4 KiB faults it saves for whole frames' images, so those are
// not advised (docs/BENCHMARKS.md).
#include <cstddef>

namespace gpuphot {

// Advises huge pages for the whole 2 MiB pages inside [p, p + bytes).
void adviseHugePages(void* p, std::size_t bytes) noexcept;

} // namespace gpuphot
