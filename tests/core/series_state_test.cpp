// DIR/series.state (core/series/series_state.cpp): format 3 read back field for field, a truncated,
// corrupt or foreign file refused with its reason while the series in DIR stays as it was, and a
// format 2 (CBOR) state still read (and rewritten as format 3 by the next save).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/series/series.hpp"
#include "core/series/series_output.hpp"
#include "core/util/errors.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;
using gpuphot::test::TempDir;

namespace {

SeriesMeasurement meas(float flux, std::int32_t flags) {
    return {flux, flux / 100.0f, 10.5f, 20.25f, 300.0f, 12.5f, flags};
}

// Three frames (one left out), two used; a target with two comparison candidates and one off the field.
SeriesState sampleState() {
    SeriesState st;
    st.fingerprint = "{\"params\":1}";
    st.filter = "V";
    st.ra0 = 150.0;
    st.dec0 = 20.0;
    st.xiSum = {1.0, 2.0, -3.5};
    st.etaSum = {0.5, -0.25, 4.0};
    st.matched = {2, 2, 1};
    st.medianFlux = {1e5, 2e5, NAN};
    st.medianMagCal = {12.5, NAN, 13.0};
    for (int f = 0; f < 3; ++f) {
        SeriesFrame fr;
        fr.path = "/night/f" + std::to_string(f) + ".cat.fits";
        fr.sourceFrame = "/raw/f" + std::to_string(f) + ".fits";
        fr.mjdMid = 60000.0 + f / 1440.0;
        fr.exptime = 60.0;
        fr.airmass = 1.1 + f;
        fr.fwhm = 3.0;
        fr.zeroPoint = NAN;
        fr.filter = f == 1 ? "R" : "V";
        fr.object = "field";
        fr.detections = 3;
        fr.matched = f == 1 ? 0 : 3;
        fr.used = f != 1;
        if (f == 1) fr.problem = "filter 'R', not the series' 'V'";
        if (f == 0) fr.site = ObservingSite{-30.24, -70.74, 2200.0, "SITELAT/SITELONG"};
        st.frames.push_back(fr);
    }
    st.used = {0, 2};
    st.observers.resize(2);
    st.observers[1].utc1 = 2460000.5;
    st.observers[1].bary[2] = 0.25;
    SeriesState::Target t;
    t.sources = {0, 1, 2};
    t.notes = {"target", "", "pinned"};
    t.meas = {{meas(1e5f, 0), meas(2e5f, 4), meas(NAN, 1 << 27)},
              {meas(1.1e5f, 0), meas(2.1e5f, 0), meas(5e4f, 0)}};
    st.targets = {t, SeriesState::Target{}};
    st.targets[1].meas.resize(2); // off the field: an empty row per used frame
    return st;
}

bool same(double a, double b) {
    return (std::isnan(a) && std::isnan(b)) || a == b;
}

void expectEqual(const SeriesState& a, const SeriesState& b) {
    EXPECT_EQ(a.fingerprint, b.fingerprint);
    EXPECT_EQ(a.filter, b.filter);
    EXPECT_EQ(a.ra0, b.ra0);
    EXPECT_EQ(a.dec0, b.dec0);
    EXPECT_EQ(a.xiSum, b.xiSum);
    EXPECT_EQ(a.etaSum, b.etaSum);
    EXPECT_EQ(a.matched, b.matched);
    ASSERT_EQ(a.medianFlux.size(), b.medianFlux.size());
    for (std::size_t s = 0; s < a.medianFlux.size(); ++s) {
        EXPECT_TRUE(same(a.medianFlux[s], b.medianFlux[s])) << s;
        EXPECT_TRUE(same(a.medianMagCal[s], b.medianMagCal[s])) << s;
    }
    EXPECT_EQ(a.used, b.used);
    ASSERT_EQ(a.observers.size(), b.observers.size());
    EXPECT_EQ(
        std::memcmp(a.observers.data(), b.observers.data(), a.observers.size() * sizeof(ObserverEphemeris)),
        0);
    ASSERT_EQ(a.frames.size(), b.frames.size());
    for (std::size_t i = 0; i < a.frames.size(); ++i) {
        const SeriesFrame &x = a.frames[i], &y = b.frames[i];
        EXPECT_EQ(x.path, y.path);
        EXPECT_EQ(x.sourceFrame, y.sourceFrame);
        EXPECT_EQ(x.filter, y.filter);
        EXPECT_EQ(x.object, y.object);
        EXPECT_EQ(x.problem, y.problem);
        EXPECT_TRUE(same(x.mjdMid, y.mjdMid) && same(x.exptime, y.exptime) && same(x.airmass, y.airmass) &&
                    same(x.fwhm, y.fwhm) && same(x.zeroPoint, y.zeroPoint))
            << i;
        EXPECT_EQ(x.detections, y.detections);
        EXPECT_EQ(x.matched, y.matched);
        EXPECT_EQ(x.used, y.used);
        ASSERT_EQ(x.site.has_value(), y.site.has_value()) << i;
        if (x.site) {
            EXPECT_EQ(x.site->latitude, y.site->latitude);
            EXPECT_EQ(x.site->elevation, y.site->elevation);
            EXPECT_EQ(x.site->source, y.site->source);
        }
    }
    ASSERT_EQ(a.targets.size(), b.targets.size());
    for (std::size_t k = 0; k < a.targets.size(); ++k) {
        EXPECT_EQ(a.targets[k].sources, b.targets[k].sources);
        EXPECT_EQ(a.targets[k].notes, b.targets[k].notes);
        ASSERT_EQ(a.targets[k].meas.size(), b.targets[k].meas.size());
        for (std::size_t u = 0; u < a.targets[k].meas.size(); ++u) {
            const auto &x = a.targets[k].meas[u], &y = b.targets[k].meas[u];
            ASSERT_EQ(x.size(), y.size());
            if (x.empty()) continue; // memcmp takes no null pointer, even for no bytes
            EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(SeriesMeasurement)), 0)
                << k << " " << u;
        }
    }
}

