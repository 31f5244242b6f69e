#pragma once
// The workbench's main window (docs/ARCHITECTURE.md, Front ends): the image viewer in the centre, the
// parameter dock, catalog table, PSF panel, source inspector, plots, header, log and follow-folder history
// around it.
// All pipeline work happens on the PipelineWorker's thread; results arrive as immutable snapshots.
#include <QMainWindow>
#include <QPointer>
#include <functional>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "ui/calibration_dialog.hpp"
#include "ui/snapshot.hpp"

class QLabel;
class QProgressBar;
class QTableView;
class QTableWidget;
class QMenu;
class QDragEnterEvent;
class QDropEvent;
class QMessageBox;
class QDockWidget;
class QDialog;
class QUrl;
class QTimer;

namespace gpuphot::viewers {
class ImageView;
}
namespace gpuphot {
struct Region;
struct RegionFile;
struct RegionStats;
} // namespace gpuphot

namespace gpuphot::ui {

class PipelineWorkerThread;
class PipelineWorker;
class RunScheduler;
class ParamDock;
class CatalogModel;
class CatalogFilter;
class PlotsPanel;
class PsfPanel;
class SourceInspector;
class HeaderView;
class LogPanel;
class FolderFollower;
class DisplayControls;
class LightCurvePanel;
class MosaicPanel;
class RegionLayer;
class RegionDrawer;
class GridLayer;
class PanDialog;

class MainWindow : public QMainWindow {
    Q_OBJECT
public:
    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    // Opens a FITS frame (HDU: "" = ask when the file has several images, else the number or EXTNAME).
    // A mosaic exposure (exposureExtensions non-empty) never asks: the Mosaic panel shows its CCDs and
    // the CCD last shown of that file opens, else the first.
    // Returns false, with an error dialog and status message, when the file cannot be read; otherwise the
    // frame loads on the worker thread and reduces with the current parameters (frameShown, then
    // snapshotShown when the result lands).
    bool openFrame(const QString& path, const QString& hdu = QString());
    void openReference(const QString& path, const QString& columns = QString());
    // Simulates the bundled demo field (resources/demo/simulate.json) into the cache directory once and
    // opens it with its reference catalog.
    void openDemo();
    void followFolder(const QString& dir); // "" stops
    void setFollowEveryFrame(bool on);     // every new frame in turn, or only the newest (default)
    // File -> Import SExtractor configuration: its keys onto the parameters (ParamDock::importSextractor),
    // what it cannot reproduce in the log as a warning; errors in the log and the status bar.
    bool importSextractor(const QString& path);

