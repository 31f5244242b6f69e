// DIR/series.state: what a later `gpuphot series` call appends to (SeriesState).
//
// Format 3 (written): a 32-byte header, then the payload its length and CRC-32 cover.
//   0  "GPSERIES"  magic
//   8  u32         format version (3)
//   12 u32         0x01020304 in the writer's byte order (a reader of another order refuses the file)
//   16 u64         payload bytes
//   24 u64         checksum of the payload (checksumOf)
// The payload is a sequence of fields: numbers as their native values, arrays as a u64 count then
// their elements, texts as a u64 length then their bytes. An append reads each array with one copy.
// Format 2 (read only, migrated by the next save): CBOR, its arrays as byte strings.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/atomic_file.hpp"
#include "core/series/series_output.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'G', 'P', 'S', 'E', 'R', 'I', 'E', 'S'};
constexpr std::uint32_t kVersion = 3, kByteOrder = 0x01020304u;
constexpr std::size_t kHeaderBytes = 32;
constexpr int kCborVersion = 2;

static_assert(sizeof(SeriesMeasurement) == 28 && std::is_trivially_copyable_v<SeriesMeasurement>);
static_assert(sizeof(ObserverEphemeris) == 10 * sizeof(double));

using Reason = SeriesStateError::Reason;

// Numbers per frame in the frame columns.
constexpr std::size_t kFrameNumbers = 8, kFrameCounts = 4, kFrameTexts = 6;

// A checksum of the payload: four lanes of 64-bit multiply-rotate mixing over 8-byte words (the
// scheme of XXH64's inner loop), folded together with the tail bytes and the length. It finds torn,
// truncated or overwritten files; an append reads and writes it at memory speed.
std::uint64_t checksumOf(const char* data, std::size_t n) {
    constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full;
    const auto round = [](std::uint64_t acc, std::uint64_t word) {
        acc += word * kP2;
        acc = (acc << 31) | (acc >> 33);
        return acc * kP1;
    };
    std::uint64_t lane[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
    std::size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k) {
            std::uint64_t w;
            std::memcpy(&w, data + i + 8 * k, 8);
            lane[k] = round(lane[k], w);
        }
    std::uint64_t h = static_cast<std::uint64_t>(n);
    for (int k = 0; k < 4; ++k)
        h = round(h ^ round(0, lane[k]), static_cast<std::uint64_t>(k));
    for (; i < n; ++i)
        h = round(h, static_cast<unsigned char>(data[i]));
    h ^= h >> 33;
    h *= kP2;
    return h ^ (h >> 29);
}

class Writer {
public:
    explicit Writer(std::size_t reserve) { m_buf.reserve(reserve); }
    template <class T> void put(const T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        const char* p = reinterpret_cast<const char*>(&v);
        m_buf.append(p, sizeof(T));
    }
    template <class T> void array(const std::vector<T>& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        put<std::uint64_t>(v.size());
        if (!v.empty()) m_buf.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
    }
    void raw(const void* p, std::size_t n) { m_buf.append(static_cast<const char*>(p), n); }
    void text(const std::string& s) {
        put<std::uint64_t>(s.size());
        m_buf += s;
    }
    void texts(const std::vector<std::string>& v) {
        put<std::uint64_t>(v.size());
        for (const auto& s : v)
            text(s);
    }
    std::string& buffer() { return m_buf; }

private:
    std::string m_buf;
};

class Reader {
public:
    Reader(const char* begin, const char* end, std::string what)
        : m_p(begin), m_end(end), m_what(std::move(what)) {}
    template <class T> T get() {
        T v;
        std::memcpy(&v, take(sizeof(T)), sizeof(T));
        return v;
    }
    template <class T> std::vector<T> array() {
        const std::uint64_t n = count(sizeof(T));
        std::vector<T> v(n);
        if (n) std::memcpy(v.data(), take(n * sizeof(T)), n * sizeof(T));
        return v;
    }
    // An array left where it is: its first byte and its element count.
    template <class T> std::pair<const char*, std::size_t> span() {
        const std::uint64_t n = count(sizeof(T));
        return {take(n * sizeof(T)), n};
    }
    std::string text() {
        const std::uint64_t n = count(1);
        return std::string(take(n), n);
    }
    std::vector<std::string> texts() {
        const std::uint64_t n = count(sizeof(std::uint64_t));
        std::vector<std::string> v(n);
        for (auto& s : v)
            s = text();
        return v;
    }
    bool done() const { return m_p == m_end; }
    [[noreturn]] void fail(const std::string& why) const {
        throw SeriesStateError(Reason::Corrupt, m_what + ": " + why + " (run with --fresh)");
    }

private:
    // A count of elements of `size` bytes that the rest of the payload can hold.
    std::uint64_t count(std::size_t size) {
        const std::uint64_t n = get<std::uint64_t>();
        if (n > static_cast<std::uint64_t>(m_end - m_p) / size) fail("an array runs past the end");
        return n;
    }
    const char* take(std::size_t n) {
        if (n > static_cast<std::size_t>(m_end - m_p)) fail("a field runs past the end");
        const char* p = m_p;
        m_p += n;
        return p;
    }
    const char* m_p;
    const char* m_end;
    std::string m_what;
};

