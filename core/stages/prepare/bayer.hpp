#pragma once
// Colour-filter-array (Bayer) frames from DSLR / one-shot-colour cameras: 2x2 super-pixel binning to
// luminance or to one colour plane, with the WCS, gain, read noise and saturation adjusted.
//
// Which colour a pixel has. BAYERPAT (else FILTER when its value is a pattern: RGGB, BGGR, GRBG, GBRG)
// names the colours of the 2x2 cell row by row, starting at the top-left pixel of the sensor as read out.
// Where that pixel is in the file follows ROWORDER (the keyword of Siril, CCDCiel, NINA, PixInsight):
//  - BOTTOM-UP (and the default when ROWORDER is absent): the file follows the FITS display convention,
//    the sensor's top row is the LAST row of the file (0-based y = height - 1), so pattern row
//    i = (height - 1 - y + YBAYROFF) mod 2;
//  - TOP-DOWN: the sensor's top row is the first row of the file, i = (y + YBAYROFF) mod 2;
//  pattern column j = (x + XBAYROFF) mod 2 in both cases; the colour is BAYERPAT[2 i + j].
// Checked on the PANOPTES Canon frame (FILTER = 'RGGB', no ROWORDER, 700 rows): the two phases that
// this rule calls green have equal medians and are the brightest, red is the faintest (the camera's red
// white-balance multiplier REDBAL = 2.02 is the largest), while the TOP-DOWN reading would pair two
// unequal phases as green (tests/core/bayer_test.cpp).
//
// Super-pixels: cell (X, Y) holds the file pixels x in {2X, 2X+1}, y in {2Y, 2Y+1}, whatever the phase
// of the pattern (every cell has one R, two G and one B); an odd last column or row is dropped. In float:
//  - luminance, sum (default): (p(2X,2Y) + p(2X+1,2Y)) + (p(2X,2Y+1) + p(2X+1,2Y+1)) in ADU. Fluxes in ADU
//    are kept, so gain (e-/ADU) is unchanged; read noise x 2; saturation x 4 (the level where all four
//    are saturated: the mask carries any saturated constituent).
//  - luminance, mean: that sum * 0.25f; gain x 4, read noise x 2, saturation unchanged.
//  - red or blue plane: that pixel; gain, read noise and saturation unchanged.
//  - green plane: 0.5f * (green of the lower file row + green of the upper file row); gain x 2,
//    read noise x sqrt(2), saturation unchanged.
// The mask of a super-pixel is the OR of the masks of the pixels it uses.
//
// WCS: super-pixel X (0-based) is centred on file x = 2X + 0.5, i.e. in 1-based FITS terms
// x = 2 X' - 0.5, so CRPIX' = (CRPIX + 0.5) / 2 (= (CRPIX - 0.5) / 2 + 0.5), CD' = 2 CD (or CDELT' =
// 2 CDELT with PC unchanged), and since pixel offsets from CRPIX halve, u = 2 U, the SIP polynomials
// keep the same intermediate coordinates when A'_p_q = A_p_q 2^(p+q-1) (B, AP, BP likewise; A_DMAX and
// B_DMAX halve). Distortions on intermediate world coordinates (TPV, PVi_m) are unchanged.
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/model/image.hpp"

namespace gpuphot {

class Header;
class RunContext;
struct Frame;
struct TanSip;

enum class CfaColour { Red = 0, Green = 1, Blue = 2 };
enum class CfaOutput { Luminance, Red, Green, Blue };

struct BayerParams {
    std::string output = "lum"; // "lum" (luminance) | "r" | "g" | "b"
    bool luminanceMean = false; // luminance as the mean of R+G+G+B instead of the sum (see above)
    std::string pattern; // "" : from the header (BAYERPAT, else FILTER); else RGGB | BGGR | GRBG | GBRG
    std::string rowOrder = "auto"; // "auto" (ROWORDER keyword, else bottom-up) | "bottom-up" | "top-down"
    int xOffset = -1;              // < 0: XBAYROFF from the header (0 when absent)
    int yOffset = -1;              // < 0: YBAYROFF from the header (0 when absent)
};


struct CfaLayout {
    std::string pattern = "RGGB"; // colours of the sensor's top-left 2x2 cell, row by row
    bool topDown = false;         // the sensor's top row is the file's first row
    int xOffset = 0;              // XBAYROFF
    int yOffset = 0;              // YBAYROFF

    // Colour of file pixel (x, y), 0-based, in an image of `height` rows.
    CfaColour colourAt(int x, int y, int height) const;
};

// "RGGB" etc. (case and blanks ignored); nullopt when the text is not one of the four patterns.
std::optional<std::string> normaliseCfaPattern(std::string_view text);
CfaOutput parseCfaOutput(const std::string& text); // lum | luminance | r | g | b; throws InvalidInput

// The layout from the header and the params' overrides; nullopt when neither names a pattern (or the
// header has CFAOUT, i.e. the frame was binned already, and params.pattern is empty). Throws
// InvalidInput for an unknown params.pattern / rowOrder / output, or a ROWORDER value that is neither.
std::optional<CfaLayout> cfaLayoutFromHeader(const Header& header, const BayerParams& params = {});

// The 2x2 super-pixel image (see above); pixels is the whole frame. Throws InvalidInput for an image
// smaller than 2 x 2.
Image<float> cfaSuperPixels(const ImageView& pixels, const CfaLayout& layout, CfaOutput output,
                            bool luminanceMean, RunContext& ctx);
// OR of the masks of the pixels each super-pixel uses (empty mask: an all-zero result).
Image<std::uint8_t> cfaSuperPixelMask(const MaskView& mask, const CfaLayout& layout, CfaOutput output,
                                      int width, int height);

// The WCS keywords of a header rescaled for 2x2 binning (primary and alternate descriptions: CRPIXia,
// CDi_ja or CDELTia, SIP A/B/AP/BP and A_DMAX/B_DMAX); other cards untouched.
void binWcsHeader2x2(Header& header);
TanSip binTanSip2x2(const TanSip& wcs);

// The whole frame: pixels, mask, header (WCS rescaled; GAIN/RDNOISE/SATURATE rewritten when the header
// gave them; BAYERPAT/XBAYROFF/YBAYROFF removed; CFAOUT and a HISTORY card added), wcs and instrument
// adjusted. Throws InvalidInput, naming the file, when the frame has no CFA pattern (header or params).
Frame binCfaFrame(const Frame& frame, const BayerParams& params, RunContext& ctx);

} // namespace gpuphot
