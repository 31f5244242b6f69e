#pragma once
// What the PipelineWorker hands to the UI after each run, by value (a shared_ptr to an immutable
// snapshot travels through queued signals). Panels and the viewer read from it and never modify it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"

namespace gpuphot::ui {

struct CatalogPrep; // ui/catalog_prep.hpp

struct Snapshot {
    std::uint64_t generation = 0;                     // increases with every request the worker accepts
    std::shared_ptr<const Frame> frame;               // the frame the run used
    std::shared_ptr<const ReferenceCatalog> reference; // null without a reference catalog
    PipelineConfig config;                            // the parameters of this run
    PipelineResult result;                            // everything the stages produced
    Stage firstStage = Stage::Background;             // the first stage that was re-run
    std::vector<StageRecord> timings;                 // per stage, this run
    std::string backend;                              // "cpu" or "cuda"
    // The catalog table's flags and row order for the sort the UI asked for (PipelineWorker::setCatalogSort),
    // computed on the worker's thread; null when not prepared (the table model then computes it).
    std::shared_ptr<const CatalogPrep> catalog;
    int psfFitsReused = -1, psfFitsMade = -1; // PSF star fits taken from the worker's cache / fitted; -1: stage not run
    bool prefetched = false; // computed ahead by the idle worker (PipelineWorker::setThresholdPrefetch)
    // A first look while the run goes on (PipelineWorker::setProvisionalResults): this config's detection,
    // with apertures and calibration measured using the previous result's PSF model (per-source PSF
    // fluxes NaN); the complete result of the same generation follows and replaces it.
    bool provisional = false;
};

using SnapshotPtr = std::shared_ptr<const Snapshot>;

} // namespace gpuphot::ui

#include <QMetaType>
Q_DECLARE_METATYPE(gpuphot::ui::SnapshotPtr)
