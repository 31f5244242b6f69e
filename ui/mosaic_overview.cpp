#include "ui/mosaic_overview.hpp"

#include "core/util/json_number.hpp"

#include <QDir>
#include <QFileInfo>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/util/errors.hpp"
#include "core/util/robust_stats.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot::ui {
namespace {

constexpr double kDeg = M_PI / 180.0;
constexpr std::size_t kStatSamples = 200000; // pixels per CCD the sky statistics are taken from

struct Vec3 {
    double x = 0, y = 0, z = 0;
};

Vec3 unitVector(double ra, double dec) {
    return {std::cos(dec * kDeg) * std::cos(ra * kDeg), std::cos(dec * kDeg) * std::sin(ra * kDeg),
            std::sin(dec * kDeg)};
}

// Gnomonic (TAN) projection of (ra, dec) about (ra0, dec0): standard coordinates in degrees.
QPointF gnomonic(double ra0, double dec0, double ra, double dec) {
    const double d0 = dec0 * kDeg, d = dec * kDeg, da = (ra - ra0) * kDeg;
    const double c = std::sin(d0) * std::sin(d) + std::cos(d0) * std::cos(d) * std::cos(da);
    if (!(c > 0.0)) return {std::nan(""), std::nan("")};
    const double xi = std::cos(d) * std::sin(da) / c;
    const double eta = (std::cos(d0) * std::sin(d) - std::sin(d0) * std::cos(d) * std::cos(da)) / c;
    return {xi / kDeg, eta / kDeg};
}

// Maps standard coordinates to the reference CCD's pixel axes (the inverse of its local Jacobian).
struct PlaneAxes {
    double ra0 = 0, dec0 = 0;
    double inv[2][2] = {{1, 0}, {0, 1}};
    QPointF toPlane(const Wcs& wcs, double x, double y) const {
        const auto [ra, dec] = wcs.pixelToWorld(x, y);
        const QPointF s = gnomonic(ra0, dec0, ra, dec);
        return {inv[0][0] * s.x() + inv[0][1] * s.y(), inv[1][0] * s.x() + inv[1][1] * s.y()};
    }
};

QPointF pixelCentre(const ExposureExtension& e) {
    return {0.5 * static_cast<double>(e.width - 1), 0.5 * static_cast<double>(e.height - 1)};
}

// The exposure's centre (mean direction of the CCD centres) and the axes of the CCD nearest it.
std::optional<PlaneAxes> planeAxes(const std::vector<ExposureExtension>& exts, const std::vector<Wcs>& wcs) {
    Vec3 sum;
    std::vector<Vec3> centres;
    for (std::size_t k = 0; k < exts.size(); ++k) {
        const QPointF c = pixelCentre(exts[k]);
        const auto [ra, dec] = wcs[k].pixelToWorld(c.x(), c.y());
        centres.push_back(unitVector(ra, dec));
        sum = {sum.x + centres.back().x, sum.y + centres.back().y, sum.z + centres.back().z};
    }
    PlaneAxes a;
    a.ra0 = std::atan2(sum.y, sum.x) / kDeg;
    a.dec0 = std::atan2(sum.z, std::hypot(sum.x, sum.y)) / kDeg;
    const Vec3 c0 = unitVector(a.ra0, a.dec0);
    std::size_t ref = 0;
    double best = -2.0;
    for (std::size_t k = 0; k < centres.size(); ++k) {
        const double dot = centres[k].x * c0.x + centres[k].y * c0.y + centres[k].z * c0.z;
        if (dot > best) best = dot, ref = k;
    }
    const QPointF c = pixelCentre(exts[ref]);
    const double d = 10.0; // px: finite differences of the projection
    const QPointF px = a.toPlane(wcs[ref], c.x() + d, c.y()) - a.toPlane(wcs[ref], c.x() - d, c.y());
    const QPointF py = a.toPlane(wcs[ref], c.x(), c.y() + d) - a.toPlane(wcs[ref], c.x(), c.y() - d);
    const double j00 = px.x() / (2 * d), j10 = px.y() / (2 * d), j01 = py.x() / (2 * d),
                 j11 = py.y() / (2 * d);
    const double det = j00 * j11 - j01 * j10;
    if (!std::isfinite(det) || det == 0.0) return std::nullopt;
    a.inv[0][0] = j11 / det, a.inv[0][1] = -j01 / det, a.inv[1][0] = -j10 / det, a.inv[1][1] = j00 / det;
    return a;
}

// Every CCD's corners from its header WCS; false when a CCD has none (or a corner does not transform).
bool placeByWcs(const std::string& path, std::vector<MosaicCcd>& ccds) {
    if (ccds.empty()) return false;
    std::vector<ExposureExtension> exts;
    std::vector<Wcs> wcs;
    try {
        for (const MosaicCcd& c : ccds) {
            auto w = Wcs::tryFromHeader(readHeader(path, std::to_string(c.ext.hdu)));
            if (!w) return false;
            exts.push_back(c.ext);
            wcs.push_back(std::move(*w));
        }
    } catch (const std::exception&) {
        return false;
    }
    const std::optional<PlaneAxes> axes = planeAxes(exts, wcs);
    if (!axes) return false;
    for (std::size_t k = 0; k < ccds.size(); ++k) {
        const double w = static_cast<double>(exts[k].width) - 0.5,
                     h = static_cast<double>(exts[k].height) - 0.5;
        const QPointF px[4] = {{-0.5, -0.5}, {w, -0.5}, {w, h}, {-0.5, h}};
        for (int i = 0; i < 4; ++i) {
            ccds[k].corners[i] = axes->toPlane(wcs[k], px[i].x(), px[i].y());
            if (!std::isfinite(ccds[k].corners[i].x()) || !std::isfinite(ccds[k].corners[i].y()))
                return false;
        }
    }
    return true;
}

// Without a WCS: a grid in HDU order, row 0 at the top.
void placeInGrid(std::vector<MosaicCcd>& ccds) {
    const int columns = std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(ccds.size())))));
    double cellW = 1.0, cellH = 1.0;
    for (const MosaicCcd& c : ccds) {
        cellW = std::max(cellW, 1.05 * static_cast<double>(c.ext.width));
        cellH = std::max(cellH, 1.05 * static_cast<double>(c.ext.height));
    }
    for (std::size_t k = 0; k < ccds.size(); ++k) {
        const double x0 = static_cast<double>(static_cast<int>(k) % columns) * cellW;
        const double y0 = -static_cast<double>(static_cast<int>(k) / columns) * cellH;
        const double w = static_cast<double>(ccds[k].ext.width), h = static_cast<double>(ccds[k].ext.height);
        ccds[k].corners = {QPointF(x0, y0), QPointF(x0 + w, y0), QPointF(x0 + w, y0 + h),
                           QPointF(x0, y0 + h)};
    }
}

