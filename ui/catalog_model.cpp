#include "ui/catalog_model.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/frame.hpp"
#include "core/model/flags.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/wcs/wcs.hpp"
#include "ui/param_schema.hpp"

namespace gpuphot::ui {
namespace {
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

const Wcs* wcsOf(const Snapshot& s) {
    if (s.result.fittedWcs) return s.result.fittedWcs.get();
    return s.frame ? s.frame->wcs.get() : nullptr;
}
} // namespace

CatalogModel::CatalogModel(QObject* parent) : QAbstractTableModel(parent) {}

const Sources* CatalogModel::sources() const { return m_snap ? &m_snap->result.detection.sources : nullptr; }

bool CatalogModel::prepMatches(const CatalogPrep& p) const {
    if (p.column != m_sortColumn) return false;
    if (m_sortColumn < 0) return true;
    if (p.descending != (m_sortOrder == Qt::DescendingOrder)) return false;
    return p.aperture == m_aperture || (m_sortColumn != MagAper && m_sortColumn != MagErr);
}

void CatalogModel::resort() {
    if (!m_snap) {
        m_prep.reset();
        return;
    }
    m_prep = prepareCatalog(*m_snap, m_sortColumn, m_sortOrder == Qt::DescendingOrder, m_aperture,
                            m_prep ? &m_prep->flags : nullptr);
}

void CatalogModel::setSnapshot(SnapshotPtr snapshot) {
    beginResetModel();
    m_snap = std::move(snapshot);
    m_usedPrep = m_snap && m_snap->catalog && m_snap->catalog->flags.size() == m_snap->result.detection.sources.size() &&
                 prepMatches(*m_snap->catalog);
    if (m_usedPrep) {
        m_prep = m_snap->catalog; // prepared by the worker: a pointer swap
    } else {
        m_prep.reset();
        resort();
    }
    endResetModel();
}

void CatalogModel::setApertureIndex(int index) {
    if (index == m_aperture) return;
    m_aperture = index;
    if (rowCount() > 0) emit dataChanged(this->index(0, MagAper), this->index(rowCount() - 1, MagErr));
    emit headerDataChanged(Qt::Horizontal, MagAper, MagErr);
    if (m_sortColumn == MagAper || m_sortColumn == MagErr) sortBy(m_sortColumn, m_sortOrder); // the key changed
    else emit sortChanged(m_sortColumn, m_sortOrder, m_aperture);
}

int CatalogModel::rowCount(const QModelIndex& parent) const {
    const Sources* s = sources();
    return parent.isValid() || !s ? 0 : static_cast<int>(s->size());
}

int CatalogModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

const char* CatalogModel::columnName(int column) {
    static const char* names[] = {"id",  "x",       "y",    "ra",       "dec", "mag_aper",
                                  "magerr", "mag_cal", "fwhm", "flux_iso", "snr", "flags"};
    return column >= 0 && column < ColumnCount ? names[column] : "";
}

int CatalogModel::sourceIndex(int row) const {
    return m_prep && row >= 0 && static_cast<std::size_t>(row) < m_prep->order.size()
               ? m_prep->order[static_cast<std::size_t>(row)]
               : -1;
}

int CatalogModel::rowOfSource(int source) const {
    if (!m_prep || source < 0) return -1;
    const auto& ord = m_prep->order;
    const auto it = std::find(ord.begin(), ord.end(), source); // O(n) once per click
    return it == ord.end() ? -1 : static_cast<int>(it - ord.begin());
}

std::uint32_t CatalogModel::flags(int row) const {
    const int i = sourceIndex(row);
    return i >= 0 ? m_prep->flags[static_cast<std::size_t>(i)] : 0u;
}

void CatalogModel::sortBy(int column, Qt::SortOrder order) {
    emit layoutAboutToBeChanged({}, QAbstractItemModel::VerticalSortHint);
    const QModelIndexList before = persistentIndexList();
    std::vector<int> sources;
    for (const QModelIndex& idx : before) sources.push_back(sourceIndex(idx.row()));
    m_sortColumn = column >= 0 && column < ColumnCount ? column : -1;
    m_sortOrder = order;
    resort();
    const std::vector<int> empty;
    const std::vector<int>& ord = m_prep ? m_prep->order : empty;
    std::vector<int> rowOf(ord.size());
    for (std::size_t r = 0; r < ord.size(); ++r) rowOf[static_cast<std::size_t>(ord[r])] = static_cast<int>(r);
    QModelIndexList after;
    for (int k = 0; k < before.size(); ++k)
        after << (sources[k] >= 0 ? index(rowOf[static_cast<std::size_t>(sources[k])], before[k].column()) : QModelIndex());
    changePersistentIndexList(before, after);
    emit layoutChanged({}, QAbstractItemModel::VerticalSortHint);
    emit sortChanged(m_sortColumn, m_sortOrder, m_aperture);
}

void CatalogModel::skyPosition(int source, double& ra, double& dec) const {
    ra = dec = kNan;
    const Wcs* wcs = m_snap ? wcsOf(*m_snap) : nullptr;
    const Sources* s = sources();
    if (!wcs || !s || source < 0 || static_cast<std::size_t>(source) >= s->size()) return;
    const double x = s->x[static_cast<std::size_t>(source)], y = s->y[static_cast<std::size_t>(source)];
    if (!std::isfinite(x) || !std::isfinite(y)) return;
    std::tie(ra, dec) = wcs->pixelToWorld(x, y);
}

double CatalogModel::value(int row, int column) const {
    const int i = sourceIndex(row);
    return i < 0 ? kNan : sourceValue(static_cast<std::size_t>(i), column);
}

double CatalogModel::sourceValue(std::size_t i, int column) const {
    if (!m_snap || !m_prep) return kNan;
    return catalogValue(*m_snap, m_prep->flags, i, column, m_aperture);
}

QVariant CatalogModel::data(const QModelIndex& index, int role) const {
    if (!index.isValid() || !m_snap) return {};
    const int row = index.row(), col = index.column();
    if (role == SortRole) return value(row, col);
    if (role == FlagsRole) return QVariant::fromValue<quint32>(flags(row));
    if (role == Qt::TextAlignmentRole)
        return QVariant::fromValue(col == Flags ? Qt::AlignLeft | Qt::AlignVCenter : Qt::AlignRight | Qt::AlignVCenter);
    if (role == Qt::ToolTipRole && col == Flags) {
        const std::uint32_t f = flags(row);
        return QStringLiteral("%1: %2").arg(f).arg(QString::fromStdString(flagNames(f, ", ")));
    }
    if (role != Qt::DisplayRole) return {};
    if (col == Flags) {
        const std::uint32_t f = flags(row);
        return f ? QString::fromStdString(flagNames(f, " ")) : QString();
    }
    if (col == Ra || col == Dec) { // one transform per visible cell; no bulk work for display
        double ra, dec;
        skyPosition(sourceIndex(row), ra, dec);
        const double v = col == Ra ? ra : dec;
        return std::isfinite(v) ? QString::number(v, 'f', 6) : QString();
    }
    const double v = value(row, col);
    if (!std::isfinite(v)) return QString();
    switch (col) {
    case Id: return QString::number(sourceIndex(row) + 1);
    case X:
    case Y: return QString::number(v, 'f', 2);
    case MagAper:
    case MagErr:
    case MagCal: return QString::number(v, 'f', 3);
    case Fwhm: return QString::number(v, 'f', 2);
    case FluxIso: return QString::number(v, 'g', 6);
    case Snr: return QString::number(v, 'f', 1);
    }
    return QString::number(v);
}

QVariant CatalogModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal) return QAbstractTableModel::headerData(section, orientation, role);
    if (role == Qt::DisplayRole) return QString::fromLatin1(columnName(section));
    if (role == Qt::ToolTipRole) {
        switch (section) {
        case X:
        case Y: return tr("windowed centroid, FITS 1-based pixels");
        case Ra:
        case Dec: return tr("degrees, from the fitted WCS (else the header WCS)");
        case MagAper:
        case MagErr: {
            QString radius;
            if (m_snap && static_cast<std::size_t>(m_aperture) < m_snap->result.aperture.radii.size())
                radius = tr(" (radius %1 px)").arg(m_snap->result.aperture.radii[m_aperture], 0, 'f', 2);
            return tr("instrumental magnitude in aperture %1%2, no aperture correction").arg(m_aperture + 1).arg(radius);
        }
        case MagCal: return tr("-2.5 log10(flux_opt) + zero point (+ colour term)");
        case Fwhm: return tr("PSF model FWHM at the source, px");
        case FluxIso: return tr("isophotal flux above background, ADU");
        case Snr: return tr("S/N of the optimal-aperture flux");
        case Flags: return tr("flag bits (docs/FLAGS.md)");
        }
    }
    return {};
}

