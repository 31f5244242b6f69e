#include "ui/param_dock.hpp"

#include <QApplication>
#include <QCheckBox>
#include <QClipboard>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QRegularExpression>
#include <QScrollArea>
#include <QSpinBox>
#include <QToolBox>
#include <QVBoxLayout>

#include <cmath>
#include <sstream>

#include "core/io/atomic_file.hpp"
#include "core/pipeline/param_table.hpp"
#include "core/pipeline/sextractor_config.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::ui {

const nlohmann::json* findPath(const nlohmann::json& j, const std::string& dotted) {
    const nlohmann::json* cur = &j;
    std::stringstream ss(dotted);
    std::string part;
    while (std::getline(ss, part, '.')) {
        if (!cur->is_object() || !cur->contains(part)) return nullptr;
        cur = &(*cur)[part];
    }
    return cur;
}

void setPath(nlohmann::json& j, const std::string& dotted, const nlohmann::json& value) {
    const auto dot = dotted.find('.');
    if (dot == std::string::npos) {
        if (value.is_null()) {
            if (j.is_object()) j.erase(dotted);
        } else {
            j[dotted] = value;
        }
        return;
    }
    const std::string head = dotted.substr(0, dot);
    if (!j.contains(head) || !j[head].is_object()) j[head] = nlohmann::json::object();
    setPath(j[head], dotted.substr(dot + 1), value);
}

namespace {

// Leaf keys of the default configuration's JSON (objects are descended one level: stage groups).
void leafKeys(const nlohmann::json& j, const std::string& prefix, std::vector<std::string>& out) {
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
        if (it.value().is_object() && prefix.empty())
            leafKeys(it.value(), key, out);
        else
            out.push_back(key);
    }
}

ParamSpec genericSpec(const std::string& key, const nlohmann::json& value) {
    ParamSpec s;
    s.key = key;
    s.group = groupOfKey(key);
    s.label = key.substr(key.find('.') == std::string::npos ? 0 : key.find('.') + 1);
    s.tooltip = key + " (docs/CONFIG.md)";
    s.min = -1e12;
    s.max = 1e12;
    s.decimals = 6;
    if (value.is_boolean())
        s.kind = ParamKind::Bool;
    else if (value.is_number_integer())
        s.kind = ParamKind::Int, s.min = -2147483647, s.max = 2147483647;
    else if (value.is_number())
        s.kind = ParamKind::Double, s.step = 0.1;
    else if (value.is_array())
        s.kind = (!value.empty() && value[0].is_string()) ? ParamKind::StringList : ParamKind::DoubleList;
    else
        s.kind = ParamKind::OptionalString;
    return s;
}

QString joinList(const nlohmann::json& v) {
    QStringList parts;
    if (v.is_array())
        for (const auto& x : v)
            parts << (x.is_string() ? QString::fromStdString(x.get<std::string>())
                                    : QString::fromStdString(x.dump()));
    return parts.join(QStringLiteral(", "));
}

QString shellQuote(const QString& s) {
    static const QString safe =
        QStringLiteral("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-=:,+@%");
    bool plain = !s.isEmpty();
    for (QChar c : s)
        plain = plain && safe.contains(c);
    if (plain) return s;
    QString q = s;
    q.replace(QStringLiteral("'"), QStringLiteral("'\\''"));
    return QStringLiteral("'") + q + QStringLiteral("'");
}

} // namespace

ParamDock::ParamDock(QWidget* parent) : QDockWidget(tr("Parameters"), parent) {
    setObjectName(QStringLiteral("ParamDock"));
    m_json = m_config;
    buildForm();
    setConfig(m_config);
}

