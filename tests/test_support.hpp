#pragma once
// Helpers shared by the test executables: a per-test scratch directory and Debian's Python (astropy,
// numpy, sep) as an independent reference. Tests that need Python skip when it is missing.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>

namespace gpuphot::test {

// A fresh empty directory under the system temp dir (prefix plus a random suffix), removed with it.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& prefix = "gpuphot_test") {
        std::random_device rd;
        path = std::filesystem::temp_directory_path() /
               (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(rd()) + std::to_string(rd()));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string str() const { return path.string(); }
    std::string file(const std::string& name) const { return (path / name).string(); }
    std::string operator/(const std::string& name) const { return file(name); }
};

// A fresh directory per test (named after the test), removed afterwards.
class ScratchDirTest : public ::testing::Test {
protected:
    explicit ScratchDirTest(std::string prefix) : m_prefix(std::move(prefix)) {}
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        m_dir = std::filesystem::temp_directory_path() /
                (m_prefix + "_" + std::to_string(::getpid()) + "_" + info->name());
        std::filesystem::remove_all(m_dir);
        std::filesystem::create_directories(m_dir);
    }
    void TearDown() override { std::filesystem::remove_all(m_dir); }
    std::string path(const std::string& name) const { return (m_dir / name).string(); }

    std::string m_prefix;
    std::filesystem::path m_dir;
};

// Debian's /usr/bin/python3 with astropy (the python3 first on PATH may lack it).
inline bool havePython() {
    static const bool ok = std::filesystem::exists("/usr/bin/python3") &&
                           std::system("/usr/bin/python3 -c 'import astropy' 2>/dev/null") == 0;
    return ok;
}

// Runs a script with /usr/bin/python3; returns stdout and stderr together, the status in *rc.
inline std::string runPython(const std::string& script, int* rc = nullptr) {
    static int counter = 0;
    const std::string file = (std::filesystem::temp_directory_path() /
                              ("gpuphot_py_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".py"))
                                 .string();
    std::ofstream(file) << script;
    std::string out;
    if (FILE* p = ::popen(("/usr/bin/python3 " + file + " 2>&1").c_str(), "r")) {
        char buf[4096];
        std::size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
        const int status = ::pclose(p);
        if (rc) *rc = status;
    }
    std::filesystem::remove(file);
    return out;
}

} // namespace gpuphot::test
