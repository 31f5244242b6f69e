#include "ui/catalog_prep.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/flags.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/wcs/wcs.hpp"
#include "ui/catalog_model.hpp"
#include "ui/snapshot.hpp"

namespace gpuphot::ui {
namespace {
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

double at(const std::vector<double>& v, std::size_t i) { return i < v.size() ? v[i] : kNan; }

const Wcs* wcsOf(const Snapshot& s) {
    if (s.result.fittedWcs) return s.result.fittedWcs.get();
    return s.frame ? s.frame->wcs.get() : nullptr;
}

// Unsigned image of a key whose order is the sort's: ascending or descending by value, NaN after all.
std::uint64_t orderKey(double k, bool descending) {
    if (std::isnan(k)) return std::numeric_limits<std::uint64_t>::max();
    if (k == 0.0) k = 0.0; // -0 == +0
    std::uint64_t u = std::bit_cast<std::uint64_t>(k);
    u = (u >> 63) ? ~u : (u | (std::uint64_t(1) << 63)); // ascending unsigned order of the doubles
    // Both stay below UINT64_MAX for every non-NaN double (+inf: 0xFFF0..., descending -inf: 0xFFF0...).
    return descending ? ~u : u;
}
} // namespace

std::vector<std::uint32_t> combinedFlags(const Snapshot& snap) {
    const PipelineResult& r = snap.result;
    const Sources& s = r.detection.sources;
    const std::size_t n = s.size();
    std::vector<std::uint32_t> flags(s.flags.begin(), s.flags.end());
    if (r.aperture.flags.size() == n)
        for (std::size_t i = 0; i < n; ++i) flags[i] |= r.aperture.flags[i];
    if (r.psf.flags.size() == n)
        for (std::size_t i = 0; i < n; ++i) flags[i] |= r.psf.flags[i];
    // as core/pipeline/catalog_builder.cpp marks them
    const auto mark = [&](const std::vector<std::int32_t>& idx, const std::vector<bool>& used, std::uint32_t bit) {
        for (std::size_t k = 0; k < idx.size() && k < used.size(); ++k)
            if (used[k] && idx[k] >= 0 && static_cast<std::size_t>(idx[k]) < n) flags[static_cast<std::size_t>(idx[k])] |= bit;
    };
    mark(r.astrometry.sourceIndex, r.astrometry.used, FlagAstromStar);
    mark(r.zeropoint.sourceIndex, r.zeropoint.used, FlagCalibrator);
    return flags;
}

double catalogValue(const Snapshot& snap, const std::vector<std::uint32_t>& flags, std::size_t i, int column,
                    int aperture, const std::vector<double>* ra, const std::vector<double>* dec) {
    const Sources& s = snap.result.detection.sources;
    if (i >= s.size()) return kNan;
    const PipelineResult& r = snap.result;
    const ApertureResult& ap = r.aperture;
    const bool haveAp = ap.count == s.size() && aperture >= 0 && static_cast<std::size_t>(aperture) < ap.flux.size();
    switch (column) {
    case CatalogModel::Id: return static_cast<double>(i + 1);
    case CatalogModel::X: return s.x[i] + 1.0;
    case CatalogModel::Y: return s.y[i] + 1.0;
    case CatalogModel::Ra:
    case CatalogModel::Dec: {
        const std::vector<double>* bulk = column == CatalogModel::Ra ? ra : dec;
        if (bulk && bulk->size() == s.size()) return (*bulk)[i];
        const Wcs* wcs = wcsOf(snap);
        if (!wcs || !std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) return kNan;
        const auto [a, d] = wcs->pixelToWorld(s.x[i], s.y[i]);
        return column == CatalogModel::Ra ? a : d;
    }
    case CatalogModel::MagAper: return haveAp ? instrumentalMag(ap.flux[aperture][i]) : kNan;
    case CatalogModel::MagErr: return haveAp ? magError(ap.flux[aperture][i], ap.fluxErr[aperture][i]) : kNan;
    case CatalogModel::MagCal: {
        if (!r.zeropoint.ok) return kNan;
        const double m = at(r.magInst, i);
        if (!std::isfinite(m)) return kNan;
        double ct = 0.0;
        if (r.zeropoint.colourTermFitted && snap.reference && r.crossmatch.refIndex.size() == s.size() &&
            r.crossmatch.refIndex[i] >= 0) {
            const auto j = static_cast<std::size_t>(r.crossmatch.refIndex[i]);
            if (j < snap.reference->color.size() && std::isfinite(snap.reference->color[j]))
                ct = r.zeropoint.colourTerm * snap.reference->color[j];
        }
        return m + r.zeropoint.zp + ct;
    }
    case CatalogModel::Fwhm: return at(r.psf.fwhm, i);
    case CatalogModel::FluxIso: return s.fluxIso[i];
    case CatalogModel::Snr: {
        // S/N of the optimal-aperture flux (the one the zero point and the limiting magnitude use)
        const double f = at(ap.fluxOpt, i), e = at(ap.fluxOptErr, i);
        return e > 0 ? f / e : kNan;
    }
    case CatalogModel::Flags: return i < flags.size() ? static_cast<double>(flags[i]) : kNan;
    }
    return kNan;
}

std::vector<int> sortPermutation(const std::vector<double>& keys, bool descending) {
    const std::size_t n = keys.size();
    std::vector<std::uint64_t> k(n), k2(n);
    std::vector<int> idx(n), idx2(n);
    std::uint64_t orAll = 0, andAll = ~std::uint64_t(0);
    for (std::size_t i = 0; i < n; ++i) {
        k[i] = orderKey(keys[i], descending);
        idx[i] = static_cast<int>(i);
        orAll |= k[i];
        andAll &= k[i];
    }
    // LSD radix, 16-bit digits; a digit every key shares is skipped. Stable: ties keep the source order.
    std::vector<std::uint32_t> count(65536 + 1);
    for (int shift = 0; shift < 64; shift += 16) {
        if ((((orAll ^ andAll) >> shift) & 0xffff) == 0) continue;
        std::fill(count.begin(), count.end(), 0u);
        for (std::size_t i = 0; i < n; ++i) ++count[((k[i] >> shift) & 0xffff) + 1];
        for (std::size_t d = 1; d < count.size(); ++d) count[d] += count[d - 1];
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t pos = count[(k[i] >> shift) & 0xffff]++;
            k2[pos] = k[i];
            idx2[pos] = idx[i];
        }
        k.swap(k2);
        idx.swap(idx2);
    }
    return idx;
}

