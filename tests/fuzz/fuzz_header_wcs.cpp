// libFuzzer target: the header parser (80-character cards, quoting, CONTINUE, HIERARCH), its typed
// getters, the card formatter, and WCSLIB's header parsing behind Wcs::tryFromHeader with a few
// transforms, the summary and the round trip through toHeader(). The input is the raw header text;
// it is padded to whole cards, as fits_hdr2str delivers it.
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/header.hpp"
#include "core/model/instrument.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace gpuphot;
    std::string text(reinterpret_cast<const char*>(data), size);
    text.resize((text.size() + 79) / 80 * 80, ' ');
    const Header h = Header::fromFitsString(text);
    for (const auto& c : h.cards()) {
        (void)h.getDouble(c.key);
        (void)h.getInt(c.key);
        (void)h.getBool(c.key);
        (void)h.getString(c.key);
        (void)Header::formatCard(c);
    }
    (void)Header::fromFitsString(h.toFitsString());
    fuzz::expectTypedErrorsOnly([&] { (void)readInstrument(h, {}, {}); });
    fuzz::expectTypedErrorsOnly([&] {
        std::string why;
        auto wcs = Wcs::tryFromHeader(h, &why);
        if (!wcs) return;
        const std::vector<double> x = {0.0, 10.5, -3.0, 1e6}, y = {0.0, -7.25, 4.0, 1e6};
        std::vector<double> ra(x.size()), dec(x.size()), xb(x.size()), yb(x.size());
        wcs->pixelToWorld(x, y, ra, dec);
        wcs->worldToPixel(ra, dec, xb, yb);
        (void)wcs->pixelScaleArcsec(0.0, 0.0);
        (void)wcs->projectionCode();
        (void)wcs->summary(64, 64);
        const Header back = wcs->toHeader();
        (void)Wcs::tryFromHeader(back);
        Wcs copy = *wcs;
        (void)copy.pixelToWorld(1.0, 1.0);
    });
    return 0;
}
