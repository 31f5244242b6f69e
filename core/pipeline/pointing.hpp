#pragma once
// Where a frame points when it has no usable WCS: the telescope's pointing keywords, as observatories
// write them (degrees or sexagesimal strings). Used by the blind astrometric solve and to choose the
// region of a default reference catalog.
#include <optional>
#include <string>
#include <utility>

namespace gpuphot {

class Header;

struct Pointing {
    double ra = 0.0, dec = 0.0; // degrees
    std::string keywords;       // e.g. "OBJCTRA/OBJCTDEC"
};

// Tries, in order: RA/DEC (numbers in degrees, or sexagesimal strings: RA in hours), OBJCTRA/OBJCTDEC,
// RA-MNT/DEC-MNT, TELRA/TELDEC, CRVAL-free CAT-RA/CAT-DEC. nullopt when none is usable.
std::optional<Pointing> framePointing(const Header& header);

} // namespace gpuphot
