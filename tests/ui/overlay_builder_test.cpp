// What the viewer draws from a result (ui/overlay_builder.hpp): a dense reference catalog is thinned to
// its brightest stars so that the image stays visible.
#include <gtest/gtest.h>

#include <algorithm>
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
