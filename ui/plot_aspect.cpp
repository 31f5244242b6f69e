#include "ui/plot_aspect.hpp"

#include <QRectF>
#include <QVariant>
#include <algorithm>

namespace gpuphot::ui {
namespace {
const char* const kBox = "gpuphotEqualAspectBox";

void fit(QCustomPlot* plot) {
    const QRectF box = plot->property(kBox).toRectF();
    const QRect r = plot->axisRect()->rect();
    if (box.width() <= 0.0 || box.height() <= 0.0) return;
    if (r.width() <= 0 || r.height() <= 0) { // not laid out yet: the box itself
        plot->xAxis->setRange(box.left(), box.right());
        plot->yAxis->setRange(box.top(), box.bottom());
        return;
    }
    const double perPixel = std::max(box.width() / r.width(), box.height() / r.height());
    const QPointF c = box.center();
    plot->xAxis->setRange(c.x() - 0.5 * perPixel * r.width(), c.x() + 0.5 * perPixel * r.width());
    plot->yAxis->setRange(c.y() - 0.5 * perPixel * r.height(), c.y() + 0.5 * perPixel * r.height());
}
} // namespace

void keepEqualAspect(QCustomPlot* plot, const QCPRange& x, const QCPRange& y) {
    const bool connected = plot->property(kBox).isValid();
    plot->setProperty(kBox, QRectF(x.lower, y.lower, x.size(), y.size()));
    if (!connected) QObject::connect(plot, &QCustomPlot::afterLayout, plot, [plot] { fit(plot); });
    fit(plot);
}

} // namespace gpuphot::ui
