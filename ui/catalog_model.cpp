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

double at(const std::vector<double>& v, int row) {
    return static_cast<std::size_t>(row) < v.size() ? v[static_cast<std::size_t>(row)] : kNan;
}

const Wcs* wcsOf(const Snapshot& s) {
    if (s.result.fittedWcs) return s.result.fittedWcs.get();
    return s.frame ? s.frame->wcs.get() : nullptr;
}
} // namespace

CatalogModel::CatalogModel(QObject* parent) : QAbstractTableModel(parent) {}

const Sources* CatalogModel::sources() const { return m_snap ? &m_snap->result.detection.sources : nullptr; }

void CatalogModel::setSnapshot(SnapshotPtr snapshot) {
    beginResetModel();
    m_snap = std::move(snapshot);
    m_ra.clear();
    m_dec.clear();
    m_flags.clear();
    if (const Sources* s = sources()) {
        // The catalog's flags column: detection | aperture | PSF, plus calibrator and astrometric-star marks.
        const PipelineResult& r = m_snap->result;
        const std::size_t n = s->size();
        m_flags.assign(s->flags.begin(), s->flags.end());
        if (r.aperture.flags.size() == n)
            for (std::size_t i = 0; i < n; ++i) m_flags[i] |= r.aperture.flags[i];
        if (r.psf.flags.size() == n)
            for (std::size_t i = 0; i < n; ++i) m_flags[i] |= r.psf.flags[i];
        // as core/pipeline/catalog_builder.cpp marks them
        const auto mark = [&](const std::vector<std::int32_t>& idx, const std::vector<bool>& used, std::uint32_t bit) {
            for (std::size_t k = 0; k < idx.size() && k < used.size(); ++k)
                if (used[k] && idx[k] >= 0 && static_cast<std::size_t>(idx[k]) < n) m_flags[static_cast<std::size_t>(idx[k])] |= bit;
        };
        mark(r.astrometry.sourceIndex, r.astrometry.used, FlagAstromStar);
        mark(r.zeropoint.sourceIndex, r.zeropoint.used, FlagCalibrator);
    }
    m_order.resize(m_flags.size());
    std::iota(m_order.begin(), m_order.end(), 0);
    if (m_sortColumn >= 0) sortRows();
    endResetModel();
}

void CatalogModel::setApertureIndex(int index) {
    if (index == m_aperture) return;
    m_aperture = index;
    if (rowCount() > 0) emit dataChanged(this->index(0, MagAper), this->index(rowCount() - 1, MagErr));
    emit headerDataChanged(Qt::Horizontal, MagAper, MagErr);
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
    return row >= 0 && static_cast<std::size_t>(row) < m_order.size() ? m_order[static_cast<std::size_t>(row)] : -1;
}

std::uint32_t CatalogModel::flags(int row) const {
    const int i = sourceIndex(row);
    return i >= 0 ? m_flags[static_cast<std::size_t>(i)] : 0u;
}

void CatalogModel::sortRows() {
    const std::size_t n = m_order.size();
    std::iota(m_order.begin(), m_order.end(), 0);
    if (m_sortColumn < 0 || n == 0) return;
    std::vector<double> key(n);
    for (std::size_t i = 0; i < n; ++i) key[i] = sourceValue(i, m_sortColumn);
    const bool asc = m_sortOrder == Qt::AscendingOrder;
    // NaN last in either order; ties keep the source order (deterministic)
    std::stable_sort(m_order.begin(), m_order.end(), [&](int a, int b) {
        const double ka = key[static_cast<std::size_t>(a)], kb = key[static_cast<std::size_t>(b)];
        const bool na = std::isnan(ka), nb = std::isnan(kb);
        if (na || nb) return !na && nb;
        return asc ? ka < kb : ka > kb;
    });
}

