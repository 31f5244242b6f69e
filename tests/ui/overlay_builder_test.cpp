// What the viewer draws from a result (ui/overlay_builder.hpp): a dense reference catalog is thinned to
// its brightest stars so that the image stays visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "ui/overlay_builder.hpp"

using namespace gpuphot;

TEST(OverlayBuilder, ReferenceStarsThinnedToTheBrightest) {
    auto ref = std::make_shared<ReferenceCatalog>();
    ui::Snapshot snap;
    CrossmatchResult& cm = snap.result.crossmatch;
    const int n = 5000;
    for (int k = 0; k < n; ++k) {
        ref->ra.push_back(0.0);
        ref->dec.push_back(0.0);
        ref->mag.push_back(10.0 + (k * 7919 % n) * 0.002); // a permutation of 10 .. 20 mag
        cm.refSelected.push_back(k);
        cm.refX.push_back(k % 100);
        cm.refY.push_back(k / 100);
    }
    snap.reference = ref;
    const ui::OverlayGeometry all = ui::buildOverlays(snap, {12, 10.0, 0});
    EXPECT_EQ(all.referenceStars.size(), std::size_t(n));
    const ui::OverlayGeometry thin = ui::buildOverlays(snap); // default: the brightest 2000
    ASSERT_EQ(thin.referenceStars.size(), 2000u);
    // Exactly the 2000 brightest: mag < 10 + 2000 * 0.002.
    for (const auto& v : thin.referenceStars) {
        const int k = static_cast<int>(v.x) + 100 * static_cast<int>(v.y);
        EXPECT_LT(ref->mag[static_cast<std::size_t>(k)], 14.0) << k;
    }
    // Without a catalog (nothing to rank by) every projected star is drawn.
    snap.reference.reset();
    EXPECT_EQ(ui::buildOverlays(snap).referenceStars.size(), std::size_t(n));
}

// PSF whiskers show at any zoom: by default the longest spans 0.8 of a grid cell, the others in proportion
// to FWHM * ellipticity, along the PSF's angle; a gain given is used as it is.
TEST(OverlayBuilder, WhiskersFillTheirCellByDefault) {
    ui::Snapshot snap;
    PsfResult& psf = snap.result.psf;
    psf.width = 2400;
    psf.height = 1200;
    // FWHM 3 px everywhere; e1 = 0.02 + 0.02 u (ellipticity from 0 at the left to 0.04 at the right), e2 = 0.
    psf.fwhmPoly.order = 0;
    psf.fwhmPoly.coeffs = {3.0};
    psf.e1Poly.order = 1;
    psf.e1Poly.coeffs = {0.02, 0.02, 0.0};
    psf.e2Poly.order = 0;
    psf.e2Poly.coeffs = {0.0};
    ASSERT_TRUE(psf.hasModel());
    const ui::OverlayGeometry g = ui::buildOverlays(snap);
    ASSERT_EQ(g.whiskers.size(), 144u);
    double longest = 0.0, shortest = 1e9;
    for (const auto& w : g.whiskers) {
        const double len = std::hypot(w.dx, w.dy);
        longest = std::max(longest, len);
        shortest = std::min(shortest, len);
        EXPECT_LT(std::fabs(w.dy), 1e-3 * (len + 1e-9)) << "e2 = 0: along x";
    }
    const double cell = 1200.0 / 12;
    EXPECT_NEAR(longest, 0.8 * cell, 1e-3);
    EXPECT_LT(shortest, 0.1 * longest) << "lengths follow the ellipticity";
    // The gain as drawn is reported, and a gain given is kept.
    const double rightmost = 11.5 * 2400.0 / 12 - 0.5; // the grid column of the largest ellipticity
    EXPECT_NEAR(g.whiskerGain, longest / (3.0 * psf.ellipticityAt(rightmost, 50.0)), 1e-6 * g.whiskerGain);
    const ui::OverlayGeometry fixed = ui::buildOverlays(snap, {12, 10.0, 2000});
    EXPECT_EQ(fixed.whiskerGain, 10.0);
}
