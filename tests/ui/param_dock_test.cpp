// ParamDock: the form shows and edits every stage's parameters; profiles and the CLI command reproduce
// the configuration exactly (checked against `gpuphot reduce --dump-config`).
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QApplication>
#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QLineEdit>
#include <QProcess>
#include <QSignalSpy>
#include <QSpinBox>

#include <filesystem>
#include <fstream>

#include "core/pipeline/pipeline_config.hpp"
#include "tests/test_support.hpp"
#include "ui/param_dock.hpp"
#include "ui/param_schema.hpp"

using namespace gpuphot;
using namespace gpuphot::ui;

namespace {

QApplication& app() {
    return gpuphot::test::uiTestApp();
}

// Values every editor kind can show exactly (spin box decimals) and that differ from the defaults.
PipelineConfig customConfig() {
    PipelineConfig c;
    c.background.meshSize = 48;
    c.backgroundSecondPass = true;
    c.detection.threshold = 2.75;
    c.detection.minArea = 7;
    c.detection.clean = false;
    c.psf.model = PsfModelKind::Gaussian;
    c.psf.excludeFlags = 15;
    c.aperture.radii = {1.5, 2.5, 7.0};
    c.aperture.skyEstimator = SkyEstimator::Median;
    c.crossmatch.radiusArcsec = 1.25;
    c.crossmatch.refMagFaint = 18.5;
    c.zeropoint.magFaint = 17.0;
    c.zeropoint.method = "ransac";
    c.astrometry.blind = 0;
    c.instrument.gain = 2.1;
    c.instrument.filter = "V";
    c.keywords.gain = {"MYGAIN", "GAIN"};
    return c;
}

nlohmann::json js(const PipelineConfig& c) {
    return nlohmann::json(c);
}

template <class W> W* editor(ParamDock& d, const std::string& key) {
    auto* w = qobject_cast<W*>(d.editorFor(key));
    EXPECT_NE(w, nullptr) << key;
    return w;
}

void typeInto(QLineEdit* e, const QString& text) {
    e->setText(text);
    emit e->editingFinished();
}

// Sets one editor to the value `key` has in `target`, as a user would.
void userSets(ParamDock& d, const std::string& key, const nlohmann::json& v) {
    QWidget* w = d.editorFor(key);
    ASSERT_NE(w, nullptr) << key;
    if (auto* s = qobject_cast<QDoubleSpinBox*>(w))
        s->setValue(v.get<double>());
    else if (auto* i = qobject_cast<QSpinBox*>(w))
        i->setValue(v.get<int>());
    else if (auto* c = qobject_cast<QCheckBox*>(w))
        c->setChecked(v.get<bool>());
    else if (auto* b = qobject_cast<QComboBox*>(w)) {
        const ParamSpec* spec = findParamSpec(key);
        ASSERT_NE(spec, nullptr);
        for (std::size_t k = 0; k < spec->choices.size(); ++k)
            if (spec->choices[k].second == v) b->setCurrentIndex(static_cast<int>(k));
    } else if (auto* e = qobject_cast<QLineEdit*>(w)) {
        QStringList parts;
        if (v.is_array())
            for (const auto& x : v)
                parts << (x.is_string() ? QString::fromStdString(x.get<std::string>())
                                        : QString::number(x.get<double>()));
        else
            parts << QString::fromStdString(v.get<std::string>());
        typeInto(e, parts.join(", "));
    }
}

} // namespace

TEST(ParamDock, EveryConfigKeyHasAnEditorOrIsFrameDerived) {
    app();
    ParamDock dock;
    std::vector<std::string> missing;
    const nlohmann::json j = PipelineConfig{};
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.value().is_object()) {
            for (auto jt = it.value().begin(); jt != it.value().end(); ++jt) {
                const std::string key = it.key() + "." + jt.key();
                const ParamSpec* s = findParamSpec(key);
                if (!dock.editorFor(key) && !(s && s->kind == ParamKind::Hidden)) missing.push_back(key);
                if (s && s->kind != ParamKind::Hidden)
                    EXPECT_FALSE(s->tooltip.empty() && s->unit.empty() && s->label.empty()) << key;
            }
        } else if (!dock.editorFor(it.key())) {
            missing.push_back(it.key());
        }
    }
    EXPECT_TRUE(missing.empty()) << "no editor for " << nlohmann::json(missing).dump();
    // Schema entries name real keys (a typo would silently show a dead editor).
    for (const auto& s : paramSchema()) {
        if (s.group == "instrument" || s.kind == ParamKind::OptionalDouble ||
            s.key == "crossmatch.refMagBright" || s.key == "crossmatch.refMagFaint" ||
            s.key == "detection.saturationLevel")
            continue; // optional keys: absent from the defaults' JSON by design
        EXPECT_NE(findPath(j, s.key), nullptr) << s.key;
    }
    auto* thr = editor<QDoubleSpinBox>(dock, "detection.threshold");
    ASSERT_TRUE(thr);
    EXPECT_TRUE(thr->toolTip().contains("DETECT_THRESH"));
}

