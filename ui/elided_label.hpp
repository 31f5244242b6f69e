#pragma once
// A one-line QLabel that ends with "…" where its text does not fit (a plain QLabel cuts mid-word); text()
// stays the whole line, and the tooltip shows it. Used for the status bar's stage times.
#include <QLabel>
#include <QPainter>

namespace gpuphot::ui {

class ElidedLabel : public QLabel {
public:
    using QLabel::QLabel;
    QSize minimumSizeHint() const override { return {0, QLabel::minimumSizeHint().height()}; }

protected:
    void paintEvent(QPaintEvent*) override {
        QPainter p(this);
        const QRect r = contentsRect();
        p.setPen(palette().color(foregroundRole()));
        p.drawText(r, Qt::AlignLeft | Qt::AlignVCenter,
                   fontMetrics().elidedText(text(), Qt::ElideRight, r.width()));
    }
};

} // namespace gpuphot::ui
