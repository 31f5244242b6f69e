// The tail of bench/flat_profile.c's and bench/alloc_trace.c's dumps: the process's mappings (to symbolise
// the addresses recorded) and its live threads' names, each section after its heading line.
#pragma once
#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

static void writeMapsAndThreads(FILE* f) {
    fprintf(f, "maps\n");
    FILE* maps = fopen("/proc/self/maps", "r");
    char line[8192];
    while (maps && fgets(line, sizeof line, maps))
        fputs(line, f);
    if (maps) fclose(maps);
    fprintf(f, "threads\n");
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", getpid());
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512], name[64] = "";
        snprintf(path, sizeof path, "%s/%s/comm", dir, e->d_name);
        FILE* c = fopen(path, "r");
        if (!c) continue;
        if (fgets(name, sizeof name, c)) fprintf(f, "%s %s", e->d_name, name);
        fclose(c);
    }
    if (d) closedir(d);
}
