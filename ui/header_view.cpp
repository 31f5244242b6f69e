#include "ui/header_view.hpp"

#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QTableWidget>
#include <QVBoxLayout>

#include "ui/panel_data.hpp"

namespace gpuphot::ui {

HeaderView::HeaderView(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(2, 2, 2, 2);
    auto* top = new QHBoxLayout;
    m_search = new QLineEdit(this);
    m_search->setPlaceholderText(tr("Search keyword, value or comment"));
    m_search->setClearButtonEnabled(true);
    m_count = new QLabel(this);
    top->addWidget(m_search, 1);
    top->addWidget(m_count);
    layout->addLayout(top);
    m_table = new QTableWidget(this);
    m_table->setColumnCount(3);
    m_table->setHorizontalHeaderLabels({tr("keyword"), tr("value"), tr("comment")});
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->verticalHeader()->setDefaultSectionSize(fontMetrics().height() + 4);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    QFont mono(QStringLiteral("monospace"));
    mono.setStyleHint(QFont::Monospace);
    m_table->setFont(mono);
    layout->addWidget(m_table);
    connect(m_search, &QLineEdit::textChanged, this, [this] { applyFilter(); });
    applyFilter();
}

void HeaderView::setSnapshot(SnapshotPtr snapshot) {
    const Frame* f = snapshot && snapshot->frame ? snapshot->frame.get() : nullptr;
    if (f == m_frame && f) return; // same frame, same header: keep the scroll position
    m_frame = f;
    setHeader(f ? f->header : Header{});
}

void HeaderView::setHeader(const Header& header) {
    m_cards = header.cards();
    m_table->setRowCount(static_cast<int>(m_cards.size()));
    for (int k = 0; k < static_cast<int>(m_cards.size()); ++k) {
        const HeaderCard& c = m_cards[k];
        m_table->setItem(k, 0, new QTableWidgetItem(QString::fromStdString(c.key)));
        m_table->setItem(k, 1, new QTableWidgetItem(QString::fromStdString(c.value)));
        m_table->setItem(k, 2, new QTableWidgetItem(QString::fromStdString(c.comment)));
        m_table->item(k, 0)->setToolTip(QString::fromStdString(Header::formatCard(c)));
    }
    m_table->resizeColumnToContents(0);
    m_table->resizeColumnToContents(1);
    applyFilter();
}

void HeaderView::setFilter(const QString& text) {
    m_search->setText(text);
}
QString HeaderView::filter() const {
    return m_search->text();
}
int HeaderView::cardCount() const {
    return m_table->rowCount();
}

int HeaderView::visibleCardCount() const {
    int n = 0;
    for (int k = 0; k < m_table->rowCount(); ++k)
        n += m_table->isRowHidden(k) ? 0 : 1;
    return n;
}

void HeaderView::applyFilter() {
    const std::string f = m_search->text().trimmed().toStdString();
    for (int k = 0; k < static_cast<int>(m_cards.size()); ++k)
        m_table->setRowHidden(k, !headerCardMatches(m_cards[k], f));
    m_count->setText(tr("%1 of %2 cards").arg(visibleCardCount()).arg(m_cards.size()));
}

} // namespace gpuphot::ui
