#include "ui/click_photometry.hpp"

#include <cmath>
#include <cstdio>

#include "core/stages/aperture/forced_photometry.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot::ui {
namespace {

std::string fmt(const char* format, double v) {
    if (!std::isfinite(v)) return "–";
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

std::string withError(const char* format, double v, double e) {
    std::string s = fmt(format, v);
    if (std::isfinite(v) && std::isfinite(e)) s += " ± " + fmt(format, e);
    return s;
}

} // namespace

double ClickPhotometry::snr() const {
    if (aperture < 0) return std::nan("");
    const double e = fluxErr[aperture];
    return e > 0 ? flux[aperture] / e : std::nan("");
}

ClickPhotometry measureAt(const Snapshot& s, double x, double y) {
    const PipelineResult& r = s.result;
    if (!s.frame || r.aperture.count != r.detection.sources.size() || r.aperture.radii.empty())
        throw InvalidInput("no aperture photometry yet: let the frame reduce first");
    const Frame& f = *s.frame;
    if (!(x >= -0.5 && y >= -0.5 && x < f.pixels.width() - 0.5 && y < f.pixels.height() - 0.5))
        throw InvalidInput("the position is off the frame");
    ApertureParams ap = s.config.aperture; // as reduce --targets calls it (core/pipeline/reduce.cpp)
    if (std::isfinite(f.instrument.saturation)) ap.saturation = f.instrument.saturation;
    const SegmentationMap& seg = r.detection.segmentation;
    RunContext ctx;
    const ForcedPhotometryResult fp = forcedPhotometry(
        f.view(), f.maskView(), r.background, seg.isMaterialised() ? seg.view() : ImageViewT<std::int32_t>{},
        r.detection.sources, r.aperture, {x}, {y}, r.fwhm, f.instrument.gain, f.instrument.readNoise, ap, {},
        ctx);
    ClickPhotometry m;
    m.x = x, m.y = y;
    const Wcs* wcs = r.fittedWcs ? r.fittedWcs.get() : f.wcs.get();
    m.ra = m.dec = std::nan("");
    if (wcs) std::tie(m.ra, m.dec) = wcs->pixelToWorld(x, y);
    const ApertureResult& a = fp.aperture;
    m.radii = a.radii;
    for (std::size_t k = 0; k < a.radii.size(); ++k) {
        m.flux.push_back(a.flux[k][0]);
        m.fluxErr.push_back(a.fluxErr[k][0]);
    }
    m.aperture = fp.calAperture[0];
    m.magTotal = fp.magTotal[0], m.magTotalErr = fp.magTotalErr[0];
    m.magCal = m.magCalErr = std::nan("");
    if (r.zeropoint.ok && std::isfinite(m.magTotal)) {
        m.magCal = m.magTotal + r.zeropoint.zp;
        m.magCalErr = std::hypot(m.magTotalErr, r.zeropoint.zpErr);
    }
    m.sky = a.sky[0], m.skyRms = a.skyRms[0];
    m.flags = fp.flags[0];
    m.detection = fp.detIndex[0];
    m.annulusInner = a.skyAnnulusInner, m.annulusOuter = a.skyAnnulusOuter;
    return m;
}

std::vector<DetailRow> clickPhotometryDetails(const ClickPhotometry& m) {
    std::vector<DetailRow> rows;
    rows.push_back({"x, y (1-based)", fmt("%.2f", m.x + 1.0) + ", " + fmt("%.2f", m.y + 1.0)});
    rows.push_back({"RA, Dec (deg)", fmt("%.6f", m.ra) + ", " + fmt("%+.6f", m.dec)});
    if (m.aperture >= 0) {
        const auto k = static_cast<std::size_t>(m.aperture);
        rows.push_back({"aperture (highest S/N)", fmt("%.2f px", m.radii[k])});
        rows.push_back({"flux (ADU)", withError("%.2f", m.flux[k], m.fluxErr[k])});
        rows.push_back({"S/N", fmt("%.1f", m.snr())});
    }
    rows.push_back({"mag (instrumental, total)", withError("%.4f", m.magTotal, m.magTotalErr)});
    rows.push_back({"mag_cal", withError("%.4f", m.magCal, m.magCalErr)});
    rows.push_back({"local sky (ADU/px)", withError("%.2f", m.sky, m.skyRms)});
    for (std::size_t k = 0; k < m.radii.size(); ++k)
        rows.push_back({"flux_aper_" + std::to_string(k + 1) + " (r " + fmt("%.2f", m.radii[k]) + ")",
                        withError("%.2f", m.flux[k], m.fluxErr[k])});
    rows.push_back(
        {"detection", m.detection >= 0 ? "source " + std::to_string(m.detection + 1) : "none within 1 FWHM"});
    rows.push_back({"flags", flagsText(m.flags & 0xffffffu) +
                                 ((m.flags & FlagTargetNearEdge) ? " | sky annulus beyond the frame" : "")});
    return rows;
}

} // namespace gpuphot::ui
