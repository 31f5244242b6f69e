#include "core/sim/sim_mosaic.hpp"

#include <fitsio.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <numbers>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/io/atomic_file.hpp"
#include "core/io/cfitsio_util.hpp"
#include "core/io/fits_table.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_random.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"

namespace gpuphot {
namespace {

constexpr double kDeg = std::numbers::pi / 180.0;
constexpr std::uint64_t kStreamMosaic = 0x4D4F534149430001ull; // per-CCD gains, offsets, rotations
constexpr double kDuplicateArcsec = 0.5;                       // reference rows closer than this are one star
constexpr int kGuideStarsPerCcd = 3;

template <class P, class F> void visitFields(P& m, F&& f) {
    f("ccds", m.ccds);
    f("columns", m.columns);
    f("gapPx", m.gapPx);
    f("gainSpread", m.gainSpread);
    f("zpSpread", m.zpSpread);
    f("rotationSpreadDeg", m.rotationSpreadDeg);
    f("badCcd", m.badCcd);
    f("badCcdOffset", m.badCcdOffset);
    f("compressed", m.compressed);
    f("tableExtension", m.tableExtension);
}

void require(bool ok, const std::string& what) {
    if (!ok) throw InvalidInput("mosaic simulation: " + what);
}

// A CCD's own seed from the exposure's: distinct per CCD and never 0 (0 means "derive" in SimParams).
std::uint64_t ccdSeed(std::uint64_t exposureSeed, std::uint64_t salt, int number) {
    const std::uint64_t s = sim::splitMix64(sim::splitMix64(exposureSeed ^ salt) +
                                            static_cast<std::uint64_t>(number) * 0x9E3779B97F4A7C15ull);
    return s != 0 ? s : 1;
}

std::string extnameOf(int number) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "CCD%02d", number);
    return buf;
}

// The shared tangent plane about the pointing: focal-plane pixels (from the pointing) <-> sky.
struct FocalPlane {
    double ra0 = 0.0, dec0 = 0.0;
    double cd[2][2] = {{0, 0}, {0, 0}}; // deg/px, as a single frame's CD with the exposure's rotation
    explicit FocalPlane(const SimParams& p) : ra0(p.ra), dec0(p.dec) {
        SimParams flat = p;
        flat.sipOrder = 0;
        const TanSip w = makeTrueWcs(flat);
        std::copy(&w.cd[0][0], &w.cd[0][0] + 4, &cd[0][0]);
    }
    void toSky(double fx, double fy, double& ra, double& dec) const {
        tanDeproject(ra0, dec0, cd[0][0] * fx + cd[0][1] * fy, cd[1][0] * fx + cd[1][1] * fy, ra, dec);
    }
    bool toFocal(double ra, double dec, double& fx, double& fy) const {
        double xi = 0.0, eta = 0.0;
        if (!tanProject(ra0, dec0, ra, dec, xi, eta)) return false;
        const double det = cd[0][0] * cd[1][1] - cd[0][1] * cd[1][0];
        fx = (cd[1][1] * xi - cd[0][1] * eta) / det;
        fy = (-cd[1][0] * xi + cd[0][0] * eta) / det;
        return true;
    }
    // Position angle (deg, east of north) of the focal plane's +y direction at (fx, fy).
    double upAngle(double fx, double fy) const {
        double ra1, dec1, ra2, dec2;
        toSky(fx, fy - 1.0, ra1, dec1);
        toSky(fx, fy + 1.0, ra2, dec2);
        const double d1 = dec1 * kDeg, d2 = dec2 * kDeg, dra = (ra2 - ra1) * kDeg;
        return std::atan2(std::sin(dra) * std::cos(d2),
                          std::cos(d1) * std::sin(d2) - std::sin(d1) * std::cos(d2) * std::cos(dra)) /
               kDeg;
    }
};

// Offsets drawn per CCD, the bad CCD's set to badCcdOffset, then the median subtracted.
void assignZeroPointOffsets(const MosaicSimParams& m, std::vector<MosaicCcd>& ccds,
                            std::vector<double> draws) {
    if (m.badCcd >= 1) draws[static_cast<std::size_t>(m.badCcd - 1)] = m.badCcdOffset;
    std::vector<double> sorted = draws;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    for (std::size_t i = 0; i < n; ++i)
        ccds[i].zpOffset = draws[i] - median;
}

// The CCD's place in the layout and in the tangent plane.
void placeCcd(const MosaicSimParams& m, int columns, int rows, MosaicCcd& c) {
    const int k = c.number - 1;
    c.row = k / columns;
    c.column = k % columns;
    const int inRow = std::min(columns, m.ccds - c.row * columns);
    const double shift = 0.5 * (columns - inRow); // a partly filled last row is centred
    c.focalX = (c.column + shift - 0.5 * (columns - 1)) * (m.ccd.width + m.gapPx);
    c.focalY = (0.5 * (rows - 1) - c.row) * (m.ccd.height + m.gapPx);
}

