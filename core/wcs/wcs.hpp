#pragma once
// World coordinate systems through WCSLIB: any celestial projection WCSLIB reads from a header (TAN,
// TPV, SIP distortions, ZPN, ...). Pixel coordinates here are 0-based (pixel centres at integers), as
// everywhere inside the code; world coordinates are degrees (RA, Dec).
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace gpuphot {

class Header;
struct TanSip;

// Parsing: wcspih on Header::toFitsString(); the primary description (alt ' ') when it has celestial axes,
// else the first alternate that does; axes beyond the celestial pair are dropped (wcssub). SIP
// (CTYPE ...-SIP with A_p_q/B_p_q, AP/BP used only as WCSLIB's starting guess) and TPV go through
// WCSLIB's distortion support (dis.h). A moved-from Wcs may only be assigned to or destroyed.
class Wcs {
public:
    // Throws InvalidInput naming the problem (no celestial axes, singular CD matrix, ...).
    static Wcs fromHeader(const Header& header);
    // nullopt when the header has no celestial WCS; `why` receives the reason. A celestial WCS that is
    // present but broken (singular CD, unknown projection, non-numeric CRVAL, ...) throws InvalidInput.
    static std::optional<Wcs> tryFromHeader(const Header& header, std::string* why = nullptr);
    static Wcs fromTanSip(const TanSip& solution);

    Wcs(const Wcs& other); // deep copy (wcsprm is not shared between copies)
    Wcs& operator=(const Wcs& other);
    Wcs(Wcs&&) noexcept;
    Wcs& operator=(Wcs&&) noexcept;
    ~Wcs();

    // Batched transforms. Safe to call concurrently on one object (serialised inside); for parallel
    // loops give each thread its own copy. Points that fail to transform come back as NaN.
    void pixelToWorld(std::span<const double> x, std::span<const double> y, std::span<double> ra,
                      std::span<double> dec) const;
    void worldToPixel(std::span<const double> ra, std::span<const double> dec, std::span<double> x,
                      std::span<double> y) const;
    std::pair<double, double> pixelToWorld(double x, double y) const;
    std::pair<double, double> worldToPixel(double ra, double dec) const;

    // Geometric mean local scale, arcsec/px (central differences of +-0.5 px on the local tangent plane,
    // so distortions count); NaN where the point does not transform.
    double pixelScaleArcsec(double x, double y) const;
    std::string projectionCode() const; // "TAN", "TAN-SIP", "TPV", "ZPN", ...
    // One paragraph for `gpuphot info`: projection, centre (1-based pixel, sexagesimal and degrees), scale,
    // rotation (position angle of +y, east of north) and parity, field size, the four corner pixels.
    std::string summary(int width, int height) const;
    // The standard keywords that describe it (wcshdo, full precision): CTYPE/CRPIX/CRVAL/CUNIT, CDi_j when
    // the source used CD (as SIP and TPV headers do; else PCi_j + CDELTi), PVi_m, A_/B_/AP_/BP_ for SIP,
    // LONPOLE/LATPOLE, RADESYS/EQUINOX. Fed back to fromHeader it gives the same transforms.
    Header toHeader() const;

private:
    struct Impl;
    explicit Wcs(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

} // namespace gpuphot
