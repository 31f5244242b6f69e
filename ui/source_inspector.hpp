#pragma once
// Source inspector: a stamp of the selected source from the frame's pixels (asinh stretch) with its
// apertures and sky annulus drawn, its curve of growth (the catalog's apertures and a finer curve
// computed with core's exact pixel/circle overlap), and its fluxes, magnitudes, errors and flags.
#include <QImage>
#include <QWidget>

#include "ui/snapshot.hpp"

class QCustomPlot;
class QLabel;
class QSpinBox;
class QTableWidget;

namespace gpuphot::ui {

class SourceInspector : public QWidget {
    Q_OBJECT
public:
    explicit SourceInspector(QWidget* parent = nullptr);

    void setSnapshot(SnapshotPtr snapshot); // keeps the selection when the index is still valid
    void setSelectedSource(int index);      // -1: none
    int selectedSource() const { return m_index; }
    void setStampHalfSize(int pixels); // stamp is (2 N + 1)^2 frame pixels (default 15)
    int stampHalfSize() const { return m_half; }

    QImage stampImage() const { return m_image; } // as shown, with the apertures drawn
    QCustomPlot* growthPlot() const { return m_growth; }
    QTableWidget* detailsTable() const { return m_details; }
    QString flagsText() const;

private:
    void refresh();

    SnapshotPtr m_snapshot;
    int m_index = -1;
    int m_half = 15;
    QImage m_image;
    QLabel* m_stamp = nullptr;
    QLabel* m_flags = nullptr;
    QSpinBox* m_halfBox = nullptr;
    QCustomPlot* m_growth = nullptr;
    QTableWidget* m_details = nullptr;
};

} // namespace gpuphot::ui
