#pragma once
// Source inspector: a stamp of the selected source from the frame's pixels (asinh stretch) with its
// apertures and sky annulus drawn, its curve of growth (the catalog's apertures and a finer curve
// computed with core's exact pixel/circle overlap), and its fluxes, magnitudes, errors and flags.
#include <QImage>
#include <QWidget>

#include <optional>

#include "ui/click_photometry.hpp"
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
    // Forced aperture photometry at a clicked position (ui/click_photometry.hpp, Ctrl+click in the
    // viewer): its stamp, curve of growth and numbers replace the selected source's until a source is
    // selected or a new snapshot arrives.
    void setClickPhotometry(const ClickPhotometry& measurement);
    const std::optional<ClickPhotometry>& clickPhotometry() const { return m_click; }
    int selectedSource() const { return m_index; }
    void setStampHalfSize(int pixels); // stamp is (2 N + 1)^2 frame pixels (default 15)
    int stampHalfSize() const { return m_half; }

    QImage stampImage() const { return m_image; } // as shown, with the apertures drawn
    QCustomPlot* growthPlot() const { return m_growth; }
    QTableWidget* detailsTable() const { return m_details; }
    QString flagsText() const;

private:
    void refresh();
    void refreshClick();
    void drawStamp(double x, double y, double sky, double rms, const std::vector<double>& radii,
                   double annulusInner, double annulusOuter, double radiusOpt);
    void fillDetails(const std::vector<DetailRow>& rows);

    SnapshotPtr m_snapshot;
    int m_index = -1;
    std::optional<ClickPhotometry> m_click;
    int m_half = 15;
    QImage m_image;
    QLabel* m_stamp = nullptr;
    QLabel* m_flags = nullptr;
    QSpinBox* m_halfBox = nullptr;
    QCustomPlot* m_growth = nullptr;
    QTableWidget* m_details = nullptr;
};

} // namespace gpuphot::ui
