#include "ui/readout.hpp"

#include <cmath>

#include "core/model/frame.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot::ui {

QString formatRa(double ra) {
    if (!std::isfinite(ra)) return QStringLiteral("--");
    ra = std::fmod(ra, 360.0);
    if (ra < 0) ra += 360.0;
    // Round to 0.01 s first so that 59.995 s carries into the minutes.
    long long cs = std::llround(ra / 15.0 * 3600.0 * 100.0);
    cs %= 24LL * 3600 * 100;
    const int h = static_cast<int>(cs / 360000), m = static_cast<int>((cs / 6000) % 60);
    const double s = static_cast<double>(cs % 6000) / 100.0;
    return QStringLiteral("%1:%2:%3").arg(h, 2, 10, QChar('0')).arg(m, 2, 10, QChar('0')).arg(s, 5, 'f', 2, QChar('0'));
}

QString formatDec(double dec) {
    if (!std::isfinite(dec)) return QStringLiteral("--");
    const QChar sign = dec < 0 ? QChar('-') : QChar('+');
    long long ds = std::llround(std::fabs(dec) * 3600.0 * 10.0);
    const int d = static_cast<int>(ds / 36000), m = static_cast<int>((ds / 600) % 60);
    const double s = static_cast<double>(ds % 600) / 10.0;
    return QStringLiteral("%1%2:%3:%4").arg(sign).arg(d, 2, 10, QChar('0')).arg(m, 2, 10, QChar('0')).arg(s, 4, 'f', 1, QChar('0'));
}

QString formatReadout(const Frame& frame, const Wcs* wcs, double x, double y) {
    const int ix = static_cast<int>(std::lround(x)), iy = static_cast<int>(std::lround(y));
    if (ix < 0 || iy < 0 || ix >= frame.width() || iy >= frame.height()) return {};
    const float v = frame.pixels(ix, iy);
    QString text = QStringLiteral("x %1  y %2  value %3").arg(x + 1.0, 0, 'f', 1).arg(y + 1.0, 0, 'f', 1).arg(v, 0, 'g', 7);
    if (!frame.mask.empty() && frame.mask(ix, iy) != 0)
        text += QStringLiteral(" [mask %1]").arg(static_cast<int>(frame.mask(ix, iy)));
    if (wcs) {
        const auto [ra, dec] = wcs->pixelToWorld(x, y);
        if (std::isfinite(ra) && std::isfinite(dec))
            text += QStringLiteral("  RA %1 Dec %2 (%3, %4)").arg(formatRa(ra), formatDec(dec)).arg(ra, 0, 'f', 6).arg(dec, 0, 'f', 6);
    }
    return text;
}

} // namespace gpuphot::ui
