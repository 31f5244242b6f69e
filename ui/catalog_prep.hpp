#pragma once
// The catalog table's per-result data that costs O(n) or O(n log n): the combined flags column and the row
// order for the current sort. Plain C++ (no widgets): the worker computes it on its thread right after a
// run, alongside the snapshot (Snapshot::catalog), so that taking in a new result on the UI thread is a
// pointer swap; the table model computes it itself only when the result comes sorted another way.
//
// Sort semantics (the same as the table's, and as std::stable_sort with "NaN last"): ascending or descending
// by the column's numeric value, NaN last in either order, ties in source order; -0 and +0 are equal.
#include <cstdint>
#include <memory>
#include <vector>

namespace gpuphot::ui {

struct Snapshot;

struct CatalogPrep {
    int column = -1;         // CatalogModel::Column sorted by; -1: source order
    bool descending = false; // sort order (ignored for column -1)
    int aperture = 0;        // the fixed aperture that mag_aper / magerr show
    std::vector<std::uint32_t> flags; // per source: detection | aperture | PSF | calibrator | astrometric star
    std::vector<int> order;           // row -> source index
};

// Detection, aperture and PSF flags of each source, plus the calibrator / astrometric-star marks.
std::vector<std::uint32_t> combinedFlags(const Snapshot& snapshot);

// Value of column `column` (CatalogModel::Column) for source i, as the table shows and sorts it (NaN when
// absent). flags: combinedFlags; ra/dec: bulk sky positions (may be null: computed per call).
double catalogValue(const Snapshot& snapshot, const std::vector<std::uint32_t>& flags, std::size_t i, int column,
                    int aperture, const std::vector<double>* ra = nullptr, const std::vector<double>* dec = nullptr);

// Row order by keys: a stable LSD radix sort of the keys' order-preserving 64-bit images (O(n), a few ms
// for 150k rows); the same permutation as std::stable_sort with "NaN last".
std::vector<int> sortPermutation(const std::vector<double>& keys, bool descending);

// Flags and row order of a snapshot for a sort column (-1: source order). flags: reuse these (the
// snapshot's, already computed) when non-null.
std::shared_ptr<const CatalogPrep> prepareCatalog(const Snapshot& snapshot, int column, bool descending,
                                                  int aperture, const std::vector<std::uint32_t>* flags = nullptr);

} // namespace gpuphot::ui