nlohmann::json ccdJson(const MosaicCcd& c, bool compressed) {
    return {{"number", c.number},
            {"extname", c.extname},
            {"hdu", c.hdu},
            {"row", c.row},
            {"column", c.column},
            {"focal_x", c.focalX},
            {"focal_y", c.focalY},
            {"gain", c.gain},
            {"zp_offset", c.zpOffset},
            {"zero_point", c.params.zeroPoint},
            {"rotation", c.rotation},
            {"position_angle", c.positionAngle},
            {"ra", c.ra},
            {"dec", c.dec},
            {"bad", c.bad},
            {"compressed", compressed},
            {"seed", c.params.seed},
            {"field_seed", c.params.fieldSeed}};
}

nlohmann::json truthJson(const MosaicTruth& t, const std::string& name) {
    nlohmann::json j;
    j["exposure"] = {{"zero_point", t.zeroPoint},
                     {"ra", t.params.ccd.ra},
                     {"dec", t.params.ccd.dec},
                     {"ccds", t.params.ccds},
                     {"columns", t.columns},
                     {"rows", t.rows},
                     {"mjd", t.params.ccd.mjd},
                     {"exptime", t.params.ccd.exptime},
                     {"filter", t.params.ccd.filter},
                     {"file", name + ".fits"},
                     {"reference", name + ".ref.fits"},
                     {"truth", name + ".truth.fits"},
                     {"truth_rows", t.truthRows},
                     {"reference_rows", t.referenceRows}};
    j["mosaic"] = t.params;
    j["ccd_params"] = t.params.ccd;
    const auto& comp = t.params.compressed;
    for (const auto& c : t.ccds)
        j["ccds"].push_back(ccdJson(c, std::find(comp.begin(), comp.end(), c.number) != comp.end()));
    return j;
}

} // namespace

void validate(const MosaicSimParams& m) {
    validate(m.ccd);
    require(m.ccds >= 1 && m.ccds <= 999, "ccds must be in [1, 999]");
    require(m.columns >= 0 && m.columns <= m.ccds, "columns must be in [0, ccds]");
    require(std::isfinite(m.gapPx) && m.gapPx >= 0.0 && m.gapPx <= 1.0e5, "gapPx must be in [0, 100000] px");
    require(std::isfinite(m.gainSpread) && m.gainSpread >= 0.0 && m.gainSpread < 0.5,
            "gainSpread must be in [0, 0.5)");
    require(std::isfinite(m.zpSpread) && m.zpSpread >= 0.0 && m.zpSpread <= 2.0,
            "zpSpread must be in [0, 2] mag");
    require(std::isfinite(m.rotationSpreadDeg) && m.rotationSpreadDeg >= 0.0 && m.rotationSpreadDeg <= 10.0,
            "rotationSpreadDeg must be in [0, 10] deg");
    require(m.badCcd == -1 || (m.badCcd >= 1 && m.badCcd <= m.ccds), "badCcd must be -1 or in [1, ccds]");
    require(std::isfinite(m.badCcdOffset) && std::fabs(m.badCcdOffset) <= 10.0,
            "badCcdOffset must be in [-10, 10] mag");
    for (int c : m.compressed)
        require(c >= 1 && c <= m.ccds, "compressed CCD numbers must be in [1, ccds]");
    // The focal plane must stay well inside the tangent plane's hemisphere.
    int cols = 0, rows = 0;
    mosaicGrid(m, cols, rows);
    const double halfDiagDeg = 0.5 *
                               std::hypot(cols * (m.ccd.width + m.gapPx), rows * (m.ccd.height + m.gapPx)) *
                               m.ccd.pixelScale / 3600.0;
    require(halfDiagDeg < 30.0, "the mosaic must span less than 60 degrees");
}

void to_json(nlohmann::json& j, const MosaicSimParams& m) {
    j = nlohmann::json::object();
    visitFields(m, [&](const char* k, const auto& v) { j[k] = v; });
}

void from_json(const nlohmann::json& j, MosaicSimParams& m) {
    if (!j.is_object()) throw InvalidInput("mosaic simulation: the parameters must be a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it) {
        bool known = false;
        visitFields(m, [&](const char* k, auto& v) {
            if (it.key() != k) return;
            known = true;
            try {
                it.value().get_to(v);
            } catch (const nlohmann::json::exception&) {
                throw InvalidInput(std::string("mosaic simulation: '") + k + "' has the wrong type");
            }
        });
        if (!known) throw InvalidInput("mosaic simulation: unknown parameter '" + it.key() + "'");
    }
}

