// `series`: reading the catalogs, cross-identification, choosing the ensembles, the state an append
// continues from, and the curves (the ensemble arithmetic is in series_ensemble.cpp).
#include "core/series/series.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <numeric>
#include <unordered_map>

#include <fitsio.h>

#include "core/catalog/reference_catalog.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/model/flags.hpp"
#include "core/series/series_internal.hpp"
#include "core/sim/sim_series.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/util/robust_stats.hpp"
#include "core/wcs/tan_sip.hpp"

namespace gpuphot {

// A measurement with one of these flags does not enter an ensemble.
constexpr std::uint32_t kBadForComparison = FlagSaturated | FlagEdge | FlagApertureIncomplete |
                                            FlagBadPixels | FlagApertureMasked | FlagSkyFailed |
                                            FlagDeblendOverflow | FlagCrowded | FlagBlended;

bool SeriesMeasurement::comparable() const {
    return good() && (static_cast<std::uint32_t>(flags) & kBadForComparison) == 0;
}

namespace {

using namespace series_detail;

// Forced photometry in one frame (reduce --targets: STEM.targets.fits), for the frames where a target, or
// a listed source (a row named sourceTargetName(s)), was not detected.
struct Forced {
    std::vector<double> ra, dec;
    std::vector<Meas> m;
    std::unordered_map<std::string, std::size_t> byName; // the rows named after a listed source
    // The row named after listed source s, or none (forcedOf checks where it was measured).
    const std::size_t* rowOf(std::size_t s) const {
        if (byName.empty()) return nullptr;
        const auto it = byName.find(sourceTargetName(s));
        return it == byName.end() ? nullptr : &it->second;
    }
    // The measurement at the target given at (ra, dec) (the list's position, to 0.01"), or none.
    Meas at(double r, double d) const {
        for (std::size_t i = 0; i < ra.size(); ++i)
            if (std::fabs(dec[i] - d) < 3e-6 && std::fabs(ra[i] - r) * std::cos(d * kDeg) < 3e-6) return m[i];
        return Meas{};
    }
};

struct Detections { // one catalog's rows
    std::vector<double> ra, dec;
    std::vector<Meas> m;
    Forced forced;
};

constexpr std::int32_t kForcedFlag = 1 << 27; // a target's measurement from STEM.targets.fits

// STEM.targets.fits beside the catalog, when the series' flux is an aperture (the forced photometry
// has the catalog's apertures only); empty when there is none or it cannot be read.
Forced readForced(const std::string& catalog, const std::string& fluxCol, const std::string& errCol) {
    Forced f;
    const std::string suffix = ".cat.fits";
    if (fluxCol.rfind("flux_aper_", 0) != 0 || catalog.size() <= suffix.size() ||
        catalog.compare(catalog.size() - suffix.size(), suffix.size(), suffix) != 0)
        return f;
    const std::string path = catalog.substr(0, catalog.size() - suffix.size()) + ".targets.fits";
    if (FILE* probe = std::fopen(path.c_str(), "rb"))
        std::fclose(probe);
    else
        return f;
    try {
        const Table t = readFitsTable(path);
        if (!t.find(fluxCol) || !t.find(errCol) || !t.find("ra") || !t.find("dec")) return f;
        const auto flux = t.doubles(fluxCol), err = t.doubles(errCol), x = t.doubles("x"), y = t.doubles("y");
        const auto sky = t.find("sky") ? t.doubles("sky") : std::vector<double>(t.rows(), kNan);
        const auto flags = t.find("flags") ? t.doubles("flags") : std::vector<double>(t.rows(), 0.0);
        if (const auto* c = t.find("name"); c && std::holds_alternative<std::vector<std::string>>(c->data)) {
            const auto& names = std::get<std::vector<std::string>>(c->data);
            for (std::size_t i = 0; i < names.size(); ++i)
                if (names[i].rfind(kSourceTargetPrefix, 0) == 0) f.byName.emplace(names[i], i);
        }
        f.ra = t.doubles("ra");
        f.dec = t.doubles("dec");
        for (std::size_t i = 0; i < t.rows(); ++i) {
            const auto fl = static_cast<std::int32_t>(std::isfinite(flags[i]) ? flags[i] : 0.0);
            const bool off = fl & (1 << 24);
            f.m.push_back({off ? NAN : static_cast<float>(flux[i]), off ? NAN : static_cast<float>(err[i]),
                           static_cast<float>(x[i]), static_cast<float>(y[i]), static_cast<float>(sky[i]),
                           NAN, (fl & 0xffffff) | kForcedFlag});
        }
    } catch (const Error&) {
        return Forced{};
    }
    return f;
}

// Gnomonic projection about (ra0, dec0), in arcsec.
struct Tangent {
    // The projection (in arcsec) with the tangent point's sine and cosine kept: the matching's hot loop;
    // the inverse is core/wcs's tanDeproject.
    double ra0 = 0, dec0 = 0, sd0 = 0, cd0 = 1;
    Tangent() = default;
    Tangent(double ra, double dec)
        : ra0(ra), dec0(dec), sd0(std::sin(dec * kDeg)), cd0(std::cos(dec * kDeg)) {}
    void project(double ra, double dec, double& xi, double& eta) const {
        const double sd = std::sin(dec * kDeg), cd = std::cos(dec * kDeg), da = (ra - ra0) * kDeg;
        const double c = sd0 * sd + cd0 * cd * std::cos(da);
        xi = cd * std::sin(da) / c / kArcsec;
        eta = (cd0 * sd - sd0 * cd * std::cos(da)) / c / kArcsec;
    }
};

std::pair<std::string, std::string> fluxColumns(const std::string& flux) {
    if (flux == "opt" || flux == "psf" || flux == "auto") return {"flux_" + flux, "fluxerr_" + flux};
    if (flux.rfind("aper_", 0) == 0 && flux.size() > 5 &&
        std::all_of(flux.begin() + 5, flux.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return {"flux_" + flux, "fluxerr_" + flux};
    throw InvalidInput("series: flux '" + flux + "' is not opt, psf, auto or aper_K");
}

// Reads one catalog: its frame's facts and its detections. Problems that leave the frame out are
// returned in frame.problem (the series goes on).
Detections readCatalog(const std::string& path, const SeriesParams& p, SeriesFrame& frame) {
    Detections d;
    frame.path = path;
    const auto columns = fluxColumns(p.flux);
    const std::string fluxCol = columns.first, errCol = columns.second;
    Table t;
    try {
        t = readFitsTable(path, {}, [&](const std::vector<std::string>& have) {
            std::vector<std::string> want;
            for (const char* c : {"ra", "dec", "x", "y", "sky", "flags", "mag_cal"})
                if (std::find(have.begin(), have.end(), c) != have.end()) want.push_back(c);
            for (const std::string& c : {fluxCol, errCol})
                if (std::find(have.begin(), have.end(), c) != have.end()) want.push_back(c);
            return want;
        });
    } catch (const Error& e) {
        frame.problem = std::string("unreadable: ") + e.what();
        return d;
    }
    const Header& h = t.meta;
    frame.mjdMid = h.getDouble("MJD-MID").value_or(kNan);
    frame.exptime = h.getDouble("EXPTIME").value_or(kNan);
    frame.airmass = h.getDouble("AIRMASS").value_or(kNan);
    frame.fwhm = h.getDouble("FWHM").value_or(kNan);
    frame.zeroPoint = h.getDouble("ZP").value_or(kNan);
    frame.filter = h.getString("FILTER").value_or("");
    frame.object = h.getString("OBJECT").value_or("");
    frame.sourceFrame = h.getString("SRCFILE").value_or("");
    try {
        frame.site = siteFromHeader(h);
    } catch (const InvalidInput& e) {
        frame.problem = e.what();
        return d;
    }
    const std::string wcs = h.getString("WCSSRC").value_or("none");
    if (!t.find("ra") || !t.find("dec") || wcs == "none")
        frame.problem = "no WCS: positions on the sky unknown";
    else if (!std::isfinite(frame.mjdMid))
        frame.problem = "no MJD-MID: the time of the exposure is unknown";
    else if (!t.find(fluxCol) || !t.find(errCol))
        frame.problem = "no column " + fluxCol + " / " + errCol;
    if (!frame.problem.empty()) return d;

    d.ra = t.doubles("ra");
    d.dec = t.doubles("dec");
    const auto flux = t.doubles(fluxCol), err = t.doubles(errCol);
    const auto col = [&](const char* name) {
        return t.find(name) ? t.doubles(name) : std::vector<double>(t.rows(), kNan);
    };
    const auto x = col("x"), y = col("y"), sky = col("sky"), magCal = col("mag_cal"), flags = col("flags");
    d.m.resize(t.rows());
    for (std::size_t i = 0; i < t.rows(); ++i)
        d.m[i] = {static_cast<float>(flux[i]),
                  static_cast<float>(err[i]),
                  static_cast<float>(x[i]),
                  static_cast<float>(y[i]),
                  static_cast<float>(sky[i]),
                  static_cast<float>(magCal[i]),
                  std::isfinite(flags[i]) ? static_cast<std::int32_t>(flags[i]) : 0};
    frame.detections = t.rows();
    d.forced = readForced(path, fluxCol, errCol);
    return d;
}

// The source list on the sky, with a grid of matchRadius cells for the nearest-source search.
class SourceList {
public:
    SourceList(const Tangent& tp, double radius) : m_tp(tp), m_r(radius) {}
    // The list a state recorded.
    SourceList(const SeriesState& st, double radius) : m_tp(st.ra0, st.dec0), m_r(radius) {
        m_xi = st.xiSum;
        m_eta = st.etaSum;
        m_n = st.matched;
        m_grid.reserve(m_xi.size());
        for (std::size_t s = 0; s < m_xi.size(); ++s)
            m_grid[key(m_xi[s] / m_n[s], m_eta[s] / m_n[s])].push_back(s);
    }
    void save(SeriesState& st) const {
        st.ra0 = m_tp.ra0;
        st.dec0 = m_tp.dec0;
        st.xiSum = m_xi;
        st.etaSum = m_eta;
        st.matched = m_n;
    }
    // Tangent-plane position (arcsec) of source s.
    double xi(std::size_t s) const { return m_xi[s] / m_n[s]; }
    double eta(std::size_t s) const { return m_eta[s] / m_n[s]; }
    std::size_t size() const { return m_xi.size(); }

    // Matches one frame's detections one-to-one (the nearest source within the radius; a source claimed
    // twice keeps the nearer detection). Returns, per detection, the source or -1 (unmatched) or -2 (lost).
    std::vector<long> match(const Detections& d) const {
        std::vector<long> out(d.ra.size(), -1);
        std::vector<long> claimedBy(m_xi.size(), -1); // the detection holding each source, its distance
        std::vector<double> claimDist(m_xi.size());
        for (std::size_t i = 0; i < d.ra.size(); ++i) {
            if (!std::isfinite(d.ra[i]) || !std::isfinite(d.dec[i])) {
                out[i] = -2;
                continue;
            }
            double xi, eta;
            m_tp.project(d.ra[i], d.dec[i], xi, eta);
            long best = -1;
            double bestD = m_r;
            forNeighbours(xi, eta, [&](std::size_t s) {
                const double dd = std::hypot(m_xi[s] / m_n[s] - xi, m_eta[s] / m_n[s] - eta);
                if (dd < bestD) {
                    bestD = dd;
                    best = static_cast<long>(s);
                }
            });
            if (best < 0) continue;
            long& holder = claimedBy[static_cast<std::size_t>(best)];
            double& held = claimDist[static_cast<std::size_t>(best)];
            if (holder < 0 || bestD < held) {
                if (holder >= 0) out[static_cast<std::size_t>(holder)] = -2;
                holder = static_cast<long>(i);
                held = bestD;
                out[i] = best;
            } else
                out[i] = -2;
        }
        return out;
    }
    std::size_t add(double ra, double dec) {
        double xi, eta;
        m_tp.project(ra, dec, xi, eta);
        m_xi.push_back(0.0);
        m_eta.push_back(0.0);
        m_n.push_back(0);
        m_grid[key(xi, eta)].push_back(m_xi.size() - 1);
        update(m_xi.size() - 1, ra, dec);
        return m_xi.size() - 1;
    }
    void update(std::size_t s, double ra, double dec) { // running mean of the matched positions
        double xi, eta;
        m_tp.project(ra, dec, xi, eta);
        m_xi[s] += xi;
        m_eta[s] += eta;
        ++m_n[s];
    }
    // Mean position (deg) of source s.
    void position(std::size_t s, double& ra, double& dec) const {
        tanDeproject(m_tp.ra0, m_tp.dec0, m_xi[s] / m_n[s] / 3600.0, m_eta[s] / m_n[s] / 3600.0, ra, dec);
    }
    // The sources within `radius` arcsec of (ra, dec).
    std::vector<std::size_t> within(double ra, double dec, double radius) const {
        double xi, eta;
        m_tp.project(ra, dec, xi, eta);
        std::vector<std::size_t> out;
        const int reach = static_cast<int>(std::ceil(radius / m_r));
        for (int dy = -reach; dy <= reach; ++dy)
            for (int dx = -reach; dx <= reach; ++dx) {
                auto it = m_grid.find(key(xi + dx * m_r, eta + dy * m_r));
                if (it == m_grid.end()) continue;
                for (std::size_t s : it->second)
                    if (std::hypot(m_xi[s] / m_n[s] - xi, m_eta[s] / m_n[s] - eta) < radius) out.push_back(s);
            }
        return out;
    }

private:
    long long key(double xi, double eta) const {
        const long long ix = static_cast<long long>(std::floor(xi / m_r)),
                        iy = static_cast<long long>(std::floor(eta / m_r));
        return ix * 4000003LL + iy;
    }
    template <class F> void forNeighbours(double xi, double eta, F&& f) const {
        for (int dy = -1; dy <= 1; ++dy)
            for (int dx = -1; dx <= 1; ++dx) {
                auto it = m_grid.find(key(xi + dx * m_r, eta + dy * m_r));
                if (it != m_grid.end())
                    for (std::size_t s : it->second)
                        f(s);
            }
    }
    Tangent m_tp;
    double m_r;
    std::vector<double> m_xi, m_eta;
    std::vector<int> m_n;
    std::unordered_map<long long, std::vector<std::size_t>> m_grid;
};

double angularDistance(double ra1, double dec1, double ra2, double dec2) { // arcsec
    return angularSeparationDeg(ra1, dec1, ra2, dec2) * 3600.0;
}

// Reads the catalogs, in parallel where CFITSIO is reentrant.
std::vector<Detections> readAll(const std::vector<std::string>& catalogs, const SeriesParams& p,
                                std::vector<SeriesFrame>& frames, const SeriesProgress& progress) {
    std::vector<Detections> dets(catalogs.size());
    frames.assign(catalogs.size(), SeriesFrame{});
    std::size_t done = 0;
    const int threads = fits_is_reentrant() && catalogs.size() > 1 ? 2 : 1;
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (std::size_t i = 0; i < catalogs.size(); ++i)
        errors.run([&] {
            dets[i] = readCatalog(catalogs[i], p, frames[i]);
#pragma omp critical(series_progress)
            if (progress) progress(++done, catalogs.size());
        });
    errors.rethrow();
    return dets;
}

std::vector<std::size_t> timeOrder(const std::vector<SeriesFrame>& frames) {
    std::vector<std::size_t> order(frames.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
        const double tx = frames[x].mjdMid, ty = frames[y].mjdMid;
        return std::isfinite(tx) && (!std::isfinite(ty) || tx < ty);
    });
    return order;
}

// Matches frame f into the list (adding its new sources) unless it is of another filter or field; then
// returns, per source, the detection matched to it (-1: none). Empty when the frame is left out.
std::vector<long> crossIdentify(SourceList& list, const Detections& d, SeriesFrame& f, std::string& filter,
                                bool first, const SeriesParams& p) {
    if (filter.empty()) filter = f.filter;
    if (f.filter != filter) {
        f.problem = "filter '" + f.filter + "', not the series' '" + filter + "'";
        return {};
    }
    const std::vector<long> m = list.match(d);
    f.matched = static_cast<std::size_t>(std::count_if(m.begin(), m.end(), [](long v) { return v >= 0; }));
    if (!first && f.detections > 0 && double(f.matched) < p.minFieldMatch * double(f.detections)) {
        f.problem = "another field: " + std::to_string(f.matched) + " of " + std::to_string(f.detections) +
                    " detections match the series' sources";
        return {};
    }
    std::vector<long> detOf(list.size(), -1);
    for (std::size_t k = 0; k < m.size(); ++k) {
        long s = m[k];
        if (s == -2) continue;
        if (s == -1)
            s = static_cast<long>(list.add(d.ra[k], d.dec[k]));
        else
            list.update(static_cast<std::size_t>(s), d.ra[k], d.dec[k]);
        if (static_cast<std::size_t>(s) >= detOf.size()) detOf.resize(static_cast<std::size_t>(s) + 1, -1);
        detOf[static_cast<std::size_t>(s)] = static_cast<long>(k);
    }
    f.used = true;
    return detOf;
}

ObserverEphemeris observerOf(const SeriesFrame& f, const SeriesParams& p) {
    const ObservingSite* site = p.site ? &*p.site : f.site ? &*f.site : nullptr;
    return observerAt(f.mjdMid, site);
}

double scintillationOf(const SeriesFrame& f, const SeriesParams& p) {
    const ObservingSite* site = p.site ? &*p.site : f.site ? &*f.site : nullptr;
    const double s = youngScintillation(p.telescopeDiameter, std::isfinite(f.airmass) ? f.airmass : 1.0,
                                        site ? site->elevation : 0.0, f.exptime);
    return std::isfinite(s) ? s : 0.0;
}

// The whole series in memory: meas[u][s] for used frame u (time order) and source s.
struct Assembly {
    std::vector<SeriesFrame> frames; // time order
    std::vector<std::size_t> used;
    std::vector<std::vector<Meas>> meas;
    std::vector<Forced> forced; // per used frame
    std::unique_ptr<SourceList> list;
    std::string filter;
    const Meas& at(std::size_t u, std::size_t s) const {
        static const Meas missing{};
        return s < meas[u].size() ? meas[u][s] : missing;
    }
    std::vector<Meas> column(std::size_t s) const {
        std::vector<Meas> c(meas.size());
        for (std::size_t u = 0; u < meas.size(); ++u)
            c[u] = at(u, s);
        return c;
    }
};

// Unit vector of the median detection position of each usable frame of the series' filter; returns the
// frame nearest their mean (the first in time order among equals), -1 when none is usable.
long seedFrame(const std::vector<SeriesFrame>& frames, const std::vector<Detections>& dets,
               const std::vector<std::size_t>& order, const std::string& filter) {
    std::string want = filter;
    std::vector<std::array<double, 3>> centre(frames.size());
    std::array<double, 3> mean{0, 0, 0};
    std::vector<std::size_t> usable;
    for (std::size_t i : order) {
        if (!frames[i].problem.empty() || dets[i].ra.empty()) continue;
        if (want.empty()) want = frames[i].filter;
        if (frames[i].filter != want) continue;
        std::vector<double> ra(dets[i].ra), dec(dets[i].dec);
        const double r = robustMedian(ra) * kDeg, d = robustMedian(dec) * kDeg;
        centre[i] = {std::cos(d) * std::cos(r), std::cos(d) * std::sin(r), std::sin(d)};
        for (int k = 0; k < 3; ++k)
            mean[k] += centre[i][k];
        usable.push_back(i);
    }
    long best = -1;
    double bestDot = -2.0;
    for (std::size_t i : usable) {
        const double dot = centre[i][0] * mean[0] + centre[i][1] * mean[1] + centre[i][2] * mean[2];
        if (dot > bestDot * (1.0 + 1e-12) + 1e-300) {
            bestDot = dot;
            best = static_cast<long>(i);
        }
    }
    return best;
}

// Puts the frames in time order (the seed frame was processed first), keeping `used` consistent.
void sortByTime(Assembly& a) {
    const std::vector<std::size_t> order = timeOrder(a.frames);
    std::vector<std::size_t> rank(order.size());
    for (std::size_t k = 0; k < order.size(); ++k)
        rank[order[k]] = k;
    std::vector<SeriesFrame> frames;
    for (std::size_t i : order)
        frames.push_back(std::move(a.frames[i]));
    a.frames = std::move(frames);
    std::vector<std::size_t> uorder(a.used.size());
    std::iota(uorder.begin(), uorder.end(), 0);
    std::sort(uorder.begin(), uorder.end(),
              [&](std::size_t x, std::size_t y) { return rank[a.used[x]] < rank[a.used[y]]; });
    std::vector<std::size_t> used;
    std::vector<std::vector<Meas>> meas;
    std::vector<Forced> forced;
    for (std::size_t k : uorder) {
        used.push_back(rank[a.used[k]]);
        meas.push_back(std::move(a.meas[k]));
        forced.push_back(std::move(a.forced[k]));
    }
    a.used = std::move(used);
    a.meas = std::move(meas);
    a.forced = std::move(forced);
}

// The forced measurement of listed source s in one frame, or none: the row of its name, if it was measured
// within `radius` arcsec of the source (a list rebuilt from other catalogs may number its sources otherwise).
Meas forcedOf(const Forced& f, const SourceList& list, std::size_t s, double radius) {
    const std::size_t* i = f.rowOf(s);
    if (!i) return Meas{};
    double ra, dec;
    list.position(s, ra, dec);
    return angularSeparationDeg(f.ra[*i], f.dec[*i], ra, dec) * 3600.0 < radius ? f.m[*i] : Meas{};
}

// Listed sources not detected in a frame take its forced photometry where reduce --targets measured them.
void fillForced(Assembly& a, double radius) {
    if (!a.list) return;
    const std::size_t ns = a.list->size();
    for (std::size_t u = 0; u < a.meas.size(); ++u) {
        if (a.forced[u].byName.empty()) continue;
        a.meas[u].resize(ns);
        for (std::size_t s = 0; s < ns; ++s)
            if (!a.meas[u][s].good()) a.meas[u][s] = forcedOf(a.forced[u], *a.list, s, radius);
    }
}

Assembly assemble(const std::vector<std::string>& catalogs, const SeriesParams& p,
                  const SeriesProgress& progress) {
    Assembly a;
    std::vector<SeriesFrame> frames;
    std::vector<Detections> dets = readAll(catalogs, p, frames, progress);
    a.filter = p.filter;
    // The series' field is the one most frames point at: the frame nearest the mean pointing starts the
    // source list, so that a stray frame is the one left out even when it comes first.
    std::vector<std::size_t> order = timeOrder(frames);
    if (const long seed = seedFrame(frames, dets, order, p.filter); seed >= 0) {
        order.erase(std::find(order.begin(), order.end(), static_cast<std::size_t>(seed)));
        order.insert(order.begin(), static_cast<std::size_t>(seed));
    }
    for (std::size_t i : order) {
        SeriesFrame& f = frames[i];
        const Detections& d = dets[i];
        if (f.problem.empty()) {
            if (!a.list) {
                std::vector<double> ra(d.ra), dec(d.dec);
                a.list =
                    std::make_unique<SourceList>(Tangent(robustMedian(ra), robustMedian(dec)), p.matchRadius);
            }
            const std::vector<long> detOf = crossIdentify(*a.list, d, f, a.filter, a.meas.empty(), p);
            if (f.used) {
                std::vector<Meas> row(detOf.size());
                for (std::size_t s = 0; s < detOf.size(); ++s)
                    if (detOf[s] >= 0) row[s] = d.m[static_cast<std::size_t>(detOf[s])];
                a.used.push_back(a.frames.size());
                a.meas.push_back(std::move(row));
                a.forced.push_back(std::move(dets[i].forced));
            }
        }
        a.frames.push_back(std::move(f));
        dets[i] = Detections{};
    }
    sortByTime(a);
    fillForced(a, p.matchRadius);
    return a;
}

std::vector<SeriesSource> sourceStats(const Assembly& a, SeriesState& st) {
    const std::size_t ns = a.list->size();
    std::vector<SeriesSource> out(ns);
    std::vector<std::vector<double>> flux(ns), mag(ns);
    for (const auto& row : a.meas)
        for (std::size_t s = 0; s < row.size(); ++s) {
            if (!row[s].good() || (row[s].flags & kForcedFlag)) continue; // detections only
            flux[s].push_back(row[s].flux);
            if (std::isfinite(row[s].magCal)) mag[s].push_back(row[s].magCal);
        }
    for (std::size_t s = 0; s < ns; ++s) {
        a.list->position(s, out[s].ra, out[s].dec);
        out[s].frames = static_cast<int>(flux[s].size());
        out[s].medianFlux = robustMedian(flux[s]);
        out[s].medianMagCal = robustMedian(mag[s]);
        st.medianFlux.push_back(out[s].medianFlux);
        st.medianMagCal.push_back(out[s].medianMagCal);
    }
    return out;
}

// Colours of the sources from the reference catalog: the nearest reference star within the match
// radius of each. Returns the sources that got one.
std::size_t assignColours(const SeriesParams& p, const SourceList& list, std::vector<SeriesSource>& src) {
    if (p.reference.empty()) return 0;
    const ReferenceCatalog ref = readReferenceCatalog(p.reference, parseRefColumnMap(p.referenceColumns));
    std::vector<double> best(src.size(), INFINITY);
    std::size_t n = 0;
    for (std::size_t r = 0; r < ref.size(); ++r) {
        if (!std::isfinite(ref.color[r])) continue;
        for (std::size_t s : list.within(ref.ra[r], ref.dec[r], p.matchRadius)) {
            const double d = angularDistance(ref.ra[r], ref.dec[r], src[s].ra, src[s].dec);
            if (d >= best[s]) continue;
            n += std::isfinite(src[s].colour) ? 0 : 1;
            best[s] = d;
            src[s].colour = ref.color[r];
        }
    }
    return n;
}

long sourceNear(const SourceList& list, const std::vector<SeriesSource>& src, double ra, double dec,
                double r) {
    long best = -1;
    double bestD = r;
    for (std::size_t s : list.within(ra, dec, r)) {
        const double d = angularDistance(ra, dec, src[s].ra, src[s].dec);
        if (d < bestD) {
            bestD = d;
            best = static_cast<long>(s);
        }
    }
    return best;
}

// Which sources may be comparison stars: measured in minCoverage of the frames, isolated, not a
// target, not excluded, and not variable against the field (prevet).
struct Pool {
    std::vector<char> eligible;
    std::vector<Normalised> norm; // per source, filled for the eligible ones
    std::vector<double> magnitude, colour;
    std::size_t variables = 0;
};

Pool comparisonPool(const Assembly& a, const std::vector<SeriesSource>& src, const std::vector<char>& banned,
                    const std::vector<double>& scint, const SeriesParams& p) {
    const std::size_t ns = src.size(), nu = a.meas.size();
    Pool pool{std::vector<char>(ns, 0), std::vector<Normalised>(ns), std::vector<double>(ns, kNan),
              std::vector<double>(ns, kNan), 0};
    for (std::size_t s = 0; s < ns; ++s)
        pool.colour[s] = src[s].colour;
    std::vector<int> good(ns, 0);
    for (const auto& row : a.meas)
        for (std::size_t s = 0; s < row.size(); ++s)
            good[s] += row[s].comparable() ? 1 : 0;
    for (std::size_t s = 0; s < ns; ++s) {
        pool.magnitude[s] = -2.5 * std::log10(src[s].medianFlux);
        pool.eligible[s] = !banned[s] && double(good[s]) >= p.minCoverage * double(nu) ? 1 : 0;
    }
    if (p.isolation > 0.0)
        for (std::size_t s = 0; s < ns; ++s) {
            if (!pool.eligible[s]) continue;
            for (std::size_t o : a.list->within(src[s].ra, src[s].dec, p.isolation))
                if (o != s && src[o].medianFlux > 0.1 * src[s].medianFlux) pool.eligible[s] = 0;
        }
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 64) num_threads(2)
    for (std::size_t s = 0; s < ns; ++s)
        errors.run([&] {
            if (pool.eligible[s]) pool.norm[s] = normalise(a.column(s));
        });
    errors.rethrow();
    pool.variables = prevet(pool.norm, pool.magnitude, pool.eligible, scint, p);
    return pool;
}

// The ensemble's candidates for target source t: pinned stars, then the nearest eligible stars within
// maxMagDiff (and maxColourDiff of its colour when known); when too few, the nearest in magnitude and
// colour make up the number.
std::vector<EnsembleStar> candidates(const Pool& pool, const SourceList& list, std::size_t t,
                                     const std::vector<long>& pinned, const SeriesParams& p) {
    std::vector<EnsembleStar> ens;
    for (long s : pinned)
        if (s >= 0 && static_cast<std::size_t>(s) != t)
            ens.push_back({static_cast<std::size_t>(s), 0, 0, 0, false, "pinned"});
    const double tMag = pool.magnitude[t], tColour = pool.colour[t], tx = list.xi(t), ty = list.eta(t);
    struct Cand {
        double key;
        std::size_t s;
    };
    std::vector<Cand> near, far;
    for (std::size_t s = 0; s < pool.eligible.size(); ++s) {
        if (s == t || !pool.eligible[s]) continue;
        const double dmag = std::fabs(pool.magnitude[s] - tMag);
        // With the target's colour known, a comparison of unknown colour counts as 1 mag off.
        const double dcol = std::isfinite(tColour)
                                ? std::isfinite(pool.colour[s]) ? std::fabs(pool.colour[s] - tColour) : 1.0
                                : 0.0;
        if (dmag <= p.maxMagDiff && dcol <= p.maxColourDiff)
            near.push_back({std::hypot(list.xi(s) - tx, list.eta(s) - ty), s});
        else
            far.push_back({dmag + dcol, s});
    }
    const auto take = [&](std::vector<Cand>& group, const char* why) {
        const std::size_t room =
            static_cast<std::size_t>(p.ensembleSize) - std::min(ens.size(), std::size_t(p.ensembleSize));
        const std::size_t n = std::min(room + pinned.size(), group.size());
        std::partial_sort(
            group.begin(), group.begin() + static_cast<long>(n), group.end(),
            [](const Cand& x, const Cand& y) { return x.key < y.key || (x.key == y.key && x.s < y.s); });
        for (std::size_t k = 0; k < n && ens.size() < static_cast<std::size_t>(p.ensembleSize); ++k)
            if (std::none_of(ens.begin(), ens.end(),
                             [&](const EnsembleStar& e) { return e.source == group[k].s; }))
                ens.push_back({group[k].s, 0, 0, 0, false, why});
    };
    take(near, "");
    take(far, "beyond maxMagDiff or maxColourDiff");
    return ens;
}

// The target's curve from its columns in the state.
LightCurve curveFromState(const SeriesState& st, std::size_t k, const TargetList& targets,
                          const std::vector<SeriesSource>& sources, const std::vector<double>& scint,
                          const SeriesParams& p) {
    LightCurve lc;
    lc.name = targets.name[k];
    lc.ra = targets.ra[k];
    lc.dec = targets.dec[k];
    const SeriesState::Target& tg = st.targets[k];
    if (tg.sources.empty()) {
        lc.problem = "not detected in any frame of the series (off the field?)";
        return lc;
    }
    lc.source = static_cast<long>(tg.sources[0]);
    const std::size_t nu = st.used.size(), nk = tg.sources.size();
    if (nk - 1 < static_cast<std::size_t>(p.minEnsemble)) {
        lc.problem = "only " + std::to_string(nk - 1) + " suitable comparison stars";
        return lc;
    }
    std::vector<Normalised> norm(nk - 1);
    std::vector<const Normalised*> ptr;
    std::vector<Meas> col(nu);
    for (std::size_t j = 1; j < nk; ++j) {
        for (std::size_t u = 0; u < nu; ++u)
            col[u] = tg.meas[u][j];
        norm[j - 1] = normalise(col);
        ptr.push_back(&norm[j - 1]);
        lc.ensemble.push_back({tg.sources[j], 0, 0, 0, false, tg.notes[j]});
    }
    vet(ptr, lc.ensemble, scint, p);
    const EnsembleFlux ens = combine(ptr, lc.ensemble, scint);
    for (std::size_t u = 0; u < nu; ++u)
        col[u] = tg.meas[u][0];
    const Relative rel = relativeFlux(col, ens, scint);
    const double magCal = sources[lc.source].medianMagCal;
    for (std::size_t u = 0; u < nu; ++u) {
        const Meas& m = col[u];
        const SeriesFrame& f = st.frames[st.used[u]];
        const ObservationTimes tm = towards(st.observers[u], lc.ra, lc.dec);
        lc.frame.push_back(st.used[u]);
        lc.jdUtc.push_back(tm.jdUtc);
        lc.bjdTdb.push_back(tm.bjdTdb);
        lc.hjdUtc.push_back(tm.hjdUtc);
        lc.airmass.push_back(f.airmass);
        lc.exptime.push_back(f.exptime);
        lc.fwhm.push_back(f.fwhm);
        lc.flux.push_back(m.flux);
        lc.fluxErr.push_back(m.err);
        lc.x.push_back(m.x);
        lc.y.push_back(m.y);
        lc.sky.push_back(m.sky);
        lc.flags.push_back(m.flags);
        lc.detected.push_back(m.good() && !(m.flags & kForcedFlag) ? 1 : 0);
        lc.nComparison.push_back(ens.n[u]);
        lc.ensembleFlux.push_back(ens.flux[u]);
        lc.ensembleErr.push_back(ens.err[u]);
        const double r = rel.ratio[u], e = rel.err[u];
        lc.relFlux.push_back(r);
        lc.relFluxErr.push_back(e);
        lc.diffMag.push_back(-2.5 * std::log10(r));
        lc.diffMagErr.push_back(1.0857362047581294 * e / r);
        lc.mag.push_back(magCal + lc.diffMag.back());
        lc.magErr.push_back(lc.diffMagErr.back());
    }
    lc.rms = rel.rms;
    lc.medianErr = rel.medianErr;
    return lc;
}

std::vector<SeriesSource> sourcesOf(const SeriesState& st, const SourceList& list) {
    std::vector<SeriesSource> out(st.xiSum.size());
    constexpr std::size_t kBlock = 1024;
    forEachShared((out.size() + kBlock - 1) / kBlock, 2, [&](std::size_t b) {
        for (std::size_t s = b * kBlock; s < std::min(out.size(), (b + 1) * kBlock); ++s) {
            list.position(s, out[s].ra, out[s].dec);
            out[s].frames = st.matched[s];
            out[s].medianFlux = s < st.medianFlux.size() ? st.medianFlux[s] : kNan;
            out[s].medianMagCal = s < st.medianMagCal.size() ? st.medianMagCal[s] : kNan;
        }
    });
    return out;
}

// The peak of the periodogram of a curve into period, power and false alarm; the reason when there is none
// (a series too short for the period range).
std::string periodogramPeak(const std::vector<double>& time, const std::vector<double>& value,
                            const std::vector<double>& err, const VariabilityParams& p, double& period,
                            double& power, double& falseAlarm) {
    try {
        const Periodogram pg = lombScargle(time, value, err, p);
        period = pg.bestPeriod;
        power = pg.bestPower;
        falseAlarm = pg.falseAlarm;
        return "";
    } catch (const InvalidInput& e) {
        return e.what();
    }
}

// A target's curve detrended (params.detrend), its variability indices and flag, with findVariables its
// periodogram's peak, with fitTransits its transit. Returns a warning ("" when none).
std::string analyseCurve(LightCurve& lc, const SeriesParams& p) {
    if (!lc.problem.empty()) return "";
    if (!p.detrend.empty()) lc.detrendFit = detrend(lc, p.detrend);
    lc.stetsonJ = stetsonJ(lc.relFlux, lc.relFluxErr);
    lc.chi2 = chi2Constant(lc.relFlux, lc.relFluxErr);
    lc.variable = isVariable(lc.stetsonJ, lc.chi2, p.variability);
    std::string why;
    if (p.findVariables)
        why = periodogramPeak(lc.bjdTdb, lc.relFlux, lc.relFluxErr, p.variability, lc.bestPeriod,
                              lc.bestPower, lc.falseAlarm);
    if (!p.detrend.empty() && lc.detrendFit.points == 0)
        why += std::string(why.empty() ? "" : "; ") + "too few points to detrend";
    if (p.fitTransits) {
        try {
            lc.transit = fitTransit(lc.bjdTdb, lc.relFlux, lc.relFluxErr, p.transit);
        } catch (const InvalidInput& e) {
            why += std::string(why.empty() ? "" : "; ") + e.what();
        }
    }
    return why;
}

// The result's curves, frames and warnings from a state.
void finish(SeriesResult& r, const TargetList& targets, const SeriesParams& p) {
    const SeriesState& st = r.state;
    r.frames = st.frames;
    r.used = st.used;
    r.observers = st.observers;
    r.filter = st.filter;
    std::vector<double> scint;
    bool noSite = false;
    for (std::size_t i : st.used) {
        scint.push_back(scintillationOf(st.frames[i], p));
        noSite = noSite || !(p.site || st.frames[i].site);
    }
    if (noSite)
        r.warnings.push_back(
            "no observatory (SITELAT/SITELONG, OBSGEO-* or --site) for some frames: their BJD is "
            "geocentric (up to 21 ms off)");
    // The targets' curves are independent: two at a time, their warnings in target-list order.
    r.curves.assign(targets.size(), LightCurve{});
    std::vector<std::string> why(targets.size());
    forEachShared(targets.size(), 2, [&](std::size_t k) {
        r.curves[k] = curveFromState(st, k, targets, r.sources, scint, p);
        why[k] = analyseCurve(r.curves[k], p);
    });
    for (std::size_t k = 0; k < targets.size(); ++k) {
        const LightCurve& lc = r.curves[k];
        if (!lc.problem.empty()) r.warnings.push_back("target " + lc.name + ": " + lc.problem);
        if (!why[k].empty()) r.warnings.push_back("target " + lc.name + ": " + why[k]);
    }
}

// Source sc.source's curve against its own ensemble from the pool, with its variability indices and flag.
void starCurve(StarCurve& sc, const Assembly& a, const Pool& pool, const std::vector<long>& pinned,
               const std::vector<double>& scint, const SeriesParams& p) {
    std::vector<EnsembleStar> ens = candidates(pool, *a.list, sc.source, pinned, p);
    std::vector<Normalised> own; // pinned stars outside the pool
    own.reserve(ens.size());
    std::vector<const Normalised*> ptr;
    for (const auto& e : ens)
        ptr.push_back(pool.norm[e.source].c.empty() ? &own.emplace_back(normalise(a.column(e.source)))
                                                    : &pool.norm[e.source]);
    if (ens.size() < static_cast<std::size_t>(p.minEnsemble)) return;
    vet(ptr, ens, scint, p);
    const Relative rel = relativeFlux(a.column(sc.source), combine(ptr, ens, scint), scint);
    for (const auto& e : ens)
        sc.comparisons += e.dropped ? 0 : 1;
    sc.points = rel.points;
    sc.rms = rel.rms;
    sc.medianErr = rel.medianErr;
    sc.chi2 = rel.chi2;
    sc.stetsonJ = stetsonJ(rel.ratio, rel.err);
    sc.variable = isVariable(sc.stetsonJ, sc.chi2, p.variability);
    sc.relFlux.assign(rel.ratio.begin(), rel.ratio.end());
    sc.relFluxErr.assign(rel.err.begin(), rel.err.end());
}

// Every well-covered source's curve against its own ensemble (params.allStars).
std::vector<StarCurve> allStarCurves(const Assembly& a, const Pool& pool,
                                     const std::vector<SeriesSource>& src, const std::vector<long>& pinned,
                                     const std::vector<double>& scint, const SeriesParams& p) {
    const std::size_t ns = src.size(), nu = a.meas.size();
    std::vector<std::size_t> stars;
    for (std::size_t s = 0; s < ns; ++s)
        if (double(src[s].frames) >= p.minCoverage * double(nu)) stars.push_back(s);
    std::vector<StarCurve> out(stars.size());
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 16) num_threads(2)
    for (std::size_t i = 0; i < stars.size(); ++i)
        errors.run([&] {
            out[i].source = stars[i];
            starCurve(out[i], a, pool, pinned, scint, p);
        });
    errors.rethrow();
    return out;
}

// params.allStars with findVariables: the stars their own curves flag leave the pool, and every star's
// curve is made again without them (a star flagged once stays flagged); then the flagged stars'
// periodograms.
void banVariableStars(SeriesResult& r, const Assembly& a, Pool& pool, const std::vector<long>& pinned,
                      const std::vector<double>& scint, const SeriesParams& p) {
    std::vector<char> flagged(pool.eligible.size(), 0);
    std::size_t banned = 0;
    for (const StarCurve& c : r.stars)
        if (c.variable) {
            flagged[c.source] = 1;
            banned += pool.eligible[c.source] ? 1 : 0;
            pool.eligible[c.source] = 0;
        }
    if (banned > 0) r.stars = allStarCurves(a, pool, r.sources, pinned, scint, p);
    std::vector<double> time;
    for (std::size_t i : a.used)
        time.push_back(a.frames[i].mjdMid);
    std::vector<double> value, err;
    for (StarCurve& c : r.stars) {
        c.variable = c.variable || flagged[c.source];
        if (!c.variable || c.relFlux.empty()) continue;
        value.assign(c.relFlux.begin(), c.relFlux.end());
        err.assign(c.relFluxErr.begin(), c.relFluxErr.end());
        double power;
        periodogramPeak(time, value, err, p.variability, c.bestPeriod, power, c.falseAlarm);
    }
}

// Each target's candidates from the pool (tSource[k]: its source, -1: none) and their measurements in
// every used frame into the state (an empty row per frame for a target off the field, so that an
// append inserts its rows where it inserts the others').
void targetsIntoState(SeriesState& st, const Assembly& a, const Pool& pool, const std::vector<long>& tSource,
                      const std::vector<long>& pinned, const TargetList& targets,
                      const SeriesParams& params) {
    st.targets.resize(targets.size());
    for (std::size_t k = 0; k < targets.size(); ++k) {
        st.targets[k].meas.resize(a.meas.size()); // a row per used frame (empty off the field), as loaded
        if (tSource[k] < 0) continue;
        const std::size_t t = static_cast<std::size_t>(tSource[k]);
        SeriesState::Target& tg = st.targets[k];
        tg.sources = {t};
        tg.notes = {"target"};
        for (const auto& e : candidates(pool, *a.list, t, pinned, params)) {
            tg.sources.push_back(e.source);
            tg.notes.push_back(e.why);
        }
        for (std::size_t u = 0; u < a.meas.size(); ++u) {
            for (std::size_t s : tg.sources)
                tg.meas[u].push_back(a.at(u, s));
            if (!tg.meas[u][0].good()) tg.meas[u][0] = a.forced[u].at(targets.ra[k], targets.dec[k]);
        }
    }
}

} // namespace

