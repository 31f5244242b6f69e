#include "tests/ui/panel_fixture.hpp"

#include <cmath>
#include <cstdio>

#include "core/pipeline/pipeline.hpp"
#include "core/sim/sim_frame.hpp"

namespace gpuphot::test {

namespace {

ReferenceCatalog referenceFrom(const Table& t) {
    ReferenceCatalog ref;
    ref.ra = t.doubles("ra");
    ref.dec = t.doubles("dec");
    ref.mag = t.doubles("mag");
    ref.magErr = t.doubles("mag_err");
    ref.color = t.doubles("colour");
    const std::size_t n = ref.ra.size();
    ref.pmRa.assign(n, std::nan(""));
    ref.pmDec.assign(n, std::nan(""));
    for (double v : t.doubles("id"))
        ref.id.push_back(static_cast<std::int64_t>(v));
    return ref;
}

PanelFixture make() {
    PanelFixture f;
    SimParams p;
    p.width = 1024;
    p.height = 900;
    p.stars = 2500;
    p.seed = 11;
    p.colourTerm = 0.1;
    p.colourMean = 0.0;
    p.colourSigma = 0.5;
    p.fwhmCornerFactor = 1.3; // a PSF that varies across the field
    p.skyGradientX = 40.0;    // and a background that does
    f.sim = simulateField(p);
    auto frame = std::make_shared<const Frame>(frameFromSimulation(f.sim));
    auto ref = std::make_shared<const ReferenceCatalog>(referenceFrom(f.sim.reference));

    PipelineConfig config;
    config.zeropoint.fitColourTerm = true;
    config.psf.gridNx = 2;
    config.psf.gridNy = 2;
    RunContext ctx;
    auto cal = std::make_shared<ui::Snapshot>();
    cal->generation = 1;
    cal->frame = frame;
    cal->reference = ref;
    cal->config = config;
    cal->backend = "cpu";
    cal->result.keepFullMaps = true; // full maps (as the CUDA backend); the worker's lean ones: panel_data_test
    runPipeline(*frame, config, ctx, cal->result, Stage::Background, ref.get());
    cal->timings = ctx.records;
    std::printf(
        "[panels] fixture: %zu sources, zp %s (%d of %d used), astrometry %s (%d used), psf %d stars\n",
        cal->result.detection.sources.size(), cal->result.zeropoint.ok ? "ok" : "failed",
        cal->result.zeropoint.nUsed, cal->result.zeropoint.nCandidates,
        cal->result.astrometry.ok ? "ok" : cal->result.astrometry.message.c_str(),
        cal->result.astrometry.nUsed, cal->result.psf.nStars);

    auto noRef = std::make_shared<ui::Snapshot>(*cal);
    noRef->generation = 2;
    noRef->reference.reset();
    noRef->firstStage = Stage::Calibration;
    runPipeline(*frame, config, ctx, noRef->result, Stage::Calibration, nullptr);

    auto noAst = std::make_shared<ui::Snapshot>(*cal);
    noAst->generation = 3;
    noAst->config.fitAstrometry = false;
    noAst->firstStage = Stage::Calibration;
    runPipeline(*frame, noAst->config, ctx, noAst->result, Stage::Calibration, ref.get());

    f.calibrated = cal;
    f.noReference = noRef;
    f.noAstrometry = noAst;
    return f;
}

} // namespace

const PanelFixture& panelFixture() {
    static const PanelFixture f = make();
    return f;
}

} // namespace gpuphot::test
