#pragma once
// Tycho-2 from astrometry.net index files (Debian's astrometry-data-tycho2-*: index-tycho2-07..19, one
// all-sky file per quad scale) as a ReferenceCatalog for a region of the sky.
//
// What is read from each index file (FITS, written by astrometry.net):
//   - the star k-d tree: table HDU "kdtree_data_stars", one row of 3 x u32 per star (raw bytes in a
//     '12A' column, byte order given by the ENDIAN keyword), the unit vector of the star being
//     minval[d] + u32 / scale with minval and scale from "kdtree_range_stars" (2·3 + 1 doubles);
//   - the tag-along table (AN_FILE = 'TAGALONG'), rows in the same order as the k-d tree's data:
//     MAG_VT (Tycho VT magnitude, float) in Debian's files.
// Positions are Tycho-2's (ICRS, epoch J2000; no proper motions in the index files).
#include <string>
#include <vector>

#include "core/catalog/reference_catalog.hpp"

namespace gpuphot {

// Index files found on this machine, sorted by name: every index-*.fits in $GPUPHOT_TYCHO2_DIR (when
// set), then index-tycho2-*.fits in Debian's install directory /usr/share/astrometry and in
// /usr/local/share/astrometry. When a file exists in both byte orders (.littleendian / .bigendian), only
// the host's order is listed. Empty when none are installed.
std::vector<std::string> findTycho2IndexFiles();

// The stars within radiusDeg of (raDeg, decDeg) from the given index files (typically all of
// findTycho2IndexFiles()). Each file is scanned in blocks (only the k-d tree's data and the tag-along
// magnitude are read; nothing else is kept in memory); a star present in several files (positions
// within 0.05 arcsec) is returned once, from the first file listed. Order: descending Dec, ties by RA
// (deterministic, independent of the file order apart from which duplicate is kept).
// Result: ra, dec (deg, J2000), mag = MAG_VT (columns.mag names the column; magErr, color, pmRa, pmDec
// NaN), id = INDEXID * 10^8 + 1-based row in that file, epoch 2000, path = the files joined by ';',
// rowsRead = stars inside the cone before deduplication, skippedNonFinite = those without a finite
// magnitude. Throws InvalidInput for a bad region (radius not in (0, 180], non-finite centre, |dec| > 90)
// or a file that is not an astrometry.net star index (naming the file and what is missing), IoError for
// an unreadable file.
ReferenceCatalog loadTycho2Region(double raDeg, double decDeg, double radiusDeg,
                                  const std::vector<std::string>& files);

} // namespace gpuphot
