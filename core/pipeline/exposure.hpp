#pragma once
// Mosaic exposures: one file, one image extension per CCD (DECam, HSC, ZTF quadrants). Every extension
// is reduced as a frame of its own (its header's instrument facts and WCS), several at once with a
// RunContext each (on the CUDA backend: a stream and memory pool each, the GPU shared), and the exposure
// is then calibrated as a whole: one zero point, each CCD's offset from it, outliers flagged.
//
// Outputs in OUTDIR (docs/CLI.md §Mosaics): STEM.cat.fits, every CCD's sources with `ccd` (HDU number)
// and `extname` columns, its measurement columns the bytes a reduction of that extension alone gives;
// the formats asked for (ecsv, csv, reg; ldac as one LDAC_IMHEAD/LDAC_OBJECTS pair per CCD in one file);
// STEM.targets.fits with --targets; each CCD's maps and fitted WCS as STEM.TOKEN.bkg.fits,
// STEM.TOKEN.wcs, ...; STEM.report.json last, listing every extension.
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuphot {

class RunContext;
struct ReduceOptions;
struct ReduceSummary;

struct ExposureExtension {
    int hdu = 0;         // 0-based HDU number (as --hdu takes it)
    std::string extname; // "" when the HDU has none
    std::string token;   // in output names, STEM.TOKEN.*: outputToken
    long long width = 0, height = 0;
    bool compressed = false; // tile-compressed
};

// The name part an extension's outputs carry: its EXTNAME with characters other than letters, digits,
// '-' and '_' replaced by '_'; EXTNAME_hduN when another image HDU of the file has the same name; hduN
// without one.
std::string outputToken(int hdu, const std::string& extname, bool nameRepeats);

// Every HDU of the file that is an image with 2-D data (tile-compressed ones included; tables, empty
// and 1-D or 3-D HDUs left out), with its token. Throws IoError / InvalidInput naming the file.
std::vector<ExposureExtension> imageExtensions(const std::string& path);

// Whether an --hdu selection asks for several extensions: "all", a list "1,3,5", a range "1-60", or a mix.
// "SCI,2" (EXTNAME,EXTVER) and single numbers or names are one extension.
bool isExposureSelection(const std::string& hduSpec);

// The extensions an exposure reduction takes from `path`: with an exposure selection, those it names (a
// number or name that matches no image extension is InvalidInput); with "" every image extension when the
// file has more than one, leaving out the auxiliary planes some science files carry beside their image
// (EXTNAME ERR, DQ, WHT, WEIGHT, MASK, BPM, VAR, VARIANCE, RMS, SIG, EXP, CON, CTX): then empty when one
// image is left (a single frame, reduced as before); otherwise (one extension named) empty.
// A path with a CFITSIO [..] suffix names one HDU: empty.
std::vector<ExposureExtension> exposureExtensions(const std::string& path, const std::string& hduSpec);

// The exposure's photometric calibration from its CCDs' own zero points.
struct ExposureParams {
    // CCDs in their stages at once, each with a RunContext of its own (0: 16 on the CUDA backend, 1 on the
    // CPU, whose stages already use every core). A context left to take every core (threads 0) gets its
    // share, ceil(threads / K), while the exposure runs.
    int concurrent = 0;
    // GPUs the CCDs' contexts are spread over, round robin (CUDA backend; 0: every visible GPU, 1: the
    // first only): context k runs on GPU k mod G, so K CCDs at once put about K / G on each GPU.
    int gpus = 0;
    // A CCD whose offset from the exposure's zero point exceeds both this many robust sigmas of the
    // CCDs' offsets and outlierMinMag is flagged as an outlier (its offset stands; the median is robust).
    double outlierSigma = 5.0;
    double outlierMinMag = 0.05; // mag
};

// The GPU of a mosaic's k-th CCD context (k = 0: the caller's own) spread over `gpus` of the `visible`
// GPUs (gpus 0, or more than are visible: all of them); -1 when none is visible.
int ccdContextDevice(std::size_t k, int gpus, int visible);

struct CcdZeroPoint {
    bool ok = false; // the CCD's own zero point fit succeeded
    double zp = 0.0, zpErr = 0.0;
    int calibrators = 0;
};

struct ExposureCalibration {
    bool ok = false; // at least one CCD had a zero point
    // The median of the zero points of every CCD that has one (mag): a bad CCD cannot move it.
    double zp = 0.0;
    // Its error: 1.2533 scatter / sqrt(n) (+) the median CCD's zpErr / sqrt(n), n the CCDs not outliers.
    double zpErr = 0.0;
    double scatter = 0.0;          // robust sigma (1.4826 MAD) of the CCDs' offsets, outliers left out (mag)
    int ccdsUsed = 0;              // CCDs in the median
    std::vector<double> offset;    // per CCD: zp_ccd - zp (NaN without a zero point of its own)
    std::vector<double> offsetErr; // per CCD: its zpErr
    std::vector<bool> outlier;     // per CCD
};
ExposureCalibration calibrateExposure(const std::vector<CcdZeroPoint>& ccds, const ExposureParams& params);

// One CCD's entry of the exposure report ("exposure" > "extensions"): written by reduceExposure (with
// the CCD's own single-frame report beside it, "report"), read back by the workbench's Mosaic dock. JSON
// null stands for NaN; a failed CCD has status "failed", its error, and no numbers.
struct ExposureCcdSummary {
    int hdu = -1;
    std::string extname, token;
    long long width = 0, height = 0;
    std::string status = "failed"; // "ok" or "failed"
    std::string error;
    long long sources = 0;
    double seconds = 0.0;
    double fwhm = std::numeric_limits<double>::quiet_NaN(); // px
    double rms = fwhm;                                      // astrometric RMS, arcsec
    double zp = fwhm, zpErr = fwhm;                         // the CCD's own zero point
    int calibrators = 0;
    int gpu = -1;                               // the GPU its stages ran on (-1: the CPU backend)
    double zpOffset = fwhm, zpOffsetErr = fwhm; // from the exposure's zero point
    bool outlier = false;
    std::string zpUsed;     // "own", "exposure" or "none"
    std::string astrometry; // "own", "exposure" or "none"
    std::vector<std::string> warnings;
    bool failed() const { return status != "ok"; }
};
void to_json(nlohmann::json& j, const ExposureCcdSummary& c);
void from_json(const nlohmann::json& j, ExposureCcdSummary& c);

// Reduces the extensions `extensions` of the exposure `path` with `options` (their read.hdu is replaced
// per extension) and writes the exposure's outputs (nothing with options.write false). `contexts`: one
// per CCD in flight (at least one). A CCD that fails is reported in the exposure report and the status's
// warnings and the others go on; when every CCD fails the first failure is thrown. Throws InvalidInput /
// IoError naming the file; Cancelled when a context's cancel flag is raised.
ReduceSummary reduceExposure(const std::string& path, const std::vector<ExposureExtension>& extensions,
                             const ReduceOptions& options, const std::vector<RunContext*>& contexts);

} // namespace gpuphot
