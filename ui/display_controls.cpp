#include "ui/display_controls.hpp"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QDoubleValidator>
#include <QFormLayout>
#include <QGroupBox>
#include <QLineEdit>
#include <QSettings>
#include <QVBoxLayout>

#include "ui/colorbar.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::ui {

using viewers::Layer;

namespace {
struct LayerEntry {
    Layer layer;
    const char* name;
    bool on;
};
const LayerEntry kLayers[] = {
    {Layer::Sources, "Detected sources (ellipses)", true},
    {Layer::Apertures, "Apertures and sky annulus", false},
    {Layer::PsfWhiskers, "PSF whiskers (FWHM x ellipticity, scaled to the grid)", true},
    {Layer::ReferenceStars, "Reference stars", true},
    {Layer::AstrometricResiduals, "Astrometric residuals", false},
    {Layer::Segmentation, "Segmentation map", false},
    {Layer::SeriesStars, "Light-curve target and comparison stars", true},
};
} // namespace

DisplayControls::DisplayControls(viewers::ImageView* view, QWidget* parent) : QWidget(parent), m_view(view) {
    auto* layout = new QVBoxLayout(this);
    auto* box = new QGroupBox(tr("Display"), this);
    auto* form = new QFormLayout(box);
    m_stretch = new QComboBox(box);
    m_stretch->addItems({tr("linear"), tr("log"), tr("sqrt"), tr("asinh"), tr("histogram equalisation")});
    m_stretch->setCurrentIndex(3);
    m_limits = new QComboBox(box);
    m_limits->addItems({tr("min/max"), tr("percentiles"), tr("zscale"), tr("manual")});
    m_limits->setCurrentIndex(2);
    m_low = new QDoubleSpinBox(box);
    m_low->setRange(0.0, 50.0);
    m_low->setDecimals(2);
    m_low->setValue(0.25);
    m_low->setSuffix(QStringLiteral(" %"));
    m_high = new QDoubleSpinBox(box);
    m_high->setRange(50.0, 100.0);
    m_high->setDecimals(2);
    m_high->setValue(99.75);
    m_high->setSuffix(QStringLiteral(" %"));
    m_min = new QLineEdit(box);
    m_min->setObjectName(QStringLiteral("LimitMin"));
    m_max = new QLineEdit(box);
    m_max->setObjectName(QStringLiteral("LimitMax"));
    for (QLineEdit* e : {m_min, m_max}) {
        e->setValidator(new QDoubleValidator(e));
        e->setToolTip(tr("Type a value and press Enter: the limits become manual"));
    }
    m_colormap = new QComboBox(box);
    m_colormap->addItems({tr("grey"), tr("inverted grey"), tr("heat"), tr("viridis"), tr("cool")});
    m_ellipseScale = new QDoubleSpinBox(box);
    m_ellipseScale->setRange(0.5, 20.0);
    m_ellipseScale->setValue(3.0);
    m_ellipseScale->setToolTip(tr("Source ellipses are drawn with semi-axes scale x (a, b)"));
    m_exaggeration = new QDoubleSpinBox(box);
    m_exaggeration->setRange(1.0, 10000.0);
    m_exaggeration->setValue(200.0);
    m_exaggeration->setToolTip(tr("Astrometric residual vectors are drawn this many times longer"));
    form->addRow(tr("Stretch"), m_stretch);
    form->addRow(tr("Limits"), m_limits);
    form->addRow(tr("Low percentile"), m_low);
    form->addRow(tr("High percentile"), m_high);
    form->addRow(tr("Min"), m_min);
    form->addRow(tr("Max"), m_max);
    form->addRow(tr("Colormap"), m_colormap);
    form->addRow(tr("Ellipse scale"), m_ellipseScale);
    form->addRow(tr("Residual exaggeration"), m_exaggeration);
    layout->addWidget(box);
    layout->addWidget(new Colorbar(m_view, this));

    auto* layers = new QGroupBox(tr("Layers"), this);
    auto* ll = new QVBoxLayout(layers);
    for (const LayerEntry& e : kLayers) {
        auto* c = new QCheckBox(tr(e.name), layers);
        c->setChecked(e.on);
        ll->addWidget(c);
        m_layers.push_back(c);
        connect(c, &QCheckBox::toggled, this,
                [this, l = e.layer](bool on) { m_view->setLayerVisible(l, on); });
        m_view->setLayerVisible(e.layer, e.on);
    }
    auto* overview = new QCheckBox(tr("Overview inset (lower right)"), layers);
    overview->setObjectName(QStringLiteral("OverviewToggle"));
    overview->setChecked(true);
    connect(overview, &QCheckBox::toggled, m_view, &viewers::ImageView::setOverviewVisible);
    ll->addWidget(overview);
    layout->addWidget(layers);
    layout->addStretch(1);

    for (QComboBox* c : {m_stretch, m_limits, m_colormap})
        connect(c, &QComboBox::currentIndexChanged, this, &DisplayControls::apply);
    for (QDoubleSpinBox* s : {m_low, m_high, m_ellipseScale})
        connect(s, &QDoubleSpinBox::valueChanged, this, &DisplayControls::apply);
    connect(m_exaggeration, &QDoubleSpinBox::valueChanged, this, &DisplayControls::exaggerationChanged);
    for (QLineEdit* e : {m_min, m_max})
        connect(e, &QLineEdit::editingFinished, this, &DisplayControls::typedLimits);
    connect(m_view, &viewers::ImageView::displayChanged, this, &DisplayControls::showLimits);
    apply();
}