void ParamDock::buildForm() {
    auto* root = new QWidget;
    auto* layout = new QVBoxLayout(root);
    layout->setContentsMargins(2, 2, 2, 2);
    m_toolbox = new QToolBox;
    layout->addWidget(m_toolbox, 1);

    // Keys in display order: the schema first, then keys the JSON has that the schema does not know.
    std::vector<std::string> keys;
    for (const auto& s : paramSchema())
        keys.push_back(s.key);
    std::vector<std::string> jsonKeys;
    leafKeys(nlohmann::json(PipelineConfig{}), "", jsonKeys);
    for (const auto& k : jsonKeys)
        if (!findParamSpec(k)) keys.push_back(k);

    std::map<std::string, QFormLayout*> forms;
    for (const auto& g : paramGroups()) {
        auto* page = new QWidget;
        auto* form = new QFormLayout(page);
        form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
        auto* scroll = new QScrollArea;
        scroll->setWidgetResizable(true);
        scroll->setFrameShape(QFrame::NoFrame);
        scroll->setWidget(page);
        m_toolbox->addItem(scroll, QString::fromStdString(g.title));
        forms[g.id] = form;
    }
    const nlohmann::json defaults = PipelineConfig{};
    for (const auto& key : keys) {
        Editor e;
        if (const ParamSpec* s = findParamSpec(key))
            e.spec = *s;
        else {
            const nlohmann::json* v = findPath(defaults, key);
            e.spec = genericSpec(key, v ? *v : nlohmann::json());
        }
        if (e.spec.kind == ParamKind::Hidden) continue;
        QWidget* w = makeEditor(e);
        w->setObjectName(QString::fromStdString(key));
        QString tip = QString::fromStdString(e.spec.tooltip);
        tip += (tip.isEmpty() ? QString() : QStringLiteral("\n")) + QStringLiteral("JSON key: ") +
               QString::fromStdString(key);
        w->setToolTip(tip);
        auto* label = new QLabel(QString::fromStdString(e.spec.label));
        label->setToolTip(tip);
        auto it = forms.find(e.spec.group);
        (it != forms.end() ? it->second : forms.begin()->second)->addRow(label, w);
        m_editors[key] = e;
    }

    auto* buttons = new QHBoxLayout;
    auto* load = new QPushButton(tr("Load…"));
    auto* save = new QPushButton(tr("Save…"));
    auto* reset = new QPushButton(tr("Defaults"));
    auto* copy = new QPushButton(tr("Copy command"));
    load->setToolTip(tr("Load a JSON profile (the format of gpuphot reduce --config)"));
    save->setToolTip(tr("Save the current parameters as a JSON profile"));
    copy->setToolTip(tr("Copy the gpuphot reduce command that reproduces the current result"));
    for (auto* b : {load, save, reset, copy})
        buttons->addWidget(b);
    layout->addLayout(buttons);
    connect(load, &QPushButton::clicked, this, [this] {
        const QString path =
            QFileDialog::getOpenFileName(this, tr("Load profile"), QString(), tr("JSON (*.json)"));
        QString error;
        if (!path.isEmpty() && !loadProfile(path, &error)) emit profileError(error);
    });
    connect(save, &QPushButton::clicked, this, [this] {
        const QString path =
            QFileDialog::getSaveFileName(this, tr("Save profile"), QString(), tr("JSON (*.json)"));
        QString error;
        if (!path.isEmpty() && !saveProfile(path, &error)) emit profileError(error);
    });
    connect(reset, &QPushButton::clicked, this, [this] {
        setConfig(PipelineConfig{});
        emit configChanged(m_config);
    });
    connect(copy, &QPushButton::clicked, this, [this] {
        QApplication::clipboard()->setText(cliCommand(
            m_framePath.isEmpty() ? QStringLiteral("FRAME.fits") : m_framePath, m_referencePath, m_hdu));
    });
    setWidget(root);
}