void mosaicGrid(const MosaicSimParams& m, int& columns, int& rows) {
    columns = m.columns;
    if (columns <= 0) { // the footprint nearest a square: columns * (w + gap) ~ rows * (h + gap)
        const double aspect = (m.ccd.height + m.gapPx) / std::max(1.0, m.ccd.width + m.gapPx);
        columns = static_cast<int>(std::lround(std::sqrt(m.ccds * aspect)));
    }
    columns = std::clamp(columns, 1, std::max(1, m.ccds));
    rows = (m.ccds + columns - 1) / columns;
}

std::vector<MosaicCcd> planMosaic(const MosaicSimParams& m) {
    validate(m);
    int columns = 0, rows = 0;
    mosaicGrid(m, columns, rows);
    const FocalPlane plane(m.ccd);
    const std::uint64_t field = fieldSeedOf(m.ccd);
    sim::SimRng rng(field, kStreamMosaic);
    std::vector<MosaicCcd> ccds(static_cast<std::size_t>(m.ccds));
    std::vector<double> zpDraws(ccds.size());
    for (std::size_t i = 0; i < ccds.size(); ++i) {
        MosaicCcd& c = ccds[i];
        c.number = static_cast<int>(i) + 1;
        c.extname = extnameOf(c.number);
        c.hdu = c.number;
        c.bad = c.number == m.badCcd;
        // Three draws per CCD, always, so that one spread does not move the others' values.
        const double g = rng.normal(), z = rng.normal(), r = rng.normal();
        c.gain = m.ccd.gain * std::max(0.25, 1.0 + m.gainSpread * g);
        zpDraws[i] = m.zpSpread * z;
        c.rotation = m.rotationSpreadDeg * r;
        placeCcd(m, columns, rows, c);
        plane.toSky(c.focalX, c.focalY, c.ra, c.dec);
        c.positionAngle = plane.upAngle(c.focalX, c.focalY) + c.rotation;
    }
    assignZeroPointOffsets(m, ccds, zpDraws);
    for (MosaicCcd& c : ccds) {
        SimParams& p = c.params;
        p = m.ccd;
        p.seed = ccdSeed(m.ccd.seed, 0x5EEDull, c.number);
        p.fieldSeed = ccdSeed(field, 0xF1E1Dull, c.number);
        if (m.ccd.detectorSeed != 0) p.detectorSeed = ccdSeed(m.ccd.detectorSeed, 0xDE7ull, c.number);
        p.ra = c.ra;
        p.dec = c.dec;
        p.rotation = c.positionAngle;
        p.gain = c.gain;
        p.zeroPoint = m.ccd.zeroPoint + c.zpOffset;
        p.object = m.ccd.object;
    }
    return ccds;
}

namespace {

// ---- simulating CCDs on worker threads, handed to the writer in order ------------------------------

// Workers take CCDs in order and simulate each one single-threaded (several threads each when there are
// fewer CCDs than threads); the writer take()s them in order. A worker does not start a CCD more than
// `window` ahead of the writer, so only a few CCDs are in memory at once.
class CcdPipeline {
public:
    CcdPipeline(const std::vector<MosaicCcd>& ccds, RunContext& ctx) : m_ccds(ccds), m_ctx(ctx) {
        const int threads = ctx.threadCount();
        const int workers = std::min<int>(threads, static_cast<int>(ccds.size()));
        m_threadsPerCcd = std::max(1, threads / std::max(1, workers));
        m_window = static_cast<std::size_t>(workers) + 2;
        if (workers <= 1) return; // simulated by take() on the calling thread
        for (int i = 0; i < workers; ++i)
            m_threads.emplace_back([this] { work(); });
    }
    ~CcdPipeline() {
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_stop = true;
        }
        m_cv.notify_all();
        for (auto& t : m_threads)
            t.join();
    }
    CcdPipeline(const CcdPipeline&) = delete;
    CcdPipeline& operator=(const CcdPipeline&) = delete;

    SimResult take(std::size_t k) {
        if (m_threads.empty()) return simulate(k);
        std::unique_lock<std::mutex> lock(m_mutex);
        m_cv.wait(lock, [&] { return m_error || m_ready.count(k) > 0; });
        if (m_error) std::rethrow_exception(m_error);
        SimResult r = std::move(m_ready[k]);
        m_ready.erase(k);
        m_taken = k + 1;
        m_cv.notify_all();
        return r;
    }

private:
    SimResult simulate(std::size_t k) {
        RunContext c;
        c.backend = Backend::Cpu;
        c.threads = m_threadsPerCcd;
        c.cancelFlag = m_ctx.cancelFlag;
        return simulateField(m_ccds[k].params, &c);
    }
    void work() {
        for (;;) {
            std::size_t k;
            {
                std::unique_lock<std::mutex> lock(m_mutex);
                m_cv.wait(lock, [&] {
                    return m_stop || m_error || m_next >= m_ccds.size() || m_next < m_taken + m_window;
                });
                if (m_stop || m_error || m_next >= m_ccds.size()) return;
                k = m_next++;
            }
            try {
                SimResult r = simulate(k);
                std::lock_guard<std::mutex> lock(m_mutex);
                m_ready.emplace(k, std::move(r));
            } catch (...) {
                std::lock_guard<std::mutex> lock(m_mutex);
                if (!m_error) m_error = std::current_exception();
            }
            m_cv.notify_all();
        }
    }