void validate(const SeriesParams& p) {
    auto require = [](bool ok, const std::string& what) {
        if (!ok) throw InvalidInput("series: " + what);
    };
    (void)fluxColumns(p.flux);
    require(p.matchRadius > 0.0 && p.matchRadius <= 60.0, "matchRadius must be in (0, 60] arcsec");
    require(p.minFieldMatch >= 0.0 && p.minFieldMatch <= 1.0, "minFieldMatch must be in [0, 1]");
    require(p.minCoverage > 0.0 && p.minCoverage <= 1.0, "minCoverage must be in (0, 1]");
    require(p.isolation >= 0.0 && p.maxMagDiff > 0.0 && p.maxColourDiff > 0.0,
            "isolation must be >= 0, maxMagDiff and maxColourDiff > 0");
    require(p.ensembleSize >= 1 && p.minEnsemble >= 1 && p.minEnsemble <= p.ensembleSize,
            "ensembleSize and minEnsemble must be >= 1 with minEnsemble <= ensembleSize");
    require(p.vetRatio > 1.0 && p.clipSigma > 1.0 && p.vetIterations >= 0,
            "vetRatio and clipSigma must be > 1, vetIterations >= 0");
    require(p.telescopeDiameter >= 0.0, "telescopeDiameter must be >= 0 m");
    for (const auto& t : p.detrend)
        require(std::find(detrendTerms().begin(), detrendTerms().end(), t) != detrendTerms().end(),
                "unknown detrend term '" + t + "' (airmass, fwhm, sky, x, y, time)");
    const VariabilityParams& v = p.variability;
    require(std::isfinite(v.stetsonJ) && v.chi2 > 0.0, "the Stetson J bar must be finite, the chi^2 bar > 0");
    require(v.minPeriod > 0.0 && v.maxPeriod >= 0.0 && (v.maxPeriod == 0.0 || v.maxPeriod > v.minPeriod),
            "minPeriod must be > 0 d and maxPeriod 0 or > minPeriod");
    require(v.oversample >= 1 && v.oversample <= 1000, "oversample must be in [1, 1000]");
    const TransitSearch& t = p.transit;
    require(std::isfinite(t.minDuration) && t.minDuration > 0.0 && std::isfinite(t.maxDuration) &&
                (t.maxDuration == 0.0 || t.maxDuration >= t.minDuration),
            "the transit's minDuration must be > 0 d and maxDuration 0 or >= minDuration");
    require(std::isfinite(t.minSnr) && t.minSnr >= 0.0, "the transit's minSnr must be >= 0");
}

