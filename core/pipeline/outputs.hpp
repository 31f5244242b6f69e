#pragma once
// Writes a reduction's files for a frame STEM.fits into OUTDIR (docs/ARCHITECTURE.md §Conventions):
// STEM.cat.fits, STEM.report.json, optional maps STEM.{bkg,rms,seg,psf,resid}.fits and formats
// STEM.cat.ecsv, STEM.cat.csv, STEM.reg; with --targets STEM.targets.fits (+ .ecsv/.csv as the formats
// ask) and with --write-solved STEM.solved.fits. Every file is written under a temporary name and renamed;
// the report is written last, so its presence marks a complete reduction.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/header.hpp"

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
// The stem of a frame's outputs: frameStem, and ".TOKEN" when one extension of the file is chosen, by a
// CFITSIO [..] suffix or by `hduSpec` (--hdu), TOKEN its EXTNAME or hduN (outputToken, exposure.hpp), so
// that runs on different extensions of one file never collide. An exposure selection ("all", a list or
// a range) gives the plain stem: the exposure's outputs.
std::string outputStem(const std::string& framePath, const std::string& hduSpec = {});
// The catalog and report paths for a frame (outputStem).
std::string catalogPath(const std::string& framePath, const OutputOptions& options,
                        const std::string& hduSpec = {});
std::string reportPath(const std::string& framePath, const OutputOptions& options,
                       const std::string& hduSpec = {});

// Writes every output; `report` gains an "outputs" section and is written last. Returns the paths.
// targets: the forced-photometry table (buildTargetTable), written as STEM.targets.fits (+ ecsv, csv).
// stem: the outputs' stem ("" : frameStem of the frame's path).
std::vector<std::string> writeReductionOutputs(const Frame& frame, const PipelineResult& result,
                                               const Table& catalog, const OutputOptions& options,
                                               nlohmann::json& report, const Table* targets = nullptr,
                                               const std::string& stem = {});
// Whether the outputs read the frame's pixels (maps, SExtractor and LDAC catalogs), not only its size,
// header and WCS: otherwise they go once the stages have run (Frame::dropPixels).
bool outputsReadPixels(const OutputOptions& options);
// The products of the image itself: the maps asked for, STEM.wcs (a verified fit) and STEM.solved.fits
// (--write-solved). Each path goes to outputs[keyPrefix + kind] and to `written`.
void writeImageProducts(const Frame& frame, const PipelineResult& result, const OutputOptions& options,
                        const std::string& stem, const std::string& keyPrefix, nlohmann::json& outputs,
                        std::vector<std::string>& written);
// The catalog's extra formats (ecsv, csv, reg; not ldac) as STEM.cat.ecsv, STEM.cat.csv, STEM.reg.
void writeCatalogFormats(const Table& catalog, const OutputOptions& options, const std::string& stem,
                         nlohmann::json& outputs, std::vector<std::string>& written);
// The targets table as STEM.targets.fits (+ .ecsv, .csv as the formats ask).
void writeTargetTables(const Table& targets, const OutputOptions& options, const std::string& stem,
                       nlohmann::json& outputs, std::vector<std::string>& written);

// Copies the FITS file `framePath` (every HDU; data bytes untouched; a CFITSIO [..] suffix is dropped,
// compressed HDUs stay compressed) to `outPath` atomically, replacing the WCS keywords of HDU `hdu`
// (0-based) with `wcsCards`: every primary-description WCS keyword is removed first (CTYPEi, CRPIXi,
// CRVALi, CDELTi, CUNITi, CROTAi, CDi_j, PCi_j, PVi_m, PSi_m, SIP A_/B_/AP_/BP_ terms and orders,
// LONPOLE, LATPOLE, RADESYS, EQUINOX, WCSAXES, distortion-table keywords). Alternate descriptions
// (keywords ending in A..Z) are kept. CHECKSUM is recomputed when present. `history` becomes a HISTORY
// card. Throws IoError naming the file.
void writeSolvedFrame(const std::string& framePath, int hdu, const Header& wcsCards, const std::string& outPath,
                      const std::string& history = {});
// The same for several HDUs of one file (a mosaic exposure's CCDs), each with its own WCS and HISTORY.
struct SolvedHdu {
    int hdu = 0;
    Header wcs;
    std::string history;
};
void writeSolvedFrame(const std::string& framePath, const std::vector<SolvedHdu>& hdus,
                      const std::string& outPath);
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
