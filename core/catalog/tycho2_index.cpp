#include "core/catalog/tycho2_index.hpp"

#include <fitsio.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <numbers>
#include <string_view>

#include "core/io/cfitsio_util.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kDeg = std::numbers::pi / 180.0;
constexpr long kBlockRows = 65536;
constexpr double kDedupArcsec = 0.05;

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\'')) s.pop_back();
    std::size_t i = 0;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\'')) ++i;
    return s.substr(i);
}

// A keyword's string value in the current HDU, "" when absent.
std::string keyString(fitsfile* f, const char* key) {
    char value[FLEN_VALUE] = {};
    int st = 0;
    if (fits_read_key(f, TSTRING, key, value, nullptr, &st)) {
        fits_clear_errmsg();
        return {};
    }
    return trimmed(value);
}

long keyLong(fitsfile* f, const char* key, long fallback) {
    long v = 0;
    int st = 0;
    if (fits_read_key(f, TLONG, key, &v, nullptr, &st)) {
        fits_clear_errmsg();
        return fallback;
    }
    return v;
}

// The layout of one index file: HDU numbers (1-based, CFITSIO) and the k-d tree's encoding.
struct IndexLayout {
    int dataHdu = 0, rangeHdu = 0, headerHdu = 0, tagHdu = 0;
    int magCol = 0;
    std::string magName;
    std::string dataType = "u32"; // KDT_DATA: u32, u16 or double
    bool swap = false;            // file byte order differs from the host's
    long nStars = 0;
    long indexId = 0;
    double minval[3] = {0, 0, 0};
    double invScale = 1.0;
};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw InvalidInput(path + ": not a usable astrometry.net star index: " + what);
}

void check(int status, const std::string& path, const std::string& what) {
    if (status) throw IoError(path + ": " + what + ": " + cfitsioText(status));
}

template <typename T>
T fromBytes(const unsigned char* p, bool swap) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, p, sizeof(T));
    if (swap) std::reverse(b, b + sizeof(T));
    T v;
    std::memcpy(&v, b, sizeof(T));
    return v;
}

