#pragma once
// What `gpuphot series` writes into its directory (docs/CLI.md, "series"):
//   NAME.lc.ecsv / NAME.lc.csv / NAME.lc.fits  the light curve of each target (the same table)
//   NAME.aij.tbl                               an AstroImageJ measurements table (tab-separated)
//   NAME.aavso.txt                             AAVSO extended format (ensemble photometry)
//   series.json                                the series report (parameters, frames, ensembles)
//   series.state                               what a later call appends to (binary; series_state.cpp)
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
#include "core/util/errors.hpp"

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

// Why DIR/series.state was refused. Nothing in DIR is changed: the call fails (a later one with --fresh
// rebuilds the series from its catalogs).
class SeriesStateError : public InvalidInput {
public:
    enum class Reason {
        NotAState,    // neither format 3 nor the CBOR of format 2
        OtherVersion, // another format version or byte order
        Truncated,    // shorter than its header says
        Corrupt,      // its checksum or its fields do not agree
    };
    SeriesStateError(Reason reason, const std::string& what) : InvalidInput(what), m_reason(reason) {}
    Reason reason() const { return m_reason; }

private:
    Reason m_reason;
};

// DIR/series.state, written atomically (format 3, series_state.cpp); read back (nullopt when there is
// none; format 2 is read too and rewritten as 3 by the next save). Throws SeriesStateError for a file
// that is not a whole state, IoError when it cannot be read.
void saveSeriesState(const SeriesState& state, const std::string& dir);
std::optional<SeriesState> loadSeriesState(const std::string& dir);
// The bytes of that file, and the state from them (`what` names them in errors).
std::string seriesStateBytes(const SeriesState& state);
SeriesState parseSeriesState(const std::string& bytes, const std::string& what);

} // namespace gpuphot
