#include "ui/pan_dialog.hpp"

#include <QComboBox>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>

#include <cmath>
#include <exception>
#include <tuple>

#include "core/io/target_list.hpp"
#include "core/wcs/wcs.hpp"
#include "ui/readout.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::ui {

namespace {
// Decimal degrees, else sexagesimal in `unitDeg` degrees per first-field unit (15 for RA in hours).
std::optional<double> parseAngle(const QString& text, double unitDeg) {
    bool ok = false;
    const double v = text.trimmed().toDouble(&ok);
    if (ok && std::isfinite(v)) return v;
    if (auto s = parseSexagesimalAngle(text.trimmed().toStdString())) return *s * unitDeg;
    return std::nullopt;
}
} // namespace

std::optional<std::pair<double, double>> parsePanTarget(const QString& first, const QString& second,
                                                        PanSystem system, const Wcs* wcs, QString* why) {
    if (system == PanSystem::Image) {
        bool okX = false, okY = false;
        const double x = first.trimmed().toDouble(&okX), y = second.trimmed().toDouble(&okY);
        if (okX && okY && std::isfinite(x) && std::isfinite(y)) return std::pair{x - 1.0, y - 1.0};
        if (why) *why = QObject::tr("Type the pixel position as two numbers (1-based x and y).");
        return std::nullopt;
    }
    if (!wcs) {
        if (why) *why = QObject::tr("The frame has no WCS: pan to a pixel position instead.");
        return std::nullopt;
    }
    const auto ra = parseAngle(first, 15.0), dec = parseAngle(second, 1.0);
    if (!ra || !dec || std::abs(*dec) > 90.0) {
        if (why) *why = QObject::tr("Type RA in degrees or hh:mm:ss.s and Dec in degrees or +dd:mm:ss.");
        return std::nullopt;
    }
    double x = std::nan(""), y = std::nan("");
    try {
        std::tie(x, y) = wcs->worldToPixel(*ra, *dec);
    } catch (const std::exception&) {
        // not projectable: reported below
    }
    if (!std::isfinite(x) || !std::isfinite(y)) {
        if (why) *why = QObject::tr("That position does not project onto the frame's WCS.");
        return std::nullopt;
    }
    return std::pair{x, y};
}

PanDialog::PanDialog(viewers::ImageView* view, std::function<const Wcs*()> wcs, QWidget* parent)
    : QDialog(parent), m_view(view), m_wcs(std::move(wcs)) {
    setObjectName(QStringLiteral("PanDialog"));
    setWindowTitle(tr("Pan to coordinates"));
    auto* form = new QFormLayout(this);
    m_system = new QComboBox(this);
    m_system->addItems({tr("image pixels (1-based)"), tr("RA, Dec (WCS)")});
    m_first = new QLineEdit(this);
    m_first->setObjectName(QStringLiteral("PanFirst"));
    m_second = new QLineEdit(this);
    m_second->setObjectName(QStringLiteral("PanSecond"));
    m_error = new QLabel(this);
    m_error->setObjectName(QStringLiteral("PanError"));
    m_error->setWordWrap(true);
    form->addRow(tr("System"), m_system);
    form->addRow(tr("x or RA"), m_first);
    form->addRow(tr("y or Dec"), m_second);
    form->addRow(m_error);
    auto* buttons =
        new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Apply | QDialogButtonBox::Close, this);
    form->addRow(buttons);
    connect(buttons->button(QDialogButtonBox::Apply), &QPushButton::clicked, this, &PanDialog::apply);
    connect(buttons, &QDialogButtonBox::accepted, this, [this] {
        if (apply()) accept();
    });
    connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
    connect(m_system, &QComboBox::currentIndexChanged, this, &PanDialog::showCurrentCentre);
    showCurrentCentre();
}

PanSystem PanDialog::system() const {
    return m_system->currentIndex() == 1 ? PanSystem::Sky : PanSystem::Image;
}

void PanDialog::setCoordinates(const QString& first, const QString& second, PanSystem system) {
    m_system->setCurrentIndex(system == PanSystem::Sky ? 1 : 0);
    m_first->setText(first);
    m_second->setText(second);
}

bool PanDialog::apply() {
    QString why;
    const auto p =
        parsePanTarget(m_first->text(), m_second->text(), system(), m_wcs ? m_wcs() : nullptr, &why);
    m_error->setText(why);
    if (!p) return false;
    m_view->centerOn(p->first, p->second);
    m_view->setCursorPosition(p->first, p->second); // the readout, crosshair and pixel table go there too
    return true;
}

void PanDialog::showCurrentCentre() {
    const QPointF c = m_view->center();
    const Wcs* wcs = m_wcs ? m_wcs() : nullptr;
    if (system() == PanSystem::Sky && wcs) {
        const auto [ra, dec] = wcs->pixelToWorld(c.x(), c.y());
        m_first->setText(formatRa(ra));
        m_second->setText(formatDec(dec));
    } else {
        m_first->setText(QString::number(c.x() + 1.0, 'f', 2));
        m_second->setText(QString::number(c.y() + 1.0, 'f', 2));
    }
    m_error->clear();
}

} // namespace gpuphot::ui