    const std::vector<MosaicCcd>& m_ccds;
    RunContext& m_ctx;
    int m_threadsPerCcd = 1;
    std::size_t m_window = 1, m_next = 0, m_taken = 0;
    std::mutex m_mutex;
    std::condition_variable m_cv;
    std::map<std::size_t, SimResult> m_ready;
    std::exception_ptr m_error;
    bool m_stop = false;
    std::vector<std::thread> m_threads;
};

// ---- the multi-extension FITS file ------------------------------------------------------------------

bool isStructural(const std::string& k) {
    static const char* exact[] = {"SIMPLE", "BITPIX", "NAXIS",    "EXTEND", "BZERO",    "BSCALE",  "BLANK",
                                  "PCOUNT", "GCOUNT", "XTENSION", "END",    "CHECKSUM", "DATASUM", "EXTNAME"};
    for (const char* e : exact)
        if (k == e) return true;
    return k.size() > 5 && k.compare(0, 5, "NAXIS") == 0;
}

void writeCards(fitsfile* f, const Header& h, int& status) {
    for (const HeaderCard& c : h.cards()) {
        if (status) return;
        if (isStructural(c.key)) continue;
        if (c.key == "COMMENT")
            fits_write_comment(f, c.comment.c_str(), &status);
        else if (c.key == "HISTORY")
            fits_write_history(f, c.comment.c_str(), &status);
        else if (!c.value.empty() && c.value.front() == '\'' && 10 + c.value.size() > 80)
            fits_update_key_longstr(f, c.key.c_str(), unquoteFitsString(c.value).c_str(), c.comment.c_str(),
                                    &status);
        else
            fits_write_record(f, Header::formatCard(c).c_str(), &status);
    }
}

// Writes the MEF to a temporary name, HDU by HDU; commit() closes and renames it.
class MosaicFile {
public:
    MosaicFile(const std::string& path, int bitpix) : m_out(path), m_bitpix(bitpix) {
        int status = 0;
        fits_clear_errmsg();
        fits_create_file(&m_h.f, ("!" + m_out.tempPath()).c_str(), &status);
        if (status) {
            m_h.f = nullptr;
            fail(status);
        }
    }
    void primary(const Header& h) {
        int status = 0;
        fits_create_img(m_h.f, BYTE_IMG, 0, nullptr, &status);
        writeCards(m_h.f, h, status);
        check(status);
    }
    void image(const MosaicCcd& c, const SimResult& r, bool compress) {
        int status = 0;
        if (compress) {
            // Rice for the integers; floats losslessly (GZIP_2 tiles, no quantisation), as fits_image does.
            fits_set_compression_type(m_h.f, m_bitpix == -32 ? GZIP_2 : RICE_1, &status);
            if (m_bitpix == -32) fits_set_quantize_level(m_h.f, 0.0f, &status);
        }
        long naxes[2] = {r.image.width(), r.image.height()};
        fits_create_img(m_h.f, m_bitpix == -32 ? FLOAT_IMG : USHORT_IMG, 2, naxes, &status);
        fits_write_key_str(m_h.f, "EXTNAME", c.extname.c_str(), "extension name", &status);
        writeCards(m_h.f, r.header, status);
        if (!status) writePixels(r.image, status);
        if (compress)
            fits_set_compression_type(m_h.f, 0,
                                      &status); // 0, not NOCOMPRESS (-1): CFITSIO would try to use -1
        check(status);
    }
    void table(const Table& t);
    void commit() {
        const int status = m_h.close();
        check(status);
        m_out.commit();
    }

private:
    void writePixels(const Image<float>& img, int& status) {
        const int w = img.width();
        std::vector<unsigned short> u16(m_bitpix == -32 ? 0 : static_cast<std::size_t>(w));
        for (int y = 0; y < img.height() && !status; ++y) {
            const long long first = static_cast<long long>(y) * w + 1;
            if (m_bitpix == -32) {
                fits_write_img(m_h.f, TFLOAT, first, w, const_cast<float*>(img.row(y)), &status);
                continue;
            }
            const float* src = img.row(y);
            for (int x = 0; x < w; ++x) // rounded half away from zero and clipped, as writeFitsImage does
                u16[x] = static_cast<unsigned short>(
                    std::clamp(std::round(static_cast<double>(src[x])), 0.0, 65535.0));
            fits_write_img(m_h.f, TUSHORT, first, w, u16.data(), &status);
        }
    }
    void check(int status) {
        if (status) fail(status);
    }
    [[noreturn]] void fail(int status) {
        throw IoError("cannot write " + m_out.finalPath() + ": " + cfitsioText(status));
    }

