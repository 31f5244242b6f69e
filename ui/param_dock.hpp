#pragma once
// The parameter dock: a form for every stage's Params, built from PipelineConfig's JSON (the format of
// `gpuphot reduce --config` and of the saved profiles) and the schema in ui/param_schema.cpp (labels,
// units, tooltips with the SExtractor names, ranges). One page per stage in a QToolBox.
//
// Every edit emits configChanged (connect it to RunScheduler::schedule). Edits patch only the edited key
// of the current config, so values the form shows rounded (spin box decimals) keep their full precision.
#include <QDockWidget>
#include <QString>

#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/model/instrument.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "ui/param_schema.hpp"
#include "ui/pipeline_types.hpp"

class QToolBox;
class QWidget;

namespace gpuphot::ui {

class ParamDock : public QDockWidget {
    Q_OBJECT
public:
    explicit ParamDock(QWidget* parent = nullptr);

    const PipelineConfig& config() const { return m_config; }
    // Shows `config` in the form without emitting configChanged.
    void setConfig(const PipelineConfig& config);

    // JSON profiles, the same format as `gpuphot reduce --config` (the complete effective configuration).
    // saveProfile writes atomically; loadProfile validates (unknown keys are errors), shows the result
    // and emits configChanged. Both return false with the message in *error on failure.
    bool saveProfile(const QString& path, QString* error = nullptr) const;
    bool loadProfile(const QString& path, QString* error = nullptr);
    // A SExtractor configuration (.sex) applied onto the current settings as `reduce --sex` applies it
    // (docs/SEXTRACTOR.md): shows the result and emits configChanged. *warning receives the keys it does
    // not support and the semantics it does not reproduce ("" when none). False with *error on failure,
    // the settings unchanged.
    bool importSextractor(const QString& path, QString* warning = nullptr, QString* error = nullptr);

    // The `gpuphot reduce` command that reproduces the current settings on `framePath`:
    //   gpuphot reduce FRAME [--hdu HDU] [--threshold T] [--minarea N] [--aper R1,R2,..] [--gain G]
    //       [--rdnoise R] [--saturation S] [--exptime E] [--config PROFILE] [--ref REF]
    // Values that have a CLI flag are inlined as flags when they differ from the defaults; every other
    // non-default value goes into a profile written to `profilePath` (default: the system temporary
    // directory's gpuphot-studio-profile.json), which is then named with --config. With only
    // flag-covered changes no profile is written and no --config appears. Paths are shell-quoted.
    QString cliCommand(const QString& framePath, const QString& referencePath = QString(),
                       const QString& hdu = QString(), const QString& profilePath = QString()) const;

    // Frame, reference and HDU the dock's "Copy command" button puts into the command.
    void setRunInputs(const QString& framePath, const QString& referencePath, const QString& hdu = QString());

    // What the frame's header gave (gain, read noise, saturation, exposure time, airmass): an Instrument
    // field left unset shows "header: VALUE (KEYWORD)" instead of just "header".
    void showFrameInstrument(const Instrument& instrument);

    // The editor widget of a key ("detection.threshold"), for tests and for focusing a parameter.
    QWidget* editorFor(const std::string& key) const;

signals:
    void configChanged(const gpuphot::PipelineConfig& config);
    void profileError(const QString& message); // from the dock's own Load/Save buttons

private:
    // Shows the configuration `make` returns and emits configChanged; false with *error when it throws,
    // the settings unchanged (loadProfile, importSextractor).
    bool adopt(const std::function<PipelineConfig()>& make, QString* error);

    struct Editor {
        ParamSpec spec; // from the schema, or a generic one made from the JSON value's type
        QWidget* widget = nullptr;
    };
    void buildForm();
    QWidget* makeEditor(Editor& e);
    void showValue(const Editor& e, const nlohmann::json& value);
    void edited(const std::string& key);
    nlohmann::json editorValue(const Editor& e, bool& ok) const;

    QToolBox* m_toolbox = nullptr;
    PipelineConfig m_config;
    nlohmann::json m_json; // m_config as JSON
    std::map<std::string, Editor> m_editors;
    bool m_updating = false;
    QString m_framePath, m_referencePath, m_hdu;
};

// JSON pointer helpers on dot paths ("detection.threshold").
const nlohmann::json* findPath(const nlohmann::json& j, const std::string& dotted);
void setPath(nlohmann::json& j, const std::string& dotted, const nlohmann::json& value); // null value: erase

} // namespace gpuphot::ui
