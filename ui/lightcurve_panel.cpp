#include "ui/lightcurve_panel.hpp"

#include <qcustomplot.h>

#include <QComboBox>
#include <QDir>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMenu>
#include <QPushButton>
#include <QSpinBox>
#include <QSplitter>
#include <QTabWidget>
#include <QTableWidget>
#include <QTimer>
#include <QToolButton>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/series/series_output.hpp"
#include "core/series/variability.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::ui {
namespace {

constexpr double kUnixEpochJd = 2440587.5;
enum EnsembleColumn { kStar, kRa, kDec, kMag, kWeight, kScatter, kStatus, kPin, kExclude, kColumns };

// Consecutive points averaged `bin` at a time (inverse-variance weights), keys averaged alike.
struct Binned {
    QVector<double> key, value, err;
};
Binned binPoints(const std::vector<double>& key, const std::vector<double>& value,
                 const std::vector<double>& err, int bin) {
    Binned out;
    double sk = 0, sv = 0, sw = 0;
    int n = 0;
    const auto flush = [&] {
        if (n > 0 && sw > 0) {
            out.key.push_back(sk / sw);
            out.value.push_back(sv / sw);
            out.err.push_back(1.0 / std::sqrt(sw));
        }
        sk = sv = sw = 0;
        n = 0;
    };
    for (std::size_t k = 0; k < key.size(); ++k) {
        if (!std::isfinite(key[k]) || !std::isfinite(value[k]) || !(err[k] > 0)) continue;
        const double w = 1.0 / (err[k] * err[k]);
        sk += w * key[k];
        sv += w * value[k];
        sw += w;
        if (++n >= bin) flush();
    }
    flush();
    return out;
}

QCustomPlot* newPlot(QWidget* parent, const QString& name) {
    auto* p = new QCustomPlot(parent);
    p->setObjectName(name);
    p->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    return p;
}

QTableWidgetItem* checkItem(bool on) {
    auto* it = new QTableWidgetItem;
    it->setFlags(Qt::ItemIsEnabled | Qt::ItemIsUserCheckable);
    it->setCheckState(on ? Qt::Checked : Qt::Unchecked);
    return it;
}

QTableWidgetItem* textItem(const QString& text) {
    auto* it = new QTableWidgetItem(text);
    it->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
    return it;
}

QString number(double v, int digits) {
    return std::isfinite(v) ? QString::number(v, 'f', digits) : QStringLiteral("-");
}

} // namespace

LightCurvePanel::LightCurvePanel(QWidget* parent) : QWidget(parent) {
    m_runner = new SeriesRunner(this);
    m_allStars = new SeriesRunner(this);
    connect(m_runner, &SeriesRunner::resultReady, this, &LightCurvePanel::onResult);
    connect(m_allStars, &SeriesRunner::resultReady, this, &LightCurvePanel::onVariables);
    for (SeriesRunner* r : {m_runner, m_allStars}) {
        connect(r, &SeriesRunner::failed, this, [this](const QString& m) {
            m_status->setText(tr("no light curve: %1").arg(m));
            emit errorShown(m);
        });
        connect(r, &SeriesRunner::started, this, [this] { m_status->setText(tr("computing...")); });
    }
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(2, 2, 2, 2);
    m_tabs = new QTabWidget(this);
    layout->addWidget(m_tabs);
    auto* curveTab = new QWidget(m_tabs);
    auto* varTab = new QWidget(m_tabs);
    auto* nightTab = new QWidget(m_tabs);
    buildCurveTab(curveTab);
    buildVariablesTab(varTab);
    buildNightTab(nightTab);
    m_tabs->addTab(curveTab, tr("Curve"));
    m_tabs->addTab(varTab, tr("Variables"));
    m_tabs->addTab(nightTab, tr("Night"));
    m_status = new QLabel(
        tr("no series: open one (Light curves > Open series) or follow a folder, then click a star"), this);
    m_status->setWordWrap(true);
    layout->addWidget(m_status);
    m_blink = new QTimer(this);
    m_blink->setInterval(600);
    connect(m_blink, &QTimer::timeout, this, [this] { stepFrame(1); });
}

LightCurvePanel::~LightCurvePanel() = default;

