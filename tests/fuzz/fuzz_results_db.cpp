// libFuzzer target: a results database file that is damaged or was written by something else (`--db
// night.sqlite`, `gpuphot query`). The input is the SQLite file; it is opened as the store (schema checks
// and migrations), then every query the CLI offers runs on it. Only typed errors (DatabaseError) may
// come out. Seeds: tests/fuzz/corpus/results_db (a store holding one small reduced frame and a series).
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "core/db/results_store.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace gpuphot;
    const std::string path = fuzz::writeScratch(data, size, ".sqlite");
    // A previous input's write-ahead log must not be replayed onto this one.
    std::remove((path + "-wal").c_str());
    std::remove((path + "-shm").c_str());
    fuzz::expectTypedErrorsOnly([&] {
        StoreOptions options;
        options.busyTimeoutSeconds = 0;
        const std::unique_ptr<ResultsStore> store = openResultsStore(path, options);
        (void)store->frames({});
        FrameQuery q;
        q.mjdMin = 0;
        q.mjdMax = 1e6;
        q.filter = "V";
        q.pathLike = "%.fits";
        (void)store->frames(q);
        for (double dec : {-90.0, 0.0, 30.0, 90.0}) {
            (void)store->cone(0.0, dec, 3600.0);
            (void)store->cone(359.99, dec, 10.0);
        }
        (void)lightCurve(*store, 150.0, 2.0, 5.0);
        (void)store->seriesCurve("target");
        (void)store->frameConfig(1);
    });
    return 0;
}
