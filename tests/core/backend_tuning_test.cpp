// BackendTuning: the environment's switches read in one place, every one documented, none read
// anywhere else in core/ or kernels/.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/pipeline/backend_tuning.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

const fs::path kSource = fs::path(GPUPHOT_TEST_DATA) / ".." / "..";

std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct ScopedEnv {
    ScopedEnv(const char* name, const char* value) : m_name(name) { ::setenv(name, value, 1); }
    ~ScopedEnv() { ::unsetenv(m_name); }
    const char* m_name;
};

} // namespace

TEST(BackendTuning, DefaultsAreTheProductsPathsAndReportNothingChanged) {
    const BackendTuning t;
    EXPECT_EQ(t.nonDefault(), "");
    EXPECT_TRUE(t.aperture.chain);
    EXPECT_TRUE(t.psfOnDevice);
    EXPECT_TRUE(t.rawUpload);
    EXPECT_EQ(t.detection.release, "idle");
    EXPECT_EQ(BackendTuning::fromEnvironment().toJson(), t.toJson()) << "no GPUPHOT_ tuning variable is set";
}

TEST(BackendTuning, EnvironmentSetsTheFieldsAndTheReportNamesThem) {
    const ScopedEnv a("GPUPHOT_APERTURE_SKY", "block0"), b("GPUPHOT_APERTURE_BATCH", "7"),
        c("GPUPHOT_DETECTION_RELEASE", "now"), d("GPUPHOT_PSF_DEVICE", "0"), e("GPUPHOT_RAW_UPLOAD", "wait"),
        f("GPUPHOT_APERTURE_SKY_THREADS", "2000"), g("GPUPHOT_APERTURE_KEEP", "1");
    const BackendTuning t = BackendTuning::fromEnvironment();
    EXPECT_EQ(t.aperture.skyMode, 0);
    EXPECT_FALSE(t.aperture.skySplit);
    EXPECT_EQ(t.aperture.batch, 7u);
    EXPECT_EQ(t.aperture.skyThreads, 1024) << "clamped";
    EXPECT_TRUE(t.aperture.keep);
    EXPECT_EQ(t.detection.release, "now");
    EXPECT_FALSE(t.psfOnDevice);
    EXPECT_TRUE(t.rawUpload);
    EXPECT_TRUE(t.rawUploadWait);
    EXPECT_EQ(t.nonDefault(),
              "APERTURE_BATCH=7 APERTURE_SKY_MODE=0 APERTURE_SKY_THREADS=1024 DETECTION_RELEASE=now "
              "PSF_DEVICE=false RAW_UPLOAD_WAIT=true");
    EXPECT_EQ(t.toJson().at("DETECTION_RELEASE"), "now");
}

TEST(BackendTuning, PinnedReserveTakesMiBOrAuto) {
    EXPECT_EQ(BackendTuning{}.pinnedReserveMiB, 0) << "none by default";
    for (const auto& [value, mib] : std::vector<std::pair<const char*, int>>{
             {"256", 256}, {"0", 0}, {"auto", -1}, {"lots", 0}, {"-5", 0}, {"12M", 0}}) {
        const ScopedEnv e("GPUPHOT_PINNED_RESERVE", value);
        EXPECT_EQ(BackendTuning::fromEnvironment().pinnedReserveMiB, mib) << value;
    }
}

TEST(BackendTuning, UnknownValuesKeepTheDefaults) {
    const ScopedEnv a("GPUPHOT_DETECTION_RELEASE", "later"), b("GPUPHOT_APERTURE_CIRCLE", "square"),
        c("GPUPHOT_APERTURE_BATCH", "0");
    const BackendTuning t = BackendTuning::fromEnvironment();
    EXPECT_EQ(t.detection.release, "idle");
    EXPECT_EQ(t.aperture.circleMode, 0);
    EXPECT_EQ(t.aperture.batch, 1u) << "a batch of at least one source";
}

// docs/CONFIG.md §Tuning lists every report key and the variable that sets it.
TEST(BackendTuning, EveryFieldIsDocumented) {
    const std::string doc = slurp(kSource / "docs" / "CONFIG.md");
    ASSERT_NE(doc.find("## Tuning"), std::string::npos);
    const nlohmann::json keys = BackendTuning{}.toJson();
    for (const auto& [key, value] : keys.items())
        EXPECT_NE(doc.find("`" + key + "`"), std::string::npos) << key << " missing from docs/CONFIG.md";
    const std::string src = slurp(kSource / "core" / "pipeline" / "backend_tuning.cpp");
    const std::regex var("\"(GPUPHOT_[A-Z0-9_]+)\"");
    int n = 0;
    for (auto it = std::sregex_iterator(src.begin(), src.end(), var); it != std::sregex_iterator(); ++it, ++n)
        EXPECT_NE(doc.find((*it)[1].str()), std::string::npos) << (*it)[1] << " missing from docs/CONFIG.md";
    EXPECT_GT(n, 25);
}

// The tuning is read in backend_tuning.cpp alone: no other getenv in core/ or kernels/ (the Tycho-2
// folder is a user's path, documented beside the tuning).
TEST(BackendTuning, NoOtherEnvironmentReadsInCoreOrKernels) {
    for (const char* layer : {"core", "kernels"}) {
        for (const auto& e : fs::recursive_directory_iterator(kSource / layer)) {
            if (!e.is_regular_file()) continue;
            const std::string name = e.path().filename().string();
            if (name == "backend_tuning.cpp") continue;
            const std::string text = slurp(e.path());
            std::size_t at = 0;
            while ((at = text.find("getenv(", at)) != std::string::npos) {
                const std::string call = text.substr(at, 40);
                EXPECT_NE(call.find("GPUPHOT_TYCHO2_DIR"), std::string::npos)
                    << e.path().string() << ": " << call;
                at += 7;
            }
        }
    }
}