    AtomicOutput m_out; // declared first: the handle closes before a failed output is removed
    FitsHandle m_h;
    int m_bitpix;
};

void MosaicFile::table(const Table& t) {
    int status = 0;
    const auto& cols = t.columns();
    std::vector<std::string> names, forms;
    for (const Column& c : cols) {
        names.push_back(c.name);
        forms.push_back(std::holds_alternative<std::vector<double>>(c.data) ? "D" : "K");
    }
    std::vector<char*> tt, tf;
    for (std::size_t i = 0; i < cols.size(); ++i) {
        tt.push_back(names[i].data());
        tf.push_back(forms[i].data());
    }
    fits_create_tbl(m_h.f, BINARY_TBL, 0, static_cast<int>(cols.size()), tt.data(), tf.data(), nullptr,
                    t.name.c_str(), &status);
    const long long n = static_cast<long long>(t.rows());
    for (std::size_t i = 0; i < cols.size() && !status && n > 0; ++i) {
        if (auto* d = std::get_if<std::vector<double>>(&cols[i].data))
            fits_write_col(m_h.f, TDOUBLE, static_cast<int>(i) + 1, 1, 1, n, const_cast<double*>(d->data()),
                           &status);
        else
            fits_write_col(m_h.f, TLONGLONG, static_cast<int>(i) + 1, 1, 1, n,
                           const_cast<std::int64_t*>(cols[i].as<std::int64_t>().data()), &status);
    }
    check(status);
}

// The empty primary HDU's keywords: the exposure's observation keywords and pointing.
Header primaryHeader(const MosaicSimParams& m, int columns, int rows) {
    const SimParams& p = m.ccd;
    Header h;
    h.set("NEXTEND", m.ccds + (m.tableExtension ? 1 : 0), "number of extensions");
    h.set("NCCD", m.ccds, "CCDs in this exposure");
    h.set("OBJECT", p.object, "target");
    h.set("TELESCOP", "GPUPHOT-SIM", "simulated telescope");
    h.set("INSTRUME", "SIMMOSAIC", "simulated mosaic camera");
    h.set("FILTER", p.filter, "filter");
    h.set("EXPTIME", p.exptime, "[s] exposure time");
    h.set("DATE-OBS", mjdToIso(p.mjd), "UTC start of exposure");
    h.set("MJD-OBS", p.mjd, "[d] MJD at the start of exposure");
    h.set("AIRMASS", p.airmass, "airmass");
    h.set("RA", p.ra, "[deg] pointing (centre of the focal plane)");
    h.set("DEC", p.dec, "[deg] pointing (centre of the focal plane)");
    h.set("EQUINOX", 2000.0, "equinox of the coordinates");
    h.set("MOSCOLS", columns, "CCD columns in the layout");
    h.set("MOSROWS", rows, "CCD rows in the layout");
    h.set("MOSGAP", m.gapPx, "[px] gap between CCDs");
    h.set("SIMULATD", true, "simulated by gpuphot simulate --mosaic");
    h.set("SIMSEED", static_cast<long long>(p.seed), "exposure seed");
    h.set("SIMZP", p.zeroPoint, "[mag] true exposure ZP (median of the CCDs')");
    h.addHistory("simulated by gpuphot " GPUPHOT_VERSION " (gpuphot simulate --mosaic)");
    return h;
}

// The mosaic keywords a CCD's header gets on top of the simulator's.
void addCcdKeywords(const MosaicSimParams& m, const MosaicCcd& c, Header& h) {
    h.set("CCDNUM", c.number, "CCD number (1-based)");
    char pos[32];
    std::snprintf(pos, sizeof pos, "R%dC%d", c.row + 1, c.column + 1);
    h.set("DETPOS", pos, "row and column in the mosaic layout (row 1 at the top)");
    const double x0 = c.focalX - 0.5 * (m.ccd.width - 1), y0 = c.focalY - 0.5 * (m.ccd.height - 1);
    char sec[96];
    std::snprintf(sec, sizeof sec, "[%ld:%ld,%ld:%ld]", std::lround(x0), std::lround(x0) + m.ccd.width - 1,
                  std::lround(y0), std::lround(y0) + m.ccd.height - 1);
    h.set("DETSEC", sec, "CCD in focal-plane pixels from the pointing");
    h.set("SIMZPOFF", c.zpOffset, "[mag] true ZP offset: SIMZP = exposure ZP + this");
    h.set("SIMEXPZP", m.ccd.zeroPoint, "[mag] true exposure ZP");
    h.set("SIMCROT", c.rotation, "[deg] the CCD's own rotation");
    h.set("SIMBADCC", c.bad, "the CCD with a large ZP offset");
}

// ---- truth and reference unions ---------------------------------------------------------------------

