#pragma once
// Fresh memory faulted in by several threads. A vector of n elements built on one thread touches its
// pages there, one fault at a time (a 150k-row catalog column is 1.2 MB; a catalog of 60 columns, a
// detection's run lists, tens of ms at 151 MP); faulting them in parallel first leaves the construction
// writing resident memory. Callable from sources compiled without OpenMP (the CUDA ones).
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

namespace gpuphot {

// Writes zeros over [bytes, bytes + n) in 64 KiB chunks on `threads` threads (0: OpenMP's default).
void prefaultBytes(unsigned char* bytes, std::size_t n, int threads);

// std::vector<T>(n), its pages faulted in on `threads` threads before the (serial) value-initialisation.
template <class T> std::vector<T> prefaultedVector(std::size_t n, int threads) {
    std::vector<T> v;
    v.reserve(n);
    prefaultBytes(reinterpret_cast<unsigned char*>(v.data()), n * sizeof(T), threads);
    v.resize(n);
    return v;
}

} // namespace gpuphot