void putFrames(Writer& w, const std::vector<SeriesFrame>& frames) {
    std::vector<double> num;
    std::vector<std::uint64_t> count;
    num.reserve(kFrameNumbers * frames.size());
    count.reserve(kFrameCounts * frames.size());
    for (const auto& f : frames) {
        const ObservingSite site = f.site.value_or(ObservingSite{NAN, NAN, NAN, ""});
        num.insert(num.end(), {f.mjdMid, f.exptime, f.airmass, f.fwhm, f.zeroPoint, site.latitude,
                               site.longitude, site.elevation});
        count.insert(count.end(), {f.detections, f.matched, f.used ? 1u : 0u, f.site ? 1u : 0u});
    }
    w.put<std::uint64_t>(frames.size());
    w.array(num);
    w.array(count);
    for (const auto& f : frames)
        for (const std::string* s :
             {&f.path, &f.filter, &f.object, &f.problem, f.site ? &f.site->source : nullptr, &f.sourceFrame})
            w.text(s ? *s : std::string());
}

std::vector<SeriesFrame> getFrames(Reader& r) {
    const std::uint64_t n = r.get<std::uint64_t>();
    const auto num = r.array<double>();
    const auto count = r.array<std::uint64_t>();
    if (num.size() != kFrameNumbers * n || count.size() != kFrameCounts * n) r.fail("frames do not fit");
    std::vector<SeriesFrame> out(n);
    for (std::size_t i = 0; i < n; ++i) {
        SeriesFrame& f = out[i];
        const double* v = &num[kFrameNumbers * i];
        const std::uint64_t* c = &count[kFrameCounts * i];
        f.mjdMid = v[0];
        f.exptime = v[1];
        f.airmass = v[2];
        f.fwhm = v[3];
        f.zeroPoint = v[4];
        f.detections = c[0];
        f.matched = c[1];
        f.used = c[2] != 0;
        f.path = r.text();
        f.filter = r.text();
        f.object = r.text();
        f.problem = r.text();
        std::string siteSource = r.text();
        if (c[3]) f.site = ObservingSite{v[5], v[6], v[7], std::move(siteSource)};
        f.sourceFrame = r.text();
    }
    return out;
}

// The state's parts that must agree: sizes per source, per used frame and per target.
void checkConsistent(const SeriesState& st, const std::string& what) {
    const std::size_t ns = st.xiSum.size();
    bool ok = st.etaSum.size() == ns && st.matched.size() == ns && st.medianFlux.size() == ns &&
              st.medianMagCal.size() == ns && st.observers.size() == st.used.size();
    for (std::size_t u : st.used)
        ok = ok && u < st.frames.size();
    for (const auto& t : st.targets) {
        ok = ok && t.notes.size() == t.sources.size() && t.meas.size() == st.used.size();
        for (std::size_t s : t.sources)
            ok = ok && s < ns;
    }
    if (!ok) throw SeriesStateError(Reason::Corrupt, what + ": inconsistent series state (run with --fresh)");
}

// The payload behind kHeaderBytes of room for the header.
std::string payloadOf(const SeriesState& st) {
    std::size_t bytes = kHeaderBytes + 256 + st.fingerprint.size() + st.xiSum.size() * 36 +
                        st.used.size() * (8 + sizeof(ObserverEphemeris)) + st.frames.size() * 200;
    for (const auto& t : st.targets)
        bytes += 64 + t.sources.size() * (40 + st.used.size() * sizeof(SeriesMeasurement));
    Writer w(bytes);
    w.buffer().resize(kHeaderBytes);
    w.text(st.fingerprint);
    w.text(st.filter);
    w.put(st.ra0);
    w.put(st.dec0);
    w.array(st.xiSum);
    w.array(st.etaSum);
    w.array(st.matched);
    w.array(st.medianFlux);
    w.array(st.medianMagCal);
    w.array(std::vector<std::uint64_t>(st.used.begin(), st.used.end()));
    w.array(st.observers);
    putFrames(w, st.frames);
    w.put<std::uint64_t>(st.targets.size());
    for (const auto& t : st.targets) { // the measurements as one array, row after row
        w.array(std::vector<std::uint64_t>(t.sources.begin(), t.sources.end()));
        w.texts(t.notes);
        std::uint64_t n = 0;
        for (const auto& row : t.meas)
            n += row.size();
        w.put(n);
        for (const auto& row : t.meas)
            w.raw(row.data(), row.size() * sizeof(SeriesMeasurement));
    }
    return std::move(w.buffer());
}