CatalogFilter::CatalogFilter(QObject* parent) : QSortFilterProxyModel(parent) { setSortRole(CatalogModel::SortRole); }

const CatalogModel* CatalogFilter::catalog() const { return qobject_cast<const CatalogModel*>(sourceModel()); }

void CatalogFilter::setExcludedFlags(std::uint32_t mask) {
    m_excluded = mask;
    invalidateFilter();
}

void CatalogFilter::setMagnitudeRange(double lo, double hi, int column) {
    m_lo = lo;
    m_hi = hi;
    m_magColumn = column;
    invalidateFilter();
}

void CatalogFilter::setText(const QString& text) {
    m_text = text.trimmed();
    invalidateFilter();
}

bool CatalogFilter::filterAcceptsRow(int row, const QModelIndex&) const {
    const CatalogModel* m = catalog();
    if (!m) return true;
    if (m_excluded && (m->flags(row) & m_excluded)) return false;
    if (std::isfinite(m_lo) || std::isfinite(m_hi)) {
        const double mag = m->value(row, m_magColumn);
        if (!std::isfinite(mag)) return false;
        if (std::isfinite(m_lo) && mag < m_lo) return false;
        if (std::isfinite(m_hi) && mag > m_hi) return false;
    }
    if (!m_text.isEmpty()) {
        if (QString::number(m->sourceIndex(row) + 1).startsWith(m_text)) return true;
        return QString::fromStdString(flagNames(m->flags(row))).contains(m_text, Qt::CaseInsensitive);
    }
    return true;
}

void CatalogFilter::sort(int column, Qt::SortOrder order) {
    if (auto* m = qobject_cast<CatalogModel*>(sourceModel())) m->sortBy(column, order);
    else QSortFilterProxyModel::sort(column, order);
}

} // namespace gpuphot::ui