void LightCurvePanel::buildCurveTab(QWidget* tab) {
    auto* v = new QVBoxLayout(tab);
    v->setContentsMargins(0, 0, 0, 0);
    auto* bar = new QHBoxLayout;
    m_axisBox = new QComboBox(tab);
    m_axisBox->addItems({tr("BJD_TDB"), tr("UTC")});
    connect(m_axisBox, &QComboBox::currentIndexChanged, this,
            [this](int i) { setTimeAxis(i == 0 ? TimeAxis::BjdTdb : TimeAxis::Utc); });
    m_binBox = new QSpinBox(tab);
    m_binBox->setRange(1, 100);
    m_binBox->setPrefix(tr("bin "));
    connect(m_binBox, &QSpinBox::valueChanged, this, [this](int n) { setBinning(n); });
    bar->addWidget(m_axisBox);
    bar->addWidget(m_binBox);
    auto* detrend = new QToolButton(tab);
    detrend->setText(tr("Detrend"));
    detrend->setToolTip(tr("Divide out a linear fit of the curve against these (series --detrend)"));
    detrend->setPopupMode(QToolButton::InstantPopup);
    auto* menu = new QMenu(detrend);
    for (const std::string& term : detrendTerms()) {
        QAction* a = menu->addAction(QString::fromStdString(term));
        a->setCheckable(true);
        connect(a, &QAction::toggled, this, [this] {
            std::vector<std::string> terms;
            for (QAction* t : m_detrendActions)
                if (t->isChecked()) terms.push_back(t->text().toStdString());
            setDetrend(terms);
        });
        m_detrendActions.push_back(a);
    }
    detrend->setMenu(menu);
    bar->addWidget(detrend);
    m_transitButton = new QPushButton(tr("Transit fit"), tab);
    m_transitButton->setCheckable(true);
    m_transitButton->setToolTip(tr("Find and fit a transit (trapezoid) in the curve (series --transit)"));
    connect(m_transitButton, &QPushButton::toggled, this, &LightCurvePanel::setFitTransit);
    bar->addWidget(m_transitButton);
    bar->addStretch(1);
    const auto button = [&](const QString& text, auto slot) {
        auto* b = new QPushButton(text, tab);
        connect(b, &QPushButton::clicked, this, slot);
        bar->addWidget(b);
    };
    button(tr("◀"), [this] { stepFrame(-1); });
    button(tr("▶"), [this] { stepFrame(1); });
    auto* blink = new QPushButton(tr("Blink"), tab);
    blink->setCheckable(true);
    connect(blink, &QPushButton::toggled, this, &LightCurvePanel::setBlinking);
    bar->addWidget(blink);
    button(tr("Export…"), [this] {
        const QString p =
            QFileDialog::getSaveFileName(this, tr("Export light curve"), m_targetName + ".lc.csv",
                                         tr("Light curve (*.csv *.ecsv *.fits)"));
        if (!p.isEmpty()) exportCurve(p);
    });
    button(tr("PNG…"), [this] {
        const QString p = QFileDialog::getSaveFileName(this, tr("Export plot"), m_targetName + ".png",
                                                       tr("PNG image (*.png)"));
        if (!p.isEmpty()) exportPng(p);
    });
    v->addLayout(bar);
    auto* split = new QSplitter(Qt::Horizontal, tab);
    m_curvePlot = newPlot(split, QStringLiteral("LightCurvePlot"));
    m_ensemble = new QTableWidget(0, kColumns, split);
    m_ensemble->setObjectName(QStringLiteral("EnsembleTable"));
    m_ensemble->setHorizontalHeaderLabels({tr("star"), tr("RA"), tr("Dec"), tr("mag"), tr("weight"),
                                           tr("scatter"), tr("status"), tr("pin"), tr("exclude")});
    m_ensemble->verticalHeader()->setVisible(false);
    m_ensemble->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    connect(m_ensemble, &QTableWidget::cellChanged, this, &LightCurvePanel::onEnsembleEdited);
    split->addWidget(m_curvePlot);
    split->addWidget(m_ensemble);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 2);
    v->addWidget(split, 1);
}