std::string readAll(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeAll(const std::filesystem::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

SeriesStateError::Reason reasonOf(const std::string& bytes) {
    try {
        (void)parseSeriesState(bytes, "test.state");
    } catch (const SeriesStateError& e) {
        EXPECT_NE(std::string(e.what()).find("test.state"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("--fresh"), std::string::npos) << e.what();
        return e.reason();
    }
    ADD_FAILURE() << "accepted";
    return SeriesStateError::Reason::NotAState;
}

// The state as format 2 wrote it: CBOR, arrays as byte strings.
template <class T> nlohmann::json blob(const std::vector<T>& v) {
    std::vector<std::uint8_t> bytes(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
    return nlohmann::json::binary(std::move(bytes));
}

std::string formatTwo(const SeriesState& st) {
    std::vector<std::uint64_t> used(st.used.begin(), st.used.end());
    nlohmann::json j = {{"version", 2},
                        {"endian", "little"},
                        {"fingerprint", st.fingerprint},
                        {"filter", st.filter},
                        {"ra0", st.ra0},
                        {"dec0", st.dec0},
                        {"xi", blob(st.xiSum)},
                        {"eta", blob(st.etaSum)},
                        {"matched", blob(st.matched)},
                        {"flux", blob(st.medianFlux)},
                        {"magcal", blob(st.medianMagCal)},
                        {"used", blob(used)},
                        {"observers", blob(st.observers)}};
    std::vector<double> num;
    std::vector<std::uint64_t> count;
    std::vector<std::string> text;
    for (const auto& f : st.frames) {
        const ObservingSite site = f.site.value_or(ObservingSite{NAN, NAN, NAN, ""});
        num.insert(num.end(), {f.mjdMid, f.exptime, f.airmass, f.fwhm, f.zeroPoint, site.latitude,
                               site.longitude, site.elevation});
        count.insert(count.end(), {f.detections, f.matched, f.used ? 1u : 0u, f.site ? 1u : 0u});
        text.insert(text.end(), {f.path, f.filter, f.object, f.problem, site.source});
    }
    j["frames"] = {{"n", st.frames.size()}, {"num", blob(num)}, {"count", blob(count)}, {"text", text}};
    j["targets"] = nlohmann::json::array();
    for (const auto& t : st.targets) {
        std::vector<std::uint64_t> sources(t.sources.begin(), t.sources.end());
        std::vector<SeriesMeasurement> flat;
        for (const auto& row : t.meas)
            flat.insert(flat.end(), row.begin(), row.end());
        j["targets"].push_back({{"sources", blob(sources)}, {"notes", t.notes}, {"meas", blob(flat)}});
    }
    const auto bytes = nlohmann::json::to_cbor(j);
    return std::string(bytes.begin(), bytes.end());
}

} // namespace

TEST(SeriesState, ReadsBackWhatItWrote) {
    const SeriesState st = sampleState();
    const std::string bytes = seriesStateBytes(st);
    EXPECT_EQ(bytes.compare(0, 8, "GPSERIES"), 0);
    expectEqual(parseSeriesState(bytes, "test.state"), st);

    TempDir dir("gpuphot_series_state3");
    EXPECT_FALSE(loadSeriesState(dir.str()).has_value()) << "no state: nothing to append to";
    saveSeriesState(st, dir.str());
    const std::optional<SeriesState> back = loadSeriesState(dir.str());
    ASSERT_TRUE(back.has_value());
    expectEqual(*back, st);
    EXPECT_EQ(back->frames[2].sourceFrame, "/raw/f2.fits");
    EXPECT_EQ(seriesStateBytes(*back), bytes) << "a second save writes the same bytes";
}

TEST(SeriesState, RefusesATruncatedOrCorruptFileAndLeavesTheSeriesAsItWas) {
    const std::string bytes = seriesStateBytes(sampleState());
    using R = SeriesStateError::Reason;
    EXPECT_EQ(reasonOf(bytes.substr(0, bytes.size() - 1)), R::Truncated);
    EXPECT_EQ(reasonOf(bytes.substr(0, 20)), R::Truncated);
    EXPECT_EQ(reasonOf(bytes + "x"), R::Truncated) << "longer than its header says";
    for (std::size_t at : {std::size_t(40), bytes.size() / 2, bytes.size() - 1}) {
        std::string bad = bytes;
        bad[at] ^= 0x20;
        EXPECT_EQ(reasonOf(bad), R::Corrupt) << "byte " << at;
    }
    std::string other = bytes;
    other[8] = 9; // format 9
    EXPECT_EQ(reasonOf(other), R::OtherVersion);
    std::string swapped = bytes;
    std::reverse(swapped.begin() + 12, swapped.begin() + 16); // written on a machine of the other order
    EXPECT_EQ(reasonOf(swapped), R::OtherVersion);
    EXPECT_EQ(reasonOf("garbage"), R::NotAState);
    EXPECT_EQ(reasonOf(""), R::NotAState);

    // Through the directory: the call fails, the state and the other files stay as they were.
    TempDir dir("gpuphot_series_state_bad");
    const std::string cut = bytes.substr(0, bytes.size() / 3);
    writeAll(dir / "series.state", cut);
    writeAll(dir / "planet.lc.csv", "frame,rel_flux\n");
    EXPECT_THROW(loadSeriesState(dir.str()), SeriesStateError);
    EXPECT_THROW(loadSeriesState(dir.str()), InvalidInput) << "a SeriesStateError is an InvalidInput";
    EXPECT_EQ(readAll(dir / "series.state"), cut);
    EXPECT_EQ(readAll(dir / "planet.lc.csv"), "frame,rel_flux\n");
}

TEST(SeriesState, ReadsFormatTwoAndSavesItAsThree) {
    SeriesState st = sampleState();
    for (auto& f : st.frames)
        f.sourceFrame.clear(); // format 2 did not record it
    TempDir dir("gpuphot_series_state2");
    writeAll(dir / "series.state", formatTwo(st));
    const std::optional<SeriesState> old = loadSeriesState(dir.str());
    ASSERT_TRUE(old.has_value());
    expectEqual(*old, st);
    saveSeriesState(*old, dir.str());
    EXPECT_EQ(readAll(dir / "series.state").compare(0, 8, "GPSERIES"), 0) << "migrated";
    expectEqual(*loadSeriesState(dir.str()), st);

    std::string cut = formatTwo(st);
    cut.resize(cut.size() / 2);
    EXPECT_EQ(reasonOf(cut), SeriesStateError::Reason::NotAState);
}

TEST(SeriesState, RefusesPartsThatDoNotAgree) {
    SeriesState st = sampleState();
    st.targets[0].sources[2] = 7; // no such source
    EXPECT_EQ(reasonOf(seriesStateBytes(st)), SeriesStateError::Reason::Corrupt);
    st = sampleState();
    st.observers.pop_back();
    EXPECT_EQ(reasonOf(seriesStateBytes(st)), SeriesStateError::Reason::Corrupt);
}
