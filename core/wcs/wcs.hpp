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

class Wcs {
public:
    // Throws InvalidInput naming the problem (no celestial axes, singular CD matrix, ...).
    static Wcs fromHeader(const Header& header);
    // nullopt when the header has no celestial WCS; `why` receives the reason.
    static std::optional<Wcs> tryFromHeader(const Header& header, std::string* why = nullptr);
    static Wcs fromTanSip(const TanSip& solution);

    Wcs(const Wcs& other);            // deep copy (wcsprm is not shared between copies)
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

    double pixelScaleArcsec(double x, double y) const; // geometric mean local scale, arcsec/px
    std::string projectionCode() const;                // "TAN", "TAN-SIP", "TPV", "ZPN", ...
    std::string summary(int width, int height) const;  // one paragraph for `gpuphot info`
    Header toHeader() const;                           // the standard keywords that describe it

private:
    struct Impl;
    explicit Wcs(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

} // namespace gpuphot