nlohmann::json toJson(const SeriesParams& p) {
    nlohmann::json j = {{"flux", p.flux},
                        {"matchRadius", p.matchRadius},
                        {"minFieldMatch", p.minFieldMatch},
                        {"filter", p.filter},
                        {"minCoverage", p.minCoverage},
                        {"isolation", p.isolation},
                        {"maxMagDiff", p.maxMagDiff},
                        {"reference", p.reference},
                        {"referenceColumns", p.referenceColumns},
                        {"maxColourDiff", p.maxColourDiff},
                        {"ensembleSize", p.ensembleSize},
                        {"minEnsemble", p.minEnsemble},
                        {"vetRatio", p.vetRatio},
                        {"telescopeDiameter", p.telescopeDiameter},
                        {"pinned", p.pinned},
                        {"excluded", p.excluded},
                        {"allStars", p.allStars},
                        {"vetIterations", p.vetIterations},
                        {"clipSigma", p.clipSigma},
                        {"detrend", p.detrend},
                        {"findVariables", p.findVariables}};
    const VariabilityParams& v = p.variability;
    j["variability"] = {{"stetsonJ", v.stetsonJ},
                        {"chi2", v.chi2},
                        {"minPeriod", v.minPeriod},
                        {"maxPeriod", v.maxPeriod},
                        {"oversample", v.oversample}};
    j["fitTransits"] = p.fitTransits;
    j["transit"] = {{"minDuration", p.transit.minDuration},
                    {"maxDuration", p.transit.maxDuration},
                    {"minSnr", p.transit.minSnr}};
    j["site"] =
        p.site ? nlohmann::json{p.site->latitude, p.site->longitude, p.site->elevation} : nlohmann::json();
    return j;
}

