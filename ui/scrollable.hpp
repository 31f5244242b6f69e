#pragma once
// A dock's panel in a frameless scroll area: the panel's minimum size no longer sets the dock area's, so
// raising its tab keeps the area as wide and tall as the user left it (the panel scrolls where it does
// not fit) and never makes the image smaller.
#include <QFrame>
#include <QScrollArea>

namespace gpuphot::ui {

inline QScrollArea* scrollable(QWidget* panel, QWidget* parent = nullptr) {
    auto* area = new QScrollArea(parent);
    area->setFrameShape(QFrame::NoFrame);
    area->setWidgetResizable(true);
    area->setWidget(panel);
    return area;
}

} // namespace gpuphot::ui