std::shared_ptr<const CatalogPrep> prepareCatalog(const Snapshot& snap, int column, bool descending, int aperture,
                                                  const std::vector<std::uint32_t>* flags) {
    auto prep = std::make_shared<CatalogPrep>();
    prep->column = column >= 0 && column < CatalogModel::ColumnCount ? column : -1;
    prep->descending = descending;
    prep->aperture = aperture;
    const std::size_t n = snap.result.detection.sources.size();
    prep->flags = flags && flags->size() == n ? *flags : combinedFlags(snap);
    if (prep->column < 0 || prep->column == CatalogModel::Id) {
        prep->order.resize(n);
        if (prep->column == CatalogModel::Id && descending)
            for (std::size_t r = 0; r < n; ++r) prep->order[r] = static_cast<int>(n - 1 - r);
        else
            std::iota(prep->order.begin(), prep->order.end(), 0);
        return prep;
    }
    std::vector<double> ra, dec;
    if (prep->column == CatalogModel::Ra || prep->column == CatalogModel::Dec) {
        const Sources& s = snap.result.detection.sources;
        if (const Wcs* wcs = wcsOf(snap); wcs && n > 0) {
            ra.assign(n, kNan);
            dec.assign(n, kNan);
            wcs->pixelToWorld(s.x, s.y, ra, dec);
        }
    }
    std::vector<double> keys(n);
    for (std::size_t i = 0; i < n; ++i)
        keys[i] = catalogValue(snap, prep->flags, i, prep->column, aperture, &ra, &dec);
    prep->order = sortPermutation(keys, descending);
    return prep;
}

} // namespace gpuphot::ui
