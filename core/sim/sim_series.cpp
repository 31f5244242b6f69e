#include "core/sim/sim_series.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/io/atomic_file.hpp"
#include "core/sim/sim_random.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

constexpr double kPi = 3.14159265358979323846;

template <class P, class F> void visitFields(P& s, F&& f) {
    f("frames", s.frames);
    f("cadence", s.cadence);
    f("airmassStart", s.airmassStart);
    f("airmassEnd", s.airmassEnd);
    f("extinction", s.extinction);
    f("colourExtinction", s.colourExtinction);
    f("transparency", s.transparency);
    f("seeing", s.seeing);
    f("jitter", s.jitter);
    f("telescopeDiameter", s.telescopeDiameter);
    f("transitDepth", s.transitDepth);
    f("transitDuration", s.transitDuration);
    f("transitMid", s.transitMid);
    f("transitSnr", s.transitSnr);
    f("sineAmplitude", s.sineAmplitude);
    f("sinePeriod", s.sinePeriod);
    f("sineSnr", s.sineSnr);
}

void require(bool ok, const std::string& what) {
    if (!ok) throw InvalidInput("series simulation: " + what);
}

// A smooth random function of time in [-1, 1]: three sinusoids of 3 h, 1.1 h and 0.4 h with random phases.
struct Smooth {
    double phase[3];
    Smooth(std::uint64_t seed, std::uint64_t stream) {
        sim::SimRng rng(seed, stream);
        for (double& p : phase)
            p = 2.0 * kPi * rng.uniform();
    }
    double operator()(double hours) const {
        static constexpr double period[3] = {3.0, 1.1, 0.4}, weight[3] = {0.6, 0.3, 0.1};
        double v = 0.0;
        for (int k = 0; k < 3; ++k)
            v += weight[k] * std::sin(2.0 * kPi * hours / period[k] + phase[k]);
        return v;
    }
};

// The truth row (0-based) of the star whose S/N per exposure (in an aperture of 1.25 FWHM) is nearest
// `snr` among the isolated, unsaturated stars well inside the frame, and that S/N; -1 when none.
// `taken` rows are skipped.
std::pair<long, double> pickStar(const SimResult& r, const SimSeriesParams& s, double snr,
                                 const std::vector<long>& taken) {
    const SimParams& p = r.params;
    const auto x = r.truth.doubles("x"), y = r.truth.doubles("y"), flux = r.truth.doubles("flux"),
               fwhm = r.truth.doubles("fwhm"), gal = r.truth.doubles("is_galaxy");
    const double margin = 15.0 + 4.0 * s.jitter + 4.0 * p.fwhm;
    long best = -1;
    double bestDist = INFINITY, bestSnr = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (gal[i] != 0.0 || std::find(taken.begin(), taken.end(), static_cast<long>(i)) != taken.end())
            continue;
        if (x[i] < margin || y[i] < margin || x[i] > p.width - margin || y[i] > p.height - margin) continue;
        const double sigma = fwhm[i] / 2.3548, peak = 1.5 * flux[i] / (2.0 * kPi * sigma * sigma);
        if (p.saturation > 0.0 && peak + p.sky > 0.5 * p.saturation) continue;
        const double rAp = 1.25 * fwhm[i], npix = kPi * rAp * rAp;
        const double var = flux[i] / p.gain + npix * (p.sky / p.gain + std::pow(p.readNoise / p.gain, 2));
        const double d = std::fabs(std::log(flux[i] / std::sqrt(var) / snr));
        if (d >= bestDist) continue;
        bool isolated = true;
        for (std::size_t j = 0; j < x.size() && isolated; ++j)
            if (j != i && std::hypot(x[j] - x[i], y[j] - y[i]) < 8.0 * fwhm[i] && flux[j] > 0.01 * flux[i])
                isolated = false;
        if (isolated) {
            best = static_cast<long>(i);
            bestDist = d;
            bestSnr = flux[i] / std::sqrt(var);
        }
    }
    return {best, bestSnr};
}

