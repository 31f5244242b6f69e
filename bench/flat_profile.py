#!/usr/bin/env python3
"""Symbolises a bench/flat_profile.c dump: the share of samples per function, then per thread name.

  flat_profile.py DUMP [DIR ...]     (TOP=N: lines shown, default 45)

Each sampled address is looked up in the mapping it falls in; a mapped file whose name is found in one of
the DIRs (unstripped binaries and the libraries that ran: build-cuda/app, .device/lib) is symbolised with
`nm`, any other mapping is given by its file name alone. Threads that ended before the process appear as
"exited". Dumps with stacks (FLAT_PROFILE_DEPTH) add a table charging each sample outside the DIRs' files
(libc, libm, libstdc++, libgomp, the driver: their symbols are shown when a DIR holds them too) to its
nearest caller inside the other files.
"""
import bisect
import collections
import os
import re
import subprocess
import sys


def read_dump(path):
    lines = open(path).read().split("\n")
    n = int(lines[0].split()[1])
    samples = [l.split() for l in lines[1:1 + n]]  # pc tid [stack...]
    i, j = lines.index("maps"), lines.index("threads")
    maps = []
    for l in lines[i + 1:j]:
        p = l.split()
        if len(p) < 6 or "x" not in p[1]:
            continue
        a, b = (int(x, 16) for x in p[0].split("-"))
        maps.append((a, b, int(p[2], 16), p[5]))
    names = {}
    for l in lines[j + 1:]:
        p = l.split(None, 1)
        if len(p) == 2:
            names[p[0]] = p[1].strip()
    return samples, sorted(maps), names


# Libraries whose time is charged to the caller (their symbols are still shown when a DIR holds them).
SYSTEM = re.compile(r"(libc|libm|libstdc\+\+|libgomp|libgcc_s|libcuda|libcudart|libpthread|ld-linux[^.]*)[.-]")


def symbol_table(path, dirs, cache):
    base = os.path.basename(path)
    if base not in cache:
        cache[base] = None
        for d in dirs:
            f = os.path.join(d, base)
            if not os.path.exists(f):
                continue
            for flags in (["-C", "--defined-only", "-n"], ["-D", "-C", "--defined-only", "-n"]):
                out = subprocess.run(["nm"] + flags + [f], capture_output=True, text=True).stdout
                table = [(int(m.group(1), 16), m.group(2)) for m in
                         (re.match(r"([0-9a-f]+) [tTwW] (.*)", l) for l in out.splitlines()) if m]
                if table:
                    cache[base] = ([t[0] for t in table], [t[1] for t in table])
                    break
            break
    return cache[base]


def main():
    samples, maps, names = read_dump(sys.argv[1])
    dirs = sys.argv[2:] or ["."]
    starts = [m[0] for m in maps]
    cache = {}

    def lookup(pc):  # (name, symbolised from the DIRs)
        k = bisect.bisect_right(starts, pc) - 1
        if k < 0 or pc >= maps[k][1]:
            return "?", False
        a, _, offset, path = maps[k]
        table = symbol_table(path, dirs, cache)
        sym = "?"
        if table:
            q = bisect.bisect_right(table[0], pc - a + offset) - 1
            sym = table[1][q] if q >= 0 else "?"
        name = os.path.basename(path) + ": " + re.sub(r"\(.*", "", sym.replace("(anonymous namespace)", "anon"))
        return name[:120], table is not None and not SYSTEM.match(os.path.basename(path))

    by_function = collections.Counter()
    by_thread = collections.Counter()
    outside = collections.Counter()  # (outside function, nearest caller inside)
    for s in samples:
        pc, tid, stack = int(s[0], 16), s[1], [int(x, 16) for x in s[2:]]
        fn, inside = lookup(pc)
        by_function[fn] += 1
        by_thread[names.get(tid, "exited")] += 1
        if stack and not inside:
            callers = stack[stack.index(pc) + 1:] if pc in stack else []
            caller = next((c for c, ok in (lookup(r - 1) for r in callers if r) if ok), "?")
            outside[(fn, caller)] += 1
    total = max(1, sum(by_function.values()))
    print(f"{total} samples")
    for fn, c in by_function.most_common(int(os.environ.get("TOP", "45"))):
        print(f"{100 * c / total:6.2f}%  {fn}")
    if outside:
        print("outside the DIRs' files, by nearest caller inside them:")
        for (fn, caller), c in outside.most_common(int(os.environ.get("TOP", "45"))):
            print(f"{100 * c / total:6.2f}%  {fn}  <-  {caller}")
    print("by thread name: " + ", ".join(f"{t} {100 * c / total:.1f}%" for t, c in by_thread.most_common()))


if __name__ == "__main__":
    main()
