#pragma once
// A cold `gpuphot reduce` on the CUDA backend spends 0.15-0.25 s, after its outputs are on disk, in the
// release of its CUDA context and memory (the driver's and the kernel's teardown of the process: ending it
// with _Exit does not shorten that). runDetached runs a command in a child process that hands its exit
// status to this process, the one the shell waits for, as soon as the command has returned (every output
// written, flushed and closed); the child then ends on its own, its standard streams on /dev/null, so
// that nothing it does after the status can reach a terminal or hold a pipe open. Signals sent to this
// process (SIGINT, SIGTERM, SIGHUP, SIGQUIT) are passed on to the child while the command runs, SIGKILL
// of this process kills the child too (PR_SET_PDEATHSIG), and a child ended by a signal ends this process
// by the same signal: stopping the command works as if it ran here. Where pipe or fork fails, the command
// runs here.
// Call it before anything starts a thread or the CUDA driver.
#include <functional>

namespace gpuphot::cli {

int runDetached(const std::function<int()>& command);

} // namespace gpuphot::cli
