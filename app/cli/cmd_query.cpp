// gpuphot query --db URL frames | cone RA DEC RADIUS | lightcurve RA DEC: the results store read back
// as a table, CSV, ECSV or JSON (docs/CLI.md §query, docs/DATABASE.md).
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "app/cli/commands.hpp"
#include "core/db/results_store.hpp"
#include "core/io/target_list.hpp"
#include "core/io/text_catalog.hpp"

namespace gpuphot::cli {

namespace {

struct QueryCli {
    std::string db, format = "table", output, mjdMin, mjdMax, filter, path;
    std::string ra, dec, name;
    double radius = 10.0;
    CLI::App *frames = nullptr, *cone = nullptr, *lightcurve = nullptr, *series = nullptr;
};

// Degrees, or sexagesimal (RA in hours "hh:mm:ss", Dec in degrees "+dd:mm:ss").
double parseAngle(const std::string& text, bool ra) {
    if (text.find_first_of(": hdms") != std::string::npos) {
        if (auto v = parseSexagesimalAngle(text)) return ra ? *v * 15.0 : *v;
    } else {
        std::size_t used = 0;
        try {
            const double v = std::stod(text, &used);
            if (used == text.size() && std::isfinite(v)) return v;
        } catch (const std::exception&) {
        }
    }
    throw InvalidInput(std::string("query: ") + (ra ? "RA" : "Dec") + " '" + text +
                       "' is neither degrees nor sexagesimal");
}

std::string cell(const Column& c, std::size_t i) {
    if (const auto* s = std::get_if<std::vector<std::string>>(&c.data)) return (*s)[i];
    const double v = c.asDouble(i);
    if (std::isnan(v)) return "-";
    char buf[32];
    if (std::holds_alternative<std::vector<std::int64_t>>(c.data))
        std::snprintf(buf, sizeof buf, "%.0f", v);
    else
        std::snprintf(buf, sizeof buf, "%.10g", v);
    return buf;
}

// An aligned text table: the columns a reader scans first (paths shortened to their file name).
std::string textTable(const Table& t) {
    std::vector<std::vector<std::string>> cells(t.columns().size());
    std::vector<std::size_t> width;
    for (std::size_t c = 0; c < t.columns().size(); ++c) {
        const Column& col = t.columns()[c];
        cells[c].push_back(col.name);
        for (std::size_t i = 0; i < t.rows(); ++i)
            cells[c].push_back(col.name == "path" ? std::filesystem::path(cell(col, i)).filename().string()
                                                  : cell(col, i));
        std::size_t w = 0;
        for (const auto& s : cells[c])
            w = std::max(w, s.size());
        width.push_back(w);
    }
    std::string out;
    for (std::size_t r = 0; r <= t.rows(); ++r) {
        for (std::size_t c = 0; c < cells.size(); ++c) {
            std::string s = cells[c][r];
            s.insert(0, width[c] - s.size(), ' ');
            out += (c ? "  " : "") + s;
        }
        out += '\n';
    }
    return out;
}

nlohmann::json jsonRows(const Table& t) {
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t i = 0; i < t.rows(); ++i) {
        nlohmann::json row = nlohmann::json::object();
        for (const Column& c : t.columns()) {
            if (const auto* s = std::get_if<std::vector<std::string>>(&c.data))
                row[c.name] = (*s)[i];
            else if (std::holds_alternative<std::vector<std::int64_t>>(c.data))
                row[c.name] = c.as<std::int64_t>()[i];
            else if (std::isfinite(c.asDouble(i)))
                row[c.name] = c.asDouble(i);
            else
                row[c.name] = nullptr;
        }
        rows.push_back(std::move(row));
    }
    return rows;
}

// Writes the table to -o FILE (atomically, its directory made) or standard output.
void emit(const Table& t, const QueryCli& o) {
    namespace fs = std::filesystem;
    if (o.format == "csv" || o.format == "ecsv") {
        fs::path target = o.output;
        std::optional<fs::path> tmpDir;
        if (target.empty()) {
            tmpDir = fs::temp_directory_path() / ("gpuphot_query_" + std::to_string(::getpid()));
            fs::create_directories(*tmpDir);
            target = *tmpDir / "out";
        } else if (target.has_parent_path()) {
            fs::create_directories(target.parent_path());
        }
        if (o.format == "csv")
            writeCsv(target.string(), t);
        else
            writeEcsv(target.string(), t);
        if (tmpDir) {
            std::ifstream in(target);
            std::cout << in.rdbuf();
            fs::remove_all(*tmpDir);
        }
        return;
    }
    const std::string text = o.format == "json" ? jsonRows(t).dump(1) + "\n" : textTable(t);
    if (o.output.empty()) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        return;
    }
    const fs::path target = o.output;
    if (target.has_parent_path()) fs::create_directories(target.parent_path());
    const fs::path tmp = target.string() + ".tmp";
    std::ofstream(tmp) << text;
    fs::rename(tmp, target);
}