void LightCurvePanel::buildVariablesTab(QWidget* tab) {
    auto* v = new QVBoxLayout(tab);
    v->setContentsMargins(0, 0, 0, 0);
    auto* bar = new QHBoxLayout;
    auto* find = new QPushButton(tr("Find variables"), tab);
    find->setToolTip(tr("Every well-measured star's curve against its own ensemble (as series --all-stars)"));
    connect(find, &QPushButton::clicked, this, &LightCurvePanel::findVariables);
    bar->addWidget(find);
    m_periodLabel = new QLabel(tab);
    bar->addWidget(m_periodLabel, 1);
    v->addLayout(bar);
    auto* split = new QSplitter(Qt::Horizontal, tab);
    m_rmsPlot = newPlot(split, QStringLiteral("RmsMagPlot"));
    m_rmsPlot->xAxis->setLabel(tr("magnitude"));
    m_rmsPlot->yAxis->setLabel(tr("RMS of rel_flux"));
    m_rmsPlot->yAxis->setScaleType(QCPAxis::stLogarithmic);
    m_rmsPlot->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
    connect(m_rmsPlot, &QCustomPlot::plottableClick, this,
            [this](QCPAbstractPlottable* p, int index, QMouseEvent*) {
                auto* g = qobject_cast<QCPGraph*>(p);
                if (!g || index < 0 || index >= g->dataCount()) return;
                const auto it = g->data()->at(index);
                onRmsClick(it->key, it->value);
            });
    m_periodPlot = newPlot(split, QStringLiteral("PeriodogramPlot"));
    m_periodPlot->xAxis->setLabel(tr("period [h]"));
    m_periodPlot->yAxis->setLabel(tr("Lomb-Scargle power"));
    m_periodPlot->xAxis->setScaleType(QCPAxis::stLogarithmic);
    m_periodPlot->xAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
    split->addWidget(m_rmsPlot);
    split->addWidget(m_periodPlot);
    v->addWidget(split, 1);
}

void LightCurvePanel::buildNightTab(QWidget* tab) {
    auto* v = new QVBoxLayout(tab);
    v->setContentsMargins(0, 0, 0, 0);
    m_nightPlot = newPlot(tab, QStringLiteral("NightPlot"));
    connect(m_nightPlot, &QCustomPlot::plottableClick, this,
            [this](QCPAbstractPlottable*, int index, QMouseEvent*) {
                if (index >= 0) stepFrame(index - m_frame);
            });
    v->addWidget(m_nightPlot, 1);
}

void LightCurvePanel::setCatalogs(const QStringList& catalogs) {
    std::vector<std::string> c;
    for (const QString& s : catalogs)
        c.push_back(s.toStdString());
    m_runner->setCatalogs(c);
    m_frame = -1;
}

void LightCurvePanel::addCatalog(const QString& catalog) {
    m_runner->addCatalog(catalog.toStdString());
}

void LightCurvePanel::setTarget(const QString& name, double ra, double dec) {
    m_targetName = name.isEmpty() ? QStringLiteral("target") : name;
    m_targetRa = ra;
    m_targetDec = dec;
    m_haveTarget = true;
    m_chosen.clear(); // another star: another neighbourhood of comparison stars
    applyInputs();
}

bool LightCurvePanel::loadTargets(const QString& path) {
    try {
        const TargetList t = readTargetList(path.toStdString());
        setTarget(QString::fromStdString(t.name[0]), t.ra[0], t.dec[0]);
        return true;
    } catch (const std::exception& e) {
        emit errorShown(QString::fromStdString(e.what()));
        return false;
    }
}

bool LightCurvePanel::openSeries(const QString& dir) {
    try {
        const std::vector<std::string> cats = seriesCatalogsIn(dir.toStdString());
        if (cats.empty())
            throw InvalidInput(dir.toStdString() + ": no series.json (a gpuphot series directory?)");
        QStringList list;
        for (const auto& c : cats)
            list << QString::fromStdString(c);
        setCatalogs(list);
        const auto j =
            nlohmann::json::parse(std::ifstream(std::filesystem::path(dir.toStdString()) / "series.json"));
        for (const auto& t : j.value("targets", nlohmann::json::array()))
            if (t.contains("ra") && t.contains("dec")) {
                setTarget(QString::fromStdString(t.value("name", std::string("target"))),
                          t["ra"].get<double>(), t["dec"].get<double>());
                break;
            }
        return true;
    } catch (const std::exception& e) {
        emit errorShown(QString::fromStdString(e.what()));
        return false;
    }
}