TEST(ParamDock, SetConfigShowsValuesWithoutEmitting) {
    app();
    ParamDock dock;
    QSignalSpy changed(&dock, &ParamDock::configChanged);
    const PipelineConfig c = customConfig();
    dock.setConfig(c);
    EXPECT_EQ(changed.count(), 0);
    EXPECT_EQ(js(dock.config()), js(c));
    EXPECT_DOUBLE_EQ(editor<QDoubleSpinBox>(dock, "detection.threshold")->value(), 2.75);
    EXPECT_EQ(editor<QSpinBox>(dock, "detection.minArea")->value(), 7);
    EXPECT_FALSE(editor<QCheckBox>(dock, "detection.clean")->isChecked());
    EXPECT_EQ(editor<QComboBox>(dock, "psf.model")->currentText(), "Gaussian");
    EXPECT_EQ(editor<QLineEdit>(dock, "aperture.radii")->text(), "1.5, 2.5, 7.0");
    EXPECT_EQ(editor<QLineEdit>(dock, "keywords.gain")->text(), "MYGAIN, GAIN");
    EXPECT_DOUBLE_EQ(editor<QDoubleSpinBox>(dock, "instrument.gain")->value(), 2.1);
    // Unset optional values sit at the spin box's "unset" position.
    EXPECT_EQ(editor<QDoubleSpinBox>(dock, "instrument.readNoise")->text(), "header");
    EXPECT_EQ(editor<QDoubleSpinBox>(dock, "crossmatch.refMagBright")->text(), "none");
}

TEST(ParamDock, UserEditsReproduceAConfigKeyByKey) {
    app();
    ParamDock dock;
    QSignalSpy changed(&dock, &ParamDock::configChanged);
    const PipelineConfig target = customConfig();
    const nlohmann::json tj = target, dj = PipelineConfig{};
    int edits = 0;
    for (auto it = tj.begin(); it != tj.end(); ++it) {
        const auto visit = [&](const std::string& key, const nlohmann::json& v) {
            const nlohmann::json* d = findPath(dj, key);
            if (d && *d == v) return;
            userSets(dock, key, v);
            ++edits;
        };
        if (it.value().is_object() && !it.value().empty())
            for (auto jt = it.value().begin(); jt != it.value().end(); ++jt)
                visit(it.key() + "." + jt.key(), jt.value());
        else if (!it.value().is_object())
            visit(it.key(), it.value());
    }
    EXPECT_GE(edits, 15);
    EXPECT_EQ(changed.count(), edits) << "one configChanged per edit";
    EXPECT_EQ(js(dock.config()), js(target));
    EXPECT_EQ(js(changed.last().at(0).value<PipelineConfig>()), js(target));

    // Unsetting an optional value removes it; a bad list is refused without emitting.
    editor<QDoubleSpinBox>(dock, "instrument.gain")->setValue(0.0);
    EXPECT_FALSE(dock.config().instrument.gain.has_value());
    const int before = changed.count();
    typeInto(editor<QLineEdit>(dock, "aperture.radii"), "2, x");
    EXPECT_EQ(changed.count(), before);
    EXPECT_EQ(dock.config().aperture.radii, target.aperture.radii);
    EXPECT_FALSE(editor<QLineEdit>(dock, "aperture.radii")->styleSheet().isEmpty()) << "marked as invalid";
    // Full precision survives an edit of another key (the form rounds windowSigmaFactor to 4 decimals).
    editor<QSpinBox>(dock, "detection.minArea")->setValue(9);
    EXPECT_EQ(dock.config().detection.windowSigmaFactor, PipelineConfig{}.detection.windowSigmaFactor);
}

TEST(ParamDock, ProfilesRoundTrip) {
    app();
    test::TempDir dir("param_dock");
    ParamDock a;
    a.setConfig(customConfig());
    QString error;
    ASSERT_TRUE(a.saveProfile(QString::fromStdString(dir / "p.json"), &error)) << error.toStdString();
    // The file is a valid `reduce --config` file holding the same configuration.
    EXPECT_EQ(js(loadPipelineConfig(dir / "p.json")), js(customConfig()));
    ParamDock b;
    QSignalSpy changed(&b, &ParamDock::configChanged);
    ASSERT_TRUE(b.loadProfile(QString::fromStdString(dir / "p.json"), &error)) << error.toStdString();
    EXPECT_EQ(changed.count(), 1);
    EXPECT_EQ(js(b.config()), js(customConfig()));
    EXPECT_EQ(editor<QComboBox>(b, "aperture.skyEstimator")->currentIndex(), 1);

    std::ofstream(dir / "bad.json") << R"({"detection": {"treshold": 2}})";
    EXPECT_FALSE(b.loadProfile(QString::fromStdString(dir / "bad.json"), &error));
    EXPECT_TRUE(error.contains("treshold")) << error.toStdString();
    EXPECT_TRUE(error.contains("bad.json")) << error.toStdString();
    EXPECT_EQ(js(b.config()), js(customConfig())) << "a failed load leaves the form as it was";
}