SeriesState stateFrom(Reader& r) {
    SeriesState st;
    st.fingerprint = r.text();
    st.filter = r.text();
    st.ra0 = r.get<double>();
    st.dec0 = r.get<double>();
    st.xiSum = r.array<double>();
    st.etaSum = r.array<double>();
    st.matched = r.array<int>();
    st.medianFlux = r.array<double>();
    st.medianMagCal = r.array<double>();
    for (std::uint64_t u : r.array<std::uint64_t>())
        st.used.push_back(u);
    st.observers = r.array<ObserverEphemeris>();
    st.frames = getFrames(r);
    return st;
}

void targetsFrom(Reader& r, SeriesState& st) {
    const std::uint64_t n = r.get<std::uint64_t>();
    for (std::uint64_t k = 0; k < n; ++k) {
        SeriesState::Target tg;
        for (std::uint64_t s : r.array<std::uint64_t>())
            tg.sources.push_back(s);
        tg.notes = r.texts();
        const std::size_t nk = tg.sources.size();
        const auto [flat, n] = r.span<SeriesMeasurement>();
        if (n != nk * st.used.size()) r.fail("measurements do not fit");
        tg.meas.resize(st.used.size());
        for (std::size_t u = 0; u < st.used.size(); ++u) {
            tg.meas[u].resize(nk);
            if (nk)
                std::memcpy(tg.meas[u].data(), flat + u * nk * sizeof(SeriesMeasurement),
                            nk * sizeof(SeriesMeasurement));
        }
        st.targets.push_back(std::move(tg));
    }
}

// Format 3 from the whole file.
SeriesState readBinary(const std::string& bytes, const std::string& what) {
    if (bytes.size() < kHeaderBytes)
        throw SeriesStateError(Reason::Truncated, what + ": truncated series state (run with --fresh)");
    std::uint32_t version, order;
    std::uint64_t size, sum;
    std::memcpy(&version, &bytes[8], 4);
    std::memcpy(&order, &bytes[12], 4);
    std::memcpy(&size, &bytes[16], 8);
    std::memcpy(&sum, &bytes[24], 8);
    if (order != kByteOrder)
        throw SeriesStateError(Reason::OtherVersion,
                               what + ": a series state of another byte order (run with --fresh)");
    if (version != kVersion)
        throw SeriesStateError(Reason::OtherVersion, what + ": a series state of format " +
                                                         std::to_string(version) + ", not " +
                                                         std::to_string(kVersion) + " (run with --fresh)");
    if (size != bytes.size() - kHeaderBytes)
        throw SeriesStateError(Reason::Truncated, what + ": truncated series state: " +
                                                      std::to_string(bytes.size() - kHeaderBytes) + " of " +
                                                      std::to_string(size) + " bytes (run with --fresh)");
    if (checksumOf(bytes.data() + kHeaderBytes, size) != sum)
        throw SeriesStateError(
            Reason::Corrupt, what + ": corrupt series state: its checksum does not match (run with --fresh)");
    Reader r(bytes.data() + kHeaderBytes, bytes.data() + bytes.size(), what);
    SeriesState st = stateFrom(r);
    targetsFrom(r, st);
    if (!r.done()) r.fail("bytes after the last field");
    return st;
}