// Appends rows `rows` of src to dst, column by column (dst takes src's columns when it has none).
void appendRows(Table& dst, const Table& src, const std::vector<std::size_t>& rows) {
    if (dst.columns().empty())
        for (const Column& c : src.columns())
            std::visit(
                [&](const auto& v) { dst.add(c.name, std::decay_t<decltype(v)>{}, c.unit, c.description); },
                c.data);
    for (const Column& c : src.columns()) {
        Column* d = dst.find(c.name);
        if (!d) throw InvalidInput("mosaic simulation: CCD tables differ in column '" + c.name + "'");
        std::visit(
            [&](const auto& v) {
                auto& out = std::get<std::decay_t<decltype(v)>>(d->data);
                for (std::size_t r : rows)
                    out.push_back(v[r]);
            },
            c.data);
    }
}

// Reorders every column of t into `order`.
void permuteRows(Table& t, const std::vector<std::size_t>& order) {
    for (Column& c : t.columns())
        std::visit(
            [&](auto& v) {
                std::decay_t<decltype(v)> out;
                out.reserve(order.size());
                for (std::size_t r : order)
                    out.push_back(v[r]);
                v = std::move(out);
            },
            c.data);
}

// Collects the exposure's reference and truth as the CCDs arrive.
class MosaicCatalogs {
public:
    MosaicCatalogs(const MosaicSimParams& m, const std::vector<MosaicCcd>& ccds)
        : m_m(m), m_ccds(ccds), m_plane(m.ccd) {
        for (const MosaicCcd& c : ccds)
            m_wcs.push_back(makeTrueWcs(c.params));
    }
    void add(const MosaicCcd& c, SimResult& r);
    Table reference(); // deduplicated, sorted by magnitude, ids 1..n; fixes the truth's ref_id
    Table& truth() { return m_truth; }
    Table guideStars() const;

private:
    bool keepDistractor(int ccdIndex, double ra, double dec) const;
    std::vector<std::size_t> duplicates(const std::vector<double>& ra, const std::vector<double>& dec,
                                        const std::vector<std::int64_t>& truthId) const;
    void addGuideStars(const MosaicCcd& c, const Table& truth);

    const MosaicSimParams& m_m;
    const std::vector<MosaicCcd>& m_ccds;
    FocalPlane m_plane;
    std::vector<TanSip> m_wcs;
    Table m_ref, m_truth;
    std::vector<std::int64_t> m_refCcd, m_refOldId, m_guideCcd, m_guideId;
    std::vector<double> m_guideRa, m_guideDec, m_guideMag;
};

// A CCD's distractor (a reference star outside its frame) is kept when this CCD's cell of the layout holds
// it and no CCD's frame does: every place is then covered once at the field's density, and a star that
// would lie on another CCD (which does not have it) never enters.
bool MosaicCatalogs::keepDistractor(int ccdIndex, double ra, double dec) const {
    double fx = 0.0, fy = 0.0;
    if (!m_plane.toFocal(ra, dec, fx, fy)) return false;
    const double cw = m_m.ccd.width + m_m.gapPx, ch = m_m.ccd.height + m_m.gapPx;
    const double reachX = 0.55 * m_m.ccd.width + 50.0, reachY = 0.55 * m_m.ccd.height + 50.0;
    int owner = -1;
    double best = INFINITY;
    for (std::size_t i = 0; i < m_ccds.size(); ++i) {
        const double dx = std::fabs(fx - m_ccds[i].focalX), dy = std::fabs(fy - m_ccds[i].focalY);
        const double d = std::max(dx / cw, dy / ch);
        if (d < best) {
            best = d;
            owner = static_cast<int>(i);
        }
        double x, y;
        if (dx < reachX && dy < reachY && m_wcs[i].worldToPixel(ra, dec, x, y) && x >= -0.5 &&
            x < m_m.ccd.width - 0.5 && y >= -0.5 && y < m_m.ccd.height - 0.5)
            return false;
    }
    return owner == ccdIndex;
}

void MosaicCatalogs::addGuideStars(const MosaicCcd& c, const Table& truth) {
    const auto mag = truth.doubles("mag"), gal = truth.doubles("is_galaxy"), ra = truth.doubles("ra"),
               dec = truth.doubles("dec"), id = truth.doubles("id");
    std::vector<std::size_t> stars;
    for (std::size_t i = 0; i < mag.size(); ++i)
        if (gal[i] == 0.0) stars.push_back(i);
    std::stable_sort(stars.begin(), stars.end(),
                     [&](std::size_t a, std::size_t b) { return mag[a] < mag[b]; });
    stars.resize(std::min<std::size_t>(stars.size(), kGuideStarsPerCcd));
    for (std::size_t i : stars) {
        m_guideCcd.push_back(c.number);
        m_guideId.push_back(static_cast<std::int64_t>(id[i]));
        m_guideRa.push_back(ra[i]);
        m_guideDec.push_back(dec[i]);
        m_guideMag.push_back(mag[i]);
    }
}

