#!/usr/bin/python3
"""Benchmark matrix for docs/BENCHMARKS.md: gpuphot (1 and 2 threads) next to sep and source-extractor on
the same simulated frames, with completeness against the simulator's truth.

Run from the repository root with Debian's Python (astropy, numpy, scipy, python3-sep):

  /usr/bin/python3 bench/run_benchmarks.py [--frames small|full|NAME,...] [--repeat 3] [--extras]
                                           [--no-peers-above MP] [--work /tmp/gpuphot-bench] [--keep]

For every frame: simulate it once (uint16, `gpuphot simulate --bitpix 16`), then
  1. `gpuphot bench FRAME --threads 1 --repeat R --json` and the same with --threads 2 (per-stage best
     times, total from read to catalog, peak host memory);
  2. `gpuphot reduce FRAME --threads 2` once, for the catalog (completeness);
  3. sep (bench/peers.py sep): astropy read, Background, extract, sum_circle, each the best of R;
  4. source-extractor (bench/peers.py sex) with NTHREADS 1 and 2, best of R wall times;
  5. completeness of each catalog against the truth (stars of true S/N >= 10, match within 1 px).
The 1-minute load average is recorded before every measurement. --extras adds the foundation figures:
`gpuphot simulate --size 4096x4096 --stars 20000` wall time and bench_fits_read on a 151 MP frame.
Results go to WORK/results.json (appended per frame, so an interrupted run keeps what it measured) and
the Markdown tables to WORK/results.md. Frames are deleted at the end unless --keep.
"""
import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "peers.py")
PY = "/usr/bin/python3"

# name: (width, height, stars)
FRAMES = {
    "1mp_1k": (1024, 1024, 1000),  # smoke test of the script
    "4mp_300": (2048, 2048, 300),
    "4mp_5k": (2048, 2048, 5000),
    "15mp_20k": (3912, 3912, 20000),
    "15mp_50k": (3912, 3912, 50000),
    "38mp_50k": (7168, 5273, 50000),
    "151mp_20k": (14208, 10656, 20000),
    "151mp_130k": (14208, 10656, 130000),
    # the orientation frames (sep 4.0 s / source-extractor 2.7 s; 8.1 s / 4.1 s)
    "16mp_50k": (4096, 4096, 50000),
    "67mp_50k": (8192, 8192, 50000),
}
SETS = {
    "small": ["4mp_300", "4mp_5k", "15mp_20k", "15mp_50k"],
    "full": ["4mp_300", "4mp_5k", "15mp_20k", "15mp_50k", "38mp_50k", "151mp_20k", "151mp_130k"],
}
SEED = 7
LAST_CPU = 0.0


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def load1():
    return round(os.getloadavg()[0], 2)


def run(cmd, timeout=None, capture=True):
    """Runs cmd; returns (stdout, wall seconds). LAST_CPU: the child's CPU seconds (user + sys)."""
    global LAST_CPU
    log("  $", " ".join(cmd))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAST_CPU = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    # The tools report their own peak memory (gpuphot bench, peers.py).
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (cmd[0], p.returncode, err.strip()[-2000:]))
    return out, wall


def machine():
    model = ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}


