#include "core/db/results_store.hpp"

#include <zlib.h>

#include <cstdio>
#include <map>
#include <memory>

#include "core/db/backends.hpp"
#include "core/db/db_records.hpp"

namespace gpuphot {

int databaseExitCode(DatabaseError::Kind kind) {
    switch (kind) {
    case DatabaseError::Kind::Unreachable:
        return 5;
    case DatabaseError::Kind::Authentication:
        return 6;
    case DatabaseError::Kind::SchemaTooNew:
        return 7;
    case DatabaseError::Kind::Full:
        return 8;
    case DatabaseError::Kind::Other:
        break;
    }
    return 9;
}

std::string fileChecksum(const std::string& path) {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) throw IoError("cannot read " + path + " for its checksum");
    std::vector<unsigned char> buf(1 << 20);
    uLong sum = adler32(0L, Z_NULL, 0);
    std::size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0)
        sum = adler32(sum, buf.data(), static_cast<uInt>(n));
    if (std::ferror(f.get())) throw IoError("error reading " + path + " for its checksum");
    char out[24];
    std::snprintf(out, sizeof out, "adler32:%08lx", static_cast<unsigned long>(sum));
    return out;
}

bool isPostgresUrl(const std::string& url) {
    return url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0 || url.rfind("pg:", 0) == 0;
}

std::unique_ptr<ResultsStore> openResultsStore(const std::string& url, const StoreOptions& options) {
    if (url.empty()) throw InvalidInput("--db: empty database name");
    if (isPostgresUrl(url)) return db::openPostgresStore(url, options);
    return db::openSqliteStore(url, options);
}

Table lightCurve(ResultsStore& store, double raDeg, double decDeg, double radiusArcsec) {
    const Table cone = store.cone(raDeg, decDeg, radiusArcsec); // sorted by mjd, frame, sep
    const auto& frame = cone.at("frame_id").as<std::int64_t>();
    std::vector<std::size_t> keep;
    for (std::size_t i = 0; i < cone.rows(); ++i)
        if (i == 0 || frame[i] != frame[i - 1]) keep.push_back(i); // the nearest source of each frame
    Table out = cone;
    out.name = "LIGHTCURVE";
    for (auto& col : out.columns())
        std::visit(
            [&](auto& v) {
                auto copy = v;
                v.resize(keep.size());
                for (std::size_t i = 0; i < keep.size(); ++i)
                    v[i] = copy[keep[i]];
            },
            col.data);
    return out;
}

} // namespace gpuphot
