// Instrument facts from headers: keyword map, per-amplifier gain fallback, overrides, unusable values,
// DATE-OBS -> MJD, and the JSON form of the keyword map and the overrides.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/model/header.hpp"
#include "core/model/instrument.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;

TEST(Instrument, DefaultsWhenTheHeaderIsSilent) {
    const Instrument i = readInstrument(Header{});
    EXPECT_EQ(i.gain, 1.0);
    EXPECT_EQ(i.gainSource, "default");
    EXPECT_EQ(i.readNoise, 0.0);
    EXPECT_TRUE(std::isinf(i.saturation));
    EXPECT_TRUE(std::isnan(i.exptime));
    EXPECT_TRUE(std::isnan(i.mjdStart));
    EXPECT_TRUE(std::isnan(i.airmass));
}

TEST(Instrument, ReadsTheKeywordMapInOrderOfPreference) {
    Header h;
    h.set("EGAIN", 2.0);
    h.set("GAIN", 1.5); // GAIN comes first in the list
    h.set("READNOIS", 4.5);
    h.set("SATLEVEL", 60000.0);
    h.set("EXPOSURE", 30.0);
    h.set("FILTER", "  V  ");
    h.set("AIRMASS", 1.25);
    h.set("OBJECT", "NGC 6822");
    h.set("DATE-OBS", "2024-03-01T02:03:04.5");
    const Instrument i = readInstrument(h);
    EXPECT_EQ(i.gain, 1.5);
    EXPECT_EQ(i.gainSource, "GAIN");
    EXPECT_EQ(i.readNoise, 4.5);
    EXPECT_EQ(i.readNoiseSource, "READNOIS");
    EXPECT_EQ(i.saturation, 60000.0);
    EXPECT_EQ(i.saturationSource, "SATLEVEL");
    EXPECT_EQ(i.exptime, 30.0);
    EXPECT_EQ(i.exptimeSource, "EXPOSURE");
    EXPECT_EQ(i.filter, "V");
    EXPECT_EQ(i.airmass, 1.25);
    EXPECT_EQ(i.object, "NGC 6822");
    EXPECT_EQ(i.dateObs, "2024-03-01T02:03:04.5");
    // 2024-03-01 is MJD 60370 (JD 2460370.5).
    const double mjd = 60370.0 + (2 * 3600 + 3 * 60 + 4.5) / 86400.0;
    EXPECT_NEAR(i.mjdStart, mjd, 1e-10);
    EXPECT_NEAR(i.mjdMid, mjd + 15.0 / 86400.0, 1e-10);
}

TEST(Instrument, CustomKeywordMap) {
    Header h;
    h.set("GAIN", 1.5);
    h.set("CAMGAIN", 3.0);
    h.set("MYFILT", "Ha");
    InstrumentKeywords k;
    k.gain = {"CAMGAIN"};
    k.filter = {"MYFILT"};
    const Instrument i = readInstrument(h, k);
    EXPECT_EQ(i.gain, 3.0);
    EXPECT_EQ(i.gainSource, "CAMGAIN");
    EXPECT_EQ(i.filter, "Ha");
}

TEST(Instrument, PerAmplifierGainFallbackIsTheMean) {
    Header h;
    h.set("GAINA", 3.7121032941793);
    h.set("GAINB", 3.71897213815899);
    const Instrument i = readInstrument(h);
    EXPECT_NEAR(i.gain, (3.7121032941793 + 3.71897213815899) / 2, 1e-15);
    EXPECT_EQ(i.gainSource, "mean(GAINA,GAINB)");
    h.set("GAIN", 4.0);
    EXPECT_EQ(readInstrument(h).gain, 4.0) << "a single GAIN wins over per-amplifier values";
    Header one;
    one.set("GAINB", 2.0);
    EXPECT_EQ(readInstrument(one).gain, 2.0);
    EXPECT_EQ(readInstrument(one).gainSource, "GAINB");
}