// The target first, then each pinned or excluded comparison star as a named entry, as a targets file for
// `gpuphot series --pin NAME --exclude NAME` would list them.
void LightCurvePanel::applyInputs() {
    if (!m_haveTarget) return;
    TargetList t;
    t.name.push_back(m_targetName.toStdString());
    t.ra.push_back(m_targetRa);
    t.dec.push_back(m_targetDec);
    SeriesParams p = m_runner->params();
    p.pinned.clear();
    p.excluded.clear();
    p.detrend = m_detrend;
    p.fitTransits = m_fitTransit;
    for (const Chosen& c : m_chosen) {
        const std::string name = "cmp" + std::to_string(c.source + 1);
        t.name.push_back(name);
        t.ra.push_back(c.ra);
        t.dec.push_back(c.dec);
        (c.choice == Choice::Pinned ? p.pinned : p.excluded).push_back(name);
    }
    m_runner->setInputs(std::move(t), std::move(p));
}

void LightCurvePanel::setComparison(std::size_t source, Choice choice) {
    m_chosen.erase(
        std::remove_if(m_chosen.begin(), m_chosen.end(), [&](const Chosen& c) { return c.source == source; }),
        m_chosen.end());
    if (choice != Choice::Auto) {
        if (!m_result || source >= m_result->sources.size()) return;
        m_chosen.push_back({source, m_result->sources[source].ra, m_result->sources[source].dec, choice});
    }
    applyInputs();
}

LightCurvePanel::Choice LightCurvePanel::comparison(std::size_t source) const {
    for (const Chosen& c : m_chosen)
        if (c.source == source) return c.choice;
    return Choice::Auto;
}

void LightCurvePanel::setTimeAxis(TimeAxis axis) {
    m_axis = axis;
    if (m_axisBox->currentIndex() != (axis == TimeAxis::BjdTdb ? 0 : 1))
        m_axisBox->setCurrentIndex(axis == TimeAxis::BjdTdb ? 0 : 1);
    drawCurve();
    drawNight();
}

void LightCurvePanel::setBinning(int points) {
    m_bin = std::max(1, points);
    if (m_binBox->value() != m_bin) m_binBox->setValue(m_bin);
    drawCurve();
}

void LightCurvePanel::setDetrend(const std::vector<std::string>& terms) {
    m_detrend = terms;
    for (QAction* a : m_detrendActions) {
        const bool on = std::find(terms.begin(), terms.end(), a->text().toStdString()) != terms.end();
        if (a->isChecked() != on) {
            const QSignalBlocker block(a);
            a->setChecked(on);
        }
    }
    applyInputs();
}

void LightCurvePanel::setFitTransit(bool on) {
    m_fitTransit = on;
    if (m_transitButton->isChecked() != on) {
        const QSignalBlocker block(m_transitButton);
        m_transitButton->setChecked(on);
    }
    applyInputs();
}

void LightCurvePanel::findVariables() {
    if (!m_haveTarget || m_runner->catalogs().empty()) {
        m_status->setText(tr("find variables: open a series and choose a star first"));
        return;
    }
    // From now on the target's ensemble also leaves the flagged stars out (series --variability).
    SeriesParams p = m_runner->params();
    p.findVariables = true;
    m_runner->setParams(p);
    p.allStars = true;
    m_allStars->setCatalogs(m_runner->catalogs());
    m_allStars->setInputs(m_runner->targets(), p);
}

const LightCurve* LightCurvePanel::curve() const {
    if (!m_result || m_result->curves.empty()) return nullptr;
    return &m_result->curves.front();
}

