#pragma once
// A small simulated frame reduced once per test executable, with its reference catalog: the snapshots
// the panel tests show (calibrated; without reference; with astrometry switched off).
#include "core/sim/simulator.hpp"
#include "ui/snapshot.hpp"

namespace gpuphot::test {

struct PanelFixture {
    SimResult sim;
    ui::SnapshotPtr calibrated; // reference catalog, astrometry, zero point with colour term
    ui::SnapshotPtr noReference;
    ui::SnapshotPtr noAstrometry; // reference catalog, fitAstrometry = false
};

const PanelFixture& panelFixture();

} // namespace gpuphot::test