    viewers::ImageView* imageView() const { return m_view; }
    ParamDock* paramDock() const { return m_params; }
    PipelineWorker* worker() const;
    SnapshotPtr lastSnapshot() const { return m_snapshot; }
    QString framePath() const { return m_framePath; }
    QString cursorReadout() const; // the status bar's readout text
    // Exports (also in the File menu). A name without a suffix gets the export's default (.fits, .reg,
    // .wcs, .png); a missing folder is made; what was written goes to the status bar and the log. Return
    // false and show the error on failure.
    bool exportCatalog(const QString& path); // .fits / .ecsv / .csv by extension
    // File > Save to database: the frame's results into a SQLite file or postgresql:// URL (core/db).
    bool saveToDatabase(const QString& url);
    bool exportRegions(const QString& path);
    bool exportWcs(const QString& path);
    bool saveViewPng(const QString& path); // the view with its overlays
    // Master bias / dark / flat and bad-pixel mask of the frame preparation (File > Calibration frames...).
    // Applied on the worker (which reads them; an unusable file is an error dialog and clears the choice),
    // persisted in QSettings once the worker took them, shown in the status bar; the frame re-reduces.
    void setCalibrationFrames(const CalibrationFrames& frames);
    CalibrationFrames calibrationFrames() const { return m_calibration; } // as the worker took them
    CalibrationDialog* showCalibrationDialog(); // non-modal-loop (open()); OK applies the files
    QString statusTimesText() const;            // the status line (stage times; "provisional" while it is)
    // Light curves (ui/lightcurve_panel.hpp). While a folder is followed, the catalog of each frame the
    // workbench reduces is written to FOLDER/gpuphot/STEM.cat.fits (as `reduce -o FOLDER/gpuphot` would)
    // and joins the panel's series; clicking a star then makes it the panel's target.
    LightCurvePanel* lightCurvePanel() const { return m_curves; }
    QString followCatalogDir() const; // "" when not following
    bool openSeries(const QString& dir);
    // The Mosaic dock (ui/mosaic_panel.hpp): visible while a mosaic exposure is open.
    MosaicPanel* mosaicPanel() const { return m_mosaic; }
    // Help menu: the window's actions that have a shortcut (name without "&" and "...", key sequences),
    // sorted; the dialog listing them (non-modal, deletes itself on close); the documentation Help >
    // Documentation opens (installed README, else the repository's README beside docs/; empty when neither is
    // found).
    QList<QPair<QString, QString>> shortcuts() const;
    QDialog* showShortcutsDialog();
    // View > Pan to coordinates (ui/main_window_view.cpp): non-modal, one at a time.
    PanDialog* showPanDialog();
    static QUrl documentationUrl();
    // DS9 regions (main_window_regions.cpp): File > Load / Save DS9 regions, drawn by the regions layer
    // (View > Show DS9 regions); statistics of the pixels inside each (File > Statistics in regions);
    // forced aperture photometry at a Ctrl+click (x, y 0-based) into the Source panel. Return false
    // (or an empty list) and show the error on failure.
    bool loadRegions(const QString& path);
    bool saveRegions(const QString& path);
    RegionLayer* regionLayer() const { return m_regionLayer; }
    RegionDrawer* regionDrawer() const { return m_regionDrawer; } // Region menu: draw with the mouse
    const RegionFile* regions() const { return m_regions.get(); } // loaded and drawn (null: none)
    GridLayer* gridLayer() const { return m_gridLayer; }          // View > Coordinate grid
    std::vector<RegionStats> regionStatistics(); // one per region that holds pixels (points left out)
    QDialog* showRegionStatistics();
    bool photometryAt(double x, double y);

signals:
    void frameShown(const QString& path);
    void snapshotShown(gpuphot::ui::SnapshotPtr snapshot); // overlays, table and panels updated
    // A provisional result shown (PipelineWorker::setProvisionalResults): the new detection with apertures
    // and calibration from the previous PSF model; snapshotShown follows with the complete result.
    void provisionalShown(gpuphot::ui::SnapshotPtr snapshot);
    void calibrationFramesApplied(); // the worker took (or refused and cleared) the calibration frames
    void errorShown(const QString& message);
    void followCatalogWritten(const QString& path);

protected:
    void dragEnterEvent(QDragEnterEvent* e) override;
    void dropEvent(QDropEvent* e) override;
    void showEvent(QShowEvent* e) override;
    void closeEvent(QCloseEvent* e) override;

private:
    std::string defaultDatabasePath() const; // gpuphot.sqlite beside the frame
    void buildMenus();
    void buildHelpMenu();
    void buildDocks();
    void showError(const QString& message);
    void onFrameLoaded(std::shared_ptr<const Frame> frame);
    void onResult(SnapshotPtr snap);
    void onCursor(double x, double y);
    void selectSource(int index, bool centre);
    void addRecent(const QString& path);
    void rebuildRecentMenu();
    void updateBackendLabel();
    void copyCliCommand();
    // main_window_series.cpp: the light-curve dock and its links to the viewer and the followed folder.
    void buildLightCurveDock();
    void lightCurveTarget(int sourceIndex);
    void updateSeriesMarkers();
    void writeFollowCatalog(const SnapshotPtr& snap);
    void showSeriesFrame(const QString& path);
    // Following a folder (main_window_series.cpp): each announced frame opens on its first 2-D image HDU,
    // never with a dialog; in every-frame mode the frames queue and reduce one after the other. A frame
    // that fails is logged and listed in History, and the next one goes on.
    void followedFrameReady(const QString& path);
    void openFollowedFrame(const QString& path);
    void nextFollowedFrame();
    void frameFailed(const QString& message);
    void addHistoryRow(const QStringList& cells); // sources, FWHM, zero point, status
    // Which image HDU of a single-frame file to open: *hdu unchanged when given, the only image, else a
    // choice in a dialog (false when cancelled). Throws for a file without a 2-D image.
    bool chooseImageHdu(const QString& path, QString& hdu);
    // ui/mosaic_dock.cpp: the Mosaic dock. openAsMosaic is false for a file that is no mosaic exposure
    // (the dock hides); otherwise the panel shows it and an empty *hdu becomes the CCD to open.
    void buildMosaicDock();
    bool openAsMosaic(const QString& path, QString& hdu);
    void buildRegions(); // main_window_regions.cpp: menus, the layer, Ctrl+click
    void buildRegionDrawing();
    // An export's file: `requested` with the default suffix when it has none, its folder made.
    static QString outputPath(const QString& requested, const QString& suffix);
    void confirmWritten(const QString& what, const QString& path); // status bar and log
    QMenu* addMenuBeforeHelp(const QString& title);                // Help stays the last menu
    void addDrawnRegion(const Region& region);
    void updateRegionLayer();
    // ui/main_window_view.cpp: DS9's viewing habits in the View menu (crosshair, magnifier, pixel table,
    // pan to coordinates, orientation, coordinate grid, CFA super-pixels); viewWcs is the WCS the readout
    // uses.
    void buildViewTools();
    void buildOrientationActions(QMenu* view);
    void buildPixelTableDock(QMenu* view);
    void buildCfaAction(QMenu* view);
    void buildColourCompositeAction(QMenu* view, QAction* superPixels);
    const Wcs* viewWcs() const;
    // The plots, PSF and source panels take a complete result once the view has drawn its overlays, and
    // only while their dock is shown (a provisional result changes the overlays and the table only): a
    // hidden panel is fed when its dock is raised or before a selection or a click refers to the
    // result, so a parameter edit's overlays never wait for the panels.
    struct PanelFeed {
        QDockWidget* dock = nullptr;
        std::function<void(SnapshotPtr)> take;
        bool stale = false;
        bool shown = false; // the dock's tab is the one shown (visibilityChanged)
    };
    void addPanelFeed(QDockWidget* dock, std::function<void(SnapshotPtr)> take);
    void feedPanels(bool provisional);
    void feedPanel(PanelFeed& panel);
    void hideProgress();
    void buildEmptyHint();
    bool eventFilter(QObject* watched, QEvent* e) override; // keeps the empty view's hint centred
    void logParameterChanges();
    void feedShownPanels(); // those whose dock is shown, after the view has drawn the overlays
    void feedAllPanels();   // before a selection or a click refers to m_snapshot

