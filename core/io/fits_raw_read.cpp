#include "core/io/fits_raw_read.hpp"

#include <fcntl.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"

namespace gpuphot {
namespace {

// Big-endian loads.
inline std::uint16_t be16(const unsigned char* p) {
    return static_cast<std::uint16_t>((static_cast<unsigned>(p[0]) << 8) | p[1]);
}
inline std::uint32_t be32(const unsigned char* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}
inline std::uint64_t be64(const unsigned char* p) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}

// Integer pixels: BLANK -> NaN, else unscaled or scaled in double (CFITSIO's fffi1r4/fffi2r4/fffi4r4).
template <class T, class Load>
void convertInt(const unsigned char* src, std::size_t n, const RawImageLayout& l, float* out, Load load) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const bool noScale = l.scale == 1.0 && l.zero == 0.0;
    const double scale = l.scale, zero = l.zero;
    const bool blankFits = l.hasBlank && l.blank >= static_cast<long long>(std::numeric_limits<T>::min()) &&
                           l.blank <= static_cast<long long>(std::numeric_limits<T>::max());
    const T blank = blankFits ? static_cast<T>(l.blank) : T(0);
    constexpr std::size_t size = sizeof(T);
    if (noScale) {
        for (std::size_t i = 0; i < n; ++i) {
            const T v = load(src + i * size);
            out[i] = blankFits && v == blank ? nan : static_cast<float>(v);
        }
    } else {
        for (std::size_t i = 0; i < n; ++i) {
            const T v = load(src + i * size);
            out[i] =
                blankFits && v == blank ? nan : static_cast<float>(static_cast<double>(v) * scale + zero);
        }
    }
}

// IEEE pixels: exponent all ones (NaN, +-Inf) -> NaN; exponent zero (+-0, subnormals) -> CFITSIO's
// "underflow" value (+0, or BZERO when scaled); else the value, unscaled or scaled in double, converted
// to float as C does (a double beyond the float range becomes +-Inf, as in CFITSIO 4.2).
template <class F, class U, class Load>
void convertIeee(const unsigned char* src, std::size_t n, const RawImageLayout& l, float* out, U expMask,
                 Load load) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const bool noScale = l.scale == 1.0 && l.zero == 0.0;
    const double scale = l.scale, zero = l.zero;
    const float under = noScale ? 0.0f : static_cast<float>(zero);
    for (std::size_t i = 0; i < n; ++i) {
        const U u = load(src + sizeof(U) * i);
        const U e = u & expMask;
        if (e == expMask) {
            out[i] = nan;
        } else if (e == 0) {
            out[i] = under;
        } else {
            F v;
            std::memcpy(&v, &u, sizeof v);
            out[i] =
                noScale ? static_cast<float>(v) : static_cast<float>(static_cast<double>(v) * scale + zero);
        }
    }
}

bool startsWithSimple(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char head[9] = {};
    const ssize_t got = ::pread(fd, head, sizeof head, 0);
    ::close(fd);
    return got == static_cast<ssize_t>(sizeof head) && std::memcmp(head, "SIMPLE  =", 9) == 0;
}

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

} // namespace

void convertRawPixels(const unsigned char* src, std::size_t n, const RawImageLayout& l, float* out) {
    switch (l.bitpix) {
    case 8:
        convertInt<std::uint8_t>(src, n, l, out, [](const unsigned char* p) { return *p; });
        return;
    case 16:
        convertInt<std::int16_t>(src, n, l, out,
                                 [](const unsigned char* p) { return static_cast<std::int16_t>(be16(p)); });
        return;
    case 32:
        convertInt<std::int32_t>(src, n, l, out,
                                 [](const unsigned char* p) { return static_cast<std::int32_t>(be32(p)); });
        return;
    case -32:
        convertIeee<float, std::uint32_t>(src, n, l, out, 0x7F800000u, be32);
        return;
    case -64:
        convertIeee<double, std::uint64_t>(src, n, l, out, 0x7FF0000000000000ull, be64);
        return;
    default:
        throw InvalidInput("convertRawPixels: unsupported BITPIX " + std::to_string(l.bitpix));
    }
}

