#include "core/pipeline/report.hpp"

#include <cmath>

#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/json_number.hpp"

namespace gpuphot {
nlohmann::json buildReport(const Frame& frame, const PipelineResult& r, const PipelineConfig& config,
                           const RunContext& ctx) {
    using nlohmann::json;
    json stages = json::array();
    std::vector<std::string> gpuNotes; // CUDA backend's re-planning notes, added to the warnings
    double total = 0.0;
    for (const auto& s : ctx.records) {
        stages.push_back({{"stage", s.stage}, {"seconds", s.seconds}, {"peak_host_bytes", s.peakHostBytes}});
        if (ctx.backend == Backend::Cuda) { // GPU memory checkpoints (docs/ARCHITECTURE.md, GPU memory model)
            stages.back()["device_high_water_bytes"] = s.deviceHighWater;
            stages.back()["device_free_bytes"] = s.deviceFree;
            if (!s.devicePlan.empty()) {
                stages.back()["gpu_plan"] = s.devicePlan;
                stages.back()["gpu_strips"] = s.deviceStrips;
            }
        }
        if (!s.deviceNote.empty()) {
            stages.back()["gpu_note"] = s.deviceNote;
            gpuNotes.push_back(s.deviceNote);
        }
        total += s.seconds;
    }
    const Instrument& in = frame.instrument;
    json report{
        {"software", "gpuphot " GPUPHOT_VERSION},
        {"frame",
         {{"path", frame.path},
          {"hdu", frame.hdu},
          {"extname", frame.extname},
          {"width", frame.width()},
          {"height", frame.height()},
          {"bitpix", frame.bitpix},
          {"has_wcs", frame.wcs != nullptr},
          {"wcs_problem", frame.wcsProblem}}},
        {"instrument",
         {{"gain", in.gain},
          {"gain_source", in.gainSource},
          {"read_noise", in.readNoise},
          {"saturation", finiteOrNull(in.saturation)},
          {"exptime", finiteOrNull(in.exptime)},
          {"mjd_mid", finiteOrNull(in.mjdMid)},
          {"airmass", finiteOrNull(in.airmass)},
          {"filter", in.filter},
          {"object", in.object}}},
        {"backend", backendName(ctx.backend)},
        {"threads", ctx.threadCount()},
        {"tuning", ctx.tuning.toJson()},
        {"tuning_non_default", ctx.tuning.nonDefault()},
        {"stages", stages},
        {"total_seconds", total},
        {"peak_host_bytes", peakResidentBytes()},
        {"counts",
         {{"sources", r.detection.sources.size()},
          {"before_deblend", r.detection.nBeforeDeblend},
          {"after_deblend", r.detection.nDeblended},
          {"cleaned", r.detection.nCleaned},
          {"psf_stars", r.psf.nStars}}},
        {"background",
         {{"level", r.background.globalLevel},
          {"rms", r.background.globalRms},
          {"bad_meshes", r.background.badMeshes},
          {"weight_scale", r.background.weightScale}}},
        {"fwhm", finiteOrNull(r.fwhm)},
        {"fwhm_source", r.fwhmSource},
        {"ellipticity", finiteOrNull(r.psf.medianEllipticity)},
        {"aperture",
         {{"radii", r.aperture.radii},
          {"apcorr_mag", r.aperture.apCorrMag},
          {"apcorr_stars", r.aperture.apCorrStars},
          {"apcorr_source", r.aperture.apCorrSource},
          {"reference_radius", r.aperture.apCorrRefRadius},
          {"reference_fraction", r.aperture.refApertureFraction}}},
        {"calibration",
         {{"ran", r.calibrationRan},
          {"problem", r.calibrationProblem},
          {"matched", r.crossmatch.nMatched},
          {"reference_in_frame", r.crossmatch.nRefInFrame},
          {"calibrators", r.zeropoint.nUsed},
          {"candidates", r.zeropoint.nCandidates},
          {"scatter", finiteOrNull(r.zeropoint.scatter)},
          {"isolation_arcsec", r.zeropoint.isolationArcsec},
          {"limiting_mag", finiteOrNull(r.zeropoint.limitingMag)},
          {"zp_err_formal", finiteOrNull(r.zeropoint.zpErrFormal)},
          {"zp_err_bootstrap", finiteOrNull(r.zeropoint.zpErrBootstrap)},
          {"zp_err_shared", finiteOrNull(r.zeropoint.zpErrShared)},
          {"mag_source", r.zeropoint.magSource},
          {"message", r.zeropoint.message},
          {"zp_gradient",
           {{"x", finiteOrNull(r.zeropoint.gradientX)},
            {"y", finiteOrNull(r.zeropoint.gradientY)},
            {"x_err", finiteOrNull(r.zeropoint.gradientXErr)},
            {"y_err", finiteOrNull(r.zeropoint.gradientYErr)},
            {"unit", "mag per 1000 px"}}},
          {"zp_map",
           {{"nx", r.zeropoint.mapNx},
            {"ny", r.zeropoint.mapNy},
            {"residual",
             [&] {
                 nlohmann::json a = nlohmann::json::array();
                 for (double v : r.zeropoint.map)
                     a.push_back(finiteOrNull(v));
                 return a;
             }()}}},
          {"matched", r.crossmatch.nMatched},
          {"chance_matches", finiteOrNull(r.crossmatch.chanceMatches)},
          {"colour_term",
           r.zeropoint.colourTermFitted ? finiteOrNull(r.zeropoint.colourTerm) : nlohmann::json(nullptr)}}},
        {"zp", r.zeropoint.ok ? finiteOrNull(r.zeropoint.zp) : nlohmann::json(nullptr)},
        {"zp_err", r.zeropoint.ok ? finiteOrNull(r.zeropoint.zpErr) : nlohmann::json(nullptr)},
        {"zp_per_second", r.zeropoint.ok && in.exptime > 0
                              ? finiteOrNull(r.zeropoint.zp + 2.5 * std::log10(in.exptime))
                              : nlohmann::json(nullptr)},
        {"astrometry",
         {{"ran", r.astrometry.ok || !r.astrometry.message.empty()},
          {"ok", r.astrometry.ok},
          {"method", r.astrometry.method},
          {"message", r.astrometry.message},
          {"sip_order", r.astrometry.sipOrder},
          {"matched", r.astrometry.nMatched},
          {"used", r.astrometry.nUsed},
          {"seconds", r.astrometry.solveSeconds}}},
        {"astrometric_rms_arcsec",
         r.astrometry.ok ? finiteOrNull(r.astrometry.rmsArcsec) : nlohmann::json(nullptr)},
        {"warnings",
         [&] {
             std::vector<std::string> w = r.warnings;
             w.insert(w.end(), gpuNotes.begin(), gpuNotes.end());
             return w;
         }()},
        {"config", config},
    };
    return report;
}

} // namespace gpuphot
