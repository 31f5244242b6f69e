#pragma once
// The workbench's Mosaic panel (issue 26; README "Mosaic exposures"): shown when the opened file is a mosaic
// exposure (one image extension per CCD, core/pipeline/exposure.hpp).
//   Overview  every CCD binned and placed by its header WCS (ui/mosaic_overview.hpp), outlined and labelled
//             with its EXTNAME, computed off the UI thread with progress; clicking a CCD opens it.
//   Table     per CCD: EXTNAME, HDU, size, gain (header), median sky, robust sigma, saturated pixels (from
//             the pixels); with a reduction of the exposure also sources, FWHM, ZP, ZP offset +- error,
//             calibrators, astrometric RMS and status; zero-point outliers and failed CCDs highlighted.
//             Choosing a row highlights the CCD on the overview and opens it.
//   Reduce    "Reduce exposure" runs reduceExposure on a background thread with the workbench's parameters
//             and reference catalog into the chosen folder (default FOLDER/gpuphot), with progress and
//             Cancel; an existing STEM.report.json (FOLDER/gpuphot/ or FOLDER/) is read when the exposure
//             opens.
#include <QHash>
#include <QPointer>
#include <QString>
#include <QWidget>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/exposure.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "ui/log_panel.hpp"
#include "ui/mosaic_overview.hpp"
#include "ui/pipeline_types.hpp"

class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;
class QTableWidget;
class QThread;

namespace gpuphot::ui {

// The overview drawing: plane px -> widget with the plane's +y up, CCD tiles, outlines and labels.
class MosaicOverviewView : public QWidget {
    Q_OBJECT
public:
    explicit MosaicOverviewView(QWidget* parent = nullptr);
    QSize sizeHint() const override { return {520, 420}; }

    void setExtensions(const std::vector<ExposureExtension>& extensions); // before the overview lands
    void setOverview(MosaicOverviewPtr overview);
    void setReduction(MosaicReductionPtr reduction); // outlines of outliers and failed CCDs
    void setProgress(int done, int total);
    void setSelected(int hdu);
    int selected() const { return m_selected; }
    // A CCD's centre in the plane (px of the reference CCD, +y up) and on the widget; NaN when unknown.
    QPointF planeCentre(int hdu) const;
    QPointF widgetCentre(int hdu) const;
    int ccdAt(QPointF widgetPos) const; // its HDU, -1 when none

signals:
    void ccdClicked(int hdu);

protected:
    void paintEvent(QPaintEvent* e) override;
    void mousePressEvent(QMouseEvent* e) override;
    void resizeEvent(QResizeEvent* e) override;

private:
    QTransform planeToWidget() const;
    QPolygonF widgetQuad(const MosaicCcd& c) const;
    void renderTiles(); // the tiles into m_cache at the widget's size
    QColor outlineColour(const MosaicCcd& c) const;

    MosaicOverviewPtr m_overview;
    MosaicReductionPtr m_reduction;
    std::vector<ExposureExtension> m_extensions;
    QImage m_cache;
    int m_selected = -1, m_done = 0, m_total = 0;
};

class MosaicPanel : public QWidget {
    Q_OBJECT
public:
    enum Column {
        Extname,
        Hdu,
        Size,
        Gain,
        Sky,
        Sigma,
        Saturated,
        Sources,
        Fwhm,
        Zp,
        ZpOffset,
        Calibrators,
        Rms,
        Status,
        ColumnCount
    };

    explicit MosaicPanel(QWidget* parent = nullptr);
    ~MosaicPanel() override; // cancels and waits for the background jobs
    QSize sizeHint() const override { return {900, 420}; }

    // A mosaic exposure: the table lists its CCDs at once; the overview and statistics are computed in the
    // background (overviewReady), an existing exposure report is read with them (reductionLoaded).
    void setExposure(const QString& path, const std::vector<ExposureExtension>& extensions);
    void clear(); // no exposure (a single-frame file was opened)
    QString path() const { return m_path; }
    const std::vector<ExposureExtension>& extensions() const { return m_extensions; }
    // The CCD shown in the viewer (an HDU number or EXTNAME, as openFrame takes it): row and outline
    // highlighted, remembered for the next opening of the file; no ccdChosen.
    void setCurrentHdu(const QString& hdu);
    int currentHdu() const { return m_current; }
    int rememberedHdu(const QString& path) const; // the CCD last shown of that file, else the first
    void setReference(ReferencePtr reference) { m_reference = std::move(reference); }

    QString outputDir() const;
    void setOutputDir(const QString& dir);
    // Reduces the exposure with `config` and the reference set with setReference into outputDir(), on a
    // background thread (reductionFinished). False, with a log message, when one runs or none is open.
    bool startReduction(const PipelineConfig& config);
    void cancelReduction();
    bool reducing() const { return m_reduceCancel != nullptr; }
    bool overviewBusy() const { return m_overviewCancel != nullptr; }

    MosaicOverviewPtr overview() const { return m_overview; }
    MosaicReductionPtr reduction() const { return m_reduction; }
    MosaicOverviewView* view() const { return m_view; }
    QTableWidget* table() const { return m_table; }
    QPushButton* reduceButton() const { return m_reduce; }
    int rowOf(int hdu) const; // -1 when not listed

signals:
    void ccdChosen(int hdu); // a click on the overview or a row chosen: open this HDU
    void reduceRequested();  // the Reduce exposure button: the window calls startReduction
    void overviewReady();
    void reductionLoaded(); // table and overview show a reduction (a run's or a report found)
    void reductionFinished(bool ok, const QString& message);
    void logMessage(gpuphot::ui::LogLevel level, const QString& message);

private:
    void buildUi();
    void runJob(std::function<void()> job); // on a thread of its own, waited for by the destructor
    void overviewDone(quint64 generation, MosaicOverviewPtr overview, MosaicReductionPtr report,
                      const QString& error);
    void reductionDone(const std::string& file, MosaicReductionPtr reduction, const QString& error,
                       const QStringList& warnings);
    void fillTable();
    void fillStatistics(int row, const MosaicCcd& c);
    void fillReduction(int row, const MosaicCcdResult* r);
    void chooseRow(int row);
    void setBusy(const QString& what, bool reduce);
    void showStatus(const QString& text);

    MosaicOverviewView* m_view = nullptr;
    QTableWidget* m_table = nullptr;
    QPushButton* m_reduce = nullptr;
    QPushButton* m_cancel = nullptr;
    QLineEdit* m_outdir = nullptr;
    QProgressBar* m_progress = nullptr;
    QLabel* m_status = nullptr;

    QString m_path;
    std::vector<ExposureExtension> m_extensions;
    MosaicOverviewPtr m_overview;
    MosaicReductionPtr m_reduction;
    ReferencePtr m_reference;
    int m_current = -1;
    QHash<QString, int> m_chosen; // file -> the HDU last shown
    quint64 m_generation = 0;     // of the exposure shown: late results of an earlier one are dropped
    std::shared_ptr<std::atomic<bool>> m_overviewCancel, m_reduceCancel; // non-null while running
    std::vector<QPointer<QThread>> m_threads;
    bool m_filling = false; // the table is being filled: no ccdChosen
};

} // namespace gpuphot::ui