QWidget* ParamDock::makeEditor(Editor& e) {
    const ParamSpec& s = e.spec;
    const std::string key = s.key;
    const auto changed = [this, key] { edited(key); };
    const QString suffix = s.unit.empty() ? QString() : QStringLiteral(" ") + QString::fromStdString(s.unit);
    switch (s.kind) {
    case ParamKind::Double:
    case ParamKind::OptionalDouble: {
        auto* w = new QDoubleSpinBox;
        w->setDecimals(s.decimals);
        w->setRange(s.min, s.max);
        w->setSingleStep(s.step);
        w->setSuffix(suffix);
        w->setKeyboardTracking(false);
        if (s.kind == ParamKind::OptionalDouble) w->setSpecialValueText(QString::fromStdString(s.noneText));
        connect(w, &QDoubleSpinBox::valueChanged, this, changed);
        e.widget = w;
        break;
    }
    case ParamKind::Int:
    case ParamKind::Flags: {
        auto* w = new QSpinBox;
        w->setRange(static_cast<int>(std::max(s.min, -2147483647.0)),
                    static_cast<int>(std::min(s.max, 2147483647.0)));
        w->setSingleStep(1);
        w->setSuffix(suffix);
        w->setKeyboardTracking(false);
        connect(w, &QSpinBox::valueChanged, this, changed);
        e.widget = w;
        break;
    }
    case ParamKind::Bool: {
        auto* w = new QCheckBox;
        connect(w, &QCheckBox::toggled, this, changed);
        e.widget = w;
        break;
    }
    case ParamKind::Choice: {
        auto* w = new QComboBox;
        for (const auto& [text, value] : s.choices)
            w->addItem(QString::fromStdString(text));
        connect(w, &QComboBox::currentIndexChanged, this, changed);
        e.widget = w;
        break;
    }
    default: { // lists and strings
        auto* w = new QLineEdit;
        if (s.kind == ParamKind::DoubleList) w->setPlaceholderText(tr("comma-separated numbers"));
        connect(w, &QLineEdit::editingFinished, this, changed);
        e.widget = w;
        break;
    }
    }
    return e.widget;
}

void ParamDock::showValue(const Editor& e, const nlohmann::json& v) {
    const QSignalBlocker block(e.widget);
    const ParamSpec& s = e.spec;
    switch (s.kind) {
    case ParamKind::Double:
        if (v.is_number()) static_cast<QDoubleSpinBox*>(e.widget)->setValue(v.get<double>());
        break;
    case ParamKind::OptionalDouble: {
        auto* w = static_cast<QDoubleSpinBox*>(e.widget);
        const bool set = v.is_number() && std::isfinite(v.get<double>());
        w->setValue(set ? v.get<double>() : s.min);
        break;
    }
    case ParamKind::Int:
    case ParamKind::Flags:
        if (v.is_number()) static_cast<QSpinBox*>(e.widget)->setValue(static_cast<int>(v.get<double>()));
        break;
    case ParamKind::Bool:
        if (v.is_boolean()) static_cast<QCheckBox*>(e.widget)->setChecked(v.get<bool>());
        break;
    case ParamKind::Choice: {
        auto* w = static_cast<QComboBox*>(e.widget);
        for (std::size_t i = 0; i < s.choices.size(); ++i)
            if (s.choices[i].second == v) w->setCurrentIndex(static_cast<int>(i));
        break;
    }
    case ParamKind::DoubleList:
    case ParamKind::StringList:
        static_cast<QLineEdit*>(e.widget)->setText(joinList(v));
        break;
    default:
        static_cast<QLineEdit*>(e.widget)->setText(
            v.is_string() ? QString::fromStdString(v.get<std::string>()) : QString());
        break;
    }
    e.widget->setStyleSheet(QString());
}

