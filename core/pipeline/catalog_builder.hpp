#pragma once
// Joins the stages' results into the catalog Table with the docs/ARCHITECTURE.md columns (one per quantity,
// always present; NaN or -1 where a stage did not run) and the calibration header keywords.
// Positions are converted to the 1-based FITS convention here and nowhere else.
#include "core/catalog/table.hpp"

namespace gpuphot {

struct ApertureResult;
struct Frame;
struct PipelineConfig;
struct PipelineResult;
struct ReferenceCatalog;

// `reference`: the catalog the calibration stages matched against (for ref_id and colours), or null.
Table buildCatalog(const Frame& frame, const PipelineResult& result, const PipelineConfig& config,
                   const ReferenceCatalog* reference = nullptr);

// -2.5 log10(flux) for flux > 0, else NaN; and its error 2.5/ln10 * err/flux.
double instrumentalMag(double flux);
double magError(double flux, double fluxErr);

// Appends flux_aper_K, fluxerr_aper_K, mag_aper_K, magerr_aper_K (K = 1..radii) for an aperture result
// of n rows; nothing when `ap` did not measure n sources.
void addApertureColumns(Table& t, const ApertureResult& ap, std::size_t n);

} // namespace gpuphot