IndexLayout inspect(fitsfile* f, const std::string& path) {
    IndexLayout L;
    int st = 0, nHdu = 0;
    check(fits_get_num_hdus(f, &nHdu, &st), path, "counting HDUs");
    std::string endian;
    L.indexId = keyLong(f, "INDEXID", 0);
    endian = keyString(f, "ENDIAN");
    for (int h = 2; h <= nHdu; ++h) {
        int type = 0;
        check(fits_movabs_hdu(f, h, &type, &st), path, "moving to HDU " + std::to_string(h - 1));
        if (type != BINARY_TBL) continue;
        const std::string ttype1 = keyString(f, "TTYPE1");
        const std::string anFile = keyString(f, "AN_FILE");
        if (ttype1 == "kdtree_data_stars") L.dataHdu = h;
        else if (ttype1 == "kdtree_range_stars") L.rangeHdu = h;
        else if (ttype1 == "kdtree_header_stars") {
            L.headerHdu = h;
            if (const auto e = keyString(f, "ENDIAN"); !e.empty()) endian = e;
            L.dataType = keyString(f, "KDT_DATA");
            L.nStars = keyLong(f, "KDT_NDAT", -1);
            if (keyLong(f, "KDT_NDIM", -1) != 3) fail(path, "the star k-d tree is not 3-dimensional");
        } else if (anFile == "TAGALONG") {
            L.tagHdu = h;
            int ncols = 0;
            check(fits_get_num_cols(f, &ncols, &st), path, "reading the tag-along table");
            for (const char* want : {"MAG_VT", "VT", "MAG_V", "MAG"}) {
                for (int c = 1; c <= ncols && L.magCol == 0; ++c) {
                    const std::string key = "TTYPE" + std::to_string(c);
                    const std::string name = keyString(f, key.c_str());
                    if (name.size() == std::strlen(want) &&
                        std::equal(name.begin(), name.end(), want,
                                   [](char a, char b) { return std::toupper(a) == std::toupper(b); })) {
                        L.magCol = c;
                        L.magName = name;
                    }
                }
                if (L.magCol) break;
            }
        }
    }
    if (!L.headerHdu || !L.dataHdu) fail(path, "no star k-d tree (kdtree_header_stars / kdtree_data_stars)");
    if (!L.tagHdu || !L.magCol) fail(path, "no tag-along table with a magnitude column (MAG_VT, VT, MAG)");
    if (L.dataType != "u32" && L.dataType != "u16" && L.dataType != "double")
        fail(path, "star k-d tree data type '" + L.dataType + "' (u32, u16 or double expected)");
    const bool fileLittle = endian == "04:03:02:01";
    if (!fileLittle && endian != "01:02:03:04") fail(path, "no ENDIAN keyword ('" + endian + "')");
    L.swap = fileLittle != (std::endian::native == std::endian::little);
    int type = 0;
    check(fits_movabs_hdu(f, L.dataHdu, &type, &st), path, "moving to kdtree_data_stars");
    long rows = 0;
    check(fits_get_num_rows(f, &rows, &st), path, "reading kdtree_data_stars");
    const long rowBytes = keyLong(f, "NAXIS1", 0);
    const long want = 3 * (L.dataType == "u32" ? 4 : L.dataType == "u16" ? 2 : 8);
    if (rowBytes != want) fail(path, "kdtree_data_stars rows of " + std::to_string(rowBytes) + " bytes");
    if (L.nStars < 0) L.nStars = rows;
    if (rows != L.nStars) fail(path, "kdtree_data_stars has " + std::to_string(rows) + " rows, KDT_NDAT " +
                                         std::to_string(L.nStars));
    if (L.dataType != "double") {
        if (!L.rangeHdu) fail(path, "no kdtree_range_stars for integer k-d tree data");
        check(fits_movabs_hdu(f, L.rangeHdu, &type, &st), path, "moving to kdtree_range_stars");
        long nr = 0;
        check(fits_get_num_rows(f, &nr, &st), path, "reading kdtree_range_stars");
        if (nr * keyLong(f, "NAXIS1", 0) != 7 * 8) fail(path, "kdtree_range_stars is not 7 doubles");
        unsigned char buf[56];
        check(fits_read_tblbytes(f, 1, 1, 56, buf, &st), path, "reading kdtree_range_stars");
        for (int d = 0; d < 3; ++d) L.minval[d] = fromBytes<double>(buf + 8 * d, L.swap);
        const double scale = fromBytes<double>(buf + 48, L.swap);
        if (!(scale > 0) || !std::isfinite(scale)) fail(path, "kdtree_range_stars scale is not positive");
        L.invScale = 1.0 / scale;
    }
    check(fits_movabs_hdu(f, L.tagHdu, &type, &st), path, "moving to the tag-along table");
    long tagRows = 0;
    check(fits_get_num_rows(f, &tagRows, &st), path, "reading the tag-along table");
    if (tagRows != L.nStars) fail(path, "tag-along table has " + std::to_string(tagRows) + " rows for " +
                                            std::to_string(L.nStars) + " stars");
    return L;
}

struct Candidate {
    double x, y, z; // unit vector
    double ra, dec, mag;
    std::int64_t id;
    int file;
    long row; // 0-based
};

