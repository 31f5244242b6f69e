#pragma once
// Runs the gpuphot binary in the app tests and captures its exit code, stdout and stderr.
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "tests/test_support.hpp"

namespace gpuphot::test {

struct CliResult {
    int exitCode = -1;
    std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// args are passed through the shell; quote them when needed.
// cli: the program (gpuphot; GPUPHOT_CLI_TESTHOOKS for the tests of its fault injection).
inline CliResult runCli(const std::string& args, const std::string& env = "GPUPHOT_NO_TYCHO2=1",
                        const std::string& cli = GPUPHOT_CLI) {
    static int counter = 0;
    const auto dir = std::filesystem::temp_directory_path();
    const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(counter++);
    const auto outPath = dir / ("gpuphot_cli_out_" + tag), errPath = dir / ("gpuphot_cli_err_" + tag);
    // Simulated fields are not on the real sky: keep `reduce` from calibrating them against an installed
    // Tycho-2 unless a test asks for it (env "").
    const std::string cmd = env + " " + cli + " " + args + " >" + outPath.string() + " 2>" + errPath.string();
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(outPath);
    r.err = slurp(errPath);
    std::filesystem::remove(outPath);
    std::filesystem::remove(errPath);
    return r;
}

// Starts gpuphot in the background (exec'd by the shell, so the pid is gpuphot's); output to `log`.
inline pid_t startCli(const std::string& args, const std::string& log) {
    const std::string cmd =
        "exec env GPUPHOT_NO_TYCHO2=1 " + std::string(GPUPHOT_CLI) + " " + args + " >" + log + " 2>&1";
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    return pid;
}

// Waits for the process (at most `limitSeconds`, then kills it); its exit code, -1 when killed.
inline int waitCli(pid_t pid, double limitSeconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(limitSeconds);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > end) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            return -1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

} // namespace gpuphot::test