std::optional<RawImageLayout> rawImageLayout(fitsfile* f, const std::string& path, long long count) {
    int status = 0;
    if (fits_is_compressed_image(f, &status) || status) {
        fits_clear_errmsg();
        return std::nullopt;
    }
    RawImageLayout l;
    l.count = count;
    fits_get_img_type(f, &l.bitpix, &status);
    if (status) {
        fits_clear_errmsg();
        return std::nullopt;
    }
    if (l.bitpix != 8 && l.bitpix != 16 && l.bitpix != 32 && l.bitpix != -32 && l.bitpix != -64)
        return std::nullopt;
    LONGLONG headStart = 0, dataStart = 0, dataEnd = 0;
    fits_get_hduaddrll(f, &headStart, &dataStart, &dataEnd, &status);
    if (status) {
        fits_clear_errmsg();
        return std::nullopt;
    }
    l.dataOffset = dataStart;
    // Scaling and BLANK as CFITSIO parses them (the same keyword reader).
    // A missing key keeps the default; an unreadable one leaves the HDU to CFITSIO.
    auto optionalKey = [f](const char* key, double& out) {
        int st = 0;
        double v = 0.0;
        fits_read_key_dbl(f, key, &v, nullptr, &st);
        if (st == 0) out = v;
        return st == 0 || st == KEY_NO_EXIST;
    };
    if (!optionalKey("BSCALE", l.scale) || !optionalKey("BZERO", l.zero))
        return fits_clear_errmsg(), std::nullopt;
    if (l.bitpix > 0) {
        LONGLONG blank = 0;
        fits_read_key_lnglng(f, "BLANK", &blank, nullptr, &status);
        if (status == 0) {
            l.hasBlank = true;
            l.blank = blank;
        } else if (status != KEY_NO_EXIST) {
            return fits_clear_errmsg(), std::nullopt;
        }
        status = 0;
    }
    fits_clear_errmsg();
    if (!std::isfinite(l.scale) || !std::isfinite(l.zero) || l.scale == 0.0) return std::nullopt;
    // The data must lie inside the file (else CFITSIO reports the truncation), and the file must be the
    // plain FITS file CFITSIO reads from (not gzip: its offsets are in the decompressed stream).
    const long long bytes = count * (std::abs(l.bitpix) / 8);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    if (l.dataOffset < 0 || l.dataOffset + bytes > static_cast<long long>(st.st_size)) return std::nullopt;
    if (!startsWithSimple(path)) return std::nullopt;
    return l;
}

void maskPixels(const float* px, std::size_t n, const RawMaskRule& rule, std::uint8_t* mask) {
    for (std::size_t i = 0; i < n; ++i) {
        const float v = px[i];
        mask[i] = !std::isfinite(v) ? rule.nullBits
                                    : (static_cast<double>(v) >= rule.saturation ? rule.saturatedBits : 0);
    }
}