std::vector<LightCurvePanel::SkyMarker> LightCurvePanel::markers() const {
    std::vector<SkyMarker> out;
    if (m_haveTarget) out.push_back({m_targetRa, m_targetDec, SkyMarker::Target});
    if (const LightCurve* c = curve())
        for (const EnsembleStar& e : c->ensemble) {
            const SeriesSource& s = m_result->sources[e.source];
            out.push_back({s.ra, s.dec, e.dropped ? SkyMarker::Dropped : SkyMarker::Comparison});
        }
    for (const Chosen& c : m_chosen)
        if (c.choice == Choice::Excluded) out.push_back({c.ra, c.dec, SkyMarker::Excluded});
    return out;
}

void LightCurvePanel::onResult(SeriesResultPtr result) {
    m_result = std::move(result);
    m_framePaths.clear();
    fillEnsemble();
    drawCurve();
    drawPeriodogram();
    drawNight();
    m_status->setText(statusText());
    emit markersChanged();
    emit curveChanged();
}

QString LightCurvePanel::statusText() const {
    const LightCurve* c = curve();
    if (!c) return tr("no light curve yet");
    if (!c->problem.empty()) return tr("%1: %2").arg(m_targetName, QString::fromStdString(c->problem));
    int active = 0;
    for (const auto& e : c->ensemble)
        active += e.dropped ? 0 : 1;
    QString s = tr("%1: %2 points over %3 frames, %4 comparison stars, RMS %5 (median error %6)")
                    .arg(m_targetName)
                    .arg(c->relFlux.size())
                    .arg(m_result->used.size())
                    .arg(active)
                    .arg(c->rms, 0, 'g', 3)
                    .arg(c->medianErr, 0, 'g', 3);
    if (c->detrendFit.points > 0) {
        s += tr("; detrended:");
        for (std::size_t k = 0; k < c->detrendFit.terms.size(); ++k)
            s += QStringLiteral(" %1 %2±%3")
                     .arg(QString::fromStdString(c->detrendFit.terms[k]))
                     .arg(c->detrendFit.coef[k], 0, 'g', 3)
                     .arg(c->detrendFit.coefErr[k], 0, 'g', 2);
    }
    if (const TransitFit& t = c->transit; t.found)
        s += tr("; transit: depth %1 ± %2 %, mid BJD_TDB %3 ± %4 min, duration %5 h (S/N %6)")
                 .arg(t.depth * 100.0, 0, 'f', 3)
                 .arg(t.depthErr * 100.0, 0, 'f', 3)
                 .arg(t.mid, 0, 'f', 5)
                 .arg(t.midErr * 1440.0, 0, 'f', 1)
                 .arg(t.duration * 24.0, 0, 'f', 2)
                 .arg(t.snr, 0, 'f', 0);
    else if (m_fitTransit)
        s += tr("; no transit found");
    return s;
}

double LightCurvePanel::timeOf(const LightCurve& c, std::size_t k) const {
    return m_axis == TimeAxis::BjdTdb ? c.bjdTdb[k] : (c.jdUtc[k] - kUnixEpochJd) * 86400.0;
}

void LightCurvePanel::drawCurve() {
    QCustomPlot* p = m_curvePlot;
    p->clearGraphs();
    p->clearPlottables();
    const LightCurve* c = curve();
    if (!c || c->relFlux.empty()) {
        p->replot();
        return;
    }
    std::vector<double> key(c->relFlux.size());
    for (std::size_t k = 0; k < key.size(); ++k)
        key[k] = timeOf(*c, k);
    const Binned b = binPoints(key, c->relFlux, c->relFluxErr, m_bin);
    QCPGraph* g = p->addGraph();
    g->setName(m_targetName);
    g->setLineStyle(QCPGraph::lsNone);
    g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, QColor(20, 90, 200), 4));
    g->setData(b.key, b.value, true);
    auto* bars = new QCPErrorBars(p->xAxis, p->yAxis);
    bars->setDataPlottable(g);
    bars->setData(b.err);
    bars->setPen(QPen(QColor(20, 90, 200, 120)));
    if (m_axis == TimeAxis::Utc) {
        auto t = QSharedPointer<QCPAxisTickerDateTime>(new QCPAxisTickerDateTime);
        t->setDateTimeFormat(QStringLiteral("HH:mm"));
        t->setDateTimeSpec(Qt::UTC);
        p->xAxis->setTicker(t);
        p->xAxis->setLabel(tr("UTC (mid-exposure)"));
    } else {
        p->xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
        p->xAxis->ticker()->setTickCount(6);
        p->xAxis->setNumberFormat(QStringLiteral("f"));
        p->xAxis->setNumberPrecision(4);
        p->xAxis->setLabel(tr("BJD_TDB"));
    }
    p->yAxis->setLabel(m_bin > 1 ? tr("relative flux (bins of %1)").arg(m_bin) : tr("relative flux"));
    p->rescaleAxes();
    drawTransit(*c);
    p->replot();
}