    std::unique_ptr<PipelineWorkerThread> m_thread;
    RunScheduler* m_scheduler = nullptr;
    viewers::ImageView* m_view = nullptr;
    ParamDock* m_params = nullptr;
    CatalogModel* m_model = nullptr;
    CatalogFilter* m_filter = nullptr;
    QTableView* m_table = nullptr;
    PlotsPanel* m_plots = nullptr;
    PsfPanel* m_psf = nullptr;
    SourceInspector* m_inspector = nullptr;
    HeaderView* m_header = nullptr;
    LogPanel* m_log = nullptr;
    QTableWidget* m_history = nullptr;
    DisplayControls* m_display = nullptr;
    FolderFollower* m_follower = nullptr;
    LightCurvePanel* m_curves = nullptr;
    MosaicPanel* m_mosaic = nullptr;
    QDockWidget* m_mosaicDock = nullptr;
    RegionLayer* m_regionLayer = nullptr;
    RegionDrawer* m_regionDrawer = nullptr;
    GridLayer* m_gridLayer = nullptr;
    std::shared_ptr<RegionFile> m_regions; // as loaded (null: none)
    QStringList m_followQueue;             // every-frame mode: announced frames waiting for the one reducing
    QString m_following;                   // the followed frame being reduced ("" when none)
    std::shared_ptr<const Frame> m_steppedFrame; // a series frame shown by stepping (not reduced)
    QMenu* m_recentMenu = nullptr;
    QLabel* m_readout = nullptr;
    QLabel* m_times = nullptr;
    QLabel* m_backend = nullptr;
    QLabel* m_calibLabel = nullptr;
    QLabel* m_followLabel = nullptr;
    QLabel* m_emptyHint = nullptr;   // over the view until a frame opens
    CalibrationFrames m_calibration; // as the worker took them
    QProgressBar* m_progress = nullptr;
    QTimer* m_progressDelay = nullptr; // shows m_progress once a run lasts
    QPointer<QMessageBox> m_errorBox;
    std::vector<PanelFeed> m_panelFeeds;
    nlohmann::json m_loggedConfig; // flattened: the parameters of the last run request logged
    QTimer* m_panelTimer = nullptr;

    std::shared_ptr<const Frame> m_frame;
    std::shared_ptr<const Frame>
        m_shownFrame; // the pixels in the viewer: the loaded frame, then the prepared one
    SnapshotPtr m_snapshot;
    QString m_framePath;
    QString m_refPath;
    bool m_fitOnResult = true;
    bool m_dockSizesToSet = false; // no saved layout: the first show sizes the docks (showEvent)
    double m_cursorX = -1, m_cursorY = -1;
};

} // namespace gpuphot::ui