QRectF cornerBounds(const std::vector<MosaicCcd>& ccds) {
    QRectF b;
    for (const MosaicCcd& c : ccds)
        for (const QPointF& p : c.corners)
            b = b.isNull() ? QRectF(p, QSizeF(1e-9, 1e-9)) : b.united(QRectF(p, QSizeF(1e-9, 1e-9)));
    return b;
}

// A CCD's binned pixels (mean of the finite ones in each bin x bin block; NaN where none).
struct Binned {
    int width = 0, height = 0;
    std::vector<float> values;
};

Binned binPixels(const Image<float>& img, int bin) {
    Binned b;
    b.width = (img.width() + bin - 1) / bin;
    b.height = (img.height() + bin - 1) / bin;
    std::vector<double> sum(static_cast<std::size_t>(b.width) * b.height, 0.0);
    std::vector<int> count(sum.size(), 0);
    for (int y = 0; y < img.height(); ++y) {
        const std::size_t row = static_cast<std::size_t>(y / bin) * b.width;
        for (int x = 0; x < img.width(); ++x) {
            const float v = img(x, y);
            if (!std::isfinite(v)) continue;
            sum[row + x / bin] += v;
            ++count[row + x / bin];
        }
    }
    b.values.resize(sum.size());
    for (std::size_t i = 0; i < sum.size(); ++i)
        b.values[i] = count[i] ? static_cast<float>(sum[i] / count[i]) : std::nanf("");
    return b;
}

// Median sky and robust sigma from an even sample of the finite pixels; saturated pixels counted.
void pixelStatistics(const Frame& f, MosaicCcd& c) {
    const std::size_t n = static_cast<std::size_t>(f.width()) * f.height();
    const std::size_t step = std::max<std::size_t>(1, n / kStatSamples) | 1; // odd: no aliasing with the rows
    std::vector<double> sample;
    sample.reserve(n / step + 1);
    const float* p = f.pixels.data();
    for (std::size_t i = 0; i < n; i += step)
        if (std::isfinite(p[i])) sample.push_back(p[i]);
    c.sky = robustMedian(sample);
    c.sigma = madSigma(sample, c.sky);
    if (f.instrument.gainSource != "default") c.gain = f.instrument.gain;
    if (f.instrument.saturationSource == "default" || !std::isfinite(f.instrument.saturation)) return;
    c.saturation = f.instrument.saturation;
    c.saturated = std::count_if(p, p + n, [&](float v) { return v >= c.saturation; });
}