def measure_frame(name, a, results):
    w, h, stars = FRAMES[name]
    mp = w * h / 1e6
    stem = os.path.join(a.work, name)
    frame, truth = stem + ".fits", stem + ".truth.fits"
    r = {"name": name, "width": w, "height": h, "megapixels": round(mp, 2), "stars": stars, "seed": SEED,
         "repeat": a.repeat, "load": {}}
    log("== %s: %dx%d (%.1f MP), %d stars" % (name, w, h, mp, stars))
    if not os.path.exists(frame):
        r["load"]["simulate"] = load1()
        _, r["simulate_seconds"] = run([a.gpuphot, "simulate", "--size", "%dx%d" % (w, h),
                                        "--stars", str(stars), "--seed", str(SEED), "--bitpix", "16",
                                        "-o", a.work, "--name", name, "-q"])
    r["file_mb"] = round(os.path.getsize(frame) / 2 ** 20, 1)
    for t in (1, 2):
        r["load"]["gpuphot_t%d" % t] = load1()
        out, _ = run([a.gpuphot, "bench", frame, "--threads", str(t), "--repeat", str(a.repeat), "--json"],
                     timeout=a.timeout)
        r["gpuphot_t%d" % t] = json.loads(out)
        # CPU seconds of one run from read to catalog (the process's user + sys over its runs)
        r["gpuphot_t%d" % t]["cpu_seconds_per_run"] = LAST_CPU / a.repeat
    outdir = os.path.join(a.work, "out")
    os.makedirs(outdir, exist_ok=True)
    run([a.gpuphot, "reduce", frame, "--threads", "2", "-o", outdir, "-q", "--no-tycho2"], timeout=a.timeout)
    ours = os.path.join(outdir, name + ".cat.fits")
    comp = {"gpuphot": (ours, "gpuphot")}
    if mp <= a.no_peers_above:
        r["load"]["sep"] = load1()
        sepcat = stem + ".sep.npz"
        out, _ = run([PY, PEERS, "sep", frame, "--repeat", str(a.repeat), "--catalog", sepcat],
                     timeout=a.timeout)
        r["sep"] = json.loads(out)
        comp["sep"] = (sepcat, "sep")
        for t in a.sex_threads:
            r["load"]["sex_t%d" % t] = load1()
            sexcat = stem + ".sex%d.cat.fits" % t
            out, _ = run([PY, PEERS, "sex", frame, "--threads", str(t), "--repeat", str(a.repeat),
                          "--catalog", sexcat], timeout=a.timeout)
            r["sex_t%d" % t] = json.loads(out)
            if "sex" not in comp:
                comp["sex"] = (sexcat, "sex")
    else:
        r["peers_skipped"] = "frame above --no-peers-above %g MP" % a.no_peers_above
    r["completeness"] = {}
    for tool, (cat, kind) in comp.items():
        out, _ = run([PY, PEERS, "complete", truth, frame, cat, "--kind", kind])
        r["completeness"][tool] = json.loads(out)
    results["frames"].append(r)
    save(a, results)
    if not a.keep:
        for f in os.listdir(a.work):
            if f.startswith(name + "."):
                os.remove(os.path.join(a.work, f))
        shutil.rmtree(outdir, ignore_errors=True)


def extras(a, results):
    e = {}
    e["load_simulate"] = load1()
    best = float("inf")
    for _ in range(a.repeat):
        _, s = run([a.gpuphot, "simulate", "--size", "4096x4096", "--stars", "20000", "-o", a.work,
                    "--name", "sim4096", "-q"])
        best = min(best, s)
    e["simulate_4096x4096_20000_seconds"] = best
    for f in os.listdir(a.work):
        if f.startswith("sim4096."):
            os.remove(os.path.join(a.work, f))
    fr = os.path.join(os.path.dirname(a.gpuphot), "..", "bench", "bench_fits_read")
    fr = os.path.normpath(fr)
    if os.path.exists(fr):
        e["load_fits_read"] = load1()
        d = os.path.join(a.work, "fits_read")
        out, _ = run([fr, "14208x10656", str(a.repeat), d], timeout=a.timeout)
        e["bench_fits_read"] = out
        shutil.rmtree(d, ignore_errors=True)
    results["extras"] = e
    save(a, results)