TEST(ParamDock, CliCommandReproducesTheConfiguration) {
    app();
    test::TempDir dir("param_dock_cli");
    ParamDock dock;
    // Defaults: no flags, no profile.
    EXPECT_EQ(dock.cliCommand("/data/f.fits").toStdString(), "gpuphot reduce /data/f.fits");
    // Only flag-covered values: inlined, no profile.
    PipelineConfig flagsOnly;
    flagsOnly.detection.threshold = 3.0;
    flagsOnly.aperture.radii = {2.0, 5.5};
    flagsOnly.instrument.gain = 1.7;
    dock.setConfig(flagsOnly);
    EXPECT_EQ(dock.cliCommand("f.fits").toStdString(),
              "gpuphot reduce f.fits --threshold 3.0 --aper 2.0,5.5 --gain 1.7");

    dock.setConfig(customConfig());
    const QString profile = QString::fromStdString(dir / "my profile.json");
    const QString cmd = dock.cliCommand("/data/my frame.fits", "/data/ref.fits", "SCI", profile);
    EXPECT_TRUE(cmd.startsWith("gpuphot reduce '/data/my frame.fits' --hdu SCI --threshold 2.75 --minarea 7"))
        << cmd.toStdString();
    EXPECT_TRUE(cmd.contains("--config '" + profile + "'")) << cmd.toStdString();
    EXPECT_TRUE(cmd.endsWith("--ref /data/ref.fits")) << cmd.toStdString();
    // The profile holds only non-default values not covered by a flag.
    const nlohmann::json p = nlohmann::json::parse(std::ifstream(profile.toStdString()));
    EXPECT_FALSE(p.contains("detection") && p["detection"].contains("threshold"));
    EXPECT_EQ(p["psf"]["model"], "gaussian");
    EXPECT_FALSE(p["psf"].contains("maxStars"));

    // The real CLI, given this command with --dump-config, prints the dock's configuration.
    const std::string cli = GPUPHOT_CLI;
    if (!std::filesystem::exists(cli)) GTEST_SKIP() << "gpuphot CLI not built: " << cli;
    QString run = cmd;
    run.replace(0, QString("gpuphot").size(), QString::fromStdString(cli));
    QProcess proc;
    proc.start("/bin/sh", {"-c", run + " --dump-config"});
    ASSERT_TRUE(proc.waitForFinished(30000));
    ASSERT_EQ(proc.exitCode(), 0) << proc.readAllStandardError().toStdString();
    const nlohmann::json dumped = nlohmann::json::parse(proc.readAllStandardOutput().toStdString());
    EXPECT_EQ(dumped, js(dock.config())) << nlohmann::json::diff(dumped, js(dock.config())).dump();
}

TEST(ParamDock, ImportsASextractorConfiguration) {
    app();
    test::TempDir dir("param_dock_sex");
    std::ofstream(dir / "t.sex") << "DETECT_MINAREA 7\nDETECT_THRESH 2.5\nFILTER N\nPHOT_APERTURES 8\n"
                                    "BACK_SIZE 96\nODD_KEY 1\n";
    ParamDock dock;
    QSignalSpy changed(&dock, &ParamDock::configChanged);
    QString warning, error;
    ASSERT_TRUE(dock.importSextractor(QString::fromStdString(dir / "t.sex"), &warning, &error))
        << error.toStdString();
    EXPECT_EQ(changed.count(), 1);
    EXPECT_EQ(dock.config().detection.minArea, 7);
    EXPECT_DOUBLE_EQ(dock.config().detection.threshold, 2.5);
    EXPECT_FALSE(dock.config().detection.filter);
    EXPECT_EQ(dock.config().aperture.radii, std::vector<double>{4.0}) << "a diameter becomes a radius";
    EXPECT_EQ(dock.config().background.meshSize, 96);
    EXPECT_EQ(editor<QSpinBox>(dock, "detection.minArea")->value(), 7) << "the form shows it";
    EXPECT_TRUE(warning.contains("ODD_KEY")) << warning.toStdString();

    std::ofstream(dir / "bad.sex") << "DETECT_MINAREA many\n";
    const nlohmann::json before = js(dock.config());
    EXPECT_FALSE(dock.importSextractor(QString::fromStdString(dir / "bad.sex"), &warning, &error));
    EXPECT_TRUE(error.contains("DETECT_MINAREA")) << error.toStdString();
    EXPECT_EQ(js(dock.config()), before) << "a failed import leaves the settings as they were";
    EXPECT_EQ(changed.count(), 1);
}
