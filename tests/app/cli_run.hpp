#pragma once
// Runs the gpuphot binary in the app tests and captures its exit code, stdout and stderr.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
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


} // namespace gpuphot::test
