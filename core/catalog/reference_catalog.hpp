#pragma once
// Reference catalogs (Gaia, Tycho-2, APASS, PanSTARRS exports, the simulator's N.ref.fits, ...) read
// from a FITS table or a CSV file into plain arrays for crossmatch, zero point and astrometry.
#include <cstdint>
#include <string>
#include <vector>

namespace gpuphot {

// Which columns hold what. An empty name means "detect": the first column whose name matches one of
// the candidates below, case-insensitively.
//   ra:     RA, RA_ICRS, RAJ2000, _RAJ2000, ALPHA_J2000, ALPHAWIN_J2000, RA_DEG, RADEG
//   dec:    DEC, DE_ICRS, DEJ2000, _DEJ2000, DECJ2000, DELTA_J2000, DELTAWIN_J2000, DEC_DEG, DECDEG
//   mag:    mag, phot_g_mean_mag, G, Gmag, r, rmag, r_mag, VT, VTmag, V, Vmag, R, Rmag, MAG, MAG_AUTO
//   magErr: e_<mag>, <mag>_err, <mag>_error, err_<mag>, mag_err, magerr, e_mag, err_mag; for Gaia's
//           phot_X_mean_mag: 2.5/ln(10) / phot_X_mean_flux_over_error
//   color:  bp_rp (else none: NaN)
//   pmRa:   pmra, pmRA, pm_ra, pmRAcosDE (mas/yr, including the cos(dec) factor, as Gaia)
//   pmDec:  pmdec, pmDE, pm_dec (mas/yr)
//   id:     source_id, id, objid, object_id (else the 1-based row number)
// color may be one column ("bp_rp") or a difference of two ("phot_bp_mean_mag-phot_rp_mean_mag";
// a column whose own name contains '-' is taken as it is when it exists). "none" switches a column off.
struct RefColumnMap {
    std::string ra, dec, mag, magErr, color, pmRa, pmDec;
    std::string id;        // id column (integer); else ids are 1-based row numbers
    std::string hdu;       // FITS: which HDU ("" = the first table HDU; number = 0-based index; EXTNAME)
    double epoch = 2000.0; // epoch of the positions (Julian year), used with the proper motions
    // Set when epoch was given explicitly (parseRefColumnMap "epoch=..."); otherwise a ref_epoch
    // column with a single value (Gaia: 2015.5) overrides the default.
    bool epochExplicit = false;
};

// Parses "ra=RA,dec=DEC,mag=phot_g_mean_mag,color=phot_bp_mean_mag-phot_rp_mean_mag,epoch=2015.5".
// Keys (case-insensitive): ra, dec, mag, magerr (mag_err), color (colour), pmra, pmdec, id, hdu, epoch.
// Throws InvalidInput on an unknown key, an entry without '=', or a bad epoch.
RefColumnMap parseRefColumnMap(const std::string& text);

struct ReferenceCatalog {
    // One entry per usable source (finite ra, dec, mag), in file order. Every vector has size() entries;
    // absent quantities are NaN (magErr, color, pmRa, pmDec).
    std::vector<double> ra, dec;      // degrees (ICRS/J2000 as the file gives them), at `epoch`
    std::vector<double> mag, magErr;  // magnitudes
    std::vector<double> color;        // e.g. BP-RP
    std::vector<double> pmRa, pmDec;  // mas/yr; pmRa includes cos(dec)
    std::vector<std::int64_t> id;     // id column, or the source's 1-based row number in the file
    std::size_t skippedNonFinite = 0; // rows dropped for a NaN/empty position or magnitude
    std::size_t rowsRead = 0;         // rows in the file's table (usable + skipped)
    double epoch = 2000.0;
    std::string path;
    RefColumnMap columns; // the column names actually used ("" = not available)

    std::size_t size() const { return ra.size(); }
    bool empty() const { return ra.empty(); }
};

// Reads a FITS table (first table HDU, or map.hdu) or a delimited text file (CSV: header row, comma
// separated, '#' comment lines; tab- and blank-separated files and ECSV also work). CSV positions may
// also be sexagesimal: RA "hh:mm:ss.s" (hours), Dec "+dd:mm:ss.s" (degrees); blanks work as separators
// too when the file is comma-separated. Rows with a NaN/empty RA, Dec or magnitude are skipped and
// counted. Throws IoError for a missing/unreadable file and InvalidInput (naming the file) for a file
// that is neither FITS nor text, a FITS file without a table, a missing column (listing the available
// ones), unparseable values, or no usable row.
ReferenceCatalog readReferenceCatalog(const std::string& path, const RefColumnMap& map = {});

// Moves positions from cat.epoch to `epoch` (Julian years) with the proper motions (rows without a
// finite proper motion keep their position); sets cat.epoch. Linear in time, on the tangent plane.
void applyProperMotion(ReferenceCatalog& cat, double epoch);

} // namespace gpuphot
