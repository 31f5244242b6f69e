#pragma once
// FITS_LDAC catalogs, the layout SCAMP and PSFEx read: an empty primary HDU, then for each image an
// LDAC_IMHEAD table (one row, one column "Field Header Card" holding the image header's 80-character
// cards, TDIM1 = (80, ncards)) and an LDAC_OBJECTS table of the objects.
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/header.hpp"

namespace gpuphot {

// One LDAC_OBJECTS column: a scalar (dims empty) or a fixed-size array per row (FLUX_APER(3): dims {3};
// VIGNET(35,35): dims {35, 35}, written as TDIMn). Values lie row after row in the vector of its type:
// 'D' -> d, 'E' -> e, 'J' -> j, 'I' -> i.
struct LdacColumn {
    std::string name, unit, comment;
    char type = 'E';
    std::vector<long> dims;
    std::vector<double> d;
    std::vector<float> e;
    std::vector<std::int32_t> j;
    std::vector<std::int16_t> i;

    long repeat() const;        // product of dims (1 for a scalar)
    std::size_t values() const; // length of the vector of its type
};

// Writes `path` atomically: primary HDU, LDAC_IMHEAD with `imageHeader`'s cards as given (END closing
// them), LDAC_OBJECTS with `columns` (each holding rows * repeat values). Throws InvalidInput for a
// column of the wrong length or type, IoError naming the file.
void writeFitsLdac(const std::string& path, const Header& imageHeader, const std::vector<LdacColumn>& columns,
                   std::size_t rows);

// One image of a multi-image LDAC file (a mosaic exposure: one pair per CCD, as SExtractor writes them).
struct LdacPart {
    Header imageHeader;
    std::vector<LdacColumn> columns;
    std::size_t rows = 0;
};
// Writes `path` atomically: the primary HDU, then an LDAC_IMHEAD / LDAC_OBJECTS pair per part, in order.
void writeFitsLdac(const std::string& path, const std::vector<LdacPart>& parts);

} // namespace gpuphot
