#pragma once
// What `gpuphot series` writes into its directory (docs/CLI.md, "series"):
//   NAME.lc.ecsv / NAME.lc.csv / NAME.lc.fits  the light curve of each target (the same table)
//   NAME.aij.tbl                               an AstroImageJ measurements table (tab-separated)
//   NAME.aavso.txt                             AAVSO extended format (ensemble photometry)
//   series.json                                the series report (parameters, frames, ensembles)
//   series.state                               what a later call appends to (CBOR; see SeriesState)
//   series.stars.fits, series.curves.fits      with allStars: one row per star (its RMS, chi^2, Stetson J,
//                                              variable flag, ...) and one row per star and frame
//   series.variables.csv                       with allStars: the flagged variables (position, median
//                                              mag, RMS, chi^2, Stetson J, best period)
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/catalog/table.hpp"
#include "core/series/series.hpp"

namespace gpuphot {

struct SeriesOutputOptions {
    std::string dir; // created when missing
    std::set<std::string> formats{"ecsv", "csv", "fits", "aij", "aavso"};
    std::string obscode = "NONE"; // AAVSO observer code
    bool state = true;            // also DIR/series.state (the last file renamed)
};

Table lightCurveTable(const SeriesResult& series, const LightCurve& curve);
nlohmann::json seriesReport(const SeriesResult& series);
// The file stem of a target's outputs: its name with characters other than [A-Za-z0-9._+-] as '_'.
std::string curveStem(const std::string& name);
// Writes every file (each atomically) and returns their paths. Throws IoError or InvalidInput.
std::vector<std::string> writeSeriesOutputs(const SeriesResult& series, const SeriesOutputOptions& options);
// The catalogs a previous call recorded in DIR/series.json (empty when there is none). Throws
// InvalidInput for a series.json that is not one.
std::vector<std::string> seriesCatalogsIn(const std::string& dir);

// DIR/series.state, written atomically; read back (nullopt when there is none). Throws InvalidInput for
// a file that is not a state of this version.
void saveSeriesState(const SeriesState& state, const std::string& dir);
std::optional<SeriesState> loadSeriesState(const std::string& dir);

} // namespace gpuphot
