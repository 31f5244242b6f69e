#pragma once
// Typed errors raised at API edges (docs/ARCHITECTURE.md §Style). Messages name the file and the problem.
#include <stdexcept>
#include <string>

namespace gpuphot {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The input (a file's contents, a parameter, a header value) is unusable.
class InvalidInput : public Error {
public:
    using Error::Error;
};

// A file could not be opened, read or written.
class IoError : public Error {
public:
    using Error::Error;
};

// A CUDA runtime call failed; the message carries file:line of the call.
class CudaError : public Error {
public:
    using Error::Error;
};

// The run was cancelled through RunContext (the GUI cancels stale runs).
class Cancelled : public Error {
public:
    Cancelled() : Error("cancelled") {}
};

} // namespace gpuphot
