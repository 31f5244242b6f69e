#pragma once
// DS9 region files (SAOImage DS9 "version 4.1" text format): a parser, a writer, the catalog's regions
// (source ids as text, colour by flag, fk5 when the frame has a WCS) and the conversion of a region to
// 0-based image pixels. Qt-free; the workbench loads, draws and saves them (ui/main_window_regions.cpp).
//
// Supported: circle, box, polygon, point, ellipse; the systems image, physical (taken as image: LTM/LTV
// are not applied), fk5 and icrs (the same to DS9's precision here); positions in degrees or
// sexagesimal (RA in hours h:m:s, Dec in d:m:s); sizes as plain numbers (pixels in image/physical,
// degrees in fk5/icrs, as DS9 reads them) or with a unit: " arcsec, ' arcmin, d degrees, i/p pixels.
// Comments, the global line, a region's properties after '#' (text={...}, color=...) and an exclude
// sign '-' are kept. Anything else (another shape, another system, a malformed number) is an
// Ds9RegionError naming the line.
#include <optional>
#include <string>
#include <vector>

#include "core/util/errors.hpp"

namespace gpuphot {

class Wcs;
class Table;

// A line of a region file that cannot be read; line() is 1-based (0: not from a file line).
class Ds9RegionError : public InvalidInput {
public:
    Ds9RegionError(const std::string& message, int line);
    int line() const { return m_line; }

private:
    int m_line = 0;
};

enum class RegionShape { Circle, Box, Polygon, Point, Ellipse };
enum class RegionSystem { Image, Physical, Fk5, Icrs };

struct RegionSize {
    double value = 0.0;
    bool sky = false; // true: degrees on the sky (needs a WCS for pixels); false: image pixels
};

struct Region {
    RegionShape shape = RegionShape::Circle;
    RegionSystem system = RegionSystem::Image;
    // x, y pairs: the centre (circle, box, point, ellipse) or the vertices (polygon). Image/physical:
    // DS9's 1-based pixels; fk5/icrs: RA, Dec in degrees.
    std::vector<double> points;
    std::vector<RegionSize> sizes; // circle: r; box: width, height; ellipse: a, b; none for point/polygon
    double angle = 0.0;            // degrees counter-clockwise from +x (box, ellipse)
    bool exclude = false;          // written with a leading '-'
    std::string text;              // text={...}
    std::string color;             // color=... ("" = the global colour)
    std::string properties;        // the other properties after '#' (text= and color= taken out), kept
    int line = 0;                  // 1-based line in the file it came from (0: made in code)
};

struct RegionFile {
    std::string global;                // the global line's properties (after "global "), "" when none
    std::vector<std::string> comments; // comment lines without '#', in order (the format line included)
    std::vector<Region> regions;
};

// Parses a region file's text. Throws Ds9RegionError (with the 1-based line) for bad input.
RegionFile parseDs9Regions(const std::string& text);
// Reads and parses a file: IoError when unreadable, Ds9RegionError (message names the file) when bad.
RegionFile readDs9Regions(const std::string& path);
// The file's text: the format comment, the other comments, the global line, then each region preceded
// by its system whenever it changes. Positions with full double precision (shortest round-trip text).
std::string formatDs9Regions(const RegionFile& file);
// Writes formatDs9Regions atomically (temporary name, rename). IoError when it cannot.
void writeDs9RegionFile(const std::string& path, const RegionFile& file);

struct CatalogRegionOptions {
    std::string idCol = "id";       // text={id}
    std::string flagsCol = "flags"; // colour by flag bits (missing column: all clean)
    double radiusPixels = 5.0;      // circle radius (written in arcsec when in fk5)
    std::string cleanColor = "green";
    std::string blendedColor = "yellow"; // FlagBlended or FlagCrowded
    std::string saturatedColor = "red";  // FlagSaturated, FlagEdge or FlagApertureIncomplete (wins)
};

// One circle per catalog row with finite x, y (1-based columns "x", "y"): text = the id, colour by flag,
// in fk5 (RA/Dec through wcs, radius in arcsec from the local pixel scale) when wcs is given, else in
// image coordinates. Throws InvalidInput when x or y is missing.
RegionFile catalogRegions(const Table& table, const Wcs* wcs, const CatalogRegionOptions& options = {});

// A region in 0-based image pixels (pixel centres at integers).
struct PixelRegion {
    RegionShape shape = RegionShape::Circle;
    std::vector<double> points; // x, y pairs (0-based)
    std::vector<double> sizes;  // px
    double angle = 0.0;         // degrees counter-clockwise from +x on the image
    bool exclude = false;
};

// Sky positions and sizes through wcs (may be null for image regions). Throws InvalidInput when the
// region needs a WCS and wcs is null, or a position does not transform.
PixelRegion toPixels(const Region& region, const Wcs* wcs);
// Whether the 0-based point (x, y) lies inside (a point region contains nothing).
bool contains(const PixelRegion& region, double x, double y);

} // namespace gpuphot