nlohmann::json ParamDock::editorValue(const Editor& e, bool& ok) const {
    ok = true;
    const ParamSpec& s = e.spec;
    switch (s.kind) {
    case ParamKind::Double:
        return static_cast<QDoubleSpinBox*>(e.widget)->value();
    case ParamKind::OptionalDouble: {
        const double v = static_cast<QDoubleSpinBox*>(e.widget)->value();
        return v <= s.min ? s.noneValue : nlohmann::json(v);
    }
    case ParamKind::Int:
    case ParamKind::Flags:
        return static_cast<QSpinBox*>(e.widget)->value();
    case ParamKind::Bool:
        return static_cast<QCheckBox*>(e.widget)->isChecked();
    case ParamKind::Choice: {
        const int i = static_cast<QComboBox*>(e.widget)->currentIndex();
        if (i < 0 || i >= static_cast<int>(s.choices.size())) return ok = false, nlohmann::json();
        return s.choices[static_cast<std::size_t>(i)].second;
    }
    case ParamKind::DoubleList:
    case ParamKind::StringList: {
        nlohmann::json arr = nlohmann::json::array();
        const QString text = static_cast<QLineEdit*>(e.widget)->text();
        for (QString part : text.split(QRegularExpression(QStringLiteral("[,;\\s]+")), Qt::SkipEmptyParts)) {
            if (s.kind == ParamKind::StringList) {
                arr.push_back(part.toStdString());
                continue;
            }
            bool good = false;
            const double v = part.toDouble(&good);
            if (!good || !std::isfinite(v)) return ok = false, nlohmann::json();
            arr.push_back(v);
        }
        return arr;
    }
    default: {
        const QString text = static_cast<QLineEdit*>(e.widget)->text().trimmed();
        return text.isEmpty() ? nlohmann::json() : nlohmann::json(text.toStdString());
    }
    }
}

void ParamDock::edited(const std::string& key) {
    if (m_updating) return;
    auto it = m_editors.find(key);
    if (it == m_editors.end()) return;
    const Editor& e = it->second;
    bool ok = false;
    const nlohmann::json value = editorValue(e, ok);
    const QString bad = QStringLiteral("background-color: #f4c7c3;");
    if (!ok) {
        e.widget->setStyleSheet(bad);
        return;
    }
    nlohmann::json patched = m_json;
    setPath(patched, key, value);
    PipelineConfig c;
    try {
        applyPipelineConfig(c, patched, "parameter " + key);
    } catch (const std::exception& ex) {
        e.widget->setStyleSheet(bad);
        e.widget->setToolTip(QString::fromStdString(e.spec.tooltip) + QStringLiteral("\n") +
                             QString::fromStdString(ex.what()));
        return;
    }
    e.widget->setStyleSheet(QString());
    m_config = std::move(c);
    m_json = m_config;
    emit configChanged(m_config);
}

void ParamDock::setConfig(const PipelineConfig& config) {
    m_updating = true;
    m_config = config;
    m_json = m_config;
    for (const auto& [key, e] : m_editors) {
        const nlohmann::json* v = findPath(m_json, key);
        showValue(e, v ? *v : nlohmann::json());
    }
    m_updating = false;
}

void ParamDock::setRunInputs(const QString& framePath, const QString& referencePath, const QString& hdu) {
    m_framePath = framePath;
    m_referencePath = referencePath;
    m_hdu = hdu;
}

void ParamDock::showFrameInstrument(const Instrument& in) {
    const struct {
        const char* key;
        double value;
        std::string source;
    } used[] = {{"instrument.gain", in.gain, in.gainSource},
                {"instrument.readNoise", in.readNoise, in.readNoiseSource},
                {"instrument.saturation", in.saturation, in.saturationSource},
                {"instrument.exptime", in.exptime, in.exptimeSource},
                {"instrument.airmass", in.airmass, "header"}};
    for (const auto& u : used) {
        auto* w = qobject_cast<QDoubleSpinBox*>(editorFor(u.key));
        if (!w || w->specialValueText().isEmpty()) continue;
        const QString v = QString::number(u.value, 'g', 6);
        w->setSpecialValueText(!std::isfinite(u.value) ? tr("header: none")
                               : u.source == "default"
                                   ? tr("header: none, %1 used").arg(v)
                                   : tr("header: %1 (%2)").arg(v, QString::fromStdString(u.source)));
    }
}

QWidget* ParamDock::editorFor(const std::string& key) const {
    auto it = m_editors.find(key);
    return it == m_editors.end() ? nullptr : it->second.widget;
}

bool ParamDock::saveProfile(const QString& path, QString* error) const {
    try {
        writeTextFileAtomic(path.toStdString(), m_json.dump(2) + "\n");
        return true;
    } catch (const std::exception& e) {
        if (error) *error = QString::fromStdString(e.what());
        return false;
    }
}