// Appends the stars of one file within the cone (centre unit vector c, cos of the radius).
// Returns the name of the magnitude column read.
std::string scanFile(const std::string& path, int fileIndex, const double c[3], double cosR,
                     std::vector<Candidate>& out) {
    FitsHandle h;
    int st = 0;
    if (fits_open_file(&h.f, path.c_str(), READONLY, &st)) {
        const bool missing = !fs::exists(path);
        throw IoError(path + ": " + (missing ? "no such file" : "cannot open: " + cfitsioText(st)));
    }
    const IndexLayout L = inspect(h.f, path);
    int type = 0;
    check(fits_movabs_hdu(h.f, L.dataHdu, &type, &st), path, "moving to kdtree_data_stars");
    const int elem = L.dataType == "u32" ? 4 : L.dataType == "u16" ? 2 : 8;
    const long rowBytes = 3L * elem;
    std::vector<unsigned char> buf;
    const std::size_t first = out.size();
    for (long r0 = 0; r0 < L.nStars; r0 += kBlockRows) {
        const long n = std::min(kBlockRows, L.nStars - r0);
        buf.resize(static_cast<std::size_t>(n * rowBytes));
        check(fits_read_tblbytes(h.f, r0 + 1, 1, n * rowBytes, buf.data(), &st), path,
              "reading kdtree_data_stars");
        for (long i = 0; i < n; ++i) {
            const unsigned char* p = buf.data() + i * rowBytes;
            double v[3];
            for (int d = 0; d < 3; ++d) {
                const unsigned char* q = p + d * elem;
                if (elem == 4) v[d] = L.minval[d] + fromBytes<std::uint32_t>(q, L.swap) * L.invScale;
                else if (elem == 2) v[d] = L.minval[d] + fromBytes<std::uint16_t>(q, L.swap) * L.invScale;
                else v[d] = fromBytes<double>(q, L.swap);
            }
            const double norm = std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
            if (!(norm > 0)) continue;
            if ((v[0] * c[0] + v[1] * c[1] + v[2] * c[2]) / norm < cosR) continue;
            Candidate s;
            s.x = v[0] / norm;
            s.y = v[1] / norm;
            s.z = v[2] / norm;
            s.ra = std::atan2(s.y, s.x) / kDeg;
            if (s.ra < 0) s.ra += 360.0;
            if (s.ra >= 360.0) s.ra -= 360.0;
            s.dec = std::asin(std::clamp(s.z, -1.0, 1.0)) / kDeg;
            s.mag = kNaN;
            s.id = static_cast<std::int64_t>(L.indexId) * 100000000LL + (r0 + i + 1);
            s.file = fileIndex;
            s.row = r0 + i;
            out.push_back(s);
        }
    }
    // Magnitudes of the selected rows: read the tag-along column block by block, only the blocks that
    // hold selected rows (rows are in k-d tree order, so a region's stars fall into few blocks).
    check(fits_movabs_hdu(h.f, L.tagHdu, &type, &st), path, "moving to the tag-along table");
    std::vector<float> mags;
    long blockStart = -1;
    for (std::size_t k = first; k < out.size(); ++k) {
        const long b0 = out[k].row / kBlockRows * kBlockRows;
        if (b0 != blockStart) {
            const long n = std::min(kBlockRows, L.nStars - b0);
            mags.resize(static_cast<std::size_t>(n));
            float nul = std::numeric_limits<float>::quiet_NaN();
            int anynul = 0;
            check(fits_read_col(h.f, TFLOAT, L.magCol, b0 + 1, 1, n, &nul, mags.data(), &anynul, &st), path,
                  "reading " + L.magName);
            blockStart = b0;
        }
        out[k].mag = mags[static_cast<std::size_t>(out[k].row - blockStart)];
    }
    return L.magName;
}

} // namespace

std::vector<std::string> findTycho2IndexFiles() {
    std::vector<std::string> result;
    auto scanDir = [&](const fs::path& dir, bool anyIndex) {
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) return;
        // name without the byte-order part -> (path, is it the host's order)
        std::map<std::string, std::pair<std::string, bool>> found;
        const bool hostLittle = std::endian::native == std::endian::little;
        for (const auto& e : fs::directory_iterator(dir, ec)) {
            if (!e.is_regular_file(ec)) continue;
            const std::string name = e.path().filename().string();
            const std::string prefix = anyIndex ? "index-" : "index-tycho2-";
            if (name.rfind(prefix, 0) != 0 || name.size() < 5 || name.substr(name.size() - 5) != ".fits") continue;
            std::string key = name;
            bool host = true;
            for (const auto& [tag, little] : {std::pair{".littleendian", true}, std::pair{".bigendian", false}}) {
                if (auto p = key.find(tag); p != std::string::npos) {
                    key.erase(p, std::strlen(tag));
                    host = little == hostLittle;
                }
            }
            auto it = found.find(key);
            if (it == found.end() || (!it->second.second && host)) found[key] = {e.path().string(), host};
        }
        for (const auto& [key, v] : found)
            if (std::find(result.begin(), result.end(), v.first) == result.end()) result.push_back(v.first);
    };
    if (const char* env = std::getenv("GPUPHOT_TYCHO2_DIR"); env && *env) scanDir(env, true);
    scanDir("/usr/share/astrometry", false);
    scanDir("/usr/local/share/astrometry", false);
    return result;
}

