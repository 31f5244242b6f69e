// CatalogModel / CatalogFilter against the catalog file's columns (core's buildCatalog) on a simulated,
// calibrated field; filtering and numeric sorting; the cost of taking in a 150,000-source result.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QApplication>
#include <QHeaderView>
#include <QTableView>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>

#include "core/catalog/reference_catalog.hpp"
#include "core/catalog/table.hpp"
#include "core/io/fits_image.hpp"
#include "core/model/flags.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "tests/test_support.hpp"
#include "ui/catalog_model.hpp"
#include "ui/catalog_prep.hpp"
#include "ui/overlay_builder.hpp"

using namespace gpuphot;
using namespace gpuphot::ui;

namespace {

QApplication& app() { return gpuphot::test::uiTestApp(); }

struct Calibrated {
    SnapshotPtr snap;
    Table catalog;
};

// A 400^2 simulated field with its reference catalog, reduced with calibration (as `reduce --ref`).
const Calibrated& calibrated() {
    static const Calibrated c = [] {
        test::TempDir dir("catalog_model");
        SimParams p;
        p.width = p.height = 400;
        p.stars = 250;
        p.seed = 11;
        p.magBright = 12.0;
        p.magFaint = 20.0;
        p.colourTerm = 0.05;
        writeSimulation(simulateField(p), dir.str(), "f", -32);
        auto snap = std::make_shared<Snapshot>();
        snap->frame = std::make_shared<const Frame>(readFrame(dir / "f.fits"));
        snap->reference = std::make_shared<const ReferenceCatalog>(readReferenceCatalog(dir / "f.ref.fits", parseRefColumnMap("color=colour")));
        snap->config.zeropoint.fitColourTerm = true;
        snap->config.zeropoint.colourTermMinSignificance = 0.0; // keep the colour term (its column path is tested)
        RunContext ctx;
        snap->result = runPipeline(*snap->frame, snap->config, ctx, snap->reference.get());
        Calibrated out;
        out.catalog = buildCatalog(*snap->frame, snap->result, snap->config, snap->reference.get());
        out.snap = snap;
        return out;
    }();
    return c;
}

bool sameValue(double a, double b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b));
}

} // namespace

TEST(CatalogModel, ColumnsMatchTheCatalogFile) {
    app();
    const Calibrated& c = calibrated();
    ASSERT_TRUE(c.snap->result.zeropoint.ok) << c.snap->result.calibrationProblem;
    ASSERT_TRUE(c.snap->result.zeropoint.colourTermFitted);
    CatalogModel model;
    model.setSnapshot(c.snap);
    const int n = static_cast<int>(c.catalog.rows());
    ASSERT_GT(n, 50);
    ASSERT_EQ(model.rowCount(), n);
    ASSERT_EQ(model.columnCount(), CatalogModel::ColumnCount);
    const std::pair<int, const char*> columns[] = {
        {CatalogModel::Id, "id"},           {CatalogModel::X, "x"},          {CatalogModel::Y, "y"},
        {CatalogModel::Ra, "ra"},           {CatalogModel::Dec, "dec"},      {CatalogModel::MagAper, "mag_aper_1"},
        {CatalogModel::MagErr, "magerr_aper_1"}, {CatalogModel::MagCal, "mag_cal"}, {CatalogModel::Fwhm, "fwhm"},
        {CatalogModel::FluxIso, "flux_iso"}, {CatalogModel::Flags, "flags"}};
    for (const auto& [col, name] : columns) {
        const std::vector<double> truth = c.catalog.doubles(name);
        int bad = 0;
        for (int i = 0; i < n; ++i) bad += !sameValue(model.value(i, col), truth[static_cast<std::size_t>(i)]);
        EXPECT_EQ(bad, 0) << "column " << name;
    }
    const std::vector<double> f = c.catalog.doubles("flux_opt"), fe = c.catalog.doubles("fluxerr_opt");
    for (int i = 0; i < n; ++i) EXPECT_TRUE(sameValue(model.value(i, CatalogModel::Snr), f[i] / fe[i])) << i;
    // Display text: 1-based positions, flag names.
    const std::vector<double> x = c.catalog.doubles("x");
    EXPECT_EQ(model.data(model.index(3, CatalogModel::X)).toString(), QString::number(x[3], 'f', 2));
    EXPECT_EQ(model.data(model.index(3, CatalogModel::Ra)).toString(),
              QString::number(c.catalog.doubles("ra")[3], 'f', 6));
    int psfStar = -1;
    for (int i = 0; i < n && psfStar < 0; ++i)
        if (model.flags(i) & FlagPsfStar) psfStar = i;
    ASSERT_GE(psfStar, 0);
    EXPECT_TRUE(model.data(model.index(psfStar, CatalogModel::Flags)).toString().contains("psf_star"));
    EXPECT_EQ(model.headerData(CatalogModel::MagCal, Qt::Horizontal).toString(), "mag_cal");
    // Another aperture.
    model.setApertureIndex(2);
    const std::vector<double> m3 = c.catalog.doubles("mag_aper_3");
    for (int i = 0; i < n; ++i) EXPECT_TRUE(sameValue(model.value(i, CatalogModel::MagAper), m3[i]));
}

