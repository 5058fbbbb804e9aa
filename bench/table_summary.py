#!/usr/bin/python3
"""Summary of bench/table.sh's logs: the techniques table (best round per row and side over all
the logs given), the traind/PyTorch ratio per row, and the issue 4 targets with MET / NOT MET,
by wall-clock time and by process CPU time (which other processes' load distorts much less).
Usage: table_summary.py LOG [LOG...]
"""
import statistics
import sys

ROWS = [("baseline", "baseline (fp32)"), ("accum", "+ grad accumulation"),
        ("ckpt", "+ grad checkpointing"), ("bf16", "+ bf16"), ("all", "+ all")]
MIB = 1048576.0


def main():
    runs = {}  # (row, side) -> list of RESULT dicts
    for path in sys.argv[1:]:
        for line in open(path):
            if line.startswith("RESULT "):
                kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
                runs.setdefault((kv["row"], kv["side"]), []).append(kv)

    def best(row, side):  # the round with the most samples/s; None when absent or unavailable
        ok = [r for r in runs.get((row, side), []) if r.get("status") == "ok"]
        return max(ok, key=lambda r: float(r["samples_s"])) if ok else None

    def cpu(row, side):  # the least CPU-ms per sample over the rounds
        ok = [float(r["cpu_ms_per_sample"]) for r in runs.get((row, side), [])
              if r.get("status") == "ok" and "cpu_ms_per_sample" in r]
        return min(ok) if ok else None

    def rss(row, side):  # median RSS growth over the rounds
        ok = [float(r["rss_bytes"]) for r in runs.get((row, side), []) if r.get("status") == "ok"]
        return statistics.median(ok) / MIB if ok else None

    print(f"{'row':22} {'ms/sample':>19} {'samples/s':>17} {'speed':>7} "
          f"{'traind peak MiB':>16} {'RSS growth MiB':>17}")
    print(f"{'':22} {'traind':>9} {'torch':>9} {'traind':>8} {'torch':>8} {'ratio':>7} "
          f"{'arena (plan)':>16} {'traind':>8} {'torch':>8}")
    ratios = {}
    for key, label in ROWS:
        a, b = best(key, "traind"), best(key, "torch")
        if a is None:
            why = "not available" if runs.get((key, "traind")) else "not run"
            tb = f"{float(b['sample_ms']):9.1f}" if b else f"{'-':>9}"
            print(f"{label:22} {why:>9} {tb} (traind row {why}: no numbers)")
            continue
        ta, sa = float(a["sample_ms"]), float(a["samples_s"])
        line = f"{label:22} {ta:9.1f} "
        if b:
            tb, sb = float(b["sample_ms"]), float(b["samples_s"])
            ratios[key] = sa / sb
            line += f"{tb:9.1f} {sa:8.2f} {sb:8.2f} {sa / sb:6.2f}x "
        else:
            line += f"{'-':>9} {sa:8.2f} {'-':>8} {'-':>7} "
        peak, plan = float(a["peak_bytes"]) / MIB, float(a["plan_bytes"]) / MIB
        rb = rss(key, "torch")
        line += f"{peak:7.0f} ({plan:6.0f}) {rss(key, 'traind'):8.0f} "
        line += f"{rb:8.0f}" if rb is not None else f"{'-':>8}"
        print(line)
    print("ms/sample, samples/s: the round with the most samples/s of each side (median step of "
          "that round / samples per optimizer step). arena: traind's DeviceArena high-water mark "
          "(plan: Model::PlanBytes + AdamW state). RSS growth: the process's VmHWM after the steps "
          "minus its VmRSS before the model existed (VmHWM reset via /proc/self/clear_refs): every "
          "byte made resident (tensors, allocator caches, library workspaces, thread stacks), "
          "median over rounds; the only like-for-like memory number for PyTorch.")

    print(f"\n{'row':22} {'CPU-ms/sample':>19} {'ratio':>7}")
    print(f"{'':22} {'traind':>9} {'torch':>9}")
    cpu_ratios = {}
    for key, label in ROWS:
        a, b = cpu(key, "traind"), cpu(key, "torch")
        if a is None:
            print(f"{label:22} {'-':>9} " + (f"{b:9.1f}" if b else f"{'-':>9}"))
            continue
        if b:
            cpu_ratios[key] = b / a
            print(f"{label:22} {a:9.1f} {b:9.1f} {b / a:6.2f}x")
        else:
            print(f"{label:22} {a:9.1f} {'-':>9}")
    print("CPU-ms/sample: process CPU time (all threads) of the timed steps per sample, least over "
          "the rounds; both sides run OMP_WAIT_POLICY=PASSIVE, so idle threads do not spin.")

    def speed(key):
        b = best(key, "traind")
        return float(b["samples_s"]) if b else None

    print("\ntargets (issue 4):")
    base, bf16, ckpt = speed("baseline"), speed("bf16"), speed("ckpt")
    if base and bf16:
        print(f"  bf16 >= 1.5x our fp32: {bf16 / base:.2f}x -> "
              f"{'MET' if bf16 / base >= 1.5 else 'NOT MET'}")
    else:
        print("  bf16 >= 1.5x our fp32: not measurable (bf16 row not available)")
    if base and ckpt:
        cost = 1.0 - ckpt / base
        print(f"  checkpointing costs <= 35% throughput: costs {100 * cost:.1f}% -> "
              f"{'MET' if cost <= 0.35 else 'NOT MET'}")
    for key, label in ROWS:
        if key in ratios:
            r = ratios[key]
            c = f"; by CPU time {cpu_ratios[key]:.2f}x" if key in cpu_ratios else ""
            print(f"  {label} >= 1.3x PyTorch: {r:.2f}x -> {'MET' if r >= 1.3 else 'NOT MET'}{c}")
        else:
            print(f"  {label} >= 1.3x PyTorch: not measurable")
    cb, c16, cck = cpu("baseline", "traind"), cpu("bf16", "traind"), cpu("ckpt", "traind")
    if cb and c16 and cck:
        print(f"  by CPU time: bf16 {cb / c16:.2f}x our fp32, checkpointing costs "
              f"{100 * (1 - cb / cck):.1f}% throughput")


if __name__ == "__main__":
    main()