void MosaicCatalogs::add(const MosaicCcd& c, SimResult& r) {
    const int index = c.number - 1;
    const auto ra = r.reference.doubles("ra"), dec = r.reference.doubles("dec");
    const auto& tid = r.reference.at("truth_id").as<std::int64_t>();
    const auto& rid = r.reference.at("id").as<std::int64_t>();
    std::vector<std::size_t> keep;
    for (std::size_t i = 0; i < tid.size(); ++i)
        if (tid[i] > 0 || keepDistractor(index, ra[i], dec[i])) {
            keep.push_back(i);
            m_refCcd.push_back(c.number);
            m_refOldId.push_back(rid[i]);
        }
    appendRows(m_ref, r.reference, keep);

    const std::size_t n = r.truth.rows();
    r.truth.add("ccd", std::vector<std::int32_t>(n, c.number), "", "CCD number (CCDNUM)");
    r.truth.add("extname", std::vector<std::string>(n, c.extname), "", "image extension of the CCD");
    std::vector<std::size_t> all(n);
    for (std::size_t i = 0; i < n; ++i)
        all[i] = i;
    appendRows(m_truth, r.truth, all);
    if (!m_truth.meta.has("EPOCH"))
        m_truth.meta.set("EPOCH", *r.truth.meta.getDouble("EPOCH"), "[yr] epoch of the true positions");
    addGuideStars(c, r.truth);
}

// The brightest stars of every CCD (the GUIDESTARS table extension).
Table MosaicCatalogs::guideStars() const {
    Table t;
    t.name = "GUIDESTARS";
    t.add("ccd", m_guideCcd, "", "CCD number");
    t.add("id", m_guideId, "", "truth id on that CCD");
    t.add("ra", m_guideRa, "deg", "right ascension");
    t.add("dec", m_guideDec, "deg", "declination");
    t.add("mag", m_guideMag, "mag", "calibrated magnitude");
    return t;
}

// Rows that repeat an earlier one within kDuplicateArcsec (a sweep in declination); of such a pair the
// one tied to a truth star is kept, else the first.
std::vector<std::size_t> MosaicCatalogs::duplicates(const std::vector<double>& ra,
                                                    const std::vector<double>& dec,
                                                    const std::vector<std::int64_t>& truthId) const {
    std::vector<std::size_t> byDec(ra.size());
    for (std::size_t i = 0; i < byDec.size(); ++i)
        byDec[i] = i;
    std::sort(byDec.begin(), byDec.end(),
              [&](std::size_t a, std::size_t b) { return dec[a] < dec[b] || (dec[a] == dec[b] && a < b); });
    const double tol = kDuplicateArcsec / 3600.0;
    std::vector<std::uint8_t> gone(ra.size(), 0);
    for (std::size_t a = 0; a < byDec.size(); ++a) {
        const std::size_t i = byDec[a];
        for (std::size_t b = a + 1; b < byDec.size() && dec[byDec[b]] - dec[i] < tol && !gone[i]; ++b) {
            const std::size_t j = byDec[b];
            if (gone[j] || angularSeparationDeg(ra[i], dec[i], ra[j], dec[j]) >= tol) continue;
            gone[truthId[i] < 0 && truthId[j] > 0 ? i : j] = 1;
        }
    }
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < gone.size(); ++i)
        if (gone[i]) out.push_back(i);
    return out;
}

Table MosaicCatalogs::reference() {
    const auto ra = m_ref.doubles("ra"), dec = m_ref.doubles("dec"), mag = m_ref.doubles("mag");
    const auto truthId = m_ref.at("truth_id").as<std::int64_t>();
    std::vector<std::uint8_t> gone(ra.size(), 0);
    for (std::size_t i : duplicates(ra, dec, truthId))
        gone[i] = 1;
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < ra.size(); ++i)
        if (!gone[i]) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return mag[a] < mag[b]; });
    std::unordered_map<std::uint64_t, std::int64_t> newId; // (ccd << 40 | old id) -> id in the union
    auto key = [](std::int64_t ccd, std::int64_t id) {
        return static_cast<std::uint64_t>(ccd) << 40 | static_cast<std::uint64_t>(id);
    };
    std::vector<std::int64_t> id(order.size()), ccd(order.size());
    for (std::size_t k = 0; k < order.size(); ++k) {
        id[k] = static_cast<std::int64_t>(k) + 1;
        ccd[k] = truthId[order[k]] > 0 ? m_refCcd[order[k]] : 0;
        newId[key(m_refCcd[order[k]], m_refOldId[order[k]])] = id[k];
    }
    Table out = m_ref;
    permuteRows(out, order);
    out.add("id", std::move(id), "", "reference star number (1 = brightest)");
    out.add("ccd", std::move(ccd), "", "CCD of the truth star (0: on no CCD)");
    // The truth's ref_id: the union's id of its reference row (-1 when that row was a duplicate).
    auto& refId = m_truth.find("ref_id")->as<std::int64_t>();
    const auto& tccd = m_truth.at("ccd").as<std::int32_t>();
    for (std::size_t i = 0; i < refId.size(); ++i) {
        std::int64_t& v = refId[i];
        if (v <= 0) continue;
        const auto it = newId.find(key(tccd[i], v));
        v = it == newId.end() ? -1 : it->second;
    }
    return out;
}

