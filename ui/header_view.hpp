#pragma once
// FITS header viewer: the cards of the frame's header (core/model/header.hpp) in a table (key, value,
// comment) with a search box that hides the cards not matching (case-insensitive, key/value/comment).
#include <QWidget>

#include "core/model/header.hpp"
#include "ui/snapshot.hpp"

class QLineEdit;
class QLabel;
class QTableWidget;

namespace gpuphot::ui {

class HeaderView : public QWidget {
    Q_OBJECT
public:
    explicit HeaderView(QWidget* parent = nullptr);

    void setSnapshot(SnapshotPtr snapshot); // shows the frame's header (unchanged frame: kept as it is)
    void setHeader(const Header& header);
    void setFilter(const QString& text);
    QString filter() const;
    int cardCount() const;        // rows in the table (all cards)
    int visibleCardCount() const; // rows not hidden by the filter
    QTableWidget* table() const { return m_table; }

private:
    void applyFilter();

    std::vector<HeaderCard> m_cards;
    const Frame* m_frame = nullptr; // identity of the frame shown (not dereferenced)
    QLineEdit* m_search = nullptr;
    QLabel* m_count = nullptr;
    QTableWidget* m_table = nullptr;
};

} // namespace gpuphot::ui