// The fitted trapezoid over the curve's time range, sampled finely enough to show its corners.
void LightCurvePanel::drawTransit(const LightCurve& c) {
    if (!c.transit.found || c.bjdTdb.empty()) return;
    const auto [lo, hi] = std::minmax_element(c.bjdTdb.begin(), c.bjdTdb.end());
    const double utcMinusBjd = c.jdUtc.front() - c.bjdTdb.front(); // constant to far below a second per night
    QVector<double> key, value;
    const int n = 2000;
    for (int k = 0; k <= n; ++k) {
        const double t = *lo + (*hi - *lo) * k / n;
        key.push_back(m_axis == TimeAxis::BjdTdb ? t : (t + utcMinusBjd - kUnixEpochJd) * 86400.0);
        value.push_back(transitModel(c.transit, t));
    }
    QCPGraph* g = m_curvePlot->addGraph();
    g->setName(tr("transit fit"));
    g->setPen(QPen(QColor(220, 40, 40), 2));
    g->setData(key, value, true);
}

void LightCurvePanel::drawPeriodogram() {
    QCustomPlot* p = m_periodPlot;
    p->clearGraphs();
    m_periodLabel->clear();
    const LightCurve* c = curve();
    if (!c || c->relFlux.size() < 8) {
        p->replot();
        return;
    }
    try {
        const Periodogram pg = lombScargle(c->bjdTdb, c->relFlux, c->relFluxErr);
        QVector<double> period, power;
        for (std::size_t k = pg.frequency.size(); k-- > 0;) {
            period.push_back(24.0 / pg.frequency[k]);
            power.push_back(pg.power[k]);
        }
        p->addGraph()->setData(period, power, true);
        p->rescaleAxes();
        m_periodLabel->setText(tr("%1: best period %2 h (power %3, false-alarm probability %4)")
                                   .arg(m_targetName)
                                   .arg(pg.bestPeriod * 24.0, 0, 'g', 5)
                                   .arg(pg.bestPower, 0, 'g', 3)
                                   .arg(pg.falseAlarm, 0, 'g', 2));
    } catch (const std::exception& e) {
        m_periodLabel->setText(QString::fromStdString(e.what()));
    }
    p->replot();
}

// FWHM, zero point, sky at the target and detections of each used frame against time, each scaled to
// its own axis (four stacked rectangles would crowd a dock; one plot with a legend stays readable).
void LightCurvePanel::drawNight() {
    QCustomPlot* p = m_nightPlot;
    p->clearGraphs();
    p->plotLayout()->clear();
    auto* rect = new QCPAxisRect(p);
    p->plotLayout()->addElement(0, 0, rect);
    if (!m_result) {
        p->replot();
        return;
    }
    const LightCurve* c = curve();
    struct Series {
        QString name;
        QColor colour;
        QVector<double> v;
    };
    std::vector<Series> s = {{tr("FWHM [px]"), Qt::darkGreen, {}},
                             {tr("zero point [mag]"), Qt::darkBlue, {}},
                             {tr("sky at target [adu]"), Qt::darkMagenta, {}},
                             {tr("detections"), Qt::darkRed, {}}};
    QVector<double> t;
    for (std::size_t k = 0; k < m_result->used.size(); ++k) {
        const SeriesFrame& f = m_result->frames[m_result->used[k]];
        t.push_back(m_axis == TimeAxis::BjdTdb ? f.mjdMid + 2400000.5
                                               : (f.mjdMid + 2400000.5 - kUnixEpochJd) * 86400.0);
        s[0].v.push_back(f.fwhm);
        s[1].v.push_back(f.zeroPoint);
        s[2].v.push_back(c && k < c->sky.size() && c->frame[k] == m_result->used[k] ? c->sky[k] : NAN);
        s[3].v.push_back(static_cast<double>(f.detections));
    }
    for (std::size_t i = 0; i < s.size(); ++i) {
        QCPAxis* y =
            i == 0 ? rect->axis(QCPAxis::atLeft) : rect->addAxis(i == 1 ? QCPAxis::atRight : QCPAxis::atLeft);
        y->setLabel(s[i].name);
        y->setLabelColor(s[i].colour);
        QCPGraph* g = p->addGraph(rect->axis(QCPAxis::atBottom), y);
        g->setName(s[i].name);
        g->setPen(QPen(s[i].colour));
        g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, s[i].colour, 4));
        g->setData(t, s[i].v, true);
        g->rescaleValueAxis();
    }
    rect->axis(QCPAxis::atBottom)
        ->setLabel(m_axis == TimeAxis::BjdTdb ? tr("JD (UTC, mid-exposure)") : tr("UTC"));
    if (p->graphCount() > 0) p->graph(0)->rescaleKeyAxis();
    p->replot();
}