// The directory the files go to (created when missing; "" is the current directory).
std::filesystem::path mosaicDirectory(const std::string& dir) {
    namespace fs = std::filesystem;
    const fs::path base = dir.empty() ? fs::path(".") : fs::path(dir);
    std::error_code ec;
    fs::create_directories(base, ec);
    if (ec) throw IoError(base.string() + ": cannot create the output directory: " + ec.message());
    return base;
}

// The exposure-level keywords of the union tables.
void setUnionMeta(const MosaicSimParams& m, std::size_t ccds, Table& ref, Table& truth) {
    const SimParams& p = m.ccd;
    ref.meta.set("EPOCH", p.refEpoch, "[yr] epoch of the positions");
    ref.meta.set("RA", p.ra, "[deg] pointing");
    ref.meta.set("DEC", p.dec, "[deg] pointing");
    ref.meta.set("MAGLIM", p.refMagLimit, "[mag] limiting magnitude (true magnitudes)");
    ref.meta.set("SIMSEED", static_cast<long long>(p.seed), "exposure seed");
    ref.meta.set("NCCD", static_cast<long long>(ccds), "CCDs of the exposure");
    truth.name = "TRUTH";
    truth.meta.set("SIMULATD", true, "simulated by gpuphot simulate --mosaic");
    truth.meta.set("SIMSEED", static_cast<long long>(p.seed), "exposure seed");
    truth.meta.set("SIMZP", p.zeroPoint, "[mag] true exposure ZP; a CCD's is this + its zp_offset");
    truth.meta.set("SIMCT", p.colourTerm, "true colour term: mag = m_inst + ZP + CT * colour");
    truth.meta.set("MJD-OBS", p.mjd, "[d] start of exposure");
    truth.meta.set("NCCD", static_cast<long long>(ccds), "CCDs of the exposure");
}

// Simulates the CCDs (in parallel, see CcdPipeline) and writes each into the MEF in order.
void writeCcds(const MosaicSimParams& m, const std::vector<MosaicCcd>& ccds, MosaicFile& file,
               MosaicCatalogs& cats, RunContext& ctx,
               const std::function<void(const MosaicCcd&, int)>& progress) {
    CcdPipeline pipe(ccds, ctx);
    for (std::size_t k = 0; k < ccds.size(); ++k) {
        SimResult r = pipe.take(k);
        const MosaicCcd& c = ccds[k];
        addCcdKeywords(m, c, r.header);
        const bool compress =
            std::find(m.compressed.begin(), m.compressed.end(), c.number) != m.compressed.end();
        file.image(c, r, compress);
        cats.add(c, r);
        if (progress) progress(c, static_cast<int>(ccds.size()));
    }
}

} // namespace

MosaicTruth writeSimulatedMosaic(const MosaicSimParams& m, const std::string& dir, const std::string& name,
                                 int bitpix, RunContext* ctxIn,
                                 const std::function<void(const MosaicCcd&, int total)>& progress) {
    if (bitpix != 16 && bitpix != -32)
        throw InvalidInput("mosaic simulation: bitpix must be 16 or -32, not " + std::to_string(bitpix));
    if (name.empty() || name.find('/') != std::string::npos)
        throw InvalidInput("mosaic simulation: output name '" + name + "' must be a plain file stem");
    MosaicTruth t;
    t.params = m;
    t.ccds = planMosaic(m);
    mosaicGrid(m, t.columns, t.rows);
    t.zeroPoint = m.ccd.zeroPoint;
    RunContext local;
    RunContext& ctx = ctxIn ? *ctxIn : local;
    auto timer = ctx.time("simulate mosaic");
    const std::filesystem::path base = mosaicDirectory(dir);

    MosaicFile file((base / (name + ".fits")).string(), bitpix);
    file.primary(primaryHeader(m, t.columns, t.rows));
    MosaicCatalogs cats(m, t.ccds);
    writeCcds(m, t.ccds, file, cats, ctx, progress);
    if (m.tableExtension) file.table(cats.guideStars());
    file.commit();

    Table ref = cats.reference();
    Table& truth = cats.truth();
    setUnionMeta(m, t.ccds.size(), ref, truth);
    writeFitsTable((base / (name + ".ref.fits")).string(), ref);
    writeFitsTable((base / (name + ".truth.fits")).string(), truth);
    t.truthRows = truth.rows();
    t.referenceRows = ref.rows();
    writeTextFileAtomic((base / (name + ".mosaic.json")).string(), truthJson(t, name).dump(1) + "\n");
    return t;
}

} // namespace gpuphot
