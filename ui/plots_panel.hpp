#pragma once
// The workbench's diagnostic plots (QCustomPlot, one tab each): zero-point residuals against reference
// magnitude and colour with the fit and the clipped calibrators marked, astrometric residuals against
// x and y and as an exaggerated vector map, S/N against magnitude with the limiting magnitude, and the
// background map. A plot without data says why ("no reference catalog", "astrometry did not run").
// Every plot exports as PNG or PDF (context menu, the Export button, exportCurrent). Clicking a point
// emits sourceSelected with the source's index.
#include <QHash>
#include <QString>
#include <QWidget>
#include <vector>

#include "ui/snapshot.hpp"

class QCustomPlot;
class QCPAbstractPlottable;
class QCPGraph;
class QCPItemLine;
class QCPItemText;
class QCPRange;
class QCPTextElement;
class QTabWidget;
class QMouseEvent;

namespace gpuphot::ui {

struct SnrPlotData;

class PlotsPanel : public QWidget {
    Q_OBJECT
public:
    enum class Plot {
        ZeroPointVsMag = 0,
        ZeroPointVsColour,
        AstrometryVsX,
        AstrometryVsY,
        AstrometryVectors,
        SnrVsMag,
        Background,
    };
    static constexpr int kPlotCount = 7;

    explicit PlotsPanel(QWidget* parent = nullptr);
    ~PlotsPanel() override;

    void setSnapshot(SnapshotPtr snapshot);
    void setSelectedSource(int index); // -1: none
    int selectedSource() const { return m_selected; }

    QCustomPlot* plot(Plot which) const;
    QString plotTitle(Plot which) const;
    // Why a plot is empty ("" when it shows data).
    QString emptyReason(Plot which) const;
    void setCurrentPlot(Plot which);
    Plot currentPlot() const;
    QTabWidget* tabs() const { return m_tabs; }

    // Saves the current plot: PDF when the path ends in .pdf, else PNG. false when saving failed.
    bool exportCurrent(const QString& path);
    bool exportPlot(Plot which, const QString& path);

    // Residual vectors are drawn this many times longer than they are; <= 0: automatic (a round number
    // that makes the RMS vector 3% of the frame).
    void setVectorExaggeration(double factor);
    double vectorExaggeration() const { return m_exaggeration; }
    // The vector map draws an arrow head on each vector up to this many vectors (QCustomPlot items; more
    // would slow the replot), plain segments beyond.
    static constexpr int kMaxArrowHeads = 3000;

signals:
    void sourceSelected(int index);

private:
    void rebuild();
    void buildZeroPoint();
    void buildAstrometry();
    void buildSnr();
    void buildBackground();
    QString snrTitle(const SnrPlotData& d) const;
    void addLimitingMag(double limit, const QCPRange& xr);
    void updateSelection();
    void setEmpty(Plot which, const QString& why);
    void setTitle(Plot which, const QString& text);
    QCPGraph* addScatter(Plot which, const QString& name, const std::vector<double>& keys,
                         const std::vector<double>& values, const std::vector<int>& sources, int shape,
                         const QColor& colour, double size);
    void onPlottableClick(QCPAbstractPlottable* plottable, int dataIndex, QMouseEvent* event);
    void showContextMenu(Plot which, const QPoint& pos);
    void exportWithDialog(Plot which, bool pdf);

    QTabWidget* m_tabs = nullptr;
    QCustomPlot* m_plots[kPlotCount] = {};
    QCPTextElement* m_titles[kPlotCount] = {};
    QCPItemText* m_emptyText[kPlotCount] = {};
    QString m_empty[kPlotCount];
    QHash<QCPAbstractPlottable*, std::vector<int>> m_pointSources; // data index (sorted) -> source
    std::vector<QCPItemLine*> m_arrowHeads; // of the vector map (objectName "arrowHead")
    SnapshotPtr m_snapshot;
    int m_selected = -1;
    double m_exaggeration = 0.0; // as used
    double m_requestedExaggeration = 0.0;
};

} // namespace gpuphot::ui