TEST(Instrument, OverridesWin) {
    Header h;
    h.set("GAIN", -1.0); // unusable, but overridden: not an error
    h.set("RDNOISE", 5.0);
    h.set("EXPTIME", 10.0);
    h.set("FILTER", "R");
    h.set("AIRMASS", 1.1);
    InstrumentOverrides o;
    o.gain = 2.2;
    o.readNoise = 3.0;
    o.saturation = 40000.0;
    o.exptime = 20.0;
    o.airmass = 1.5;
    o.filter = "r'";
    o.object = "field 7";
    const Instrument i = readInstrument(h, {}, o);
    EXPECT_EQ(i.gain, 2.2);
    EXPECT_EQ(i.gainSource, "override");
    EXPECT_EQ(i.readNoise, 3.0);
    EXPECT_EQ(i.readNoiseSource, "override");
    EXPECT_EQ(i.saturation, 40000.0);
    EXPECT_EQ(i.saturationSource, "override");
    EXPECT_EQ(i.exptime, 20.0);
    EXPECT_EQ(i.exptimeSource, "override");
    EXPECT_EQ(i.airmass, 1.5);
    EXPECT_EQ(i.filter, "r'");
    EXPECT_EQ(i.object, "field 7");
}

TEST(Instrument, UnusableValuesNameTheKeyword) {
    struct Case {
        const char* key;
        double value;
    } cases[] = {{"GAIN", 0.0},     {"GAIN", -2.0},     {"GAINA", -1.0},  {"RDNOISE", -3.0},
                 {"SATURATE", 0.0}, {"SATURATE", -5.0}, {"EXPTIME", -1.0}};
    for (const auto& c : cases) {
        Header h;
        h.set(c.key, c.value);
        try {
            readInstrument(h);
            ADD_FAILURE() << c.key << " = " << c.value << " accepted";
        } catch (const InvalidInput& e) {
            EXPECT_NE(std::string(e.what()).find(c.key), std::string::npos) << e.what();
        }
    }
    InstrumentOverrides o;
    o.gain = 0.0;
    EXPECT_THROW(readInstrument(Header{}, {}, o), InvalidInput);
    // 'NaN' means "not measured": treated as absent, the next keyword in the list is used.
    Header h;
    h.set("RDNOISE", std::nan(""));
    h.set("RON", 7.0);
    EXPECT_EQ(readInstrument(h).readNoise, 7.0);
    // An airmass below 1 is "not recorded" in many camera headers: ignored.
    Header a;
    a.set("AIRMASS", 0.0);
    EXPECT_TRUE(std::isnan(readInstrument(a).airmass));
}

TEST(Instrument, MjdObsWinsAndSplitDateTimeIsJoined) {
    Header h;
    h.set("DATE-OBS", "2017-11-13T06:03:40.037227");
    h.set("MJD-OBS", 58070.25254673);
    EXPECT_EQ(readInstrument(h).mjdStart, 58070.25254673);
    Header s;
    s.set("DATE-OBS", "2016-09-09");
    s.set("TIME-OBS", "08:14:34");
    const Instrument i = readInstrument(s);
    EXPECT_EQ(i.dateObs, "2016-09-09T08:14:34");
    EXPECT_NEAR(i.mjdStart, 57640.34344907408, 1e-9); // astropy Time('2016-09-09T08:14:34').mjd
    EXPECT_TRUE(std::isnan(i.mjdMid)) << "no exposure time";
}

