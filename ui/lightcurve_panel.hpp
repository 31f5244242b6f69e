#pragma once
// The workbench's light-curve panel (docs/WORKBENCH.md, "Light curves"): the differential light curve of
// a chosen star over a series of reduced catalogs (an opened `gpuphot series` directory, or the catalogs
// the workbench writes while it follows a folder), computed by the same core as `gpuphot series`.
//   Curve     the target's relative flux with error bars against BJD_TDB or UTC, optionally binned and
//             detrended; its comparison stars in a table (pin, exclude: the curve is recomputed at once);
//             export of the curve (CSV, ECSV, FITS: the CLI's table) and of a PNG.
//   Variables every well-measured star's RMS against its magnitude, the flagged variables marked
//             (clicking one makes it the target); the Lomb-Scargle periodogram of the target.
//   Night     FWHM, zero point, sky and detections per frame against time (clicking a point steps there).
// Frames step and blink through the series (frameStepped: the viewer shows that frame, aligned by WCS).
#include <QSize>
#include <QString>
#include <QStringList>
#include <QWidget>

#include <vector>

#include "ui/series_runner.hpp"

class QCustomPlot;
class QComboBox;
class QLabel;
class QSpinBox;
class QTableWidget;
class QTabWidget;
class QTimer;
class QPushButton;
class QAction;

namespace gpuphot::ui {

class LightCurvePanel : public QWidget {
    Q_OBJECT
public:
    enum class TimeAxis { BjdTdb, Utc };
    enum class Choice { Auto, Pinned, Excluded };
    struct SkyMarker {
        double ra = 0.0, dec = 0.0;
        enum Kind { Target, Comparison, Dropped, Excluded } kind = Comparison;
    };

    explicit LightCurvePanel(QWidget* parent = nullptr);
    ~LightCurvePanel() override;
    QSize sizeHint() const override { return {640, 200}; } // a dock beside the catalog, not above the image

    void setCatalogs(const QStringList& catalogs); // replaces the series' catalogs
    void addCatalog(const QString& catalog);       // one more (follow mode): the series is appended to
    // The star whose curve is shown; comparison choices are kept for stars that stay in the series.
    void setTarget(const QString& name, double ra, double dec);
    // A targets file (reduce --targets formats): its first entry becomes the target. false: error shown.
    bool loadTargets(const QString& path);
    // Opens a `gpuphot series` output directory: its catalogs and its first target. false: error shown.
    bool openSeries(const QString& dir);
    // A comparison star (a source of the series) pinned, excluded or left to the automatic choice.
    void setComparison(std::size_t source, Choice choice);
    Choice comparison(std::size_t source) const;
    void setTimeAxis(TimeAxis axis);
    void setBinning(int points); // 1: none
    void setDetrend(const std::vector<std::string>& terms);
    void setFitTransit(bool on); // a blind trapezoid fit on the curve (series --transit), drawn and reported
    void findVariables();        // every star's curve (all-stars run) for the Variables tab

    // Exports: the target's light-curve table by extension (.csv, .ecsv, else FITS), or the curve's plot.
    bool exportCurve(const QString& path);
    bool exportPng(const QString& path);

    SeriesResultPtr result() const { return m_result; }
    SeriesResultPtr variables() const { return m_variables; } // the last findVariables run
    QCustomPlot* nightPlot() const { return m_nightPlot; }
    const LightCurve* curve() const; // the target's (nullptr before a result)
    std::vector<SkyMarker> markers() const;
    SeriesRunner* runner() const { return m_runner; }
    QCustomPlot* curvePlot() const { return m_curvePlot; }
    QCustomPlot* variablesPlot() const { return m_rmsPlot; }
    QCustomPlot* periodogramPlot() const { return m_periodPlot; }
    QTableWidget* ensembleTable() const { return m_ensemble; }
    QString statusText() const;
    // The frames of the shown series in time order (SRCFILE of each used catalog) and the stepped one.
    QStringList framePaths() const;
    int currentFrame() const { return m_frame; }
    void stepFrame(int delta); // emits frameStepped
    void setBlinking(bool on);

signals:
    void curveChanged();     // a new result is shown
    void variablesChanged(); // a findVariables result is shown
    void markersChanged();   // markers() changed: the viewer redraws them
    void starChosen(double ra, double dec);
    void frameStepped(const QString& framePath);
    void errorShown(const QString& message);

private:
    void buildCurveTab(QWidget* tab);
    void buildVariablesTab(QWidget* tab);
    void buildNightTab(QWidget* tab);
    void applyInputs(); // the runner's targets and parameters from the panel's choices
    void onResult(SeriesResultPtr result);
    void onVariables(SeriesResultPtr result);
    void drawCurve();
    void drawTransit(const LightCurve& c);
    void drawPeriodogram();
    void drawNight();
    void fillEnsemble();
    void onEnsembleEdited(int row, int column);
    void onRmsClick(double mag, double rms);
    double timeOf(const LightCurve& c, std::size_t k) const;

    SeriesRunner* m_runner = nullptr;
    SeriesRunner* m_allStars = nullptr;
    SeriesResultPtr m_result, m_variables;
    QString m_targetName;
    double m_targetRa = 0.0, m_targetDec = 0.0;
    bool m_haveTarget = false;
    struct Chosen {
        std::size_t source;
        double ra, dec;
        Choice choice;
    };
    std::vector<Chosen> m_chosen;
    std::vector<std::string> m_detrend;
    bool m_fitTransit = false;
    QPushButton* m_transitButton = nullptr;
    TimeAxis m_axis = TimeAxis::BjdTdb;
    int m_bin = 1, m_frame = -1;
    bool m_filling = false;

    QTabWidget* m_tabs = nullptr;
    QCustomPlot* m_curvePlot = nullptr;
    QCustomPlot* m_rmsPlot = nullptr;
    QCustomPlot* m_periodPlot = nullptr;
    QCustomPlot* m_nightPlot = nullptr;
    QTableWidget* m_ensemble = nullptr;
    QLabel* m_status = nullptr;
    QLabel* m_periodLabel = nullptr;
    QComboBox* m_axisBox = nullptr;
    QSpinBox* m_binBox = nullptr;
    std::vector<QAction*> m_detrendActions;
    QTimer* m_blink = nullptr;
    mutable QStringList m_framePaths; // framePaths() of m_result, read once
};

} // namespace gpuphot::ui
