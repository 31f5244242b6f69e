// ui/elided_label.hpp: the status bar's stage-times label ends with "…" where the window is too narrow (a
// QLabel cuts mid-word), keeps the whole line as its text, and draws a line that fits as a QLabel does.
#include <gtest/gtest.h>

#include <QImage>
#include <QLabel>

#include "tests/ui/ui_test_app.hpp"
#include "ui/elided_label.hpp"

using gpuphot::ui::ElidedLabel;

namespace {

QImage render(QLabel& label, QSize size) {
    label.resize(size);
    return label.grab().toImage();
}

} // namespace

TEST(ElidedLabel, NarrowLineEndsWithAnEllipsisWideLineAsQLabel) {
    gpuphot::test::uiTestApp();
    const QString line =
        QStringLiteral("#2  455 sources  |  total 348 ms (cpu)  |  background 68 ms, detection 150 ms, "
                       "psf 82 ms, aperture 40 ms, astrometry 8 ms, crossmatch 1 ms");
    ElidedLabel elided;
    elided.setText(line);
    EXPECT_EQ(elided.text(), line);
    EXPECT_EQ(elided.minimumSizeHint().width(), 0); // never forces the status bar wider

    const QSize narrow(160, 24);
    QLabel expected;
    expected.setText(expected.fontMetrics().elidedText(line, Qt::ElideRight, narrow.width()));
    ASSERT_TRUE(expected.text().endsWith(QChar(0x2026))) << expected.text().toStdString();
    EXPECT_EQ(render(elided, narrow), render(expected, narrow));

    QLabel cut; // what a plain QLabel draws instead: the line cut, no ellipsis
    cut.setText(line);
    EXPECT_NE(render(elided, narrow), render(cut, narrow));

    const QSize wide(elided.fontMetrics().horizontalAdvance(line) + 40, 24);
    QLabel whole;
    whole.setText(line);
    EXPECT_EQ(render(elided, wide), render(whole, wide));
}
