#pragma once
// Writes a reduction's files for a frame STEM.fits into OUTDIR (docs/ARCHITECTURE.md §Conventions):
// STEM.cat.fits, STEM.report.json, optional maps STEM.{bkg,rms,seg,psf,resid}.fits and formats
// STEM.cat.ecsv, STEM.cat.csv, STEM.reg; with --targets STEM.targets.fits (+ .ecsv/.csv as the formats
// ask) and with --write-solved STEM.solved.fits. Every file is written under a temporary name and renamed;
// the report is written last, so its presence marks a complete reduction.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/pipeline/sextractor_catalog.hpp"

namespace gpuphot {

struct Frame;
struct PipelineResult;
class Table;
class Header;

struct OutputOptions {
    std::string outdir = ".";
    std::vector<std::string> formats; // any of: ecsv, csv, reg, ldac (STEM.ldac, FITS_LDAC of ldacParams)
    std::vector<std::string> maps;    // any of: bkg, rms, seg, psf, resid
    // STEM.solved.fits: a copy of the frame file with the fitted WCS in the image HDU's header, written
    // only when the astrometric fit was verified (PipelineResult::fittedWcs set).
    bool writeSolved = false;
    // The SExtractor catalog of --sex (CATALOG_NAME in outdir, or STEM.CATALOG_NAME with prefixStem).
    bool sextractorCatalog = false;
    SextractorCatalogOptions sextractor;
    // The parameters of STEM.ldac (format "ldac"); empty: defaultLdacParams.
    std::vector<SextractorParam> ldacParams;
};

// What STEM.ldac holds without --param: the columns SCAMP reads, and PSFEx's but VIGNET.
std::vector<SextractorParam> defaultLdacParams(int apertures);
// STEM.ldac's catalog options: the SExtractor ones typed FITS_LDAC, with ldacParams or the defaults.
SextractorCatalogOptions ldacOptions(const OutputOptions& options, int apertures);

// Throws InvalidInput for an unknown format or map name, or a SExtractor catalog that cannot be written.
// Makes a missing output directory (IoError when it cannot, or when the path is not a directory).
void validateOutputOptions(const OutputOptions& options);
// "dir/frame.fits.fz" -> "frame" (strips .fits/.fit/.fts/.fz/.gz and a CFITSIO [..] suffix).
std::string frameStem(const std::string& path);
// The catalog and report paths for a frame.
std::string catalogPath(const std::string& framePath, const OutputOptions& options);
std::string reportPath(const std::string& framePath, const OutputOptions& options);

// Writes every output; `report` gains an "outputs" section and is written last. Returns the paths.
// targets: the forced-photometry table (buildTargetTable), written as STEM.targets.fits (+ ecsv, csv).
std::vector<std::string> writeReductionOutputs(const Frame& frame, const PipelineResult& result, const Table& catalog,
                                               const OutputOptions& options, nlohmann::json& report,
                                               const Table* targets = nullptr);

// Copies the FITS file `framePath` (every HDU; data bytes untouched; a CFITSIO [..] suffix is dropped,
// compressed HDUs stay compressed) to `outPath` atomically, replacing the WCS keywords of HDU `hdu`
// (0-based) with `wcsCards`: every primary-description WCS keyword is removed first (CTYPEi, CRPIXi,
// CRVALi, CDELTi, CUNITi, CROTAi, CDi_j, PCi_j, PVi_m, PSi_m, SIP A_/B_/AP_/BP_ terms and orders,
// LONPOLE, LATPOLE, RADESYS, EQUINOX, WCSAXES, distortion-table keywords). Alternate descriptions
// (keywords ending in A..Z) are kept. CHECKSUM is recomputed when present. `history` becomes a HISTORY
// card. Throws IoError naming the file.
void writeSolvedFrame(const std::string& framePath, int hdu, const Header& wcsCards, const std::string& outPath,
                      const std::string& history = {});
// True for a keyword writeSolvedFrame removes (primary WCS description, SIP and TPV terms).
bool isPrimaryWcsKeyword(const std::string& key);

// The targets table (STEM.targets.fits): name, ra, dec (as given), x, y (1-based), flux_aper_k,
// fluxerr_aper_k, mag_aper_k, magerr_aper_k (raw, as the catalog's), mag_cal, magerr_cal (aperture of
// highest S/N, corrected to total with the catalog's aperture correction, plus ZP; NaN without a
// zero point), aper_cal (1-based aperture used), sky, flags, det_id (matched catalog id, -1), det_sep.
struct TargetList;
struct ForcedPhotometryResult;
Table buildTargetTable(const Frame& frame, const PipelineResult& result, const TargetList& targets,
                       const ForcedPhotometryResult& forced);

// Image of the PSF model's ePSF cells side by side (gridNx x gridNy cells), for STEM.psf.fits.
// Residual image: frame - background - sum of flux_psf * PSF model, for STEM.resid.fits.
struct PsfResult;
struct BackgroundResult;
struct Sources;
template <class T> class Image;
Image<float> psfMosaic(const PsfResult& psf);
Image<float> residualImage(const Frame& frame, const BackgroundResult& bkg, const Sources& sources, const PsfResult& psf);

} // namespace gpuphot
