#pragma once
// Shared by the CFITSIO adapters (fits_image, fits_table): an owning handle and error text.
#include <fitsio.h>

#include <string>

namespace gpuphot {

// Owns an open fitsfile; closes it (ignoring errors, clearing CFITSIO's message stack) when it goes
// out of scope. close() closes early and returns the status of the final flush.
struct FitsHandle {
    fitsfile* f = nullptr;
    FitsHandle() = default;
    FitsHandle(const FitsHandle&) = delete;
    FitsHandle& operator=(const FitsHandle&) = delete;
    ~FitsHandle();
    int close();
};

// CFITSIO's status text plus the newest messages of its error stack (which it then clears).
std::string cfitsioText(int status);

} // namespace gpuphot
