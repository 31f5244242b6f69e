// libFuzzer target: the reference-catalog reader, FITS table and delimited text (CSV, tab/blank,
// ECSV, sexagesimal positions), plus the --ref-columns parser. The first byte chooses the file name
// suffix and whether the remainder starts with a column map ("map\n" then the file).
#include <cstdint>
#include <string>

#include "core/catalog/reference_catalog.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace gpuphot;
    if (size == 0) return 0;
    const std::uint8_t mode = data[0];
    ++data;
    --size;
    RefColumnMap map;
    if (mode & 4) { // a column map on the first line
        std::size_t nl = 0;
        while (nl < size && nl < 256 && data[nl] != '\n') ++nl;
        const std::string spec(reinterpret_cast<const char*>(data), nl);
        bool ok = true;
        try {
            map = parseRefColumnMap(spec);
        } catch (const Error&) {
            ok = false;
        }
        if (!ok) map = {};
        const std::size_t skip = nl < size ? nl + 1 : nl;
        data += skip;
        size -= skip;
    }
    static const char* suffixes[] = {".fits", ".csv", ".ecsv", ".txt"};
    const std::string path = fuzz::writeScratch(data, size, suffixes[mode & 3]);
    fuzz::expectTypedErrorsOnly([&] {
        ReferenceCatalog cat = readReferenceCatalog(path, map);
        if (cat.ra.size() != cat.dec.size() || cat.ra.size() != cat.mag.size() || cat.ra.size() != cat.id.size() ||
            cat.ra.size() != cat.magErr.size() || cat.ra.size() != cat.color.size() ||
            cat.ra.size() != cat.pmRa.size() || cat.ra.size() != cat.pmDec.size())
            __builtin_trap(); // the documented invariant: every vector has size() entries
        applyProperMotion(cat, 2016.0);
    });
    return 0;
}