std::optional<double> optionalNumber(const std::string& text, const char* option) {
    if (text.empty()) return std::nullopt;
    try {
        return std::stod(text);
    } catch (const std::exception&) {
        throw InvalidInput(std::string("query: ") + option + " '" + text + "' is not a number");
    }
}

int runQuery(const QueryCli& o) {
    if (o.format != "table" && o.format != "csv" && o.format != "ecsv" && o.format != "json")
        throw InvalidInput("query: --format must be table, csv, ecsv or json");
    if (!isPostgresUrl(o.db) && !std::filesystem::exists(o.db))
        throw DatabaseError(DatabaseError::Kind::Unreachable, o.db + ": no such database file");
    auto store = openResultsStore(o.db);
    Table t;
    if (o.frames->parsed()) {
        FrameQuery q;
        q.mjdMin = optionalNumber(o.mjdMin, "--mjd-min");
        q.mjdMax = optionalNumber(o.mjdMax, "--mjd-max");
        q.filter = o.filter;
        q.pathLike = o.path;
        t = store->frames(q);
    } else if (o.series->parsed()) {
        t = store->seriesCurve(o.name);
    } else {
        if (!(o.radius > 0)) throw InvalidInput("query: the radius must be > 0 arcsec");
        const double ra = parseAngle(o.ra, true), dec = parseAngle(o.dec, false);
        if (dec < -90 || dec > 90) throw InvalidInput("query: Dec " + o.dec + " is outside -90..+90");
        t = o.cone->parsed() ? store->cone(ra, dec, o.radius) : lightCurve(*store, ra, dec, o.radius);
    }
    emit(t, o);
    return 0;
}

} // namespace

Command registerQuery(CLI::App& app) {
    auto o = std::make_shared<QueryCli>();
    CLI::App* sub =
        app.add_subcommand("query", "Read the results database: frames, cone, lightcurve, series");
    sub->add_option("--db", o->db, "The database (a SQLite file, or postgresql://USER@HOST/DB)")->required();
    sub->add_option("--format", o->format, "table | csv | ecsv | json")->capture_default_str();
    sub->add_option("-o,--output", o->output, "Write here instead of standard output");
    sub->require_subcommand(1);
    o->frames = sub->add_subcommand("frames", "The stored frames, in time order");
    o->frames->add_option("--mjd-min", o->mjdMin, "From this mid-exposure MJD");
    o->frames->add_option("--mjd-max", o->mjdMax, "Up to this mid-exposure MJD");
    o->frames->add_option("--filter", o->filter, "Only this FILTER");
    o->frames->add_option("--path", o->path, "Only frame paths LIKE this pattern (% and _)");
    o->cone = sub->add_subcommand("cone", "Every stored source within RADIUS arcsec of RA DEC");
    o->cone->add_option("ra", o->ra, "RA: degrees or hh:mm:ss")->required();
    o->cone->add_option("dec", o->dec, "Dec: degrees or +dd:mm:ss")->required();
    o->cone->add_option("radius", o->radius, "Radius in arcsec")->capture_default_str();
    o->lightcurve = sub->add_subcommand("lightcurve", "The nearest source of each frame within --radius");
    o->lightcurve->add_option("ra", o->ra, "RA: degrees or hh:mm:ss")->required();
    o->lightcurve->add_option("dec", o->dec, "Dec: degrees or +dd:mm:ss")->required();
    o->lightcurve->add_option("--radius", o->radius, "Match radius in arcsec")->default_val(1.5);
    o->series = sub->add_subcommand("series", "The light curve `gpuphot series --db` stored for a target");
    o->series->add_option("name", o->name, "The target's name (as in the targets file)")->required();
    return {sub, [o] { return runQuery(*o); }};
}

} // namespace gpuphot::cli
