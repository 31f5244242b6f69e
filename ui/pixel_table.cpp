#include "ui/pixel_table.hpp"

#include <QHeaderView>

#include <algorithm>
#include <cmath>

#include "viewers/image_view.hpp"

namespace gpuphot::ui {

PixelTable::PixelTable(viewers::ImageView* view, QWidget* parent) : QTableWidget(parent), m_view(view) {
    setObjectName(QStringLiteral("PixelTable"));
    setEditTriggers(QAbstractItemView::NoEditTriggers);
    setSelectionMode(QAbstractItemView::NoSelection);
    horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    verticalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    setTableSize(kDefaultSize);
    connect(view, &viewers::ImageView::cursorMoved, this, &PixelTable::setPosition);
}

void PixelTable::setTableSize(int n) {
    n = std::clamp(n | 1, 1, 15);
    setRowCount(n);
    setColumnCount(n);
    for (int r = 0; r < n; ++r)
        for (int c = 0; c < n; ++c) {
            auto* item = new QTableWidgetItem;
            item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
            setItem(r, c, item);
        }
    QFont bold = font();
    bold.setBold(true);
    item(n / 2, n / 2)->setFont(bold);
    refill();
}

void PixelTable::setPosition(double x, double y) {
    const bool ok = std::isfinite(x) && std::isfinite(y);
    m_cx = ok ? static_cast<int>(std::lround(x)) : -1;
    m_cy = ok ? static_cast<int>(std::lround(y)) : -1;
    refill();
}

void PixelTable::refill() {
    const auto image = m_view->image();
    const int n = rowCount(), half = n / 2;
    QStringList cols, rows;
    for (int i = 0; i < n; ++i) {
        const int x = m_cx - half + i, y = m_cy + half - i;
        cols << (m_cx >= 0 ? QString::number(x + 1) : QString());
        rows << (m_cy >= 0 ? QString::number(y + 1) : QString());
        for (int j = 0; j < n; ++j) {
            const int px = m_cx - half + j;
            const bool inside =
                image && m_cx >= 0 && px >= 0 && y >= 0 && px < image->width() && y < image->height();
            item(i, j)->setText(inside ? QString::number((*image)(px, y), 'g', 7) : QString());
        }
    }
    setHorizontalHeaderLabels(cols);
    setVerticalHeaderLabels(rows);
}

} // namespace gpuphot::ui