void LightCurvePanel::fillEnsemble() {
    const QSignalBlocker block(m_ensemble);
    m_ensemble->setRowCount(0);
    const LightCurve* c = curve();
    if (!c) return;
    const auto add = [&](std::size_t source, const EnsembleStar* e, Choice choice) {
        const SeriesSource& s = m_result->sources[source];
        const int row = m_ensemble->rowCount();
        m_ensemble->insertRow(row);
        auto* star = textItem(QString::number(source + 1));
        star->setData(Qt::UserRole, static_cast<qulonglong>(source));
        m_ensemble->setItem(row, kStar, star);
        m_ensemble->setItem(row, kRa, textItem(number(s.ra, 5)));
        m_ensemble->setItem(row, kDec, textItem(number(s.dec, 5)));
        m_ensemble->setItem(row, kMag, textItem(number(s.medianMagCal, 2)));
        m_ensemble->setItem(row, kWeight, textItem(e ? number(e->weight, 3) : QStringLiteral("-")));
        m_ensemble->setItem(row, kScatter, textItem(e ? number(e->scatter, 4) : QStringLiteral("-")));
        const QString status = e ? (e->dropped ? tr("dropped: %1").arg(QString::fromStdString(e->why))
                                               : QString::fromStdString(e->why.empty() ? "used" : e->why))
                                 : tr("excluded");
        m_ensemble->setItem(row, kStatus, textItem(status));
        m_ensemble->setItem(row, kPin, checkItem(choice == Choice::Pinned));
        m_ensemble->setItem(row, kExclude, checkItem(choice == Choice::Excluded));
    };
    for (const EnsembleStar& e : c->ensemble)
        add(e.source, &e, comparison(e.source));
    for (const Chosen& ch : m_chosen)
        if (ch.choice == Choice::Excluded && ch.source < m_result->sources.size())
            add(ch.source, nullptr, ch.choice);
}

void LightCurvePanel::onEnsembleEdited(int row, int column) {
    if (column != kPin && column != kExclude) return;
    const std::size_t source = m_ensemble->item(row, kStar)->data(Qt::UserRole).toULongLong();
    const bool on = m_ensemble->item(row, column)->checkState() == Qt::Checked;
    setComparison(source, on ? (column == kPin ? Choice::Pinned : Choice::Excluded) : Choice::Auto);
}

void LightCurvePanel::onVariables(SeriesResultPtr result) {
    m_variables = std::move(result);
    QCustomPlot* p = m_rmsPlot;
    p->clearGraphs();
    QVector<double> mag[2], rms[2];
    for (const StarCurve& sc : m_variables->stars) {
        const SeriesSource& s = m_variables->sources[sc.source];
        const double m = std::isfinite(s.medianMagCal) ? s.medianMagCal : -2.5 * std::log10(s.medianFlux);
        if (!std::isfinite(m) || !(sc.rms > 0)) continue;
        mag[sc.variable ? 1 : 0].push_back(m);
        rms[sc.variable ? 1 : 0].push_back(sc.rms);
    }
    const QColor colour[2] = {QColor(60, 60, 60), QColor(220, 30, 30)};
    const QString name[2] = {tr("stars"), tr("flagged variable")};
    for (int k = 0; k < 2; ++k) {
        QCPGraph* g = p->addGraph();
        g->setName(name[k]);
        g->setLineStyle(QCPGraph::lsNone);
        g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, colour[k], k ? 7 : 4));
        g->setData(mag[k], rms[k], false);
    }
    p->legend->setVisible(true);
    p->rescaleAxes();
    p->replot();
    m_status->setText(
        tr("%1 stars measured, %2 flagged variable").arg(mag[0].size() + mag[1].size()).arg(mag[1].size()));
    emit variablesChanged();
}

