#include "ui/param_schema.hpp"

#include <cstdint>
#include <limits>

#include "core/model/flags.hpp"

namespace gpuphot::ui {
namespace {

ParamSpec dbl(std::string key, std::string group, std::string label, std::string unit, std::string tip, double lo,
              double hi, double step, int decimals) {
    ParamSpec s;
    s.key = std::move(key);
    s.group = std::move(group);
    s.label = std::move(label);
    s.unit = std::move(unit);
    s.tooltip = std::move(tip);
    s.kind = ParamKind::Double;
    s.min = lo;
    s.max = hi;
    s.step = step;
    s.decimals = decimals;
    return s;
}
ParamSpec integer(std::string key, std::string group, std::string label, std::string unit, std::string tip, int lo,
                  int hi) {
    ParamSpec s = dbl(std::move(key), std::move(group), std::move(label), std::move(unit), std::move(tip), lo, hi, 1, 0);
    s.kind = ParamKind::Int;
    return s;
}
ParamSpec boolean(std::string key, std::string group, std::string label, std::string tip) {
    ParamSpec s = dbl(std::move(key), std::move(group), std::move(label), "", std::move(tip), 0, 1, 1, 0);
    s.kind = ParamKind::Bool;
    return s;
}
ParamSpec choice(std::string key, std::string group, std::string label, std::string tip,
                 std::vector<std::pair<std::string, nlohmann::json>> choices) {
    ParamSpec s = dbl(std::move(key), std::move(group), std::move(label), "", std::move(tip), 0, 0, 1, 0);
    s.kind = ParamKind::Choice;
    s.choices = std::move(choices);
    return s;
}
ParamSpec kind(ParamSpec s, ParamKind k) {
    s.kind = k;
    return s;
}
ParamSpec optional(std::string key, std::string group, std::string label, std::string unit, std::string tip,
                   double lo, double hi, double step, int decimals, std::string noneText = "header",
                   nlohmann::json noneValue = nullptr) {
    ParamSpec s = dbl(std::move(key), std::move(group), std::move(label), std::move(unit), std::move(tip), lo, hi,
                      step, decimals);
    s.kind = ParamKind::OptionalDouble;
    s.noneText = std::move(noneText);
    s.noneValue = std::move(noneValue);
    return s;
}
ParamSpec text(std::string key, std::string group, std::string label, std::string tip) {
    ParamSpec s = dbl(std::move(key), std::move(group), std::move(label), "", std::move(tip), 0, 0, 1, 0);
    s.kind = ParamKind::OptionalString;
    return s;
}
ParamSpec flags(std::string key, std::string group, std::string label, std::string tip) {
    ParamSpec s = integer(std::move(key), std::move(group), std::move(label), "", std::move(tip), 0, (1 << 16) - 1);
    s.kind = ParamKind::Flags;
    return s;
}
ParamSpec hidden(std::string key, std::string group, std::string why) {
    ParamSpec s = dbl(std::move(key), std::move(group), "", "", std::move(why), 0, 0, 1, 0);
    s.kind = ParamKind::Hidden;
    return s;
}

const std::string kFlagList = " Bits (docs/FLAGS.md): 1 crowded, 2 blended, 4 saturated, 8 edge, 16 aperture incomplete, "
                              "32 bad pixels, 64 aperture masked, 128 PSF fit failed, 256 sky failed, 512 Kron failed, "
                              "1024 deblend overflow.";

std::vector<ParamSpec> buildSchema() {
    const double inf = 1e9;
    std::vector<ParamSpec> v;
    // --- Preparation (before stage 1; core/stages/prepare/prepare.hpp, docs/CONFIG.md "prepare") ---
    const std::string pr = "prepare";
    v.push_back(boolean("prepare.overscan", pr, "Overscan", "Subtract the median of the overscan (BIASSEC) when the header has one"));
    v.push_back(choice("prepare.overscanMethod", pr, "Overscan method", "One level for the frame, or the median of each overscan row",
                       {{"median", "median"}, {"per row", "row"}}));
    v.push_back(boolean("prepare.trim", pr, "Trim", "Cut the frame to TRIMSEC (else DATASEC); CRPIX1/2 shift with it"));
    v.push_back(boolean("prepare.bleedTrails", pr, "Bleed trails",
                        "Mask runs of pixels above the bleed fraction of SATURATE along a column touching a saturated pixel"));
    v.push_back(dbl("prepare.bleedFraction", pr, "Bleed fraction", "", "Fraction of SATURATE that continues a bleed trail", 0.01, 1, 0.05, 2));
    v.push_back(integer("prepare.bleedGrow", pr, "Bleed growth", "px", "Saturated pixels and trails grown along the column", 0, 100));
    v.push_back(dbl("prepare.minFlat", pr, "Min. flat", "",
                    "Master-flat values at or below this (or NaN) are masked as bad, not divided", 0, 1, 0.01, 3));
    v.push_back(boolean("prepare.saltPepper", pr, "Salt-and-pepper filter",
                        "Mask pixels far above/below the local median as bad (--salt-pepper)"));
    v.push_back(boolean("prepare.cosmics", pr, "Cosmic rays", "L.A.Cosmic; found pixels get the cosmic-ray mask bit (--cosmics)"));
    v.push_back(dbl("prepare.cosmic.sigclip", pr, "CR σ clip", "σ", "Laplacian-to-noise limit for cosmic-ray pixels [astroscrappy sigclip]",
                    0.5, 100, 0.1, 2));
    v.push_back(dbl("prepare.cosmic.sigfrac", pr, "CR σ fraction", "",
                    "Fraction of the σ clip for neighbouring pixels [astroscrappy sigfrac]", 0.01, 1, 0.05, 2));
    v.push_back(dbl("prepare.cosmic.objlim", pr, "CR object limit", "",
                    "Minimum contrast of Laplacian to fine structure; raise it when star cores are flagged [astroscrappy objlim]",
                    0.1, 100, 0.5, 2));
    v.push_back(integer("prepare.cosmic.niter", pr, "CR iterations", "", "Maximum L.A.Cosmic iterations [astroscrappy niter]", 1, 20));
    v.push_back(choice("prepare.bayer", pr, "Bayer (CFA)", "Colour-filter-array frames: 2x2 super-pixel luminance or one colour (--bayer)",
                       {{"none", "none"}, {"luminance", "lum"}, {"red", "r"}, {"green", "g"}, {"blue", "b"}}));
    for (const char* key : {"autoBadPixels", "hotSigma", "flatLow", "flatHigh"})
        v.push_back(hidden(std::string("prepare.") + key, pr, "used with master frames (reduce --dark/--flat)"));
    for (const char* key : {"highSigma", "lowSigma", "window"})
        v.push_back(hidden(std::string("prepare.saltPepperParams.") + key, pr, "advanced: profile JSON"));
    for (const char* key : {"gain", "readnoise", "satlevel", "pedestal", "clean"})
        v.push_back(hidden(std::string("prepare.cosmic.") + key, pr, "from the frame (advanced: profile JSON)"));
    for (const char* key : {"output", "luminanceMean", "pattern", "rowOrder", "xOffset", "yOffset"})
        v.push_back(hidden(std::string("prepare.bayerParams.") + key, pr, "from the header (advanced: profile JSON)"));
    // Whole objects (the dock's leaf keys are one level deep): their fields have specs above.
    for (const char* key : {"saltPepperParams", "cosmic", "bayerParams"})
        v.push_back(hidden(std::string("prepare.") + key, pr, "fields listed separately"));
    // --- Background (stage 1) ---
    const std::string bg = "background";
    v.push_back(integer("background.meshSize", bg, "Mesh width", "px", "Background mesh width [BACK_SIZE, sep bw]", 4, 4096));
    v.push_back(integer("background.meshHeight", bg, "Mesh height", "px", "Mesh height; 0: same as the width [sep bh]", 0, 4096));
    v.push_back(integer("background.filterSize", bg, "Filter width", "meshes", "Median filter of the mesh grid [BACK_FILTERSIZE, sep fw]", 1, 15));
    v.push_back(integer("background.filterHeight", bg, "Filter height", "meshes", "0: same as the width [sep fh]", 0, 15));
    v.push_back(dbl("background.filterThreshold", bg, "Filter threshold", "ADU",
                    "Replace a mesh by its filtered value only above this difference [BACK_FILTERTHRESH, sep fthresh]", 0, inf, 1, 2));
    v.push_back(dbl("background.minGoodFraction", bg, "Min. good fraction", "",
                    "Fraction of valid pixels a mesh needs; others are filled from neighbours", 0, 1, 0.05, 2));
    v.push_back(boolean("background.fullMaps", bg, "Full-resolution maps", "Build full-resolution level/rms maps (off: mesh grids only)"));
    v.push_back(boolean("background.sextractorSpline", bg, "SExtractor spline",
                        "Reproduce sep/SExtractor's interpolation quirks bit for bit (default: exact natural splines)"));
    v.push_back(boolean("backgroundSecondPass", bg, "Second pass",
                        "Re-estimate the background with the detected objects masked, then detect again"));
    v.push_back(integer("secondPassDilate", bg, "Second-pass mask growth", "px", "Growth of the object mask for the second pass", 0, 64));
    // --- Detection (stage 2) ---
    const std::string det = "detection";
    v.push_back(dbl("detection.threshold", det, "Threshold", "σ", "Detection threshold in units of the local background RMS [DETECT_THRESH]", 0.1, 1e6, 0.1, 2));
    v.push_back(boolean("detection.thresholdIsAbsolute", det, "Absolute threshold", "Threshold in ADU [THRESH_TYPE ABSOLUTE]"));
    v.push_back(integer("detection.minArea", det, "Minimum area", "px", "Minimum object area, also of a deblended branch [DETECT_MINAREA]", 1, 10000));
    v.push_back(boolean("detection.filter", det, "Matched filter", "Convolve with a Gaussian before thresholding [FILTER]"));
    v.push_back(dbl("detection.filterFwhm", det, "Filter FWHM", "px", "FWHM of the Gaussian matched filter [FILTER_NAME]", 0.5, 50, 0.1, 2));
    v.push_back(kind(dbl("detection.filterKernel", det, "Filter kernel", "", "A supplied kernel instead (row-major, comma-separated); empty: Gaussian", 0, 0, 1, 0), ParamKind::DoubleList));
    v.push_back(integer("detection.filterKernelWidth", det, "Kernel width", "px", "Width of the supplied kernel", 0, 99));
    v.push_back(integer("detection.deblendLevels", det, "Deblend levels", "", "Number of deblending thresholds [DEBLEND_NTHRESH]; 1 disables deblending", 1, 256));
    v.push_back(dbl("detection.deblendContrast", det, "Deblend contrast", "", "Minimum contrast of a branch [DEBLEND_MINCONT]", 0, 1, 0.0005, 5));
    v.push_back(integer("detection.deblendMaxChildren", det, "Max. branches", "", "More branches in one blend: stop, flag deblend_overflow", 1, 1 << 20));
    v.push_back(boolean("detection.clean", det, "Clean", "Remove spurious detections in the wings of bright objects [CLEAN]"));
    v.push_back(dbl("detection.cleanParam", det, "Clean parameter", "", "[CLEAN_PARAM]", 0.1, 10, 0.1, 2));
    v.push_back(dbl("detection.windowSigmaFactor", det, "Window σ factor", "", "Windowed centroid (XWIN): window sigma = factor x half-light radius", 0.1, 5, 0.01, 4));
    v.push_back(dbl("detection.windowMinSigma", det, "Window min. σ", "px", "Lower bound of the window sigma", 0, 10, 0.1, 2));
    v.push_back(dbl("detection.windowMaxSigma", det, "Window max. σ", "px",
                    "Upper bound of the window sigma (0: none); bounds the cost of huge objects", 0, 1000, 1, 1));
    v.push_back(integer("detection.windowMaxIterations", det, "Window iterations", "", "Maximum iterations of the windowed centroid", 0, 100));
    v.push_back(dbl("detection.windowTolerance", det, "Window tolerance", "px", "Convergence tolerance of the windowed centroid", 0, 1, 0.0001, 5));
    v.push_back(hidden("detection.gain", det, "from the frame (gain keyword or instrument override)"));
    v.push_back(hidden("detection.saturationLevel", det, "from the frame"));
    // --- PSF (stage 3) ---
    const std::string psf = "psf";
    v.push_back(choice("psf.model", psf, "Model", "Analytic profile fitted to each PSF star", {{"Moffat", "moffat"}, {"Gaussian", "gaussian"}}));
    v.push_back(dbl("psf.moffatBeta", psf, "Moffat β", "", "Moffat beta start value", 0.5, 30, 0.1, 2));
    v.push_back(boolean("psf.fitBeta", psf, "Fit β", "Moffat beta free (off: fixed)"));
    v.push_back(dbl("psf.betaMin", psf, "β min", "", "Lower bound of the fitted beta", 0.5, 30, 0.1, 2));
    v.push_back(dbl("psf.betaMax", psf, "β max", "", "Upper bound of the fitted beta", 0.5, 100, 0.5, 2));
    v.push_back(integer("psf.pixelIntegration", psf, "Pixel integration", "nodes", "Gauss-Legendre nodes per axis over a pixel (1: point samples)", 1, 10));
    v.push_back(integer("psf.stampRadius", psf, "Stamp radius", "px", "Fit stamp half-size (0: 4 x FWHM guess)", 0, 200));
    v.push_back(dbl("psf.minSnr", psf, "Star min. S/N", "", "PSF star selection: minimum S/N", 0, 1e5, 5, 1));
    v.push_back(dbl("psf.maxPeakFraction", psf, "Max. peak fraction", "", "PSF stars peak below this fraction of saturation", 0, 1, 0.05, 2));
    v.push_back(dbl("psf.isolationRadius", psf, "Isolation radius", "px", "No other source this close (0: automatic)", 0, 500, 1, 1));
    v.push_back(flags("psf.excludeFlags", psf, "Exclude flags", "PSF stars must have none of these flag bits." + kFlagList));
    v.push_back(integer("psf.maxStars", psf, "Max. stars", "", "At most this many PSF stars (brightest first)", 1, 100000));
    v.push_back(dbl("psf.maxMaskedFraction", psf, "Max. masked fraction", "", "PSF star stamps with more masked pixels are skipped", 0, 1, 0.01, 2));
    v.push_back(integer("psf.maxIterations", psf, "LM iterations", "", "Levenberg-Marquardt iterations per star", 1, 10000));
    v.push_back(integer("psf.maxStarsPerCell", psf, "Stars per ePSF cell", "",
                        "Most candidate stars fitted per ePSF grid cell, brightest first (0: no limit)", 0, 100000));
    v.push_back(dbl("psf.clipSigma", psf, "Clip σ", "", "Outlier clipping of the fitted shapes", 0.5, 20, 0.1, 2));
    v.push_back(integer("psf.clipIterations", psf, "Clip iterations", "", "", 0, 100));
    v.push_back(integer("psf.polyOrder", psf, "Spatial order", "", "Polynomial order of FWHM, e1, e2 across the field (lowered when stars are few)", 0, 6));
    v.push_back(integer("psf.minStarsPerTerm", psf, "Stars per term", "", "Minimum stars per polynomial term", 1, 100));
    v.push_back(integer("psf.epsfOversampling", psf, "ePSF oversampling", "", "Empirical PSF nodes per pixel", 1, 10));
    v.push_back(integer("psf.gridNx", psf, "ePSF cells x", "", "Empirical PSF cells across the frame", 1, 20));
    v.push_back(integer("psf.gridNy", psf, "ePSF cells y", "", "Empirical PSF cells down the frame", 1, 20));
    v.push_back(integer("psf.epsfMinStars", psf, "ePSF min. stars", "", "Stars an ePSF cell needs", 1, 1000));
    v.push_back(boolean("psf.psfPhotometry", psf, "PSF photometry", "PSF-fit flux (flux_psf) with the ePSF"));
    v.push_back(dbl("psf.psfFitRadius", psf, "PSF fit radius", "px", "0: automatic", 0, 100, 0.5, 2));
    v.push_back(boolean("psf.psfFitBackground", psf, "Fit background", "Fit a constant background with the PSF flux"));
    v.push_back(dbl("psf.maxMaskedPsfWeight", psf, "Max. masked PSF weight", "", "PSF fit fails above this masked share of the PSF", 0, 1, 0.01, 2));
    v.push_back(dbl("defaultFwhm", psf, "Default FWHM", "px", "Used to scale apertures when no PSF model could be built", 0.5, 100, 0.1, 2));
    v.push_back(hidden("psf.saturation", psf, "from the frame"));
    // --- Aperture (stage 4) ---
    const std::string ap = "aperture";
    v.push_back(kind(dbl("aperture.radii", ap, "Radii", "", "Aperture RADII in px, or FWHM multiples (SExtractor's PHOT_APERTURES are diameters)", 0, 0, 1, 0), ParamKind::DoubleList));
    v.push_back(boolean("aperture.radiiInFwhm", ap, "Radii in FWHM", "Radii are multiples of the PSF FWHM"));
    v.push_back(boolean("aperture.useLocalSky", ap, "Local sky", "Local sky from an annulus (off: the background map) [BACKPHOTO_TYPE LOCAL]"));
    v.push_back(dbl("aperture.annulusInner", ap, "Annulus inner", "", "Sky annulus inner radius (px or FWHM)", 0, 1000, 0.5, 2));
    v.push_back(dbl("aperture.annulusOuter", ap, "Annulus outer", "", "Sky annulus outer radius (px or FWHM) [BACKPHOTO_THICK]", 0, 1000, 0.5, 2));
    v.push_back(boolean("aperture.annulusInFwhm", ap, "Annulus in FWHM", "Annulus radii are FWHM multiples"));
    v.push_back(choice("aperture.skyEstimator", ap, "Sky estimator", "Sigma-clipped estimator of the annulus",
                       {{"mean", "mean"}, {"median", "median"}, {"mode (SExtractor)", "mode"}}));
    v.push_back(dbl("aperture.skyClipSigma", ap, "Sky clip σ", "", "", 0.5, 20, 0.1, 2));
    v.push_back(integer("aperture.skyClipIterations", ap, "Sky clip iterations", "", "", 0, 100));
    v.push_back(integer("aperture.minSkyPixels", ap, "Min. sky pixels", "px", "Fewer annulus pixels: the map is used and sky_failed flagged", 1, 100000));
    v.push_back(dbl("aperture.kronFactor", ap, "Kron factor", "", "[PHOT_AUTOPARAMS k]", 0.5, 10, 0.1, 2));
    v.push_back(dbl("aperture.kronMinRadius", ap, "Kron min. radius", "", "[PHOT_AUTOPARAMS min radius]", 0.1, 50, 0.1, 2));
    v.push_back(dbl("aperture.kronMaxRadius", ap, "Kron max. radius", "", "Maximum Kron radius (units of a, b)", 0.1, 100, 0.5, 2));
    v.push_back(boolean("aperture.apertureCorrection", ap, "Aperture correction", "Curve-of-growth correction from bright isolated stars"));
    v.push_back(dbl("aperture.apCorrRefRadius", ap, "Correction ref. radius", "FWHM", "Reference radius of the curve of growth", 0.5, 50, 0.5, 2));
    v.push_back(integer("aperture.apCorrMaxStars", ap, "Correction max. stars", "", "", 1, 100000));
    v.push_back(integer("aperture.apCorrMinStars", ap, "Correction min. stars", "", "", 1, 10000));
    v.push_back(dbl("aperture.apCorrMinSnr", ap, "Correction min. S/N", "", "", 0, 1e5, 5, 1));
    v.push_back(dbl("aperture.apCorrClip", ap, "Correction clip σ", "", "", 0.5, 20, 0.1, 2));
    v.push_back(dbl("aperture.apCorrIsolation", ap, "Correction isolation", "",
                    "Neighbours' light in a correction star's reference aperture at most this fraction (0: off)", 0, 1, 0.001, 4));
    v.push_back(dbl("aperture.apCorrModelErr", ap, "Model curve error", "mag",
                    "Error of a curve of growth taken from the PSF model", 0, 1, 0.001, 4));
    v.push_back(boolean("aperture.optimal", ap, "Optimal aperture", "S/N-optimal aperture per source (flux_opt)"));
    v.push_back(dbl("aperture.optimalMinRadius", ap, "Optimal min. radius", "FWHM", "", 0.05, 10, 0.05, 2));
    v.push_back(dbl("aperture.cogStep", ap, "Curve-of-growth step", "FWHM", "", 0.001, 1, 0.01, 3));
    v.push_back(boolean("apertureToTotal", ap, "Correct to total",
                        "Extend the aperture correction from its reference radius to the total flux with the PSF model"));
    v.push_back(hidden("aperture.saturation", ap, "from the frame"));
    // --- Crossmatch (stage 5) ---
    const std::string xm = "crossmatch";
    v.push_back(dbl("crossmatch.radiusArcsec", xm, "Match radius", "arcsec", "[CROSSID_RADIUS]", 0.01, 3600, 0.1, 2));
    v.push_back(boolean("crossmatch.oneToOne", xm, "One to one", "Each reference star matches at most one source (closest wins)"));
    v.push_back(optional("crossmatch.refMagBright", xm, "Ref. mag bright", "mag", "Brightest reference magnitude used for matching", -5, 40, 0.1, 2, "none"));
    v.push_back(optional("crossmatch.refMagFaint", xm, "Ref. mag faint", "mag", "Faintest reference magnitude used for matching", -5, 40, 0.1, 2, "none"));
    v.push_back(dbl("crossmatch.marginPx", xm, "Margin", "px", "Reference stars projected this far outside the frame are kept", 0, 10000, 1, 1));
    v.push_back(choice("crossmatch.index", xm, "Search index", "Spatial index of the candidate search (same matches either way; auto = grid, the faster)",
                       {{"auto", "auto"}, {"grid", "grid"}, {"k-d tree", "kdtree"}}));
    // --- Zero point (stage 6) ---
    const std::string zp = "zeropoint";
    v.push_back(optional("zeropoint.magBright", zp, "Calibrator mag bright", "mag", "Reference magnitude range of calibrators (bright end)", -5, 40, 0.1, 2, "none", "-inf"));
    v.push_back(optional("zeropoint.magFaint", zp, "Calibrator mag faint", "mag", "Reference magnitude range of calibrators (faint end)", -5, 40, 0.1, 2, "none", "inf"));
    v.push_back(dbl("zeropoint.minSnr", zp, "Calibrator min. S/N", "", "S/N of the instrumental magnitude", 0, 1e5, 1, 1));
    v.push_back(flags("zeropoint.excludeFlags", zp, "Exclude flags", "Calibrators must have none of these flag bits." + kFlagList));
    v.push_back(dbl("zeropoint.isolationFwhm", zp, "Isolation (FWHM)", "FWHM", "Drop calibrators with a brighter reference star within this many FWHM (0: off, unless the radius is given in arcsec)", 0, 100, 0.5, 2));
    v.push_back(dbl("zeropoint.isolationArcsec", zp, "Isolation (arcsec)", "arcsec", "> 0: the isolation radius in arcsec, instead of in FWHM", 0, 3600, 0.5, 2));
    v.push_back(dbl("zeropoint.isolationDeltaMag", zp, "Isolation Δmag", "mag", "Neighbours brighter than own mag + this count", 0, 20, 0.1, 2));
    v.push_back(choice("zeropoint.method", zp, "Method", "Zero-point estimator", {{"clipped mean", "clipped-mean"}, {"RANSAC", "ransac"}}));
    v.push_back(dbl("zeropoint.clipSigma", zp, "Clip σ", "", "", 0.5, 20, 0.1, 2));
    v.push_back(integer("zeropoint.maxIterations", zp, "Clip iterations", "", "", 1, 1000));
    v.push_back(boolean("zeropoint.fitColourTerm", zp, "Colour term", "Fit a colour term (needs the reference colour)"));
    v.push_back(integer("zeropoint.seed", zp, "RANSAC seed", "", "", 0, std::numeric_limits<int>::max()));
    v.push_back(integer("zeropoint.ransacIterations", zp, "RANSAC iterations", "", "", 1, 1000000));
    v.push_back(dbl("zeropoint.ransacThreshold", zp, "RANSAC threshold", "mag", "Inlier residual", 0.001, 5, 0.01, 3));
    v.push_back(integer("zeropoint.minStars", zp, "Min. calibrators", "", "Fewer calibrators after clipping: no zero point", 1, 100000));
    v.push_back(choice("zeropoint.magSource", zp, "Calibrated magnitudes",
                       "Which instrumental magnitudes are calibrated (auto: the one with the smaller zero-point error)",
                       {{"auto", "auto"}, {"aperture", "aperture"}, {"PSF fit", "psf"}}));
    v.push_back(dbl("zeropoint.matchSigma", zp, "Matches above chance", "σ", "Matches must exceed chance by this many sigmas (0: off)", 0, 1000, 1, 1));
    v.push_back(integer("zeropoint.bootstrap", zp, "Bootstrap resamples", "", "0: the formal error alone", 0, 100000));
    v.push_back(dbl("zeropoint.maxZpErr", zp, "Max. zero-point error", "mag", "A less certain zero point is not reported (0: no limit)", 0, 10, 0.01, 3));
    // --- Astrometry (stage 7) ---
    const std::string as = "astrometry";
    v.push_back(boolean("fitAstrometry", as, "Fit astrometry", "Refine (or solve) the WCS against the reference catalog"));
    v.push_back(choice("astrometry.blind", as, "Blind solving", "Blind: when the header WCS is missing or fails verification",
                       {{"automatic", -1}, {"never", 0}, {"always", 1}}));
    v.push_back(integer("astrometry.maxSipOrder", as, "Max. SIP order", "", "Highest SIP order tried", 1, 9));
    v.push_back(integer("astrometry.minSipOrder", as, "Min. SIP order", "", "Lowest SIP order tried; <= 1 also tries pure TAN", 0, 9));
    v.push_back(dbl("astrometry.minMatchesPerTerm", as, "Matches per term", "", "An order is tried only with this many matches per term", 1, 100, 0.5, 1));
    v.push_back(dbl("astrometry.matchRadiusPx", as, "Match radius", "px", "Final match radius", 0.1, 100, 0.1, 2));
    v.push_back(dbl("astrometry.refineRadiusPx", as, "Refine radius", "px", "First match radius when refining a header WCS", 0.1, 1000, 1, 1));
    v.push_back(dbl("astrometry.clipSigma", as, "Clip σ", "", "Outlier rejection in robust sigmas per axis", 0.5, 20, 0.1, 2));
    v.push_back(integer("astrometry.iterations", as, "Iterations", "", "Match + fit + clip rounds", 1, 100));
    v.push_back(dbl("astrometry.scaleLow", as, "Scale low", "″/px", "Lowest pixel scale searched (no header scale)", 0.01, 1000, 0.1, 2));
    v.push_back(dbl("astrometry.scaleHigh", as, "Scale high", "″/px", "Highest pixel scale searched", 0.01, 1000, 0.5, 2));
    v.push_back(dbl("astrometry.headerScaleTolerance", as, "Header scale tolerance", "", "Relative scale range around the header's", 0, 1, 0.01, 3));
    v.push_back(dbl("astrometry.searchRadiusDeg", as, "Search radius", "deg", "Field centre searched within this of the pointing", 0, 180, 0.5, 2));
    v.push_back(integer("astrometry.nBrightest", as, "Brightest detections", "", "Used to build quads", 4, 10000));
    v.push_back(integer("astrometry.refPerCell", as, "Ref. stars per cell", "", "Uniformisation (16 cells per field)", 1, 1000));
    v.push_back(dbl("astrometry.codeTolerance", as, "Code tolerance", "", "Quad code distance accepted as a hit", 0.001, 1, 0.005, 3));
    v.push_back(integer("astrometry.maxFullVerifications", as, "Max. verifications", "", "", 1, 100000));
    v.push_back(integer("astrometry.seed", as, "Seed", "", "Reserved for randomised steps", 0, std::numeric_limits<int>::max()));
    v.push_back(integer("astrometry.verifyMinMatches", as, "Verify min. matches", "", "", 1, 100000));
    v.push_back(dbl("astrometry.verifyMinFraction", as, "Verify min. fraction", "", "", 0, 1, 0.01, 2));
    v.push_back(dbl("astrometry.verifySigma", as, "Verify σ", "", "Poisson sigmas above the chance-match count", 0, 1000, 0.5, 1));
    // --- Instrument overrides (win over the header) ---
    const std::string in = "instrument";
    v.push_back(optional("instrument.gain", in, "Gain", "e⁻/ADU", "Overrides the header [GAIN]; CLI --gain", 0, 1e4, 0.1, 3));
    v.push_back(optional("instrument.readNoise", in, "Read noise", "e⁻", "Overrides the header; CLI --rdnoise", -1, 1e4, 0.1, 2));
    v.push_back(optional("instrument.saturation", in, "Saturation", "ADU", "Overrides the header [SATUR_LEVEL]; CLI --saturation", 0, 1e12, 100, 1));
    v.push_back(optional("instrument.exptime", in, "Exposure time", "s", "Overrides the header; CLI --exptime", -1, 1e7, 1, 3));
    v.push_back(optional("instrument.airmass", in, "Airmass", "", "Overrides the header", 0, 100, 0.01, 3));
    v.push_back(text("instrument.filter", in, "Filter", "Overrides the header"));
    v.push_back(text("instrument.object", in, "Object", "Overrides the header"));
    // --- Header keywords ---
    const std::string kw = "keywords";
    for (const auto& [key, label] : std::vector<std::pair<std::string, std::string>>{
             {"gain", "Gain"}, {"gainPerAmp", "Gain per amplifier"}, {"readNoise", "Read noise"},
             {"saturation", "Saturation"}, {"exptime", "Exposure time"}, {"filter", "Filter"},
             {"dateObs", "DATE-OBS"}, {"mjdObs", "MJD-OBS"}, {"airmass", "Airmass"}, {"object", "Object"}})
        v.push_back(kind(dbl("keywords." + key, kw, label, "", "Header keywords in order of preference, comma-separated", 0, 0, 1, 0),
                         ParamKind::StringList));
    return v;
}

} // namespace

const std::vector<ParamGroup>& paramGroups() {
    static const std::vector<ParamGroup> groups{
        {"prepare", "0 Preparation"},   {"background", "1 Background"}, {"detection", "2 Detection"},  {"psf", "3 PSF"},
        {"aperture", "4 Aperture"},     {"crossmatch", "5 Crossmatch"}, {"zeropoint", "6 Zero point"},
        {"astrometry", "7 Astrometry"}, {"instrument", "Instrument"},   {"keywords", "Header keywords"}};
    return groups;
}

const std::vector<ParamSpec>& paramSchema() {
    static const std::vector<ParamSpec> schema = buildSchema();
    return schema;
}

const ParamSpec* findParamSpec(std::string_view key) {
    for (const auto& s : paramSchema())
        if (s.key == key) return &s;
    return nullptr;
}

std::string groupOfKey(std::string_view key) {
    if (const ParamSpec* s = findParamSpec(key)) return s->group;
    const auto dot = key.find('.');
    const std::string first(key.substr(0, dot));
    for (const auto& g : paramGroups())
        if (g.id == first) return first;
    return "background";
}

std::string flagNames(std::uint32_t f, const char* separator) {
    static const std::pair<std::uint32_t, const char*> names[] = {
        {FlagCrowded, "crowded"},       {FlagBlended, "blended"},
        {FlagSaturated, "saturated"},   {FlagEdge, "edge"},
        {FlagApertureIncomplete, "aperture_incomplete"}, {FlagBadPixels, "bad_pixels"},
        {FlagApertureMasked, "aperture_masked"},         {FlagPsfFitFailed, "psf_fit_failed"},
        {FlagSkyFailed, "sky_failed"},  {FlagKronFailed, "kron_failed"},
        {FlagDeblendOverflow, "deblend_overflow"},       {FlagPsfStar, "psf_star"},
        {FlagCalibrator, "calibrator"}, {FlagAstromStar, "astrom_star"}};
    std::string out;
    for (const auto& [bit, name] : names)
        if (f & bit) {
            if (!out.empty()) out += separator;
            out += name;
        }
    return out;
}

} // namespace gpuphot::ui