// Reads the CCDs on a few threads: statistics and binned pixels. False when cancelled.
bool readCcds(const std::string& path, std::vector<MosaicCcd>& ccds, int bin, std::vector<Binned>& binned,
              const std::function<void(int, int)>& progress, const std::atomic<bool>& cancel) {
    std::atomic<std::size_t> next{0};
    std::atomic<int> done{0};
    const int total = static_cast<int>(ccds.size());
    auto work = [&] {
        for (std::size_t k; !cancel && (k = next++) < ccds.size();) {
            try {
                FrameReadOptions o;
                o.hdu = std::to_string(ccds[k].ext.hdu);
                const Frame f = readFrame(path, o);
                pixelStatistics(f, ccds[k]);
                binned[k] = binPixels(f.pixels, bin);
            } catch (const std::exception& e) {
                ccds[k].error = e.what();
            }
            if (progress) progress(++done, total);
        }
    };
    const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads && t < ccds.size(); ++t)
        pool.emplace_back(work);
    work();
    for (std::thread& t : pool)
        t.join();
    return !cancel;
}

// One stretch for every CCD: from a little below the median sky to far above it, square root between.
void stretchTiles(MosaicOverview& o, const std::vector<Binned>& binned) {
    std::vector<double> skies, sigmas;
    for (const MosaicCcd& c : o.ccds)
        if (std::isfinite(c.sky) && std::isfinite(c.sigma)) skies.push_back(c.sky), sigmas.push_back(c.sigma);
    const double sky = skies.empty() ? 0.0 : robustMedian(skies);
    const double sigma = sigmas.empty() ? 1.0 : std::max(robustMedian(sigmas), 1e-6);
    o.stretchLow = sky - 2.0 * sigma;
    o.stretchHigh = sky + 40.0 * sigma;
    const double range = o.stretchHigh - o.stretchLow;
    for (std::size_t k = 0; k < o.ccds.size(); ++k) {
        const Binned& b = binned[k];
        if (b.values.empty()) continue;
        QImage img(b.width, b.height, QImage::Format_Grayscale8);
        for (int y = 0; y < b.height; ++y) {
            uchar* line = img.scanLine(y);
            for (int x = 0; x < b.width; ++x) {
                const double v = b.values[static_cast<std::size_t>(y) * b.width + x];
                const double t = std::isfinite(v) ? std::clamp((v - o.stretchLow) / range, 0.0, 1.0) : 0.0;
                line[x] = static_cast<uchar>(std::lround(255.0 * std::sqrt(t)));
            }
        }
        o.ccds[k].tile = std::move(img);
    }
}

} // namespace

MosaicOverviewPtr computeMosaicOverview(const std::string& path,
                                        const std::vector<ExposureExtension>& extensions,
                                        const std::function<void(int, int)>& progress,
                                        const std::atomic<bool>& cancel) {
    auto o = std::make_shared<MosaicOverview>();
    o->path = path;
    o->ccds.resize(extensions.size());
    for (std::size_t k = 0; k < extensions.size(); ++k)
        o->ccds[k].ext = extensions[k];
    o->placedByWcs = placeByWcs(path, o->ccds);
    if (!o->placedByWcs) placeInGrid(o->ccds);
    o->bounds = cornerBounds(o->ccds);
    const double extent = std::max(o->bounds.width(), o->bounds.height());
    o->bin = std::max(1, static_cast<int>(std::ceil(extent / kMosaicOverviewPx)));
    std::vector<Binned> binned(o->ccds.size());
    if (!readCcds(path, o->ccds, o->bin, binned, progress, cancel)) return nullptr;
    stretchTiles(*o, binned);
    return o;
}

const MosaicCcdResult* MosaicReduction::find(int hdu) const {
    for (const MosaicCcdResult& c : ccds)
        if (c.hdu == hdu) return &c;
    return nullptr;
}

MosaicReduction parseExposureReport(const nlohmann::json& report) {
    const auto ex = report.find("exposure");
    if (ex == report.end() || !ex->is_object())
        throw InvalidInput("not an exposure report (no \"exposure\")");
    MosaicReduction r;
    r.zp = numberOrNaN(*ex, "zp");
    r.zpErr = numberOrNaN(*ex, "zp_err");
    r.scatter = numberOrNaN(*ex, "zp_offset_scatter");
    for (const auto& name : ex->value("zp_outliers", nlohmann::json::array()))
        if (name.is_string()) r.outliers.push_back(name.get<std::string>());
    for (const auto& e : ex->value("extensions", nlohmann::json::array()))
        r.ccds.push_back(e.get<MosaicCcdResult>());
    return r;
}

MosaicReductionPtr findExposureReport(const std::string& path) {
    const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
    const std::string name = frameStem(path) + ".report.json";
    for (const std::filesystem::path& p : {dir / "gpuphot" / name, dir / name}) {
        std::ifstream in(p);
        if (!in) continue;
        try {
            auto r = std::make_shared<MosaicReduction>(parseExposureReport(nlohmann::json::parse(in)));
            r->reportPath = p.string();
            return r;
        } catch (const std::exception&) {
            continue; // a single-frame report of the same stem, or a damaged file: not this exposure's
        }
    }
    return nullptr;
}

QString defaultMosaicOutputDir(const QString& path) {
    return QDir(QFileInfo(path).absolutePath()).filePath(QStringLiteral("gpuphot"));
}

} // namespace gpuphot::ui
