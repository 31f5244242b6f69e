#pragma once
// Writes a reduction's files for a frame STEM.fits into OUTDIR (DESIGN.md §Conventions):
// STEM.cat.fits, STEM.report.json, optional maps STEM.{bkg,rms,seg,psf,resid}.fits and formats
// STEM.cat.ecsv, STEM.cat.csv, STEM.reg. Every file is written under a temporary name and renamed;
// the report is written last, so its presence marks a complete reduction.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuphot {

struct Frame;
struct PipelineResult;
class Table;

struct OutputOptions {
    std::string outdir = ".";
    std::vector<std::string> formats; // any of: ecsv, csv, reg
    std::vector<std::string> maps;    // any of: bkg, rms, seg, psf, resid
};

// Throws InvalidInput for an unknown format or map name.
void validateOutputOptions(const OutputOptions& options);
// "dir/frame.fits.fz" -> "frame" (strips .fits/.fit/.fts/.fz/.gz and a CFITSIO [..] suffix).
std::string frameStem(const std::string& path);
// The catalog and report paths for a frame.
std::string catalogPath(const std::string& framePath, const OutputOptions& options);
std::string reportPath(const std::string& framePath, const OutputOptions& options);

// Writes every output; `report` gains an "outputs" section and is written last. Returns the paths.
std::vector<std::string> writeReductionOutputs(const Frame& frame, const PipelineResult& result, const Table& catalog,
                                               const OutputOptions& options, nlohmann::json& report);

// Image of the PSF model's ePSF cells side by side (gridNx x gridNy cells), for STEM.psf.fits.
// Residual image: frame - background - sum of flux_psf * PSF model, for STEM.resid.fits.
struct PsfResult;
struct BackgroundResult;
struct Sources;
template <class T> class Image;
Image<float> psfMosaic(const PsfResult& psf);
Image<float> residualImage(const Frame& frame, const BackgroundResult& bkg, const Sources& sources, const PsfResult& psf);

} // namespace gpuphot