def save(a, results):
    with open(os.path.join(a.work, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(a.work, "results.md"), "w") as f:
        f.write(markdown(results))


def fmt(v, nd=2):
    return "–" if v is None else ("%.*f" % (nd, v))


def markdown(results):
    m = results["machine"]
    lines = ["Machine: %s, %d cores; %s" % (m["cpu"], m["cores"], m["date"]), ""]
    for r in results["frames"]:
        g1, g2 = r["gpuphot_t1"], r["gpuphot_t2"]
        lines.append("### %s: %dx%d (%.1f MP), %d stars, uint16 (%.0f MB)" % (
            r["name"], r["width"], r["height"], r["megapixels"], r["stars"], r["file_mb"]))
        lines.append("")
        lines.append("1-min load average before each measurement: " + ", ".join(
            "%s %.2f" % (k, v) for k, v in r["load"].items()) + ". Best of %d." % r["repeat"])
        lines.append("")
        lines.append("| stage | gpuphot 1 thread (s) | gpuphot 2 threads (s) | sep (s) |")
        lines.append("|---|---:|---:|---:|")
        sep = r.get("sep", {}).get("seconds", {})
        sepmap = {"read": "read", "background": "background", "detection": "extract",
                  "aperture": "sum_circle"}
        order = ["read", "background", "detection", "background (second pass)", "detection (second pass)",
                 "psf", "aperture", "catalog"]
        for st in sorted(g1["stages"], key=lambda k: order.index(k) if k in order else len(order)):
            sv = sep.get(sepmap.get(st, ""), None)
            lines.append("| %s | %s | %s | %s |" % (st, fmt(g1["stages"][st], 3),
                                                  fmt(g2["stages"].get(st), 3),
                                                  fmt(sv, 3) if sv is not None else ""))
        lines.append("| **total** | **%s** | **%s** | **%s** |" % (
            fmt(g1["total_seconds_best"]), fmt(g2["total_seconds_best"]), fmt(sep.get("total"))))
        lines.append("")
        lines.append("| tool | total wall (s) | CPU (s) | sources | completeness S/N>=10 "
                     "| unmatched detections | peak RSS (MiB) |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        c = r["completeness"]

        def row(label, total, cpu, sources, comp, peak):
            cs = ("%.4f (%d/%d)" % (comp["completeness"], comp["found"], comp["truth_selected"])
                  if comp else "")
            um = str(comp["detections_unmatched"]) if comp else ""
            lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                label, fmt(total), fmt(cpu), sources, cs, um, fmt(peak / 2 ** 20, 0) if peak else ""))
        row("gpuphot, 1 thread", g1["total_seconds_best"], g1.get("cpu_seconds_per_run"), g1["sources"], None,
            g1["peak_host_bytes"])
        row("gpuphot, 2 threads", g2["total_seconds_best"], g2.get("cpu_seconds_per_run"), g2["sources"],
            c.get("gpuphot"), g2["peak_host_bytes"])
        if "sep" in r:
            row("sep " + r["sep"]["tool"].split()[-1], r["sep"]["seconds"]["total"],
                r["sep"].get("cpu_seconds", {}).get("total"), r["sep"]["sources"], c.get("sep"),
                r["sep"].get("peak_rss_bytes"))
            for t in (1, 2):
                if "sex_t%d" % t not in r:
                    continue
                s = r["sex_t%d" % t]
                row("source-extractor NTHREADS %d" % t, s["seconds"]["total"],
                    s.get("cpu_seconds", {}).get("total"),
                    s["sources"], c.get("sex") if c.get("sex", {}).get("catalog", "").endswith(
                        ".sex%d.cat.fits" % t) else None, s.get("peak_rss_bytes"))
        else:
            lines.append("")
            lines.append("sep / source-extractor not run: " + r.get("peers_skipped", ""))
        lines.append("")
    if "extras" in results:
        e = results["extras"]
        lines.append("### Foundation figures")
        lines.append("")
        lines.append("- `gpuphot simulate --size 4096x4096 --stars 20000`: %.2f s (best, load %.2f)" % (
            e["simulate_4096x4096_20000_seconds"], e["load_simulate"]))
        if "bench_fits_read" in e:
            lines.append("- `bench_fits_read 14208x10656` (load %.2f):" % e["load_fits_read"])
            lines.append("")
            lines.append("```")
            lines.append(e["bench_fits_read"].rstrip())
            lines.append("```")
        lines.append("")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpuphot", default="build-bench/app/gpuphot")
    ap.add_argument("--frames", default="small", help="small, full, or comma-separated names: " +
                    ", ".join(FRAMES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default="/tmp/gpuphot-bench")
    ap.add_argument("--no-peers-above", type=float, default=1e9, metavar="MP",
                    help="skip sep and source-extractor on frames larger than this")
    ap.add_argument("--sex-threads", default="1,2", help="source-extractor NTHREADS values to run (Debian's "
                    "build is single-threaded: 1 is enough there)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    ap.add_argument("--extras", action="store_true", help="simulate 4096x4096 timing and 151 MP FITS read")
    ap.add_argument("--keep", action="store_true", help="keep frames and catalogs")
    ap.add_argument("--markdown", metavar="RESULTS_JSON", help="only render RESULTS_JSON as Markdown")
    a = ap.parse_args()
    if a.markdown:
        with open(a.markdown) as f:
            sys.stdout.write(markdown(json.load(f)))
        return
    a.sex_threads = [int(t) for t in a.sex_threads.split(",")]
    a.gpuphot = os.path.abspath(a.gpuphot)
    if not os.path.exists(a.gpuphot):
        sys.exit("no gpuphot at %s (build it: cmake --build build-bench --target gpuphot)" % a.gpuphot)
    names = SETS.get(a.frames, a.frames.split(","))
    for n in names:
        if n not in FRAMES:
            sys.exit("unknown frame '%s' (known: %s)" % (n, ", ".join(FRAMES)))
    os.makedirs(a.work, exist_ok=True)
    need = sum(FRAMES[n][0] * FRAMES[n][1] * 2 for n in names) / 2 ** 30 * 1.1
    free = shutil.disk_usage(a.work).free / 2 ** 30
    if free < need + 2:
        sys.exit("%s: %.1f GiB free, the frames need about %.1f GiB" % (a.work, free, need))
    results = {"machine": machine(), "frames": []}
    for n in names:
        measure_frame(n, a, results)
    if a.extras:
        extras(a, results)
    log("results: %s/results.json, %s/results.md" % (a.work, a.work))
    sys.stdout.write(markdown(results))


if __name__ == "__main__":
    main()