nlohmann::json truthJson(const SimSeriesTruth& t) {
    nlohmann::json j;
    j["field"] = t.field;
    j["series"] = t.series;
    j["transit_mid_mjd"] = t.transitMidMjd;
    for (const auto& v : t.variables)
        j["variables"].push_back(
            {{"id", v.id}, {"kind", v.kind}, {"ra", v.ra}, {"dec", v.dec}, {"mag", v.mag}, {"snr", v.snr}});
    for (const auto& f : t.frames)
        j["frames"].push_back({{"file", f.file},
                               {"mjd_start", f.mjdStart},
                               {"mjd_mid", f.mjdMid},
                               {"airmass", f.airmass},
                               {"transparency", f.transparency},
                               {"fwhm", f.fwhm},
                               {"offset_x", f.offsetX},
                               {"offset_y", f.offsetY},
                               {"zero_point", f.zeroPoint},
                               {"colour_term", f.colourTerm},
                               {"scintillation", f.scintillation},
                               {"seed", f.seed},
                               {"dmag", f.dmag}});
    return j;
}

} // namespace

void validate(const SimSeriesParams& s) {
    require(s.frames >= 1 && s.frames <= 100000, "frames must be in [1, 100000]");
    require(s.cadence > 0.0, "cadence must be > 0 s");
    require(s.airmassStart >= 1.0 && s.airmassEnd >= 1.0, "airmasses must be >= 1");
    require(std::isfinite(s.colourExtinction), "colourExtinction must be finite");
    require(s.extinction >= 0.0 && s.transparency >= 0.0 && s.transparency < 1.0,
            "extinction must be >= 0 and "
            "transparency in [0, 1)");
    require(s.seeing >= 0.0 && s.seeing < 0.5 && s.jitter >= 0.0, "seeing must be in [0, 0.5), jitter >= 0");
    require(s.telescopeDiameter >= 0.0, "telescopeDiameter must be >= 0 m");
    require(s.transitDepth >= 0.0 && s.transitDepth < 1.0 && s.transitDuration > 0.0,
            "transitDepth must be in [0, 1) and transitDuration > 0 h");
    require(s.sineAmplitude >= 0.0 && s.sinePeriod > 0.0, "sineAmplitude must be >= 0 and sinePeriod > 0 h");
    require(s.transitSnr > 0.0 && s.sineSnr > 0.0, "transitSnr and sineSnr must be > 0");
}

void to_json(nlohmann::json& j, const SimSeriesParams& s) {
    j = nlohmann::json::object();
    visitFields(s, [&](const char* k, const auto& v) { j[k] = v; });
}

void from_json(const nlohmann::json& j, SimSeriesParams& s) {
    if (!j.is_object()) throw InvalidInput("series simulation: the parameters must be a JSON object");
    std::size_t used = 0;
    visitFields(s, [&](const char* k, auto& v) {
        if (!j.contains(k)) return;
        ++used;
        try {
            j.at(k).get_to(v);
        } catch (const nlohmann::json::exception&) {
            throw InvalidInput(std::string("series simulation: '") + k + "' has the wrong type");
        }
    });
    if (used != j.size())
        for (auto it = j.begin(); it != j.end(); ++it) {
            bool known = false;
            visitFields(s, [&](const char* k, auto&) { known = known || it.key() == k; });
            if (!known) throw InvalidInput("series simulation: unknown parameter '" + it.key() + "'");
        }
}

double youngScintillation(double diameterM, double airmass, double elevationM, double exptimeS) {
    if (!(diameterM > 0.0) || !(exptimeS > 0.0)) return 0.0;
    return 0.09 * std::pow(diameterM * 100.0, -2.0 / 3.0) * std::pow(airmass, 1.75) *
           std::exp(-elevationM / 8000.0) / std::sqrt(2.0 * exptimeS);
}

double transitDmag(const SimSeriesParams& s, double mjd, double midMjd) {
    if (s.transitDepth <= 0.0) return 0.0;
    const double half = 0.5 * s.transitDuration / 24.0, ramp = 0.1 * s.transitDuration / 24.0;
    const double d = std::fabs(mjd - midMjd);
    if (d >= half) return 0.0;
    const double shape = d <= half - ramp ? 1.0 : (half - d) / ramp;
    return -2.5 * std::log10(1.0 - s.transitDepth * shape);
}

double sineDmag(const SimSeriesParams& s, double mjd, double startMjd) {
    return s.sineAmplitude * std::sin(2.0 * kPi * (mjd - startMjd) * 24.0 / s.sinePeriod);
}

