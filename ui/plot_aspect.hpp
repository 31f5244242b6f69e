#pragma once
// Spatial plots (astrometric vectors, background and FWHM maps) at one data unit per the same number of
// screen pixels on both axes, so a frame is drawn with its own shape instead of stretched to the panel.
#include <qcustomplot.h>

namespace gpuphot::ui {

// Shows at least the box x × y, centred, with equal scales on the two axes; fitted again after every
// layout of the plot (a resize). Calling it again replaces the box. Zooming or dragging the axes by hand
// holds until the next layout.
void keepEqualAspect(QCustomPlot* plot, const QCPRange& x, const QCPRange& y);

} // namespace gpuphot::ui
