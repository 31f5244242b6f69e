#pragma once
// The one-line JSON status of a frame's reduction, shared by every batch front end: `gpuphot reduce` with
// many frames (--jsonl), `gpuphot watch`, Slurm array elements, and Redis workers. One object per line:
//   {"frame": path, "status": "ok"|"failed"|"skipped", "exit_code": int, "seconds": s,
//    "sources": n, "fwhm": px|null, "zp": mag|null, "zp_err": mag|null, "astrometric_rms_arcsec": "|null,
//    "matched": n, "calibration_failed": bool, "outputs": {...}, "report": path, "error": message,
//    "warnings": [...], "host": hostname, "pid": pid, "time": ISO-8601 UTC}
// Fields that do not apply are left out (a failed frame has no "sources").
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuphot {

struct ReduceSummary;
struct OutputOptions;

// A reduced frame (status "ok", exit_code 0, or 4 when a reference was given but no zero point came out).
nlohmann::json frameStatusOk(const ReduceSummary& summary);
// A frame that failed: exit_code as the CLI's (2 invalid input, 3 I/O, 1 other), the error message.
nlohmann::json frameStatusFailed(const std::string& frame, const std::string& error, int exitCode);
// A frame skipped because its outputs are complete (see outputsComplete); `report` is their report.
nlohmann::json frameStatusSkipped(const std::string& frame, const std::string& report);

// True when the frame's report STEM.report.json exists in options.outdir, parses, lists outputs that
// all exist, and is not older than the frame file (the report is written last, so its presence marks
// a complete reduction).
bool outputsComplete(const std::string& framePath, const OutputOptions& options,
                     const std::string& hduSpec = {});

// True when `path` is a complete FITS file: every HDU's header parses and the file is at least as long as
// the end of the last HDU's data (a camera still writing it, or a copy cut short, is not complete).
// Gzip-compressed files (.gz) are checked by opening every HDU only. On false, *why says what is missing.
bool fitsFileComplete(const std::string& path, std::string* why = nullptr);

// Appends `line` (compact, one line, '\n') to `path` with one write(2) on an O_APPEND descriptor, so
// concurrent writers (processes on the same host or array elements on a shared file system that keeps
// O_APPEND atomic) never interleave within a line. Creates the file. Throws IoError naming the file.
void appendJsonLine(const std::string& path, const nlohmann::json& line);

// Reads every line of a JSON-lines file; malformed lines (a writer killed mid-line on a file system
// without atomic appends) are skipped and counted in *malformed. A missing file gives an empty list.
std::vector<nlohmann::json> readJsonLines(const std::string& path, std::size_t* malformed = nullptr);

} // namespace gpuphot
