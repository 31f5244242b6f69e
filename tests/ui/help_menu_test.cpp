// The Help menu of the main window: "Keyboard shortcuts" lists every action that has a shortcut
// (gathered from the window's actions, so it stays current) and "Documentation" points to a README
// that exists (installed, or the repository's beside docs/).
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QAction>
#include <QApplication>
#include <QDialog>
#include <QFileInfo>
#include <QMenu>
#include <QMenuBar>
#include <QTableWidget>
#include <QUrl>

#include "ui/main_window.hpp"

using namespace gpuphot::ui;

namespace {

QMenu* helpMenu(MainWindow& w) {
    for (QAction* a : w.menuBar()->actions())
        if (a->menu() && a->text().remove(QLatin1Char('&')) == QLatin1String("Help")) return a->menu();
    return nullptr;
}

QAction* actionNamed(QMenu* menu, const QString& text) {
    for (QAction* a : menu->actions())
        if (a->text().remove(QLatin1Char('&')) == text) return a;
    return nullptr;
}

} // namespace

TEST(HelpMenu, HasShortcutsAndDocumentation) {
    gpuphot::test::uiTestApp();
    MainWindow w;
    QMenu* help = helpMenu(w);
    ASSERT_NE(help, nullptr);
    EXPECT_NE(actionNamed(help, QStringLiteral("Keyboard shortcuts")), nullptr);
    EXPECT_NE(actionNamed(help, QStringLiteral("Documentation")), nullptr);
    const QUrl url = MainWindow::documentationUrl();
    ASSERT_TRUE(url.isLocalFile()) << url.toString().toStdString();
    EXPECT_TRUE(QFileInfo::exists(url.toLocalFile())) << url.toLocalFile().toStdString();
    EXPECT_TRUE(url.toLocalFile().endsWith(QStringLiteral("README.md")));
}

TEST(HelpMenu, ShortcutsDialogListsEveryActionWithAShortcut) {
    gpuphot::test::uiTestApp();
    MainWindow w;
    QAction* keys = actionNamed(helpMenu(w), QStringLiteral("Keyboard shortcuts"));
    ASSERT_NE(keys, nullptr);
    keys->trigger();
    auto* dialog = w.findChild<QDialog*>(QStringLiteral("shortcutsDialog"));
    ASSERT_NE(dialog, nullptr);
    EXPECT_TRUE(dialog->isVisible());
    auto* table = dialog->findChild<QTableWidget*>();
    ASSERT_NE(table, nullptr);
    QStringList listed;
    for (int r = 0; r < table->rowCount(); ++r)
        listed << table->item(r, 0)->text() + QLatin1Char('|') + table->item(r, 1)->text();
    int withShortcut = 0;
    for (const QAction* a : w.findChildren<QAction*>()) {
        if (a->shortcut().isEmpty()) continue;
        ++withShortcut;
        const QString name = a->text().remove(QLatin1Char('&'));
        const QString key = a->shortcut().toString(QKeySequence::NativeText);
        bool found = false;
        for (const QString& row : listed)
            found = found || (name.startsWith(row.section('|', 0, 0)) && row.contains(key));
        EXPECT_TRUE(found) << name.toStdString() << " " << key.toStdString();
    }
    EXPECT_GE(withShortcut, 3); // Open, Quit, Re-run at least
    const QString open = QKeySequence(QKeySequence::Open).toString(QKeySequence::NativeText);
    EXPECT_TRUE(listed.contains(QStringLiteral("Open frame|") + open)) << listed.join(", ").toStdString();
    dialog->close();
}
