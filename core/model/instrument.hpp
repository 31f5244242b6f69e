#pragma once
// Instrument facts of a frame, read from its header through a configurable keyword map, with explicit
// overrides from the CLI or the config file taking precedence.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gpuphot {

class Header;

// Which header keywords hold each fact, in order of preference.
struct InstrumentKeywords {
    std::vector<std::string> gain{"GAIN", "EGAIN", "CCDGAIN", "GAINEFF"}; // e-/ADU
    std::vector<std::string> gainPerAmp{"GAINA", "GAINB", "GAINC",
                                        "GAIND"}; // fallback: mean of those present
    std::vector<std::string> readNoise{"RDNOISE", "READNOIS", "RON", "READNOISE", "RDNOISEA"}; // e-
    std::vector<std::string> saturation{"SATURATE", "SATLEVEL", "MAXLIN", "SATURATN"};         // ADU
    std::vector<std::string> exptime{"EXPTIME", "EXPOSURE", "ITIME", "EXP_TIME"};              // s
    std::vector<std::string> filter{"FILTER", "FILTER1", "FILTNAME", "BAND"};
    std::vector<std::string> dateObs{"DATE-OBS", "DATE_OBS", "DATE"};
    std::vector<std::string> mjdObs{"MJD-OBS", "MJD_OBS"};
    std::vector<std::string> airmass{"AIRMASS", "SECZ", "AMSTART"};
    std::vector<std::string> object{"OBJECT", "TARGET"};
};

// Values given explicitly by the user; each one, when set, wins over the header.
struct InstrumentOverrides {
    std::optional<double> gain, readNoise, saturation, exptime, airmass;
    std::optional<std::string> filter, object;
    // Used only where the header has none (SExtractor's GAIN and SATUR_LEVEL beside GAIN_KEY, SATUR_KEY).
    std::optional<double> gainIfAbsent, saturationIfAbsent;
};

struct Instrument {
    double gain = 1.0;      // e-/ADU (1 when the header has none: gainSource says "default")
    double readNoise = 0.0; // e- RMS
    double saturation = std::numeric_limits<double>::infinity(); // ADU, after BZERO/BSCALE
    double exptime = std::nan("");                               // s
    double airmass = std::nan("");
    double mjdStart = std::nan(""); // from MJD-OBS or DATE-OBS
    double mjdMid = std::nan("");   // mjdStart + exptime/2
    std::string filter, dateObs, object;
    // Where each value came from: the keyword name, "override", or "default".
    std::string gainSource = "default", readNoiseSource = "default", saturationSource = "default",
                exptimeSource = "default";
};

// Reads the instrument facts. Throws InvalidInput for a present but unusable value (GAIN <= 0,
// negative read noise, non-positive saturation, negative exposure time), naming the keyword.
Instrument readInstrument(const Header& header, const InstrumentKeywords& keys = {},
                          const InstrumentOverrides& overrides = {});

// ISO-8601 DATE-OBS ("2024-03-01T02:03:04.5" or "2024-03-01") to MJD; nullopt when unparsable.
std::optional<double> isoDateToMjd(const std::string& iso);

void to_json(nlohmann::json& j, const InstrumentKeywords& k);
void from_json(const nlohmann::json& j, InstrumentKeywords& k);
void to_json(nlohmann::json& j, const InstrumentOverrides& o);
void from_json(const nlohmann::json& j, InstrumentOverrides& o);

} // namespace gpuphot
