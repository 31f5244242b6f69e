#pragma once
// DS9's pixel table: the values of the N x N pixels around the cursor of an ImageView (default 5 x 5),
// following its cursorMoved. Headers are 1-based pixel numbers (FITS convention, as every user-visible
// coordinate); the top row is the highest y, as the image is shown unflipped; the centre cell is the pixel
// under the cursor (bold). Cells outside the image are empty.
#include <QTableWidget>

namespace gpuphot::viewers {
class ImageView;
}

namespace gpuphot::ui {

class PixelTable : public QTableWidget {
    Q_OBJECT
public:
    static constexpr int kDefaultSize = 5;
    explicit PixelTable(viewers::ImageView* view, QWidget* parent = nullptr);
    void setTableSize(int n); // odd, 1..15 (even sizes grow by one)
    int tableSize() const { return rowCount(); }
    // 0-based image position; the table centres on the nearest pixel. NaN clears the values.
    void setPosition(double x, double y);
    int centerX() const { return m_cx; } // 0-based pixel at the centre cell (-1: none)
    int centerY() const { return m_cy; }

private:
    void refill();

    viewers::ImageView* m_view;
    int m_cx = -1, m_cy = -1;
};

} // namespace gpuphot::ui
