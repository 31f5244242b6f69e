#pragma once
// Small text helpers: for the readers of text formats (FITS cards, .sex and .param files, target
// lists), and the UTC time stamps of status lines and stored frames.
#include <algorithm>
#include <cctype>
#include <ctime>
#include <string>
#include <string_view>

namespace gpuphot {

// The current time in UTC as ISO 8601 to the second ("2026-12-03T16:27:20Z").
inline std::string utcNowIso() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// `s` without leading and trailing white space (std::isspace).
inline std::string_view trimView(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
        s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
        s.remove_suffix(1);
    return s;
}
inline std::string trimmed(std::string_view s) {
    return std::string(trimView(s));
}

// An upper-case name as SExtractor's keys and parameters are: a capital letter, then capitals, digits and
// '_' ("DETECT_THRESH", "FLUX_APER"). Lower-case text never is, so `-KEY value` pairs cannot collide with
// gpuphot's options.
inline bool isUpperCaseName(std::string_view s) {
    if (s.empty() || !std::isupper(static_cast<unsigned char>(s.front()))) return false;
    return std::all_of(s.begin(), s.end(), [](char c) {
        return std::isupper(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
               c == '_';
    });
}

} // namespace gpuphot