bool ParamDock::adopt(const std::function<PipelineConfig()>& make, QString* error) {
    try {
        setConfig(make());
        emit configChanged(m_config);
        return true;
    } catch (const std::exception& e) {
        if (error) *error = QString::fromStdString(e.what());
        return false;
    }
}

bool ParamDock::loadProfile(const QString& path, QString* error) {
    return adopt([&] { return loadPipelineConfig(path.toStdString()); }, error);
}

bool ParamDock::importSextractor(const QString& path, QString* warning, QString* error) {
    return adopt(
        [&] {
            PipelineConfig c = m_config;
            const SextractorMapping m =
                applySextractorSettings(readSextractorSettings(path.toStdString()), c);
            std::string w = m.warning();
            if (!m.weightImage.empty()) { // the workbench reduces without an external weight map
                c.prepare.weightType = "none";
                w += std::string(w.empty() ? "" : "\n") + "WEIGHT_IMAGE " + m.weightImage +
                     ": not loaded in the workbench (gpuphot reduce --sex uses it)";
            }
            if (warning) *warning = QString::fromStdString(w);
            return c;
        },
        error);
}

QString ParamDock::cliCommand(const QString& framePath, const QString& referencePath, const QString& hdu,
                              const QString& profilePath) const {
    const nlohmann::json defaults = PipelineConfig{};
    nlohmann::json rest = m_json; // what the flags do not cover
    QStringList args{QStringLiteral("gpuphot"), QStringLiteral("reduce"), shellQuote(framePath)};
    if (!hdu.isEmpty()) args << QStringLiteral("--hdu") << shellQuote(hdu);
    // The parameters with a CLI flag (their table, core/pipeline/param_table.hpp) as flags.
    for (const ParamDef& def : paramTable()) {
        if (def.cli.empty()) continue;
        const nlohmann::json* v = findPath(m_json, def.key);
        const nlohmann::json* d = findPath(defaults, def.key);
        if (!v || v->is_null() || (d && *v == *d)) continue;
        if (v->is_array() && v->empty()) continue;
        const QString name = QString::fromStdString(def.cli);
        if (def.type == ParamType::Bool) {
            if (!v->get<bool>()) continue; // a switch only turns on: the profile keeps "false"
            args << name;
        } else if (v->is_string()) {
            args << name << shellQuote(QString::fromStdString(v->get<std::string>()));
        } else {
            args << name
                 << (v->is_array() ? joinList(*v).remove(QLatin1Char(' '))
                                   : QString::fromStdString(v->dump()));
        }
        setPath(rest, def.key, d ? *d : nlohmann::json()); // the flag sets it: the profile keeps the default
    }
    // The profile: only the values that differ from the defaults.
    nlohmann::json profile = nlohmann::json::object();
    for (auto it = rest.begin(); it != rest.end(); ++it) {
        const nlohmann::json* d = findPath(defaults, it.key());
        if (it.value().is_object()) {
            nlohmann::json sub = nlohmann::json::object();
            for (auto jt = it.value().begin(); jt != it.value().end(); ++jt)
                if (!d || !d->contains(jt.key()) || (*d)[jt.key()] != jt.value()) sub[jt.key()] = jt.value();
            if (!sub.empty()) profile[it.key()] = sub;
        } else if (!d || *d != it.value()) {
            profile[it.key()] = it.value();
        }
    }
    if (!profile.empty()) {
        const QString path = profilePath.isEmpty()
                                 ? QDir::temp().filePath(QStringLiteral("gpuphot-studio-profile.json"))
                                 : profilePath;
        try {
            writeTextFileAtomic(path.toStdString(), profile.dump(2) + "\n");
        } catch (const std::exception&) {
            // The command still names the profile; the caller's copy then fails visibly at `reduce`.
        }
        args << QStringLiteral("--config") << shellQuote(path);
    }
    if (!referencePath.isEmpty()) args << QStringLiteral("--ref") << shellQuote(referencePath);
    return args.join(QLatin1Char(' '));
}

} // namespace gpuphot::ui