std::string sourceTargetName(std::size_t s) {
    return kSourceTargetPrefix + std::to_string(s + 1);
}

void writeSourceTargets(const SeriesState& state, const TargetList& targets, const std::string& path) {
    std::vector<std::string> name = targets.name;
    std::vector<double> ra = targets.ra, dec = targets.dec;
    const SourceList list(state, 1.0);
    for (std::size_t s = 0; s < list.size(); ++s) {
        double r, d;
        list.position(s, r, d);
        name.push_back(sourceTargetName(s));
        ra.push_back(r);
        dec.push_back(d);
    }
    Table t;
    t.add("name", std::move(name));
    t.add("ra", std::move(ra), "deg");
    t.add("dec", std::move(dec), "deg");
    writeCsv(path, t);
}

std::string seriesFingerprint(const TargetList& targets, const SeriesParams& params) {
    nlohmann::json j = {
        {"params", toJson(params)}, {"names", targets.name}, {"ra", targets.ra}, {"dec", targets.dec}};
    return j.dump();
}

SeriesResult buildSeries(const std::vector<std::string>& catalogs, const TargetList& targets,
                         const SeriesParams& params, const SeriesProgress& progress) {
    validate(params);
    SeriesResult r;
    r.params = params;
    Assembly a = assemble(catalogs, params, progress);
    if (a.meas.empty()) {
        std::string why = "series: no usable catalog among " + std::to_string(catalogs.size());
        for (const auto& f : a.frames)
            why += "\n  " + f.path + ": " + f.problem;
        throw InvalidInput(why);
    }
    SeriesState& st = r.state;
    st.fingerprint = seriesFingerprint(targets, params);
    st.filter = a.filter;
    st.frames = a.frames;
    st.used = a.used;
    r.sources = sourceStats(a, st);
    a.list->save(st);
    if (!params.reference.empty()) {
        const std::size_t n = assignColours(params, *a.list, r.sources);
        if (n == 0)
            r.warnings.push_back("reference " + params.reference +
                                 ": no colour for any source (a color column? --ref-columns color=A-B)");
    }
    std::vector<double> scint;
    for (std::size_t i : a.used) {
        st.observers.push_back(observerOf(a.frames[i], params));
        scint.push_back(scintillationOf(a.frames[i], params));
    }

    // Targets, pinned and excluded stars as sources; targets and excluded stars are never comparisons.
    const std::size_t ns = r.sources.size();
    std::vector<long> tSource(targets.size());
    std::vector<char> banned(ns, 0);
    for (std::size_t k = 0; k < targets.size(); ++k) {
        tSource[k] = sourceNear(*a.list, r.sources, targets.ra[k], targets.dec[k], params.matchRadius);
        if (tSource[k] >= 0) banned[static_cast<std::size_t>(tSource[k])] = 1;
    }
    auto resolve = [&](const std::vector<std::string>& names, char mark) {
        std::vector<long> out;
        for (const auto& n : names) {
            const auto it = std::find(targets.name.begin(), targets.name.end(), n);
            const long s =
                it == targets.name.end() ? -1 : tSource[static_cast<std::size_t>(it - targets.name.begin())];
            if (s < 0)
                r.warnings.push_back("comparison star '" + n + "' is not a detected target-list entry");
            else
                banned[static_cast<std::size_t>(s)] = mark;
            out.push_back(s);
        }
        return out;
    };
    const std::vector<long> pinned = resolve(params.pinned, 0); // a pinned star is a comparison, not a target
    resolve(params.excluded, 1);
    Pool pool = comparisonPool(a, r.sources, banned, scint, params);
    if (params.allStars) { // first: with findVariables, the stars it flags are no comparison of a target
        r.stars = allStarCurves(a, pool, r.sources, pinned, scint, params);
        if (params.findVariables) banVariableStars(r, a, pool, pinned, scint, params);
    }

    targetsIntoState(st, a, pool, tSource, pinned, targets, params);
    finish(r, targets, params);
    return r;
}