SimSeriesTruth writeSimulatedSeries(const SimParams& field, const SimSeriesParams& series,
                                    const std::string& dir, const std::string& name, int bitpix,
                                    RunContext* ctx, const std::function<void(int, int)>& progress) {
    validate(field);
    validate(series);
    SimSeriesTruth t;
    t.field = field;
    t.field.fieldSeed = fieldSeedOf(field);
    t.field.writeSite = true;
    t.series = series;
    const double day = 86400.0, start = field.mjd, halfExp = 0.5 * field.exptime / day;
    const double span = (series.frames - 1) * series.cadence / day;
    t.transitMidMjd = start + series.transitMid * span + halfExp;
    const Smooth clouds(t.field.fieldSeed, 101), seeing(t.field.fieldSeed, 102);
    sim::SimRng jitter(t.field.fieldSeed, 103);

    std::vector<long> rows; // truth rows of the variables (0-based)
    for (int i = 0; i < series.frames; ++i) {
        SimSeriesFrame f;
        char buf[32];
        std::snprintf(buf, sizeof buf, "_%04d", i + 1);
        f.file = name + buf + ".fits";
        f.mjdStart = start + i * series.cadence / day;
        f.mjdMid = f.mjdStart + halfExp;
        const double hours = (f.mjdStart - start) * 24.0,
                     frac = series.frames > 1 ? double(i) / (series.frames - 1) : 0.0;
        f.airmass = series.airmassStart + frac * (series.airmassEnd - series.airmassStart);
        f.transparency = 1.0 - series.transparency * 0.5 * (1.0 + clouds(hours));
        f.fwhm = field.fwhm * (1.0 + series.seeing * seeing(hours));
        f.offsetX = series.jitter * jitter.normal();
        f.offsetY = series.jitter * jitter.normal();
        f.zeroPoint =
            field.zeroPoint - series.extinction * (f.airmass - 1.0) + 2.5 * std::log10(f.transparency);
        f.scintillation =
            youngScintillation(series.telescopeDiameter, f.airmass, field.siteElevation, field.exptime);
        f.seed = field.seed + 7919ull * static_cast<std::uint64_t>(i + 1);
        f.colourTerm = field.colourTerm - series.colourExtinction * (f.airmass - 1.0);

        SimParams p = t.field;
        p.seed = f.seed;
        p.mjd = f.mjdStart;
        p.airmass = f.airmass;
        p.fwhm = f.fwhm;
        p.offsetX = f.offsetX;
        p.offsetY = f.offsetY;
        p.zeroPoint = f.zeroPoint;
        // m_inst = mag - zp - colourTerm * colour: a lower colour term dims the redder stars more.
        p.colourTerm = f.colourTerm;
        p.scintillation = f.scintillation;
        SimResult r = simulateField(p, ctx);
        if (i == 0) { // the variables are chosen on the first exposure
            const auto tr = series.transitDepth > 0.0 ? pickStar(r, series, series.transitSnr, rows)
                                                      : std::pair<long, double>{-1, 0.0};
            if (tr.first >= 0) rows.push_back(tr.first);
            const auto sn = series.sineAmplitude > 0.0 ? pickStar(r, series, series.sineSnr, rows)
                                                       : std::pair<long, double>{-1, 0.0};
            if (sn.first >= 0) rows.push_back(sn.first);
            const auto ra = r.truth.doubles("ra"), dec = r.truth.doubles("dec"), mag = r.truth.doubles("mag");
            for (long row : rows) // snr: the star's own at the first exposure
                t.variables.push_back({row + 1, row == tr.first ? "transit" : "sine", ra[row], dec[row],
                                       mag[row], row == tr.first ? tr.second : sn.second});
        }
        SimVariation var;
        for (const auto& v : t.variables) {
            var.ids.push_back(v.id);
            var.dmag.push_back(v.kind == "transit" ? transitDmag(series, f.mjdMid, t.transitMidMjd)
                                                   : sineDmag(series, f.mjdMid, start + halfExp));
        }
        f.dmag = var.dmag;
        if (std::any_of(var.dmag.begin(), var.dmag.end(), [](double d) { return d != 0.0; }))
            r = simulateField(p, ctx, &var);
        r.header.set("SIMSERIE", i + 1, "exposure number in the simulated series");
        writeSimulation(r, dir, name + buf, bitpix);
        t.frames.push_back(std::move(f));
        if (progress) progress(i + 1, series.frames);
    }
    const std::string json = truthJson(t).dump(1) + "\n";
    writeTextFileAtomic((std::filesystem::path(dir.empty() ? "." : dir) / (name + ".series.json")).string(),
                        json);
    return t;
}

} // namespace gpuphot
