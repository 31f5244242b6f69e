// When a file that another process writes is at rest: `watch` (frames from the camera) and
// `series --follow` (catalogs from `watch`) take a file once its size and modification time have not
// changed for --settle seconds. A file already at rest when first seen counts from its modification
// time, so a directory of finished files is taken at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>

namespace gpuphot::cli {

struct FileVersion {
    std::uintmax_t size = 0;
    std::filesystem::file_time_type mtime{};
    bool operator==(const FileVersion&) const = default;
};

class SettleClock {
public:
    using Clock = std::chrono::steady_clock;
    struct Look {
        FileVersion version;
        double stableSeconds = 0.0; // unchanged for this long
    };

    // The file's version and how long it has been unchanged as of `now`; nullopt when it cannot be
    // read (gone, renamed away).
    std::optional<Look> look(const std::string& path, Clock::time_point now) {
        namespace fs = std::filesystem;
        std::error_code ec;
        const FileVersion v{fs::file_size(path, ec),
                            ec ? fs::file_time_type{} : fs::last_write_time(path, ec)};
        if (ec) {
            m_seen.erase(path);
            return std::nullopt;
        }
        auto [it, fresh] = m_seen.try_emplace(path, Seen{v, now});
        if (fresh) { // at rest since its modification time, when that is in the past
            const auto age = fs::file_time_type::clock::now() - v.mtime;
            if (age > decltype(age)::zero())
                it->second.since = now - std::chrono::duration_cast<Clock::duration>(age);
        } else if (!(it->second.version == v)) {
            it->second = Seen{v, now};
        }
        return Look{v, std::chrono::duration<double>(now - it->second.since).count()};
    }

    void forget(const std::string& path) { m_seen.erase(path); }

private:
    struct Seen {
        FileVersion version;
        Clock::time_point since;
    };
    std::unordered_map<std::string, Seen> m_seen;
};

} // namespace gpuphot::cli