void CatalogModel::sortBy(int column, Qt::SortOrder order) {
    emit layoutAboutToBeChanged({}, QAbstractItemModel::VerticalSortHint);
    const QModelIndexList before = persistentIndexList();
    std::vector<int> sources;
    for (const QModelIndex& idx : before) sources.push_back(sourceIndex(idx.row()));
    m_sortColumn = column >= 0 && column < ColumnCount ? column : -1;
    m_sortOrder = order;
    sortRows();
    std::vector<int> rowOf(m_order.size());
    for (std::size_t r = 0; r < m_order.size(); ++r) rowOf[static_cast<std::size_t>(m_order[r])] = static_cast<int>(r);
    QModelIndexList after;
    for (int k = 0; k < before.size(); ++k)
        after << (sources[k] >= 0 ? index(rowOf[static_cast<std::size_t>(sources[k])], before[k].column()) : QModelIndex());
    changePersistentIndexList(before, after);
    emit layoutChanged({}, QAbstractItemModel::VerticalSortHint);
}

void CatalogModel::skyPosition(int row, double& ra, double& dec) const {
    ra = dec = kNan;
    if (!m_ra.empty()) {
        ra = at(m_ra, row);
        dec = at(m_dec, row);
        return;
    }
    const Wcs* wcs = m_snap ? wcsOf(*m_snap) : nullptr;
    const Sources* s = sources();
    if (!wcs || !s || static_cast<std::size_t>(row) >= s->size()) return;
    const double x = s->x[static_cast<std::size_t>(row)], y = s->y[static_cast<std::size_t>(row)];
    if (!std::isfinite(x) || !std::isfinite(y)) return;
    std::tie(ra, dec) = wcs->pixelToWorld(x, y);
}

void CatalogModel::ensureSkyCache() const {
    const Wcs* wcs = m_snap ? wcsOf(*m_snap) : nullptr;
    const Sources* s = sources();
    if (!m_ra.empty() || !wcs || !s || s->size() == 0) return;
    std::vector<double> ra(s->size(), kNan), dec(s->size(), kNan);
    wcs->pixelToWorld(s->x, s->y, ra, dec);
    m_ra = std::move(ra);
    m_dec = std::move(dec);
}

double CatalogModel::value(int row, int column) const {
    const int i = sourceIndex(row);
    return i < 0 ? kNan : sourceValue(static_cast<std::size_t>(i), column);
}

double CatalogModel::sourceValue(std::size_t i, int column) const {
    const Sources* s = sources();
    if (!s || i >= s->size()) return kNan;
    const int row = static_cast<int>(i); // source index
    const PipelineResult& r = m_snap->result;
    const ApertureResult& ap = r.aperture;
    const bool haveAp = ap.count == s->size() && static_cast<std::size_t>(m_aperture) < ap.flux.size();
    switch (column) {
    case Id: return static_cast<double>(row + 1);
    case X: return s->x[i] + 1.0;
    case Y: return s->y[i] + 1.0;
    case Ra:
    case Dec: {
        if (m_ra.empty()) ensureSkyCache(); // sorting asks for every row: one bulk transform
        double ra, dec;
        skyPosition(row, ra, dec);
        return column == Ra ? ra : dec;
    }
    case MagAper: return haveAp ? instrumentalMag(ap.flux[m_aperture][i]) : kNan;
    case MagErr: return haveAp ? magError(ap.flux[m_aperture][i], ap.fluxErr[m_aperture][i]) : kNan;
    case MagCal: {
        if (!r.zeropoint.ok) return kNan;
        const double m = at(r.magInst, row);
        if (!std::isfinite(m)) return kNan;
        double ct = 0.0;
        if (r.zeropoint.colourTermFitted && m_snap->reference && r.crossmatch.refIndex.size() == s->size() &&
            r.crossmatch.refIndex[i] >= 0) {
            const auto j = static_cast<std::size_t>(r.crossmatch.refIndex[i]);
            if (j < m_snap->reference->color.size() && std::isfinite(m_snap->reference->color[j]))
                ct = r.zeropoint.colourTerm * m_snap->reference->color[j];
        }
        return m + r.zeropoint.zp + ct;
    }
    case Fwhm: return at(r.psf.fwhm, row);
    case FluxIso: return s->fluxIso[i];
    case Snr: {
        // S/N of the optimal-aperture flux (the one the zero point and the limiting magnitude use)
        const double f = at(ap.fluxOpt, row), e = at(ap.fluxOptErr, row);
        return e > 0 ? f / e : kNan;
    }
    case Flags: return static_cast<double>(flags(row));
    }
    return kNan;
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
