#pragma once
// Process laps (`gpuphot reduce -v`): where a cold process's wall time goes beyond the report's stages
// (start-up, device warm-up, the reference catalog, the outputs, the teardown). Off unless enabled; one
// line on stderr per mark, from any thread: "timeline: +S.SSS s WHAT", seconds since the process started
// (the kernel's start time, 10 ms ticks) or, where that cannot be read, since the first enable.
namespace gpuphot {
void enableTimeline();
bool timelineEnabled();
void timelineMark(const char* what);
} // namespace gpuphot
