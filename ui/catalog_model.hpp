#pragma once
// The catalog table of the workbench: a QAbstractTableModel over a Snapshot's sources (no copy of the
// catalog: data() reads the result's arrays lazily), and CatalogFilter, a QSortFilterProxyModel with a
// flag mask, a magnitude range and a text filter, sorting numerically.
//
// Positions are shown 1-based (FITS convention, as every catalog file). Column values for sorting come
// from CatalogModel::value() (double, NaN where absent; NaN sorts last in ascending order).
#include <QAbstractTableModel>
#include <QSortFilterProxyModel>

#include <cstdint>
#include <limits>
#include <vector>

#include "ui/catalog_prep.hpp"
#include "ui/snapshot.hpp"

namespace gpuphot::ui {

class CatalogModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { Id, X, Y, Ra, Dec, MagAper, MagErr, MagCal, Fwhm, FluxIso, Snr, Flags, ColumnCount };
    static constexpr int SortRole = Qt::UserRole;     // double
    static constexpr int FlagsRole = Qt::UserRole + 1; // quint32 flag bits

    explicit CatalogModel(QObject* parent = nullptr);

    // Takes a new result (beginResetModel/endResetModel). O(1) when the snapshot carries its CatalogPrep
    // (Snapshot::catalog, made by the worker) for the current sort column, order and aperture; else the
    // flags and the order are computed here (O(n), radix sort).
    void setSnapshot(SnapshotPtr snapshot);
    const SnapshotPtr& snapshot() const { return m_snap; }
    // Which fixed aperture mag_aper/magerr show (0-based index into aperture.radii; default 0).
    void setApertureIndex(int index);
    int apertureIndex() const { return m_aperture; }

    int rowCount(const QModelIndex& parent = QModelIndex()) const override;
    int columnCount(const QModelIndex& parent = QModelIndex()) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

    // Sorting happens here, on a row permutation with cached keys (150k rows in a few ms), not in the
    // proxy: CatalogFilter::sort forwards to it. The order survives setSnapshot (the new result is
    // sorted the same way). column < 0: source order.
    void sortBy(int column, Qt::SortOrder order = Qt::AscendingOrder);
    int sortColumn() const { return m_sortColumn; }
    Qt::SortOrder sortOrder() const { return m_sortOrder; }
    // True when the last setSnapshot took the worker's precomputed flags and order (no O(n) work).
    bool lastResetUsedPrep() const { return m_usedPrep; }
    // The source index (into Sources) shown in a row, and the row showing a source (-1: none).
    int sourceIndex(int row) const;
    int rowOfSource(int source) const;

    // The numeric value of a cell (NaN when absent).
    double value(int row, int column) const;
    std::uint32_t flags(int row) const; // combined: detection | aperture | psf | calibrator | astrometric star
    static const char* columnName(int column); // "id", "x", ... as the catalog file's columns

signals:
    // The table was sorted another way (the worker then prepares the next results in that order).
    void sortChanged(int column, Qt::SortOrder order, int aperture);

private:
    double sourceValue(std::size_t i, int column) const;
    bool prepMatches(const CatalogPrep& prep) const; // same sort column, order and (when it matters) aperture
    void resort();                                   // m_prep for m_sortColumn / m_sortOrder / m_aperture
    const Sources* sources() const;
    void skyPosition(int source, double& ra, double& dec) const;

    SnapshotPtr m_snap;
    int m_aperture = 0;
    std::shared_ptr<const CatalogPrep> m_prep; // combined flags and row -> source index
    int m_sortColumn = -1;
    Qt::SortOrder m_sortOrder = Qt::AscendingOrder;
    bool m_usedPrep = false;
};

class CatalogFilter : public QSortFilterProxyModel {
    Q_OBJECT
public:
    explicit CatalogFilter(QObject* parent = nullptr);

    // Rows with any of these flag bits are hidden (0: no flag filter).
    void setExcludedFlags(std::uint32_t mask);
    // Rows whose magnitude (column MagCal or MagAper) lies outside [lo, hi] are hidden; NaN bounds are
    // open; with a bound set, rows without a magnitude are hidden.
    void setMagnitudeRange(double lo, double hi, int column = CatalogModel::MagAper);
    // Case-insensitive: the row's id starts with the text, or one of its flag names contains it.
    void setText(const QString& text);
    std::uint32_t excludedFlags() const { return m_excluded; }

    // Sorting is the model's (CatalogModel::sortBy); the proxy keeps the model's row order.
    void sort(int column, Qt::SortOrder order = Qt::AscendingOrder) override;

protected:
    bool filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const override;

private:
    const CatalogModel* catalog() const;
    std::uint32_t m_excluded = 0;
    double m_lo = std::numeric_limits<double>::quiet_NaN(), m_hi = std::numeric_limits<double>::quiet_NaN();
    int m_magColumn = CatalogModel::MagAper;
    QString m_text;
};

} // namespace gpuphot::ui
