#pragma once
// PSF panel: the ePSF stamp of the grid cell nearest to a position (the cursor or the selected star),
// its radial profile with the fitted analytic model (QCustomPlot), and a FWHM / ellipticity map across
// the field from the PSF stage's spatial polynomials. Clicking the map emits positionChosen.
#include <QImage>
#include <QWidget>

#include "ui/snapshot.hpp"

class QCustomPlot;
class QComboBox;
class QLabel;
class QCPTextElement;

namespace gpuphot::ui {

class PsfPanel : public QWidget {
    Q_OBJECT
public:
    explicit PsfPanel(QWidget* parent = nullptr);

    void setSnapshot(SnapshotPtr snapshot);
    void setSelectedSource(int index);    // shows the PSF at that source (-1: keeps the position)
    void setPosition(double x, double y); // 0-based pixel position (e.g. the cursor)
    double positionX() const { return m_x; }
    double positionY() const { return m_y; }

    enum class MapKind { Fwhm = 0, Ellipticity = 1 };
    void setMapKind(MapKind kind);

    int currentCell() const { return m_cell; }    // ePSF cell shown, -1: none
    QImage stampImage() const { return m_stamp; } // the ePSF as shown (before scaling to the label)
    QCustomPlot* profilePlot() const { return m_profile; }
    QCustomPlot* mapPlot() const { return m_map; }
    QString message() const; // why nothing is shown ("" when there is a PSF model)

signals:
    void positionChosen(double x, double y); // a click on the field map (0-based px)

private:
    void updateStampAndProfile();
    void updateMap();

    SnapshotPtr m_snapshot;
    double m_x = 0, m_y = 0;
    int m_cell = -1;
    MapKind m_kind = MapKind::Fwhm;
    QImage m_stamp;
    QLabel* m_stampLabel = nullptr;
    QLabel* m_info = nullptr;
    QComboBox* m_kindBox = nullptr;
    QCustomPlot* m_profile = nullptr;
    QCustomPlot* m_map = nullptr;
    QCPTextElement* m_profileTitle = nullptr;
    QCPTextElement* m_mapTitle = nullptr;
};

} // namespace gpuphot::ui