void DisplayControls::apply() {
    m_view->setStretch(static_cast<viewers::Stretch>(m_stretch->currentIndex()));
    const viewers::LimitMode modes[] = {viewers::LimitMode::MinMax, viewers::LimitMode::Percentile,
                                        viewers::LimitMode::ZScale};
    if (m_limits->currentIndex() == 3) {
        bool okLo = false, okHi = false;
        const double lo = QLocale().toDouble(m_min->text(), &okLo),
                     hi = QLocale().toDouble(m_max->text(), &okHi);
        const auto [curLo, curHi] = m_view->limits();
        m_view->setManualLimits(okLo ? lo : curLo, okHi ? hi : curHi);
    } else {
        m_view->setLimitMode(modes[m_limits->currentIndex()], m_low->value(), m_high->value());
    }
    m_low->setEnabled(m_limits->currentIndex() == 1);
    m_high->setEnabled(m_limits->currentIndex() == 1);
    m_view->setColormap(static_cast<viewers::Colormap>(m_colormap->currentIndex()));
    m_view->setSourceScale(static_cast<float>(m_ellipseScale->value()));
}

void DisplayControls::showLimits() {
    if (m_limits->currentIndex() == 3) return; // what was typed stays
    const auto [lo, hi] = m_view->limits();
    m_min->setText(QLocale().toString(lo, 'g', 7));
    m_max->setText(QLocale().toString(hi, 'g', 7));
}

void DisplayControls::typedLimits() {
    if (m_limits->currentIndex() == 3)
        apply();
    else
        m_limits->setCurrentIndex(3); // applies
}

void DisplayControls::setManualLimits(double lo, double hi) {
    m_min->setText(QLocale().toString(lo, 'g', 9));
    m_max->setText(QLocale().toString(hi, 'g', 9));
    typedLimits();
}

double DisplayControls::residualExaggeration() const {
    return m_exaggeration->value();
}

void DisplayControls::restoreSettings() {
    QSettings s;
    s.beginGroup(QStringLiteral("display"));
    m_stretch->setCurrentIndex(s.value(QStringLiteral("stretch"), m_stretch->currentIndex()).toInt());
    m_limits->setCurrentIndex(s.value(QStringLiteral("limits"), m_limits->currentIndex()).toInt());
    m_colormap->setCurrentIndex(s.value(QStringLiteral("colormap"), m_colormap->currentIndex()).toInt());
    m_low->setValue(s.value(QStringLiteral("low"), m_low->value()).toDouble());
    m_high->setValue(s.value(QStringLiteral("high"), m_high->value()).toDouble());
    m_min->setText(s.value(QStringLiteral("min"), m_min->text()).toString());
    m_max->setText(s.value(QStringLiteral("max"), m_max->text()).toString());
    for (std::size_t i = 0; i < m_layers.size(); ++i)
        m_layers[i]->setChecked(s.value(QStringLiteral("layer%1").arg(i), m_layers[i]->isChecked()).toBool());
    s.endGroup();
    apply();
}

void DisplayControls::saveSettings() const {
    QSettings s;
    s.beginGroup(QStringLiteral("display"));
    s.setValue(QStringLiteral("stretch"), m_stretch->currentIndex());
    s.setValue(QStringLiteral("limits"), m_limits->currentIndex());
    s.setValue(QStringLiteral("colormap"), m_colormap->currentIndex());
    s.setValue(QStringLiteral("low"), m_low->value());
    s.setValue(QStringLiteral("high"), m_high->value());
    s.setValue(QStringLiteral("min"), m_min->text());
    s.setValue(QStringLiteral("max"), m_max->text());
    for (std::size_t i = 0; i < m_layers.size(); ++i)
        s.setValue(QStringLiteral("layer%1").arg(i), m_layers[i]->isChecked());
    s.endGroup();
}

} // namespace gpuphot::ui
