#pragma once
// SExtractor catalogs: the output parameters a .param file asks for (PARAMETERS_NAME, --param), computed
// from gpuphot's catalog and frame and written as CATALOG_TYPE asks: FITS_LDAC (for SCAMP and PSFEx),
// ASCII_HEAD or ASCII. docs/SEXTRACTOR.md lists the parameters and where their values differ from
// SExtractor's.
#include <string>
#include <vector>

#include "core/io/fits_ldac.hpp"

namespace gpuphot {

struct Frame;
struct PipelineResult;
class Table;
struct LdacColumn;

// One line of a .param file: NAME, NAME(n) (FLUX_APER(3): the first n apertures) or NAME(w,h) (VIGNET).
struct SextractorParam {
    std::string name;
    std::vector<long> dims;   // empty: no parentheses
    std::string text() const; // as written: "FLUX_APER(3)"
};

// One parameter per line, '#' comments, blank lines skipped. Throws InvalidInput naming `origin` and the
// line for text that is not NAME[(n[,m])].
std::vector<SextractorParam> parseSextractorParams(const std::string& text, const std::string& origin);
// Throws InvalidInput (unreadable file: naming it) or as parseSextractorParams.
std::vector<SextractorParam> readSextractorParams(const std::string& path);

struct SextractorCatalogOptions {
    std::vector<SextractorParam> params; // empty: no SExtractor catalog is written
    std::string name = "test.cat";       // CATALOG_NAME, a file name inside the output directory
    std::string type = "ASCII_HEAD";     // CATALOG_TYPE: FITS_LDAC, ASCII_HEAD or ASCII
    double magZeropoint = 0.0;           // MAG_ZEROPOINT: MAG_* = magZeropoint - 2.5 log10(FLUX_*)
    std::vector<double> fluxFrac{0.5};   // PHOT_FLUXFRAC, for FLUX_RADIUS
    bool prefixStem = false;             // several frames in one run: STEM.<name> for each
    // FLAG_IMAGE (read when IMAFLAGS_ISO or NIMAFLAGS_ISO is asked for) and FLAG_TYPE per image: OR, AND,
    // MIN, MAX or MOST over the non-zero flag pixels of each object's isophotal footprint.
    std::vector<std::string> flagImages;
    std::vector<std::string> flagTypes;
    // MASK_TYPE for the windowed measurement: other objects' pixels are unusable (BLANK, CORRECT) or not
    // (NONE); unusable pixels take their mirror's value (CORRECT), else 0.
    std::string maskType = "CORRECT";
};

// The parameters this writer gives, in the order docs/SEXTRACTOR.md lists them.
const std::vector<std::string>& supportedSextractorParams();

// Throws InvalidInput listing every parameter it cannot give (CLASS_STAR among them: gpuphot has no
// star/galaxy classifier), every malformed size, and an unknown catalog type.
void checkSextractorCatalog(const SextractorCatalogOptions& options);

// The columns, one per parameter, for the objects of `catalog` (buildCatalog's table of this frame and
// result). `apertures`: the number of aperture radii in the catalog (FLUX_APER(n) needs n of them).
std::vector<LdacColumn> sextractorColumns(const Frame& frame, const PipelineResult& result,
                                          const Table& catalog, const SextractorCatalogOptions& options);

// The catalog of one image as an LDAC part: the image's header as SExtractor writes it (the fitted WCS in
// place of the header's) and the columns.
LdacPart sextractorPart(const Frame& frame, const PipelineResult& result, const Table& catalog,
                        const SextractorCatalogOptions& options);
// Writes several images' catalogs to `path` (atomically) as options.type: FITS_LDAC one pair per part,
// ASCII one table of every part's rows (their columns must agree).
void writeSextractorCatalog(const std::string& path, const std::vector<LdacPart>& parts,
                            const SextractorCatalogOptions& options);

// Writes the catalog to `path` (atomically) as options.type.
void writeSextractorCatalog(const std::string& path, const Frame& frame, const PipelineResult& result,
                            const Table& catalog, const SextractorCatalogOptions& options);

} // namespace gpuphot