ReferenceCatalog loadTycho2Region(double raDeg, double decDeg, double radiusDeg,
                                  const std::vector<std::string>& files) {
    if (!std::isfinite(raDeg) || !std::isfinite(decDeg) || std::fabs(decDeg) > 90.0)
        throw InvalidInput("Tycho-2 region: centre (" + std::to_string(raDeg) + ", " + std::to_string(decDeg) +
                           ") is not a sky position");
    if (!(radiusDeg > 0.0) || radiusDeg > 180.0)
        throw InvalidInput("Tycho-2 region: radius " + std::to_string(radiusDeg) + " deg not in (0, 180]");
    if (files.empty()) throw InvalidInput("Tycho-2 region: no index files given");
    const double c[3] = {std::cos(decDeg * kDeg) * std::cos(raDeg * kDeg),
                         std::cos(decDeg * kDeg) * std::sin(raDeg * kDeg), std::sin(decDeg * kDeg)};
    const double cosR = std::cos(radiusDeg * kDeg);
    std::vector<Candidate> cand;
    std::string magName;
    for (std::size_t f = 0; f < files.size(); ++f) {
        const std::string m = scanFile(files[f], static_cast<int>(f), c, cosR, cand);
        if (magName.empty()) magName = m;
        else if (m != magName && magName.find(m) == std::string::npos) magName += "/" + m;
    }

    // Deduplicate: among stars within kDedupArcsec of each other keep the one of the earliest file (then
    // row). Sorted by z, a duplicate lies within the chord tolerance in z.
    const double tol = 2.0 * std::sin(0.5 * kDedupArcsec / 3600.0 * kDeg);
    std::vector<std::size_t> order(cand.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return cand[a].z != cand[b].z ? cand[a].z < cand[b].z : a < b;
    });
    std::vector<bool> drop(cand.size(), false);
    for (std::size_t k = 0; k < order.size(); ++k) {
        const Candidate& s = cand[order[k]];
        for (std::size_t j = k + 1; j < order.size() && cand[order[j]].z - s.z <= tol; ++j) {
            const Candidate& t = cand[order[j]];
            const double dx = s.x - t.x, dy = s.y - t.y, dz = s.z - t.z;
            if (dx * dx + dy * dy + dz * dz > tol * tol) continue;
            // index order of cand = (file, row) order: the later one is the duplicate
            drop[std::max(order[k], order[j])] = true;
        }
    }
    std::vector<std::size_t> keep;
    for (std::size_t i = 0; i < cand.size(); ++i)
        if (!drop[i]) keep.push_back(i);
    std::sort(keep.begin(), keep.end(), [&](std::size_t a, std::size_t b) {
        if (cand[a].dec != cand[b].dec) return cand[a].dec > cand[b].dec;
        if (cand[a].ra != cand[b].ra) return cand[a].ra < cand[b].ra;
        return a < b;
    });

    ReferenceCatalog cat;
    cat.rowsRead = cand.size();
    for (std::size_t i : keep) {
        const Candidate& s = cand[i];
        if (!std::isfinite(s.mag)) {
            ++cat.skippedNonFinite;
            continue;
        }
        cat.ra.push_back(s.ra);
        cat.dec.push_back(s.dec);
        cat.mag.push_back(s.mag);
        cat.id.push_back(s.id);
    }
    const std::size_t n = cat.ra.size();
    cat.magErr.assign(n, kNaN);
    cat.color.assign(n, kNaN);
    cat.pmRa.assign(n, kNaN);
    cat.pmDec.assign(n, kNaN);
    cat.epoch = 2000.0;
    for (std::size_t f = 0; f < files.size(); ++f)
        cat.path += (f ? ";" : "") + files[f];
    cat.columns.ra = "kdtree_data_stars";
    cat.columns.dec = "kdtree_data_stars";
    cat.columns.mag = magName; // MAG_VT in Debian's files
    cat.columns.magErr = cat.columns.color = cat.columns.pmRa = cat.columns.pmDec = "";
    cat.columns.id = "";
    cat.columns.epoch = 2000.0;
    cat.columns.epochExplicit = true;
    return cat;
}

} // namespace gpuphot