namespace {

bool canAppend(const SeriesState& state, const TargetList& targets, const SeriesParams& params) {
    validate(params);
    return !params.allStars && state.fingerprint == seriesFingerprint(targets, params) &&
           state.targets.size() == targets.size() && !state.used.empty();
}

// appendSeries on its own copy of the state (the result holds it).
std::optional<SeriesResult> appendTo(SeriesState st, const std::vector<std::string>& catalogs,
                                     const TargetList& targets, const SeriesParams& params,
                                     const SeriesProgress& progress) {
    std::vector<std::string> fresh;
    for (const auto& c : catalogs)
        if (std::none_of(st.frames.begin(), st.frames.end(),
                         [&](const SeriesFrame& f) { return f.path == c; }))
            fresh.push_back(c);

    // The new catalogs are read while the source list's grid is built.
    std::unique_ptr<SourceList> grid;
    std::vector<SeriesFrame> frames;
    std::vector<Detections> dets;
    forEachShared(2, 2, [&](std::size_t job) {
        if (job == 0)
            dets = readAll(fresh, params, frames, progress);
        else
            grid = std::make_unique<SourceList>(st, params.matchRadius);
    });
    SourceList& list = *grid;
    for (std::size_t i : timeOrder(frames)) {
        SeriesFrame& f = frames[i];
        std::vector<long> detOf;
        if (f.problem.empty()) detOf = crossIdentify(list, dets[i], f, st.filter, false, params);
        // Insert in time order (after frames of the same time).
        std::size_t at = 0;
        while (at < st.frames.size() && std::isfinite(st.frames[at].mjdMid) &&
               !(std::isfinite(f.mjdMid) && f.mjdMid < st.frames[at].mjdMid))
            ++at;
        const auto pos = st.frames.begin() + static_cast<long>(at);
        for (auto& u : st.used)
            u += u >= at ? 1 : 0;
        st.frames.insert(pos, std::move(f));
        if (!st.frames[at].used) continue;
        const auto upos = std::upper_bound(st.used.begin(), st.used.end(), at);
        const std::size_t uat = static_cast<std::size_t>(upos - st.used.begin());
        st.used.insert(upos, at);
        st.observers.insert(st.observers.begin() + static_cast<long>(uat), observerOf(st.frames[at], params));
        for (auto& tg : st.targets) {
            std::vector<Meas> row;
            for (std::size_t s : tg.sources)
                row.push_back(s < detOf.size() && detOf[s] >= 0
                                  ? dets[i].m[static_cast<std::size_t>(detOf[s])]
                                  : forcedOf(dets[i].forced, list, s, params.matchRadius));
            const std::size_t k = static_cast<std::size_t>(&tg - st.targets.data());
            if (!row.empty() && !row[0].good()) row[0] = dets[i].forced.at(targets.ra[k], targets.dec[k]);
            tg.meas.insert(tg.meas.begin() + static_cast<long>(uat), std::move(row));
        }
    }
    // A target without a source that the new frames detected: its ensemble needs every source's history.
    for (std::size_t k = 0; k < targets.size(); ++k)
        if (st.targets[k].sources.empty() &&
            !list.within(targets.ra[k], targets.dec[k], params.matchRadius).empty())
            return std::nullopt;
    list.save(st);
    // Sources the new frames added have no median yet (as sourcesOf reports them): the state stays one
    // entry per source, as its reader checks.
    st.medianFlux.resize(st.xiSum.size(), kNan);
    st.medianMagCal.resize(st.xiSum.size(), kNan);
    SeriesResult r;
    r.params = params;
    r.appended = true;
    r.state = std::move(st);
    r.sources = sourcesOf(r.state, list);
    finish(r, targets, params);
    return r;
}

} // namespace

std::optional<SeriesResult> appendSeries(SeriesState& state, const std::vector<std::string>& catalogs,
                                         const TargetList& targets, const SeriesParams& params,
                                         const SeriesProgress& progress) {
    if (!canAppend(state, targets, params)) return std::nullopt;
    std::optional<SeriesResult> r = appendTo(state, catalogs, targets, params, progress);
    if (r) state = r->state;
    return r;
}

std::optional<SeriesResult> appendSeries(SeriesState&& state, const std::vector<std::string>& catalogs,
                                         const TargetList& targets, const SeriesParams& params,
                                         const SeriesProgress& progress) {
    if (!canAppend(state, targets, params)) return std::nullopt;
    return appendTo(std::move(state), catalogs, targets, params, progress);
}

} // namespace gpuphot
