#include "ui/mosaic_panel.hpp"

#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QMouseEvent>
#include <QPainter>
#include <QProgressBar>
#include <QPushButton>
#include <QSplitter>
#include <QTableWidget>
#include <QThread>
#include <QToolButton>
#include <QVBoxLayout>

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"
#include "ui/elided_label.hpp"

namespace gpuphot::ui {
namespace {

constexpr double kMargin = 8.0; // px around the overview

QString fixed(double v, int decimals) {
    return std::isfinite(v) ? QString::number(v, 'f', decimals) : QStringLiteral("–");
}

// Runs reduceExposure with one RunContext per CCD in flight (4 on the CUDA backend, 1 on the CPU, whose
// stages use every core), spread over the visible GPUs as `reduce` spreads them (ccdContextDevice).
// progress(fraction) after each CCD, from the reducing threads.
MosaicReductionPtr reduceOnThisThread(const std::string& path, const std::vector<ExposureExtension>& exts,
                                      const ReduceOptions& options, const std::atomic<bool>& cancel,
                                      const std::function<void(double)>& progress, QStringList& warnings) {
    Backend backend = Backend::Cpu;
    try {
        backend = resolveBackend(Backend::Auto);
    } catch (const std::exception&) {
    }
    const std::size_t k = std::min<std::size_t>(backend == Backend::Cuda ? 4 : 1, exts.size());
    const int visible = backend == Backend::Cuda ? static_cast<int>(listCudaDevices().size()) : 0;
    std::vector<std::unique_ptr<RunContext>> owned;
    std::vector<RunContext*> contexts;
    for (std::size_t i = 0; i < k; ++i) {
        auto ctx = std::make_unique<RunContext>();
        ctx->backend = backend;
        ctx->device = ccdContextDevice(i, options.exposure.gpus, visible);
        ctx->cancelFlag = &cancel;
        ctx->progress = [progress](const std::string& stage, double f) {
            if (stage == "exposure") progress(f); // per CCD; the stages' own progress is too fine here
        };
        contexts.push_back(ctx.get());
        owned.push_back(std::move(ctx));
    }
    const ReduceSummary s = reduceExposure(path, exts, options, contexts);
    for (const std::string& w : s.warnings)
        warnings << QString::fromStdString(w);
    auto r = std::make_shared<MosaicReduction>(parseExposureReport(s.report));
    r->reportPath = reportPath(path, options.output);
    return r;
}

} // namespace

// ---- overview ---------------------------------------------------------------------------------------

MosaicOverviewView::MosaicOverviewView(QWidget* parent) : QWidget(parent) {
    setObjectName(QStringLiteral("MosaicOverview"));
    setMinimumSize(240, 180);
    setMouseTracking(false);
    setToolTip(tr("Click a CCD to open it in the viewer"));
}

void MosaicOverviewView::setExtensions(const std::vector<ExposureExtension>& extensions) {
    m_extensions = extensions;
    m_overview.reset();
    m_reduction.reset();
    m_cache = QImage();
    m_done = m_total = 0;
    update();
}

void MosaicOverviewView::setOverview(MosaicOverviewPtr overview) {
    m_overview = std::move(overview);
    m_cache = QImage();
    update();
}

void MosaicOverviewView::setReduction(MosaicReductionPtr reduction) {
    m_reduction = std::move(reduction);
    update();
}

void MosaicOverviewView::setProgress(int done, int total) {
    m_done = done;
    m_total = total;
    update();
}

void MosaicOverviewView::setSelected(int hdu) {
    m_selected = hdu;
    update();
}

QTransform MosaicOverviewView::planeToWidget() const {
    if (!m_overview || m_overview->bounds.isEmpty()) return {};
    const QRectF b = m_overview->bounds;
    const double s =
        std::max(1e-9, std::min((width() - 2 * kMargin) / b.width(), (height() - 2 * kMargin) / b.height()));
    const double offX = 0.5 * (width() - s * b.width()), offY = 0.5 * (height() - s * b.height());
    // x right; the plane's +y up, so the widget's y runs from the bounds' largest y.
    return QTransform(s, 0, 0, -s, offX - b.left() * s, offY + b.bottom() * s);
}

QPolygonF MosaicOverviewView::widgetQuad(const MosaicCcd& c) const {
    const QTransform t = planeToWidget();
    QPolygonF q;
    for (const QPointF& p : c.corners)
        q << t.map(p);
    return q;
}

QPointF MosaicOverviewView::planeCentre(int hdu) const {
    if (m_overview)
        for (const MosaicCcd& c : m_overview->ccds)
            if (c.ext.hdu == hdu) return c.centre();
    return {std::nan(""), std::nan("")};
}

QPointF MosaicOverviewView::widgetCentre(int hdu) const {
    const QPointF p = planeCentre(hdu);
    return std::isfinite(p.x()) ? planeToWidget().map(p) : p;
}

int MosaicOverviewView::ccdAt(QPointF widgetPos) const {
    if (!m_overview) return -1;
    for (const MosaicCcd& c : m_overview->ccds)
        if (widgetQuad(c).containsPoint(widgetPos, Qt::OddEvenFill)) return c.ext.hdu;
    return -1;
}

void MosaicOverviewView::renderTiles() {
    m_cache = QImage(size(), QImage::Format_RGB32);
    m_cache.fill(QColor(24, 24, 28));
    if (!m_overview) return;
    QPainter p(&m_cache);
    p.setRenderHint(QPainter::SmoothPixmapTransform);
    for (const MosaicCcd& c : m_overview->ccds) {
        if (c.tile.isNull()) continue;
        const QPolygonF from{QPointF(0, 0), QPointF(c.tile.width(), 0),
                             QPointF(c.tile.width(), c.tile.height()), QPointF(0, c.tile.height())};
        QTransform t;
        if (!QTransform::quadToQuad(from, widgetQuad(c), t)) continue;
        p.setTransform(t);
        p.drawImage(QPointF(0, 0), c.tile);
    }
}

QColor MosaicOverviewView::outlineColour(const MosaicCcd& c) const {
    if (!c.error.empty()) return QColor(255, 60, 60);
    if (const MosaicCcdResult* r = m_reduction ? m_reduction->find(c.ext.hdu) : nullptr) {
        if (r->failed()) return QColor(255, 60, 60);
        if (r->outlier) return QColor(255, 150, 0);
    }
    return QColor(90, 200, 120);
}

void MosaicOverviewView::paintEvent(QPaintEvent*) {
    QPainter p(this);
    if (!m_overview) {
        p.fillRect(rect(), QColor(24, 24, 28));
        p.setPen(Qt::lightGray);
        const QString text = m_extensions.empty() ? tr("no mosaic exposure open")
                                                  : tr("reading %1 CCDs for the overview... %2 / %3")
                                                        .arg(m_extensions.size())
                                                        .arg(m_done)
                                                        .arg(m_total);
        p.drawText(rect(), Qt::AlignCenter, text);
        return;
    }
    if (m_cache.size() != size()) renderTiles();
    p.drawImage(0, 0, m_cache);
    p.setRenderHint(QPainter::Antialiasing);
    QFont f = font();
    f.setPointSizeF(std::max(6.0, f.pointSizeF() * 0.85));
    p.setFont(f);
    for (const MosaicCcd& c : m_overview->ccds) {
        const QPolygonF q = widgetQuad(c);
        const bool chosen = c.ext.hdu == m_selected;
        p.setPen(QPen(chosen ? QColor(255, 235, 60) : outlineColour(c), chosen ? 3.0 : 1.0));
        p.setBrush(Qt::NoBrush);
        p.drawPolygon(q);
        const QString label = QString::fromStdString(c.ext.extname.empty() ? c.ext.token : c.ext.extname);
        const QRectF box = q.boundingRect();
        p.setPen(QColor(0, 0, 0, 200));
        p.drawText(box.translated(1, 1), Qt::AlignCenter, label);
        p.setPen(chosen ? QColor(255, 235, 60) : QColor(230, 230, 255));
        p.drawText(box, Qt::AlignCenter, label);
    }
}

void MosaicOverviewView::mousePressEvent(QMouseEvent* e) {
    const int hdu = ccdAt(e->position());
    if (e->button() == Qt::LeftButton && hdu >= 0) emit ccdClicked(hdu);
    QWidget::mousePressEvent(e);
}

void MosaicOverviewView::resizeEvent(QResizeEvent* e) {
    m_cache = QImage();
    QWidget::resizeEvent(e);
}

// ---- panel ------------------------------------------------------------------------------------------

MosaicPanel::MosaicPanel(QWidget* parent) : QWidget(parent) {
    setObjectName(QStringLiteral("MosaicPanel"));
    buildUi();
}

MosaicPanel::~MosaicPanel() {
    if (m_overviewCancel) *m_overviewCancel = true;
    if (m_reduceCancel) *m_reduceCancel = true;
    for (const QPointer<QThread>& t : m_threads)
        if (t) t->wait();
}

void MosaicPanel::buildUi() {
    auto* top = new QHBoxLayout;
    m_reduce = new QPushButton(tr("Reduce exposure"), this);
    m_reduce->setObjectName(QStringLiteral("ReduceExposureButton"));
    m_reduce->setToolTip(tr("Every CCD with the current parameters and reference catalog (gpuphot reduce)"));
    m_cancel = new QPushButton(tr("Cancel"), this);
    m_cancel->setEnabled(false);
    m_outdir = new QLineEdit(this);
    m_outdir->setObjectName(QStringLiteral("MosaicOutputDir"));
    m_outdir->setToolTip(tr("Folder the reduction is written to (created when missing)"));
    auto* browse = new QToolButton(this);
    browse->setText(QStringLiteral("..."));
    top->addWidget(m_reduce);
    top->addWidget(m_cancel);
    top->addWidget(new QLabel(tr("to"), this));
    top->addWidget(m_outdir, 1);
    top->addWidget(browse);
    auto* bottom = new QHBoxLayout;
    m_progress = new QProgressBar(this);
    m_progress->setRange(0, 100);
    m_progress->setVisible(false);
    m_status = new ElidedLabel(this); // a long message never widens the dock
    m_status->setObjectName(QStringLiteral("MosaicStatus"));
    bottom->addWidget(m_status, 1);
    bottom->addWidget(m_progress);

    m_view = new MosaicOverviewView(this);
    m_table = new QTableWidget(0, ColumnCount, this);
    m_table->setObjectName(QStringLiteral("MosaicTable"));
    m_table->setHorizontalHeaderLabels({tr("EXTNAME"), tr("HDU"), tr("size"), tr("gain"), tr("sky [ADU]"),
                                        tr("sigma [ADU]"), tr("saturated"), tr("sources"), tr("FWHM [px]"),
                                        tr("ZP"), tr("ZP offset"), tr("calibrators"), tr("astrom. RMS [\"]"),
                                        tr("status")});
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->verticalHeader()->setVisible(false);
    m_table->verticalHeader()->setDefaultSectionSize(20);
    m_table->horizontalHeader()->setStretchLastSection(true);
    auto* split = new QSplitter(Qt::Horizontal, this);
    split->addWidget(m_view);
    split->addWidget(m_table);
    split->setStretchFactor(0, 2);
    split->setStretchFactor(1, 3);

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->addLayout(top);
    layout->addWidget(split, 1);
    layout->addLayout(bottom);

    connect(m_reduce, &QPushButton::clicked, this, &MosaicPanel::reduceRequested);
    connect(m_cancel, &QPushButton::clicked, this, &MosaicPanel::cancelReduction);
    connect(browse, &QToolButton::clicked, this, [this] {
        const QString d = QFileDialog::getExistingDirectory(this, tr("Write the reduction to"), outputDir());
        if (!d.isEmpty()) m_outdir->setText(d);
    });
    connect(m_view, &MosaicOverviewView::ccdClicked, this, [this](int hdu) { chooseRow(rowOf(hdu)); });
    connect(m_table, &QTableWidget::currentCellChanged, this, [this](int row, int, int, int) {
        if (!m_filling) chooseRow(row);
    });
    setEnabled(false);
}

void MosaicPanel::runJob(std::function<void()> job) {
    QThread* t = QThread::create(std::move(job));
    connect(t, &QThread::finished, t, &QObject::deleteLater);
    std::erase_if(m_threads, [](const QPointer<QThread>& p) { return p.isNull(); });
    m_threads.emplace_back(t);
    t->start();
}

void MosaicPanel::setExposure(const QString& path, const std::vector<ExposureExtension>& extensions) {
    if (m_overviewCancel) *m_overviewCancel = true; // an earlier exposure's overview is not wanted any more
    if (path != m_path || outputDir().isEmpty()) m_outdir->setText(defaultMosaicOutputDir(path));
    m_path = path;
    m_extensions = extensions;
    m_overview.reset();
    m_reduction.reset();
    m_current = -1;
    m_view->setExtensions(extensions);
    fillTable();
    setEnabled(true);
    const quint64 generation = ++m_generation;
    auto cancel = std::make_shared<std::atomic<bool>>(false);
    m_overviewCancel = cancel;
    setBusy(tr("reading the CCDs..."), false);
    const std::string file = path.toStdString();
    runJob([this, file, extensions, cancel, generation] {
        auto progress = [this, cancel](int done, int total) {
            if (*cancel) return;
            QMetaObject::invokeMethod(
                this,
                [this, done, total] {
                    m_view->setProgress(done, total);
                    m_progress->setValue(100 * done / std::max(1, total));
                },
                Qt::QueuedConnection);
        };
        MosaicOverviewPtr overview;
        MosaicReductionPtr report;
        QString error;
        try {
            overview = computeMosaicOverview(file, extensions, progress, *cancel);
            report = findExposureReport(file);
        } catch (const std::exception& e) { // unreadable CCDs are kept per CCD; this is anything else
            error = QString::fromStdString(e.what());
        }
        QMetaObject::invokeMethod(
            this,
            [this, generation, overview, report, error] {
                overviewDone(generation, overview, report, error);
            },
            Qt::QueuedConnection);
    });
}

void MosaicPanel::overviewDone(quint64 generation, MosaicOverviewPtr overview, MosaicReductionPtr report,
                               const QString& error) {
    if (generation != m_generation) return; // another exposure opened since
    m_overviewCancel.reset();
    if (!m_reduceCancel) setBusy(QString(), false);
    if (!overview) {
        showStatus(error.isEmpty() ? tr("overview cancelled") : tr("overview failed: %1").arg(error));
        if (!error.isEmpty()) emit logMessage(LogLevel::Error, tr("mosaic: overview failed: %1").arg(error));
        return;
    }
    m_overview = std::move(overview);
    m_view->setOverview(m_overview);
    int unread = 0;
    for (const MosaicCcd& c : m_overview->ccds)
        if (!c.error.empty()) {
            ++unread;
            emit logMessage(LogLevel::Error, QString::fromStdString(c.ext.token + ": " + c.error));
        }
    showStatus(tr("%1 CCDs, overview binned %2x%2%3%4")
                   .arg(m_overview->ccds.size())
                   .arg(m_overview->bin)
                   .arg(m_overview->placedByWcs ? QString() : tr(", no WCS: laid out in HDU order"))
                   .arg(unread ? tr(", %1 unreadable").arg(unread) : QString()));
    if (report && !m_reduction) {
        m_reduction = std::move(report);
        emit logMessage(
            LogLevel::Info,
            tr("mosaic: reduction found: %1").arg(QString::fromStdString(m_reduction->reportPath)));
    }
    fillTable();
    m_view->setReduction(m_reduction);
    emit overviewReady();
    if (m_reduction) emit reductionLoaded();
}

void MosaicPanel::clear() {
    if (m_overviewCancel) *m_overviewCancel = true;
    m_overviewCancel.reset();
    ++m_generation;
    m_path.clear();
    m_extensions.clear();
    m_overview.reset();
    m_reduction.reset();
    m_current = -1;
    m_view->setExtensions({});
    fillTable();
    m_status->clear();
    if (!m_reduceCancel) setBusy(QString(), false);
    setEnabled(false);
}

int MosaicPanel::rowOf(int hdu) const {
    for (std::size_t k = 0; k < m_extensions.size(); ++k)
        if (m_extensions[k].hdu == hdu) return static_cast<int>(k);
    return -1;
}

void MosaicPanel::setCurrentHdu(const QString& hdu) {
    bool number = false;
    int h = hdu.toInt(&number);
    if (!number)
        for (const ExposureExtension& e : m_extensions)
            if (QString::fromStdString(e.extname).compare(hdu, Qt::CaseInsensitive) == 0) h = e.hdu;
    const int row = rowOf(h);
    if (row < 0) return;
    m_current = h;
    m_chosen[m_path] = h;
    m_view->setSelected(h);
    m_filling = true;
    m_table->selectRow(row);
    m_table->setCurrentCell(row, 0);
    m_filling = false;
}

int MosaicPanel::rememberedHdu(const QString& path) const {
    const auto it = m_chosen.find(path);
    if (it != m_chosen.end() && (path != m_path || rowOf(*it) >= 0)) return *it;
    return path == m_path && !m_extensions.empty() ? m_extensions.front().hdu : -1;
}

void MosaicPanel::chooseRow(int row) {
    if (row < 0 || row >= static_cast<int>(m_extensions.size())) return;
    const int hdu = m_extensions[static_cast<std::size_t>(row)].hdu;
    m_view->setSelected(hdu);
    if (hdu != m_current) emit ccdChosen(hdu);
}

QString MosaicPanel::outputDir() const {
    return m_outdir->text().trimmed();
}

void MosaicPanel::setOutputDir(const QString& dir) {
    m_outdir->setText(dir);
}

void MosaicPanel::showStatus(const QString& text) {
    m_status->setText(text);
    m_status->setToolTip(text); // the whole line where the label cuts it
}

void MosaicPanel::setBusy(const QString& what, bool reduce) {
    const bool busy = !what.isEmpty();
    m_progress->setVisible(busy);
    if (busy) {
        m_progress->setValue(0);
        m_progress->setFormat(what + QStringLiteral(" %p%"));
        showStatus(what);
    }
    m_reduce->setEnabled(!m_reduceCancel && !reduce);
    m_cancel->setEnabled(reduce);
}

// ---- the table --------------------------------------------------------------------------------------

void MosaicPanel::fillTable() {
    m_filling = true;
    m_table->setRowCount(static_cast<int>(m_extensions.size()));
    for (std::size_t k = 0; k < m_extensions.size(); ++k) {
        const ExposureExtension& e = m_extensions[k];
        const int row = static_cast<int>(k);
        for (int col = 0; col < ColumnCount; ++col) {
            auto* item = new QTableWidgetItem;
            if (col != Extname && col != Status) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
            m_table->setItem(row, col, item);
        }
        m_table->item(row, Extname)->setText(QString::fromStdString(e.extname.empty() ? e.token : e.extname));
        m_table->item(row, Hdu)->setText(QString::number(e.hdu));
        m_table->item(row, Size)->setText(QStringLiteral("%1 x %2").arg(e.width).arg(e.height));
        if (m_overview && k < m_overview->ccds.size()) fillStatistics(row, m_overview->ccds[k]);
        fillReduction(row, m_reduction ? m_reduction->find(e.hdu) : nullptr);
    }
    m_table->resizeColumnsToContents();
    const int row = rowOf(m_current);
    if (row >= 0) m_table->selectRow(row);
    m_filling = false;
}

void MosaicPanel::fillStatistics(int row, const MosaicCcd& c) {
    m_table->item(row, Gain)->setText(fixed(c.gain, 3));
    m_table->item(row, Sky)->setText(fixed(c.sky, 1));
    m_table->item(row, Sigma)->setText(fixed(c.sigma, 2));
    m_table->item(row, Saturated)
        ->setText(c.saturated < 0 ? QStringLiteral("–") : QString::number(c.saturated));
    if (!c.error.empty()) {
        m_table->item(row, Status)->setText(tr("unreadable"));
        m_table->item(row, Status)->setToolTip(QString::fromStdString(c.error));
    }
}

void MosaicPanel::fillReduction(int row, const MosaicCcdResult* r) {
    if (!r) return;
    m_table->item(row, Sources)->setText(QString::number(r->sources));
    m_table->item(row, Fwhm)->setText(fixed(r->fwhm, 2));
    m_table->item(row, Zp)->setText(fixed(r->zp, 3));
    m_table->item(row, ZpOffset)
        ->setText(std::isfinite(r->zpOffset)
                      ? QStringLiteral("%1 ± %2").arg(fixed(r->zpOffset, 3), fixed(r->zpOffsetErr, 3))
                      : QStringLiteral("–"));
    m_table->item(row, Calibrators)->setText(QString::number(r->calibrators));
    m_table->item(row, Rms)->setText(fixed(r->rms, 3));
    QString status = r->failed()  ? tr("failed: %1").arg(QString::fromStdString(r->error))
                     : r->outlier ? tr("ZP outlier")
                                  : tr("ok");
    if (!r->failed() && r->zpUsed != "own")
        status += tr(" (zero point: %1)").arg(QString::fromStdString(r->zpUsed));
    m_table->item(row, Status)->setText(status);
    m_table->item(row, Status)->setToolTip(status);
    if (!r->failed() && !r->outlier) return;
    const QColor colour = r->failed() ? QColor(255, 140, 140) : QColor(255, 200, 120);
    for (int col = 0; col < ColumnCount; ++col) {
        m_table->item(row, col)->setBackground(colour);
        m_table->item(row, col)->setForeground(Qt::black);
    }
}

// ---- the reduction ----------------------------------------------------------------------------------

bool MosaicPanel::startReduction(const PipelineConfig& config) {
    if (m_reduceCancel || m_path.isEmpty()) {
        emit logMessage(LogLevel::Warning, m_path.isEmpty() ? tr("mosaic: no exposure open")
                                                            : tr("mosaic: a reduction is already running"));
        return false;
    }
    const QString outdir = outputDir().isEmpty() ? defaultMosaicOutputDir(m_path) : outputDir();
    if (!QDir().mkpath(outdir)) {
        emit logMessage(LogLevel::Error, tr("mosaic: cannot create %1").arg(outdir));
        return false;
    }
    ReduceOptions options;
    options.config = config;
    options.output.outdir = outdir.toStdString();
    options.reference = m_reference.get();
    if (!m_reference)
        emit logMessage(LogLevel::Warning,
                        tr("mosaic: no reference catalog: no astrometric fit or zero points"));
    auto cancel = std::make_shared<std::atomic<bool>>(false);
    m_reduceCancel = cancel;
    setBusy(tr("reducing %1 CCDs").arg(m_extensions.size()), true);
    emit logMessage(LogLevel::Info, tr("mosaic: reducing %1 into %2").arg(m_path, outdir));
    const std::string file = m_path.toStdString();
    runJob([this, file, exts = m_extensions, options, reference = m_reference, cancel] {
        auto progress = [this](double f) {
            QMetaObject::invokeMethod(
                this, [this, f] { m_progress->setValue(static_cast<int>(100 * f)); }, Qt::QueuedConnection);
        };
        MosaicReductionPtr result;
        QString error;
        QStringList warnings;
        try {
            result = reduceOnThisThread(file, exts, options, *cancel, progress, warnings);
        } catch (const Cancelled&) {
            error = tr("cancelled");
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        QMetaObject::invokeMethod(
            this, [this, file, result, error, warnings] { reductionDone(file, result, error, warnings); },
            Qt::QueuedConnection);
    });
    return true;
}

void MosaicPanel::cancelReduction() {
    if (m_reduceCancel) *m_reduceCancel = true;
}

void MosaicPanel::reductionDone(const std::string& file, MosaicReductionPtr reduction, const QString& error,
                                const QStringList& warnings) {
    m_reduceCancel.reset();
    setBusy(m_overviewCancel ? tr("reading the CCDs...") : QString(), false);
    for (const QString& w : warnings)
        emit logMessage(LogLevel::Warning, tr("mosaic: %1").arg(w));
    if (reduction && QString::fromStdString(file) != m_path) { // another file opened meanwhile: only logged
        emit logMessage(LogLevel::Info, tr("mosaic: %1 reduced: %2")
                                            .arg(QString::fromStdString(file),
                                                 QString::fromStdString(reduction->reportPath)));
        emit reductionFinished(true, QString::fromStdString(reduction->reportPath));
        return;
    }
    if (!reduction) {
        const QString message = tr("mosaic: reduction failed: %1").arg(error);
        showStatus(message);
        emit logMessage(error == tr("cancelled") ? LogLevel::Warning : LogLevel::Error, message);
        emit reductionFinished(false, message);
        return;
    }
    m_reduction = std::move(reduction);
    fillTable();
    m_view->setReduction(m_reduction);
    const QString message =
        tr("mosaic: reduced, exposure ZP %1 ± %2, offset scatter %3 mag, %4 outlier(s); "
           "report %5")
            .arg(fixed(m_reduction->zp, 3), fixed(m_reduction->zpErr, 3), fixed(m_reduction->scatter, 3))
            .arg(m_reduction->outliers.size())
            .arg(QString::fromStdString(m_reduction->reportPath));
    showStatus(message);
    emit logMessage(LogLevel::Info, message);
    emit reductionLoaded();
    emit reductionFinished(true, message);
}

} // namespace gpuphot::ui