// Format 2 (CBOR): arrays as byte strings of their native values.
template <class T> std::vector<T> unblob(const nlohmann::json& j, const std::string& what) {
    const auto& bytes = j.get_binary();
    if (bytes.size() % sizeof(T) != 0) throw SeriesStateError(Reason::Corrupt, what + ": a truncated array");
    std::vector<T> v(bytes.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
}

std::vector<SeriesFrame> cborFrames(const nlohmann::json& j, const std::string& what) {
    const std::size_t n = j.at("n").get<std::size_t>();
    const auto num = unblob<double>(j.at("num"), what);
    const auto count = unblob<std::uint64_t>(j.at("count"), what);
    const auto text = j.at("text").get<std::vector<std::string>>();
    if (num.size() != 8 * n || count.size() != 4 * n || text.size() != 5 * n)
        throw SeriesStateError(Reason::Corrupt, what + ": frames do not fit (run with --fresh)");
    std::vector<SeriesFrame> out(n);
    for (std::size_t i = 0; i < n; ++i) {
        SeriesFrame& f = out[i];
        const double* v = &num[8 * i];
        const std::uint64_t* c = &count[4 * i];
        const std::string* t = &text[5 * i];
        f.mjdMid = v[0];
        f.exptime = v[1];
        f.airmass = v[2];
        f.fwhm = v[3];
        f.zeroPoint = v[4];
        if (c[3]) f.site = ObservingSite{v[5], v[6], v[7], t[4]};
        f.detections = c[0];
        f.matched = c[1];
        f.used = c[2] != 0;
        f.path = t[0];
        f.filter = t[1];
        f.object = t[2];
        f.problem = t[3];
    }
    return out;
}

SeriesState readCbor(const std::string& bytes, const std::string& what) {
    nlohmann::json j;
    try {
        j = nlohmann::json::from_cbor(bytes);
    } catch (const nlohmann::json::exception& e) {
        throw SeriesStateError(Reason::NotAState,
                               what + ": not a series state (" + e.what() + "); run with --fresh");
    }
    try {
        if (!j.is_object())
            throw SeriesStateError(Reason::NotAState, what + ": not a series state (run with --fresh)");
        if (j.at("version").get<int>() != kCborVersion)
            throw SeriesStateError(Reason::OtherVersion,
                                   what + ": a series state of another version (run with --fresh)");
        if (j.at("endian").get<std::string>() != "little")
            throw SeriesStateError(Reason::OtherVersion, what + ": another byte order (run with --fresh)");
        SeriesState st;
        st.fingerprint = j.at("fingerprint").get<std::string>();
        st.filter = j.at("filter").get<std::string>();
        st.ra0 = j.at("ra0").get<double>();
        st.dec0 = j.at("dec0").get<double>();
        st.xiSum = unblob<double>(j.at("xi"), what);
        st.etaSum = unblob<double>(j.at("eta"), what);
        st.matched = unblob<int>(j.at("matched"), what);
        st.medianFlux = unblob<double>(j.at("flux"), what);
        st.medianMagCal = unblob<double>(j.at("magcal"), what);
        for (std::uint64_t u : unblob<std::uint64_t>(j.at("used"), what))
            st.used.push_back(u);
        st.observers = unblob<ObserverEphemeris>(j.at("observers"), what);
        st.frames = cborFrames(j.at("frames"), what);
        for (const auto& t : j.at("targets")) {
            SeriesState::Target tg;
            for (std::uint64_t s : unblob<std::uint64_t>(t.at("sources"), what))
                tg.sources.push_back(s);
            tg.notes = t.at("notes").get<std::vector<std::string>>();
            const auto flat = unblob<SeriesMeasurement>(t.at("meas"), what);
            const std::size_t nk = tg.sources.size();
            if (flat.size() != nk * st.used.size())
                throw SeriesStateError(Reason::Corrupt,
                                       what + ": measurements do not fit (run with --fresh)");
            for (std::size_t u = 0; u < st.used.size(); ++u)
                tg.meas.emplace_back(flat.begin() + static_cast<long>(u * nk),
                                     flat.begin() + static_cast<long>((u + 1) * nk));
            st.targets.push_back(std::move(tg));
        }
        return st;
    } catch (const nlohmann::json::exception& e) {
        throw SeriesStateError(Reason::NotAState,
                               what + ": not a series state (" + e.what() + "); run with --fresh");
    }
}

std::string statePath(const std::string& dir) {
    return (fs::path(dir.empty() ? "." : dir) / "series.state").string();
}

} // namespace

std::string seriesStateBytes(const SeriesState& st) {
    std::string out = payloadOf(st); // behind kHeaderBytes left blank
    const std::uint64_t size = out.size() - kHeaderBytes;
    const std::uint64_t sum = checksumOf(out.data() + kHeaderBytes, size);
    std::memcpy(&out[0], kMagic, 8);
    std::memcpy(&out[8], &kVersion, 4);
    std::memcpy(&out[12], &kByteOrder, 4);
    std::memcpy(&out[16], &size, 8);
    std::memcpy(&out[24], &sum, 8);
    return out;
}

SeriesState parseSeriesState(const std::string& bytes, const std::string& what) {
    SeriesState st = bytes.size() >= 8 && std::memcmp(bytes.data(), kMagic, 8) == 0 ? readBinary(bytes, what)
                                                                                    : readCbor(bytes, what);
    checkConsistent(st, what);
    return st;
}

void saveSeriesState(const SeriesState& state, const std::string& dir) {
    writeTextFileAtomic(statePath(dir), seriesStateBytes(state));
}

std::optional<SeriesState> loadSeriesState(const std::string& dir) {
    const std::string path = statePath(dir);
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return std::nullopt;
    std::string bytes;
    bool failed = std::fseek(f, 0, SEEK_END) != 0;
    const long size = failed ? -1 : std::ftell(f);
    failed = failed || size < 0 || std::fseek(f, 0, SEEK_SET) != 0;
    if (!failed) {
        bytes.resize(static_cast<std::size_t>(size));
        failed = std::fread(bytes.data(), 1, bytes.size(), f) != bytes.size();
    }
    std::fclose(f);
    if (failed) throw IoError(path + ": cannot read the series state");
    return parseSeriesState(bytes, path);
}

} // namespace gpuphot
