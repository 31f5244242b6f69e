// libFuzzer target: target lists for forced photometry (`reduce --targets FILE`: FITS table, ECSV, CSV,
// blank-separated text, sexagesimal positions) and the sexagesimal parser that `query` shares. The first
// byte picks the file suffix.
#include <cstdint>
#include <string>
#include <string_view>

#include "core/io/target_list.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace gpuphot;
    if (size < 1) return 0;
    static const char* const kSuffix[] = {".csv", ".txt", ".ecsv", ".fits", ".tsv", ".dat"};
    const std::string path = fuzz::writeScratch(data + 1, size - 1, kSuffix[data[0] % 6]);
    fuzz::expectTypedErrorsOnly([&] {
        const TargetList t = readTargetList(path);
        volatile double sink = 0;
        for (std::size_t i = 0; i < t.size(); ++i)
            sink = sink + t.ra[i] + t.dec[i] + static_cast<double>(t.name[i].size());
        (void)sink;
    });
    const std::string_view text(reinterpret_cast<const char*>(data + 1),
                                std::min<std::size_t>(size - 1, 256));
    (void)parseSexagesimalAngle(text);
    return 0;
}