TEST(CatalogFilter, SortsNumericallyAndFilters) {
    app();
    const Calibrated& c = calibrated();
    CatalogModel model;
    model.setSnapshot(c.snap);
    CatalogFilter proxy;
    proxy.setSourceModel(&model);
    const int n = model.rowCount();
    const std::vector<double> mag = c.catalog.doubles("mag_aper_1");
    const std::vector<double> flags = c.catalog.doubles("flags");

    proxy.sort(CatalogModel::MagAper, Qt::AscendingOrder);
    ASSERT_EQ(proxy.rowCount(), n);
    std::vector<double> shown;
    for (int r = 0; r < n; ++r) shown.push_back(mag[model.sourceIndex(proxy.mapToSource(proxy.index(r, 0)).row())]);
    std::vector<double> expected = mag; // independent: finite ascending, then NaN
    std::stable_sort(expected.begin(), expected.end(), [](double a, double b) {
        if (std::isnan(a) != std::isnan(b)) return std::isnan(b);
        return !std::isnan(a) && a < b;
    });
    for (int r = 0; r < n; ++r) EXPECT_TRUE(sameValue(shown[r], expected[r])) << r;
    // Numeric, not lexical: ids sort 1, 2, ..., 10 (a text sort would put 10 before 2).
    proxy.sort(CatalogModel::Id, Qt::AscendingOrder);
    for (int r = 0; r < n; ++r) ASSERT_EQ(model.sourceIndex(proxy.mapToSource(proxy.index(r, 0)).row()), r);
    proxy.sort(CatalogModel::Id, Qt::DescendingOrder);
    EXPECT_EQ(proxy.data(proxy.index(0, CatalogModel::Id)).toString(), QString::number(n));

    const std::uint32_t mask = FlagSaturated | FlagBlended | FlagEdge;
    proxy.setExcludedFlags(mask);
    int clean = 0;
    for (double f : flags) clean += (static_cast<std::uint32_t>(f) & mask) == 0;
    EXPECT_EQ(proxy.rowCount(), clean);
    EXPECT_LT(clean, n);
    proxy.setExcludedFlags(0);

    proxy.setMagnitudeRange(-12.0, -9.0);
    int inRange = 0;
    for (double m : mag) inRange += m >= -12.0 && m <= -9.0;
    EXPECT_EQ(proxy.rowCount(), inRange);
    EXPECT_GT(inRange, 0);
    const std::vector<double> cal = c.catalog.doubles("mag_cal");
    proxy.setMagnitudeRange(std::nan(""), 16.0, CatalogModel::MagCal);
    int bright = 0;
    for (double m : cal) bright += m <= 16.0;
    EXPECT_EQ(proxy.rowCount(), bright);
    proxy.setMagnitudeRange(std::nan(""), std::nan(""));

    proxy.setText("PSF_STAR");
    int psfStars = 0;
    for (double f : flags) psfStars += (static_cast<std::uint32_t>(f) & FlagPsfStar) != 0;
    EXPECT_EQ(proxy.rowCount(), psfStars);
    proxy.setText("");
    EXPECT_EQ(proxy.rowCount(), n);
}