namespace {

// The smallest float f with (double) f >= s (NaN when s is): a float pixel v is saturated by maskPixels'
// rule exactly when v >= it.
float saturationThreshold(double s) {
    float t = static_cast<float>(s);
    if (static_cast<double>(t) < s) t = std::nextafter(t, std::numeric_limits<float>::infinity());
    return t;
}

template <class T> inline T loadBigEndian(const unsigned char* p) {
    if constexpr (sizeof(T) == 1) {
        return static_cast<T>(*p);
    } else if constexpr (sizeof(T) == 2) {
        std::uint16_t u;
        std::memcpy(&u, p, 2);
        return static_cast<T>(__builtin_bswap16(u));
    } else {
        std::uint32_t u;
        std::memcpy(&u, p, 4);
        return static_cast<T>(__builtin_bswap32(u));
    }
}

// Integer pixels with BSCALE 1 and an integral BZERO: v + BZERO is exact in Acc as in CFITSIO's double,
// and one rounding to float gives the same value. Converted and masked in one vectorisable pass; BLANK
// pixels (when WithBlank) become NaN with the null bits.
template <class T, class Acc, bool WithMask, bool WithBlank>
void convertIntegral(const unsigned char* src, std::size_t n, Acc zero, T blank, float thr,
                     const RawMaskRule& rule, float* out, std::uint8_t* mask) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t i = 0; i < n; ++i) {
        const T v = loadBigEndian<T>(src + i * sizeof(T));
        float f = static_cast<float>(static_cast<Acc>(v) + zero);
        if constexpr (WithBlank) f = v == blank ? nan : f;
        out[i] = f;
        if constexpr (WithMask) {
            std::uint8_t m = f >= thr ? rule.saturatedBits : std::uint8_t(0);
            if constexpr (WithBlank) m = v == blank ? rule.nullBits : m;
            mask[i] = m;
        }
    }
}

template <class T, class Acc, bool WithMask>
void convertIntegral(const unsigned char* src, std::size_t n, const RawImageLayout& l,
                     const RawMaskRule& rule, float* out, std::uint8_t* mask) {
    const float thr = saturationThreshold(rule.saturation);
    const Acc zero = static_cast<Acc>(l.zero);
    const bool blankFits = l.hasBlank && l.blank >= static_cast<long long>(std::numeric_limits<T>::min()) &&
                           l.blank <= static_cast<long long>(std::numeric_limits<T>::max());
    if (blankFits)
        convertIntegral<T, Acc, WithMask, true>(src, n, zero, static_cast<T>(l.blank), thr, rule, out, mask);
    else
        convertIntegral<T, Acc, WithMask, false>(src, n, zero, T(0), thr, rule, out, mask);
}

// The one-pass conversion (and mask, when given) of integer pixels of BSCALE 1 and an integral BZERO;
// false for any other layout (convertRawPixels and maskPixels then do it).
bool convertIntegralChunk(const unsigned char* src, std::size_t n, const RawImageLayout& l,
                          const RawMaskRule& rule, float* out, std::uint8_t* mask) {
    if (l.bitpix <= 0 || l.scale != 1.0 || l.zero != std::floor(l.zero) || std::fabs(l.zero) > 0x1p40)
        return false;
    const bool small = l.bitpix < 32 && std::fabs(l.zero) <= 0x1p30; // v + zero fits 32 bits
    auto run = [&]<class T>() {
        if (small && mask)
            convertIntegral<T, std::int32_t, true>(src, n, l, rule, out, mask);
        else if (small)
            convertIntegral<T, std::int32_t, false>(src, n, l, rule, out, mask);
        else if (mask)
            convertIntegral<T, std::int64_t, true>(src, n, l, rule, out, mask);
        else
            convertIntegral<T, std::int64_t, false>(src, n, l, rule, out, mask);
    };
    if (l.bitpix == 8)
        run.template operator()<std::uint8_t>();
    else if (l.bitpix == 16)
        run.template operator()<std::int16_t>();
    else if (l.bitpix == 32)
        run.template operator()<std::int32_t>();
    else
        return false;
    return true;
}

// A chunk converted (and masked) in pieces that stay in the core's cache between the passes.
void convertChunk(const unsigned char* src, std::size_t first, std::size_t n, const RawImageLayout& l,
                  float* out, std::uint8_t* mask, const RawMaskRule& rule) {
    constexpr std::size_t kPiece = 16384;
    const std::size_t elem = static_cast<std::size_t>(std::abs(l.bitpix) / 8);
    for (std::size_t at = 0; at < n; at += kPiece) {
        const std::size_t m = std::min(kPiece, n - at);
        float* px = out + first + at;
        std::uint8_t* mk = mask ? mask + first + at : nullptr;
        if (!convertIntegralChunk(src + at * elem, m, l, rule, px, mk)) {
            convertRawPixels(src + at * elem, m, l, px);
            if (mk) maskPixels(px, m, rule, mk);
        }
    }
}

} // namespace

