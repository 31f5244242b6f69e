#include "ui/calibration_dialog.hpp"

#include <QDialogButtonBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPushButton>
#include <QSettings>
#include <QVBoxLayout>

#include <exception>
#include <optional>
#include <utility>

#include "core/io/fits_image.hpp"

namespace gpuphot::ui {

namespace {
// Kind names as the CLI options and the settings keys name them.
constexpr std::array<const char*, 4> kKeys = {"bias", "dark", "flat", "bpm"};

QString& member(CalibrationFrames& f, int kind) {
    switch (kind) {
    case CalibrationDialog::Bias:
        return f.bias;
    case CalibrationDialog::Dark:
        return f.dark;
    case CalibrationDialog::Flat:
        return f.flat;
    default:
        return f.bpm;
    }
}
const QString& member(const CalibrationFrames& f, int kind) {
    return member(const_cast<CalibrationFrames&>(f), kind);
}

QString kindLabel(int kind) {
    switch (kind) {
    case CalibrationDialog::Bias:
        return QObject::tr("master bias");
    case CalibrationDialog::Dark:
        return QObject::tr("master dark");
    case CalibrationDialog::Flat:
        return QObject::tr("master flat");
    default:
        return QObject::tr("bad-pixel mask");
    }
}
} // namespace

QString CalibrationFrames::summary() const {
    QStringList set;
    for (int k = 0; k < 4; ++k)
        if (!member(*this, k).isEmpty()) set << QString::fromLatin1(kKeys[k]);
    return set.isEmpty() ? QObject::tr("none") : set.join(QStringLiteral(", "));
}

QString CalibrationFrames::details() const {
    QStringList lines;
    for (int k = 0; k < 4; ++k)
        if (!member(*this, k).isEmpty())
            lines << QStringLiteral("%1: %2").arg(kindLabel(k), member(*this, k));
    return lines.isEmpty() ? QObject::tr("no calibration frames") : lines.join(QLatin1Char('\n'));
}

CalibrationFrames loadCalibrationSettings() {
    QSettings s;
    CalibrationFrames f;
    for (int k = 0; k < 4; ++k)
        member(f, k) = s.value(QStringLiteral("calibration/") + QString::fromLatin1(kKeys[k])).toString();
    return f;
}

void saveCalibrationSettings(const CalibrationFrames& frames) {
    QSettings s;
    for (int k = 0; k < 4; ++k)
        s.setValue(QStringLiteral("calibration/") + QString::fromLatin1(kKeys[k]), member(frames, k));
}

QStringList validateCalibrationFrames(const CalibrationFrames& frames) {
    QStringList problems;
    struct Size {
        long long w, h;
        QString path;
    };
    std::optional<Size> first;
    for (int k = 0; k < 4; ++k) {
        const QString& path = member(frames, k);
        if (path.isEmpty()) continue;
        const QFileInfo info(path);
        const QString what = kindLabel(k);
        if (!info.exists()) {
            problems << QObject::tr("%1: %2 does not exist").arg(path, what);
            continue;
        }
        if (!info.isFile() || !info.isReadable()) {
            problems << QObject::tr("%1: %2 is not a readable file").arg(path, what);
            continue;
        }
        // The first 2-D image HDU, as the preparation reads it.
        std::optional<Size> size;
        try {
            for (const HduSummary& h : listHdus(path.toStdString()))
                if (h.type == "IMAGE" && h.axes.size() == 2 && h.axes[0] > 0 && h.axes[1] > 0) {
                    size = Size{h.axes[0], h.axes[1], path};
                    break;
                }
        } catch (const std::exception& e) {
            problems << QObject::tr("%1: %2 cannot be read as FITS (%3)")
                            .arg(path, what, QString::fromStdString(e.what()));
            continue;
        }
        if (!size) {
            problems << QObject::tr("%1: %2 holds no 2-D image").arg(path, what);
            continue;
        }
        if (!first) {
            first = size;
        } else if (size->w != first->w || size->h != first->h) {
            problems << QObject::tr("%1: %2 is %3 x %4 px but %5 is %6 x %7 px (the calibration frames must "
                                    "agree in size)")
                            .arg(path, what)
                            .arg(size->w)
                            .arg(size->h)
                            .arg(first->path)
                            .arg(first->w)
                            .arg(first->h);
        }
    }
    return problems;
}

CalibrationDialog::CalibrationDialog(const CalibrationFrames& current, QWidget* parent) : QDialog(parent) {
    setWindowTitle(tr("Calibration frames"));
    setObjectName(QStringLiteral("CalibrationDialog"));
    auto* layout = new QVBoxLayout(this);
    auto* intro =
        new QLabel(tr("Master frames applied before stage 1 (as gpuphot reduce --bias --dark --flat "
                      "--bpm): bias subtracted, dark scaled by EXPTIME and subtracted, divided by the "
                      "flat (normalised to median 1); non-zero mask pixels are bad. Empty: not used."),
                   this);
    intro->setWordWrap(true);
    layout->addWidget(intro);
    auto* form = new QFormLayout;
    for (int k = 0; k < 4; ++k) {
        auto* row = new QWidget(this);
        auto* h = new QHBoxLayout(row);
        h->setContentsMargins(0, 0, 0, 0);
        auto* edit = new QLineEdit(row);
        edit->setObjectName(QStringLiteral("calibration_") + QString::fromLatin1(kKeys[k]));
        edit->setMinimumWidth(420);
        edit->setClearButtonEnabled(true);
        edit->setPlaceholderText(tr("not used"));
        auto* browseButton = new QPushButton(tr("Browse..."), row);
        auto* clearButton = new QPushButton(tr("Clear"), row);
        h->addWidget(edit, 1);
        h->addWidget(browseButton);
        h->addWidget(clearButton);
        connect(browseButton, &QPushButton::clicked, this, [this, k] { browse(static_cast<Kind>(k)); });
        connect(clearButton, &QPushButton::clicked, edit, &QLineEdit::clear);
        m_edits[k] = edit;
        QString label = kindLabel(k);
        label[0] = label[0].toUpper();
        form->addRow(label + QLatin1Char(':'), row);
    }
    layout->addLayout(form);
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
    auto* clearAll = buttons->addButton(tr("Clear all"), QDialogButtonBox::ResetRole);
    connect(clearAll, &QPushButton::clicked, this, [this] { setFrames({}); });
    connect(buttons, &QDialogButtonBox::accepted, this, &CalibrationDialog::accept);
    connect(buttons, &QDialogButtonBox::rejected, this, &CalibrationDialog::reject);
    layout->addWidget(buttons);
    setFrames(current);
}

CalibrationFrames CalibrationDialog::frames() const {
    CalibrationFrames f;
    for (int k = 0; k < 4; ++k)
        member(f, k) = m_edits[k]->text().trimmed();
    return f;
}

void CalibrationDialog::setFrames(const CalibrationFrames& frames) {
    for (int k = 0; k < 4; ++k)
        m_edits[k]->setText(member(frames, k));
}

QMessageBox* CalibrationDialog::errorBox() const {
    return m_errorBox.data();
}

void CalibrationDialog::browse(Kind kind) {
    QSettings s;
    const QString start = m_edits[kind]->text().isEmpty()
                              ? s.value(QStringLiteral("dirs/calibration")).toString()
                              : QFileInfo(m_edits[kind]->text()).absolutePath();
    const QString path =
        QFileDialog::getOpenFileName(this, tr("Choose the %1").arg(kindLabel(kind)), start,
                                     tr("FITS files (*.fits *.fit *.fts *.fz *.fits.gz);;All files (*)"));
    if (path.isEmpty()) return;
    s.setValue(QStringLiteral("dirs/calibration"), QFileInfo(path).absolutePath());
    m_edits[kind]->setText(path);
}

void CalibrationDialog::accept() {
    const QStringList problems = validateCalibrationFrames(frames());
    if (problems.isEmpty()) {
        if (m_errorBox) m_errorBox->close();
        QDialog::accept();
        return;
    }
    // Window-modal, not a nested event loop: the dialog stays open for the user to fix the entry.
    if (!m_errorBox) {
        m_errorBox =
            new QMessageBox(QMessageBox::Warning, tr("Calibration frames"), QString(), QMessageBox::Ok, this);
        m_errorBox->setAttribute(Qt::WA_DeleteOnClose);
    }
    m_errorBox->setText(problems.size() == 1 ? tr("This file cannot be used:")
                                             : tr("These files cannot be used:"));
    m_errorBox->setInformativeText(problems.join(QLatin1Char('\n')));
    m_errorBox->open();
}

} // namespace gpuphot::ui