// The radix permutation is std::stable_sort's with "NaN last" (ties in source order, -0 == +0), both orders.
TEST(CatalogPrep, RadixPermutationEqualsStableSort) {
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> pick(0, 9);
    std::normal_distribution<double> g(0.0, 1e3);
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    for (int trial = 0; trial < 6; ++trial) {
        const std::size_t n = trial == 0 ? 0 : trial == 1 ? 1 : 5000 * trial;
        std::vector<double> keys(n);
        for (double& k : keys) {
            switch (pick(rng)) {
            case 0: k = nan; break;
            case 1: k = (rng() & 1) ? 0.0 : -0.0; break;
            case 2: k = (rng() & 1) ? inf : -inf; break;
            case 3: k = std::round(g(rng) / 100.0); break; // many ties
            case 4: k = std::numeric_limits<double>::denorm_min() * ((rng() & 1) ? 1 : -1); break;
            default: k = g(rng); break;
            }
        }
        for (bool desc : {false, true}) {
            std::vector<int> ref(n);
            std::iota(ref.begin(), ref.end(), 0);
            std::stable_sort(ref.begin(), ref.end(), [&](int a, int b) {
                const double ka = keys[static_cast<std::size_t>(a)], kb = keys[static_cast<std::size_t>(b)];
                const bool na = std::isnan(ka), nb = std::isnan(kb);
                if (na || nb) return !na && nb;
                return desc ? ka > kb : ka < kb;
            });
            EXPECT_EQ(sortPermutation(keys, desc), ref) << "n " << n << (desc ? " descending" : " ascending");
        }
    }
}

// A result that comes with the worker's prepared order is taken as it is (no sorting on the UI thread) and
// shows the same rows as one the model sorts itself; a prepared order for another sort is ignored.
TEST(CatalogModel, UsesThePreparedOrderOnlyWhenItMatches) {
    app();
    const Calibrated& c = calibrated();
    CatalogModel local, prepared;
    local.setSnapshot(c.snap);
    local.sortBy(CatalogModel::MagCal, Qt::DescendingOrder);
    prepared.sortBy(CatalogModel::MagCal, Qt::DescendingOrder);
    auto withPrep = std::make_shared<Snapshot>(*c.snap);
    withPrep->catalog = prepareCatalog(*withPrep, CatalogModel::MagCal, true, 0);
    prepared.setSnapshot(withPrep);
    EXPECT_TRUE(prepared.lastResetUsedPrep());
    local.setSnapshot(c.snap); // no prepared order: sorted here
    EXPECT_FALSE(local.lastResetUsedPrep());
    ASSERT_EQ(local.rowCount(), prepared.rowCount());
    for (int r = 0; r < local.rowCount(); ++r) {
        ASSERT_EQ(local.sourceIndex(r), prepared.sourceIndex(r)) << r;
        ASSERT_EQ(local.flags(r), prepared.flags(r)) << r;
    }
    // Descending by calibrated magnitude, NaN last.
    for (int r = 1; r < local.rowCount(); ++r) {
        const double a = local.value(r - 1, CatalogModel::MagCal), b = local.value(r, CatalogModel::MagCal);
        if (!std::isnan(b)) {
            EXPECT_GE(a, b) << r;
        }
        if (std::isnan(a)) {
            EXPECT_TRUE(std::isnan(b)) << r;
        }
    }
    auto otherSort = std::make_shared<Snapshot>(*c.snap);
    otherSort->catalog = prepareCatalog(*otherSort, CatalogModel::X, false, 0);
    prepared.setSnapshot(otherSort);
    EXPECT_FALSE(prepared.lastResetUsedPrep());
    for (int r = 0; r < local.rowCount(); ++r) ASSERT_EQ(local.sourceIndex(r), prepared.sourceIndex(r)) << r;
}

