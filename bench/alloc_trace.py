#!/usr/bin/env python3
"""Symbolises a bench/alloc_trace.c dump: the bytes allocated per caller chain, largest first.

  alloc_trace.py DUMP [DIR ...]     (TOP=N: lines shown, default 30; CALLERS=N: frames per chain, default 4;
                                     FRAMES=N: also give megabytes per frame of a night of N frames)

Frames in libc, libstdc++ and the other system libraries (flat_profile.py's SYSTEM) are skipped, so that a
chain starts at the first caller inside the DIRs' files (unstripped binaries: build-cuda/app, ...).
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flat_profile  # noqa: E402


def main():
    records, maps, names = flat_profile.read_dump(sys.argv[1])
    dirs = sys.argv[2:] or ["."]
    import bisect
    starts = [m[0] for m in maps]
    cache = {}

    def lookup(pc):
        k = bisect.bisect_right(starts, pc) - 1
        if k < 0 or pc >= maps[k][1]:
            return "?", False
        a, _, offset, path = maps[k]
        table = flat_profile.symbol_table(path, dirs, cache)
        sym = "?"
        if table:
            q = bisect.bisect_right(table[0], pc - a + offset) - 1
            sym = table[1][q] if q >= 0 else "?"
        sym = flat_profile.re.sub(r"\(.*", "", sym.replace("(anonymous namespace)", "anon"))
        name = os.path.basename(path) + ": " + sym
        return name[:110], table is not None and not flat_profile.SYSTEM.match(os.path.basename(path))

    depth = int(os.environ.get("CALLERS", "4"))
    by_chain = collections.defaultdict(lambda: [0, 0])
    total = 0
    for r in records:
        size = int(r[0], 16)
        total += size
        chain = [name for name, inside in (lookup(int(a, 16) - 1) for a in r[2:])
                 if inside and "operator new" not in name][:depth]
        entry = by_chain[" <- ".join(chain) or "?"]
        entry[0] += size
        entry[1] += 1
    frames = int(os.environ.get("FRAMES", "0"))
    per = f", {total / frames / 1e6:.0f} MB per frame" if frames else ""
    print(f"{len(records)} allocations, {total / 1e6:.0f} MB{per}")
    ranked = sorted(by_chain.items(), key=lambda kv: -kv[1][0])
    for chain, (size, count) in ranked[:int(os.environ.get("TOP", "30"))]:
        pf = f" {size / frames / 1e6:8.1f} MB/frame" if frames else ""
        print(f"{size / 1e6:9.1f} MB{pf} {count:6d}x  {chain}")


if __name__ == "__main__":
    main()