TEST(Instrument, IsoDateToMjd) {
    // Reference epochs: MJD 0 = 1858-11-17; J2000.0 = 2000-01-01T12:00 = MJD 51544.5; 1970-01-01 = 40587.
    EXPECT_EQ(isoDateToMjd("1858-11-17"), 0.0);
    EXPECT_EQ(isoDateToMjd("2000-01-01T12:00:00"), 51544.5);
    EXPECT_EQ(isoDateToMjd("1970-01-01"), 40587.0);
    EXPECT_EQ(isoDateToMjd("2000-03-01"), 51604.0); // after a leap day in a century leap year
    EXPECT_EQ(isoDateToMjd("2024-02-29T00:00:00Z"), 60369.0);
    EXPECT_NEAR(*isoDateToMjd("2024-03-01T02:03"), 60370.0 + 123.0 / 1440.0, 1e-12);
    for (const char* bad : {"", "2024-13-01", "2023-02-29", "2024-03-01T25:00:00", "01/03/24",
                            "2024-03-01Tnoon", "2024-03-01T02:03:xx"})
        EXPECT_FALSE(isoDateToMjd(bad).has_value()) << bad;
}

TEST(Instrument, JsonRoundTripAndPartialConfig) {
    InstrumentKeywords k;
    k.gain = {"CAMGAIN", "GAIN"};
    nlohmann::json j = k;
    EXPECT_EQ(j["gain"], (nlohmann::json{"CAMGAIN", "GAIN"}));
    InstrumentKeywords back = j.get<InstrumentKeywords>();
    EXPECT_EQ(back.gain, k.gain);
    EXPECT_EQ(back.saturation, k.saturation);

    InstrumentKeywords partial = nlohmann::json{{"filter", "MYFILT"}}.get<InstrumentKeywords>();
    EXPECT_EQ(partial.filter, std::vector<std::string>{"MYFILT"});
    EXPECT_EQ(partial.gain, InstrumentKeywords{}.gain) << "unset lists keep their defaults";
    EXPECT_THROW((nlohmann::json{{"gian", {"G"}}}.get<InstrumentKeywords>()), InvalidInput);
    EXPECT_THROW((nlohmann::json{{"gain", 5}}.get<InstrumentKeywords>()), InvalidInput);

    InstrumentOverrides o;
    o.gain = 1.5;
    o.filter = "B";
    nlohmann::json oj = o;
    EXPECT_EQ(oj, (nlohmann::json{{"gain", 1.5}, {"filter", "B"}}));
    InstrumentOverrides ob = oj.get<InstrumentOverrides>();
    EXPECT_EQ(ob.gain, 1.5);
    EXPECT_EQ(ob.filter, "B");
    EXPECT_FALSE(ob.readNoise.has_value());
    EXPECT_THROW((nlohmann::json{{"gain", "high"}}.get<InstrumentOverrides>()), InvalidInput);
    EXPECT_THROW((nlohmann::json{{"bogus", 1}}.get<InstrumentOverrides>()), InvalidInput);
}

TEST(Instrument, ValuesIfAbsentFillOnlyWhatTheHeaderLacks) {
    InstrumentOverrides ov;
    ov.gainIfAbsent = 2.5;
    ov.saturationIfAbsent = 50000.0;
    Header silent;
    const Instrument a = readInstrument(silent, {}, ov);
    EXPECT_DOUBLE_EQ(a.gain, 2.5);
    EXPECT_EQ(a.gainSource, "gainIfAbsent");
    EXPECT_DOUBLE_EQ(a.saturation, 50000.0);
    EXPECT_EQ(a.saturationSource, "saturationIfAbsent");
    Header h;
    h.set("GAIN", 1.6);
    h.set("SATURATE", 60000.0);
    const Instrument b = readInstrument(h, {}, ov);
    EXPECT_DOUBLE_EQ(b.gain, 1.6) << "the header wins over SExtractor's GAIN";
    EXPECT_DOUBLE_EQ(b.saturation, 60000.0);
    ov.gain = 3.0;
    EXPECT_DOUBLE_EQ(readInstrument(silent, {}, ov).gain, 3.0) << "an override wins over both";
    InstrumentOverrides bad;
    bad.gainIfAbsent = 0.0;
    EXPECT_THROW(readInstrument(silent, {}, bad), InvalidInput);
}