TEST(CatalogModel, TakingIn150kSourcesIsCheap) {
    app();
    const std::size_t n = 150000;
    auto snap = std::make_shared<Snapshot>();
    Sources& s = snap->result.detection.sources;
    s.resize(n);
    std::mt19937 rng(3);
    std::uniform_real_distribution<double> u(0.0, 14000.0), fl(10.0, 1e6);
    ApertureResult& ap = snap->result.aperture;
    ap.count = n;
    ap.radii = {2, 3, 4, 6};
    ap.flux.assign(4, std::vector<double>(n));
    ap.fluxErr.assign(4, std::vector<double>(n));
    ap.flags.assign(n, 0);
    ap.fluxOpt.resize(n);
    ap.fluxOptErr.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        s.x[i] = u(rng);
        s.y[i] = u(rng);
        s.fluxIso[i] = fl(rng);
        s.flags[i] = static_cast<std::uint32_t>(rng() & 0xff);
        for (int r = 0; r < 4; ++r) ap.flux[r][i] = s.fluxIso[i] * (0.5 + 0.1 * r), ap.fluxErr[r][i] = 30.0;
        ap.fluxOpt[i] = s.fluxIso[i];
        ap.fluxOptErr[i] = 25.0;
    }
    snap->result.psf.fwhm.assign(n, 3.0);
    auto snap2 = std::make_shared<Snapshot>(*snap);

    CatalogModel model;
    CatalogFilter proxy;
    proxy.setSourceModel(&model);
    QTableView view;
    view.setModel(&proxy);
    view.resize(900, 600);
    view.show();
    const auto ms = [](auto t0) {
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    auto t0 = std::chrono::steady_clock::now();
    model.setSnapshot(snap);
    const double unsorted = ms(t0);
    ASSERT_EQ(proxy.rowCount(), static_cast<int>(n));
    QApplication::processEvents();
    proxy.sort(CatalogModel::MagAper, Qt::AscendingOrder);
    t0 = std::chrono::steady_clock::now();
    model.setSnapshot(snap2); // a new result while the table is sorted by magnitude: the proxy re-sorts
    const double sorted = ms(t0);
    t0 = std::chrono::steady_clock::now();
    QApplication::processEvents();
    const double paint = ms(t0);
    // As the worker delivers results: the flags and the order for the table's sort come with the snapshot.
    auto snap3 = std::make_shared<Snapshot>(*snap);
    t0 = std::chrono::steady_clock::now();
    snap3->catalog = prepareCatalog(*snap3, CatalogModel::MagAper, false, 0);
    const double prepMs = ms(t0);
    t0 = std::chrono::steady_clock::now();
    model.setSnapshot(snap3);
    const double prepared = ms(t0);
    EXPECT_TRUE(model.lastResetUsedPrep());
    t0 = std::chrono::steady_clock::now();
    QApplication::processEvents();
    const double paint2 = ms(t0);
    CatalogModel bare;
    t0 = std::chrono::steady_clock::now();
    bare.setSnapshot(snap);
    const double alone = ms(t0);
    t0 = std::chrono::steady_clock::now();
    const OverlayGeometry g = buildOverlays(*snap3); // the other UI-thread step of onResult (then the viewer's)
    const double overlays = ms(t0);
    EXPECT_EQ(g.sources.size(), n);
    std::printf("[ measure  ] 150k sources: overlay geometry from the snapshot %.1f ms\n", overlays);
    std::printf("[ measure  ] 150k sources: model reset alone %.2f ms; through proxy + QTableView %.1f ms "
                "(unsorted), %.1f ms (sorted by mag, sorted on the UI thread), next event-loop turn %.1f ms; "
                "sorted, order prepared by the worker (%.1f ms there): %.1f ms + next turn %.1f ms (goal <= 50)\n",
                alone, unsorted, sorted, paint, prepMs, prepared, paint2);
    // The sort is by value: the first row shown is the brightest.
    const double first = model.value(proxy.mapToSource(proxy.index(0, 0)).row(), CatalogModel::MagAper);
    double brightest = 1e9;
    for (std::size_t i = 0; i < n; ++i) brightest = std::min(brightest, -2.5 * std::log10(ap.flux[0][i]));
    EXPECT_NEAR(first, brightest, 1e-12);
}