// The star of the RMS-magnitude point: the nearest (in magnitude and log RMS) among the all-stars curves.
void LightCurvePanel::onRmsClick(double mag, double rms) {
    if (!m_variables) return;
    double best = INFINITY;
    const SeriesSource* chosen = nullptr;
    for (const StarCurve& sc : m_variables->stars) {
        const SeriesSource& s = m_variables->sources[sc.source];
        const double m = std::isfinite(s.medianMagCal) ? s.medianMagCal : -2.5 * std::log10(s.medianFlux);
        const double d = std::hypot(m - mag, std::log10(sc.rms / rms));
        if (d < best) {
            best = d;
            chosen = &s;
        }
    }
    if (!chosen) return;
    setTarget(tr("star_%1").arg(chosen - m_variables->sources.data() + 1), chosen->ra, chosen->dec);
    m_tabs->setCurrentIndex(0);
    emit starChosen(chosen->ra, chosen->dec);
}

bool LightCurvePanel::exportCurve(const QString& path) {
    const LightCurve* c = curve();
    if (!c || !c->problem.empty()) {
        emit errorShown(tr("no light curve to export"));
        return false;
    }
    try {
        const std::filesystem::path p = path.toStdString();
        if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
        const Table t = lightCurveTable(*m_result, *c);
        if (path.endsWith(QStringLiteral(".csv"), Qt::CaseInsensitive))
            writeCsv(p.string(), t);
        else if (path.endsWith(QStringLiteral(".ecsv"), Qt::CaseInsensitive))
            writeEcsv(p.string(), t);
        else
            writeFitsTable(p.string(), t);
        return true;
    } catch (const std::exception& e) {
        emit errorShown(QString::fromStdString(e.what()));
        return false;
    }
}

bool LightCurvePanel::exportPng(const QString& path) {
    const int w = m_curvePlot->width() > 50 ? 0 : 900, h = m_curvePlot->height() > 50 ? 0 : 500;
    if (m_curvePlot->savePng(path, w, h)) return true;
    emit errorShown(tr("cannot write %1").arg(path));
    return false;
}

QStringList LightCurvePanel::framePaths() const {
    QStringList& out = m_framePaths;
    if (!m_result || !out.isEmpty()) return out;
    for (std::size_t i : m_result->used) {
        if (!m_result->frames[i].sourceFrame.empty()) { // recorded in the series: no header to read
            out << QString::fromStdString(m_result->frames[i].sourceFrame);
            continue;
        }
        try { // a series migrated from an older state: the catalog's header says it
            const Table t = readFitsTable(m_result->frames[i].path, {}, [](const std::vector<std::string>&) {
                return std::vector<std::string>{};
            });
            out << QString::fromStdString(t.meta.getString("SRCFILE").value_or(""));
        } catch (const std::exception&) {
            out << QString();
        }
    }
    return out;
}

void LightCurvePanel::stepFrame(int delta) {
    if (!m_result || m_result->used.empty()) return;
    const int n = static_cast<int>(m_result->used.size());
    m_frame = ((m_frame < 0 ? (delta > 0 ? -1 : 0) : m_frame) + delta % n + n) % n;
    const QStringList frames = framePaths();
    if (m_frame < frames.size() && !frames[m_frame].isEmpty()) emit frameStepped(frames[m_frame]);
}

void LightCurvePanel::setBlinking(bool on) {
    if (on)
        m_blink->start();
    else
        m_blink->stop();
}

} // namespace gpuphot::ui
