#pragma once
// Process laps of `gpuphot reduce -v`: where a cold process's wall time goes beyond the report's stages
// (start-up, the reference catalog, the outputs, the teardown). Off unless enabled; one line on stderr per
// mark: "timeline: +S.SSS s WHAT", seconds since the process started (the kernel's start time, 10 ms
// ticks) or, where that cannot be read, since main was entered.
namespace gpuphot::cli {
void enableTimeline();
bool timelineEnabled();
void timelineMark(const char* what);
} // namespace gpuphot::cli