void readRawImage(const std::string& path, const RawImageLayout& l, float* out, int threads,
                  std::size_t chunkBytes, RawChunkSink* sink, std::uint8_t* mask, const RawMaskRule& rule) {
    const std::size_t elem = static_cast<std::size_t>(std::abs(l.bitpix) / 8);
    if (elem == 0 || l.count < 0) throw InvalidInput(path + ": bad raw image layout");
    const std::size_t total = static_cast<std::size_t>(l.count);
    if (!chunkBytes && sink) chunkBytes = sink->chunkBytes();
    std::size_t perChunk = (chunkBytes ? chunkBytes : (std::size_t(8) << 20)) / elem;
    perChunk = std::max<std::size_t>(perChunk, 1);
    const long long chunks = static_cast<long long>((total + perChunk - 1) / perChunk);
    Fd file;
    file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (file.fd < 0) throw IoError(path + ": cannot open for reading: " + std::strerror(errno));
    if (chunks > 1)
        ::posix_fadvise(file.fd, l.dataOffset, static_cast<off_t>(total * elem), POSIX_FADV_SEQUENTIAL);
    int failedErrno = 0;
    bool failed = false;
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    // With a sink, each reader reads into the sink's buffer for it (e.g. pinned memory that the device
    // copies from while the reader converts the same bytes on the host).
    const std::vector<unsigned char*> sinkBuffers = sink ? sink->start(nt, perChunk * elem)
                                                         : std::vector<unsigned char*>{};
    if (sink && sinkBuffers.size() < static_cast<std::size_t>(nt))
        throw InvalidInput(path + ": raw read: the chunk sink gave too few buffers");
    ParallelErrors errors;
#pragma omp parallel num_threads(nt) if (chunks > 1)
    {
        const int tid = omp_get_thread_num();
        // A chunk's buffer, no larger than the image (a small frame does not zero 8 MiB per thread).
        std::vector<unsigned char> own;
        errors.run([&] { own.resize(sink ? 0 : std::min(perChunk, total) * elem); });
        unsigned char* const buf = sink ? sinkBuffers[static_cast<std::size_t>(tid)] : own.data();
#pragma omp for schedule(dynamic, 1)
        for (long long c = 0; c < chunks; ++c)
            errors.run([&] {
                bool stop = false;
#pragma omp atomic read
                stop = failed;
                if (stop) return;
                const std::size_t first = static_cast<std::size_t>(c) * perChunk;
                const std::size_t n = std::min(perChunk, total - first);
                const std::size_t want = n * elem;
                std::size_t got = 0;
                if (sink) sink->reuse(tid);
                while (got < want) {
                    const ssize_t r = ::pread(file.fd, buf + got, want - got,
                                              static_cast<off_t>(l.dataOffset + first * elem + got));
                    if (r < 0 && errno == EINTR) continue;
                    if (r <= 0) {
#pragma omp critical(gpuphot_raw_read)
                        {
                            failed = true;
                            failedErrno = r < 0 ? errno : 0;
                        }
                        break;
                    }
                    got += static_cast<std::size_t>(r);
                }
                if (got == want) {
                    if (sink) sink->chunk(tid, first, n);
                    convertChunk(buf, first, n, l, out, mask, rule);
                }
            });
    }
    errors.rethrow();
    if (failed)
        throw IoError(path + ": cannot read the pixel data" +
                      (failedErrno ? std::string(": ") + std::strerror(failedErrno)
                                   : std::string(" (truncated file?)")));
    if (sink) sink->finish();
}

} // namespace gpuphot
