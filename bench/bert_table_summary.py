#!/usr/bin/python3
"""Summary of bench/bert_table.sh's logs: the memory-anatomy guide's BERT table (best round per
row and side over all the logs given): samples/s of both sides and the traind/PyTorch ratio, peak
memory (traind: arena high-water and plan, process RSS growth and peak; PyTorch: process RSS growth
and peak) and the memory ratio, CPU time per sample; rows a side cannot run say why.
Usage: bert_table_summary.py LOG [LOG...]
"""
import re
import statistics
import sys

ROWS = [("baseline", "baseline (fp32 AdamW)"), ("accum", "+ grad accumulation"),
        ("ckpt", "+ grad checkpointing"), ("bf16", "+ bf16"), ("adafactor", "+ Adafactor"),
        ("adamw_8bit", "+ 8-bit AdamW"), ("all", "+ all"), ("mixtral", "mixtral-style MoE (causal LM)"),
        ("dense", "dense causal LM, mixtral's active parameters")]
MIB = 1048576.0


def main():
    runs = {}  # (row, side) -> list of RESULT dicts
    model = None
    for path in sys.argv[1:]:
        for line in open(path):
            if line.startswith("RESULT "):
                kv = dict((m.group(1), m.group(2).strip('"')) for m in
                          re.finditer(r'(\w+)=("[^"]*"|\S+)', line))
                runs.setdefault((kv["row"], kv["side"]), []).append(kv)
                model = model or kv.get("model")

    def best(row, side):  # the round with the most samples/s; None when absent or unavailable
        ok = [r for r in runs.get((row, side), []) if r.get("status") == "ok"]
        return max(ok, key=lambda r: float(r["samples_s"])) if ok else None

    def why(row, side):
        rs = runs.get((row, side), [])
        return rs[-1].get("reason", "not available") if rs else "not run"

    def med(row, side, key):  # median over the rounds
        ok = [float(r[key]) for r in runs.get((row, side), []) if r.get("status") == "ok"]
        return statistics.median(ok) / MIB if ok else None

    def cpu(row, side):
        ok = [float(r["cpu_ms_per_sample"]) for r in runs.get((row, side), [])
              if r.get("status") == "ok"]
        return min(ok) if ok else None

    print(f"bert-{model}")
    print("| row | traind samples/s | torch samples/s | speed ratio | traind CPU-ms/sample | "
          "torch CPU-ms/sample | traind arena MiB (plan) | RSS growth MiB traind / torch | "
          "peak RSS MiB traind / torch | memory ratio (torch / traind RSS growth) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key, label in ROWS:
        a, b = best(key, "traind"), best(key, "torch")
        if a is None and b is None:
            if runs.get((key, "traind")) or runs.get((key, "torch")):
                print(f"| {label} | not built: {why(key, 'traind')} | {why(key, 'torch')} "
                      f"| - | - | - | - | - | - | - |")
            continue
        sa = f"{float(a['samples_s']):.3f}" if a else f"n/a ({why(key, 'traind')})"
        sb = f"{float(b['samples_s']):.3f}" if b else f"no peer ({why(key, 'torch')})"
        ratio = (f"{float(a['samples_s']) / float(b['samples_s']):.2f}x" if a and b else "-")
        ca, cb = cpu(key, "traind"), cpu(key, "torch")
        cas = f"{ca:.1f}" if ca is not None else "-"
        cbs = f"{cb:.1f}" if cb is not None else "-"
        arena = (f"{float(a['peak_bytes']) / MIB:.0f} ({float(a['plan_bytes']) / MIB:.0f})"
                 if a else "-")
        ra, rb = med(key, "traind", "rss_bytes"), med(key, "torch", "rss_bytes")
        ha, hb = med(key, "traind", "hwm_bytes"), med(key, "torch", "hwm_bytes")

        def f(v):
            return f"{v:.0f}" if v is not None else "-"
        mem = f"{rb / ra:.2f}x" if ra and rb else "-"
        print(f"| {label} | {sa} | {sb} | {ratio} | {cas} | {cbs} | {arena} | {f(ra)} / {f(rb)} "
              f"| {f(ha)} / {f(hb)} | {mem} |")
    print("samples/s: the round with the most samples/s of each side (median timed step; the "
          "first step is not timed). CPU-ms/sample: process CPU time of the timed steps per "
          "sample, least over the rounds. arena: traind's DeviceArena high-water mark (plan: "
          "Model::PlanBytes + optimizer state + step runner). RSS growth: VmHWM after the steps "
          "minus VmRSS before the model existed (VmHWM reset via /proc/self/clear_refs); peak "
          "RSS: VmHWM; medians over the rounds.")


if __name__ == "__main__":
    main()
