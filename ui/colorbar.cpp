#include "ui/colorbar.hpp"

#include <QPainter>

#include <algorithm>
#include <cmath>

#include "viewers/image_view.hpp"
#include "viewers/stretch.hpp"

namespace gpuphot::ui {

namespace {
constexpr int kBarHeight = 14;

QString formatValue(double v) {
    return QString::number(v, 'g', 5);
}

// The pixel value whose stretched level is t (bisection: every stretch is monotonic on [lo, hi]).
double valueAtLevel(const viewers::ImageView& view, double t) {
    viewers::StretchParams p;
    p.stretch = view.stretch() == viewers::Stretch::HistEq ? viewers::Stretch::Linear : view.stretch();
    std::tie(p.lo, p.hi) = view.limits();
    double a = p.lo, b = p.hi;
    for (int i = 0; i < 60; ++i) {
        const double m = 0.5 * (a + b);
        (viewers::stretchValue(static_cast<float>(m), p) < t ? a : b) = m;
    }
    return 0.5 * (a + b);
}
} // namespace

Colorbar::Colorbar(viewers::ImageView* view, QWidget* parent) : QWidget(parent), m_view(view) {
    setObjectName(QStringLiteral("Colorbar"));
    setMinimumHeight(kBarHeight + fontMetrics().height() + 6);
    connect(view, &viewers::ImageView::displayChanged, this, qOverload<>(&QWidget::update));
}

QSize Colorbar::sizeHint() const {
    return {200, kBarHeight + fontMetrics().height() + 6};
}

QStringList Colorbar::labels() const {
    const auto [lo, hi] = m_view->limits();
    return {formatValue(lo), formatValue(valueAtLevel(*m_view, 0.5)), formatValue(hi)};
}

QRgb Colorbar::colourAt(double fraction) const {
    static_assert(sizeof(std::uint32_t) == sizeof(QRgb));
    const auto table = viewers::colormapTable(m_view->colormap());
    const std::uint32_t c =
        table[static_cast<std::size_t>(viewers::colormapIndex(static_cast<float>(fraction)))];
    return qRgb(static_cast<int>(c & 255u), static_cast<int>((c >> 8) & 255u),
                static_cast<int>((c >> 16) & 255u));
}

void Colorbar::paintEvent(QPaintEvent*) {
    QPainter p(this);
    const int w = std::max(1, width() - 1);
    for (int x = 0; x <= w; ++x) {
        p.setPen(QColor(colourAt(static_cast<double>(x) / w)));
        p.drawLine(x, 0, x, kBarHeight);
    }
    p.setPen(palette().color(QPalette::WindowText));
    const QStringList l = labels();
    const QRect text(0, kBarHeight + 2, width(), height() - kBarHeight - 2);
    p.drawText(text, Qt::AlignLeft | Qt::AlignTop, l[0]);
    p.drawText(text, Qt::AlignHCenter | Qt::AlignTop, l[1]);
    p.drawText(text, Qt::AlignRight | Qt::AlignTop, l[2]);
}

} // namespace gpuphot::ui
