#!/usr/bin/python3
"""Data-parallel scaling on this machine (issue 15; bench/README.md, "Data parallel").

bench/dp_scaling.py BUILD_DIR [--rounds N] [--steps N] [--quick] [--work DIR] [--keep]

One gpt2 (d256, 6 layers, 4 heads, T128, vocab 512) on a token file this script writes
(`format: tokens`, uint16), global batch 8, --steps optimizer steps (default 30), trained by
`traind run JOB.yaml --device cpu --threads N` in four ways, alternating them round by round
(--rounds, default 3; the medians count):
  (a) 1 process x 1 thread                  batch 8
  (b) 1 process x 2 threads (--threads 2)   batch 8
  (c) world 2 x 1 thread each, batch 4 per rank, TRAIND_DIST_BUCKET_MB=0: one all-reduce of the
      whole gradient after backward
  (d) world 2 x 1 thread each, batch 4 per rank, TRAIND_DIST_BUCKET_MB unset: the default bucketed
      all-reduce (4 MiB buckets) overlapped with backward
Ranks meet on 127.0.0.1 and a port the kernel hands out (WORLD_SIZE, RANK, MASTER_ADDR,
MASTER_PORT as in docs/distributed.md). tokens/s is the `done:` line's (the world's tokens over
the whole run, set-up and the first step included); steady tokens/s the step lines' windows after
the first (logging every steps/3); communication is rank 0's `communication:` line (seconds in collectives not
hidden by compute, seconds hidden behind backward). Then allreduce_bench --spawn 2 (the Gloo
all-reduce over loopback against memcpy). Every process runs with OMP_WAIT_POLICY=PASSIVE, as the
other benches. The load average is printed at the start and the end; above 0.5 at the start the
numbers are not a measurement of this code (other processes share the 2 cores) and a warning says
so.

--quick (the ctest smoke test): 3 steps, one round, allreduce_bench --quick; checks that every
row and the all-reduce table came out and prints "dp_scaling: every row present".
"""
import argparse
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from array import array

ROWS = [
    ("a", "1 process x 1 thread", 1, 1, None),
    ("b", "1 process x 2 threads", 1, 2, None),
    ("c", "world 2 x 1 thread, one all-reduce after backward (BUCKET_MB=0)", 2, 1, "0"),
    ("d", "world 2 x 1 thread, bucketed all-reduce overlapped (default)", 2, 1, None),
]
GLOBAL_BATCH = 8
VOCAB = 512
SEQ = 128

DONE_RE = re.compile(r"^done: (\d+) steps, train_loss (\S+), eval_loss (\S+), (\d+) tok/s, "
                     r"([\d.]+)s", re.M)
STEP_RE = re.compile(r"^step (\d+)/\d+\s+loss \S+\s+lr \S+\s+grad_norm \S+\s+(\d+) tok/s", re.M)
COMM_RE = re.compile(r"^communication: ([\d.]+) s in collectives not hidden by compute "
                     r"\(([\d.]+)% of the steps' time\)(?:, ([\d.]+) s hidden behind backward)?"
                     r", ([\d.]+) MiB sent by this rank", re.M)


def load():
    return "%.2f %.2f %.2f" % os.getloadavg()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tokens(path, n):
    # A learnable stream (a walk through the vocabulary with one token in five random), as the
    # data-parallel tests write; enough for every step without wrapping in the default run.
    rng = random.Random(4)
    t = array("H", ((rng.randrange(VOCAB) if rng.randrange(5) == 0 else (i * 7 + i // 13) % VOCAB)
                    for i in range(n)))
    with open(path, "wb") as f:
        t.tofile(f)


def spec(work, name, out, batch, steps, world):
    s = (f"name: {name}\n"
         f"model: {{arch: gpt2, config: {{vocab_size: {VOCAB}, n_positions: {SEQ}, n_embd: 256, "
         f"n_layer: 6, n_head: 4}}}}\n"
         f"data: {{train_file: {work}/tokens.bin, format: tokens, token_dtype: uint16, "
         f"seq_len: {SEQ}, validation_split: 0.0, shuffle: true}}\n"
         f"training: {{max_steps: {steps}, per_device_train_batch_size: {batch}, "
         f"gradient_accumulation_steps: 1, learning_rate: 1.0e-3, lr_scheduler_type: cosine, "
         f"warmup_steps: 2, weight_decay: 0.1, max_grad_norm: 1.0, seed: 7, "
         f"logging_steps: {max(1, steps // 3)}, save_steps: 0}}\n"
         f"output_dir: {out}\n")
    if world > 1:
        s += "distributed: {}\n"  # world_size, rank, master_addr, master_port from the environment
    return s


def run_row(args, work, row, rnd):
    key, _, world, threads, bucket = row
    name = f"dp-scaling-{key}-{rnd}"
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    for v in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "TRAIND_DIST_BUCKET_MB"):
        env.pop(v, None)
    if bucket is not None:
        env["TRAIND_DIST_BUCKET_MB"] = bucket
    port = free_port()
    procs = []
    for rank in range(world):
        out = f"{work}/out-{name}-rank{rank}"
        shutil.rmtree(out, ignore_errors=True)
        path = f"{work}/{name}-rank{rank}.yaml"
        with open(path, "w") as f:
            f.write(spec(work, name, out, GLOBAL_BATCH // world, args.steps, world))
        renv = dict(env)
        if world > 1:
            renv.update(WORLD_SIZE=str(world), RANK=str(rank), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))
        log = open(f"{work}/{name}-rank{rank}.log", "w+")
        procs.append((subprocess.Popen([args.traind, "run", path, "--device", "cpu", "--threads",
                                        str(threads)], stdout=log, stderr=subprocess.STDOUT,
                                       env=renv), log, out))
    texts = []
    for p, log, out in procs:
        try:
            rc = p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        log.seek(0)
        texts.append((rc, log.read()))
        log.close()
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    rc0, text0 = texts[0]
    result = {"row": key, "round": rnd, "ok": False}
    done = DONE_RE.search(text0)
    bad = [r for r, (rc, _) in enumerate(texts) if rc != 0]
    if bad or not done:
        tail = "\n".join("    " + l for l in texts[bad[0] if bad else 0][1].splitlines()[-5:])
        print(f"  ({key}) round {rnd}: FAILED (exit {[rc for rc, _ in texts]}):\n{tail}")
        return result
    result.update(ok=True, tok_s=float(done.group(4)), seconds=float(done.group(5)),
                  loss=done.group(2))
    # Steady state: the logged windows after the first (which holds the first step's one-time
    # costs); equal windows of tokens, so their harmonic mean is tokens over time.
    rates = [float(m.group(2)) for m in STEP_RE.finditer(text0)][1:]
    if rates and all(r > 0 for r in rates):
        result["steady_tok_s"] = len(rates) / sum(1.0 / r for r in rates)
    comm = COMM_RE.search(text0)
    if comm:
        result.update(not_hidden=float(comm.group(1)), not_hidden_pct=float(comm.group(2)),
                      hidden=float(comm.group(3)) if comm.group(3) is not None else None,
                      mib=float(comm.group(4)))
    line = f"  ({key}) round {rnd}: {result['tok_s']:.0f} tok/s " \
           f"(steady {result.get('steady_tok_s', 0):.0f}), {result['seconds']:.1f} s, " \
           f"train_loss {result['loss']}"
    if comm:
        line += f"; rank 0 comm: {comm.group(1)} s not hidden ({comm.group(2)}%), " + \
                (f"{comm.group(3)} s hidden" if comm.group(3) else "hidden: not reported") + \
                f", {comm.group(4)} MiB sent"
    print(line + f"  [load {load()}]", flush=True)
    return result


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--work", default=None, help="scratch directory (default: a fresh temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run")
    args = ap.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.steps = args.steps or (3 if args.quick else 30)
    args.timeout = args.timeout or (120 if args.quick else 900)
    args.traind = os.path.join(args.build_dir, "server", "traind")
    bench = os.path.join(args.build_dir, "bench", "allreduce_bench")
    for exe in (args.traind, bench):
        if not os.access(exe, os.X_OK):
            print(f"missing {exe}: build the traind and allreduce_bench targets first",
                  file=sys.stderr)
            return 1
    work = args.work or tempfile.mkdtemp(prefix="dp-scaling-")
    os.makedirs(work, exist_ok=True)
    write_tokens(f"{work}/tokens.bin", max(200_000, 2 * args.steps * GLOBAL_BATCH * (SEQ + 1)))

    start_load = os.getloadavg()
    print(f"== data-parallel scaling: gpt2 d256 L6 H4, T{SEQ}, vocab {VOCAB}, global batch "
          f"{GLOBAL_BATCH}, {args.steps} steps, {args.rounds} round(s), OMP_WAIT_POLICY=PASSIVE")
    print(f"   host={socket.gethostname()} cpus={os.cpu_count()} load at start={load()} "
          f"({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})")
    if start_load[0] > 0.5:
        print(f"WARNING: 1-minute load average {start_load[0]:.2f} > 0.5 at the start: other "
              f"processes share the cores, so these numbers measure the contention as much as "
              f"traind (do not report them as its scaling)")
    sys.stdout.flush()
    results = {key: [] for key, *_ in ROWS}
    for rnd in range(1, args.rounds + 1):
        for row in ROWS:
            results[row[0]].append(run_row(args, work, row, rnd))

    print(f"\n== allreduce_bench --spawn 2{' --quick' if args.quick else ''}", flush=True)
    ar = subprocess.run([bench, "--spawn", "2"] + (["--quick"] if args.quick else []),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        timeout=args.timeout, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    print(ar.stdout, end="", flush=True)
    end_load = load()

    ok = {k: [r for r in v if r["ok"]] for k, v in results.items()}
    tok = {k: med([r["tok_s"] for r in v]) for k, v in ok.items()}
    steady = {k: med([r.get("steady_tok_s") for r in v]) for k, v in ok.items()}
    print(f"\n{'row':68} {'tok/s':>7} {'runs':>5} {'vs (a)':>7} {'steady':>7} {'vs (a)':>7} "
          f"{'not hidden s':>13} {'(% of steps)':>12} {'hidden s':>9} {'hidden frac':>11}")
    for key, label, *_ in ROWS:
        t = tok[key]
        nh = med([r.get("not_hidden") for r in ok[key]])
        pct = med([r.get("not_hidden_pct") for r in ok[key]])
        hid = med([r.get("hidden") for r in ok[key]])
        fracs = [r["hidden"] / (r["hidden"] + r["not_hidden"]) for r in ok[key]
                 if r.get("hidden") is not None and r["hidden"] + r["not_hidden"] > 0]
        frac = med(fracs)
        st = steady[key]
        f = lambda v, fmt: (fmt % v) if v is not None else "-"
        print(f"({key}) {label:64} {f(t, '%.0f'):>7} {len(ok[key]):>2}/{len(results[key]):<2} "
              f"{f(t / tok['a'] if t and tok['a'] else None, '%.2fx'):>7} {f(st, '%.0f'):>7} "
              f"{f(st / steady['a'] if st and steady['a'] else None, '%.2fx'):>7} {f(nh, '%.2f'):>13} "
              f"{f(pct, '%.1f%%'):>12} {f(hid, '%.2f'):>9} {f(frac, '%.2f'):>11}")
        print(f"RESULT dp_scaling row={key} tok_s={f(t, '%.1f')} runs={len(ok[key])} "
              f"speedup_vs_a={f(t / tok['a'] if t and tok['a'] else None, '%.3f')} "
              f"steady_tok_s={f(st, '%.1f')} "
              f"steady_speedup_vs_a={f(st / steady['a'] if st and steady['a'] else None, '%.3f')} "
              f"comm_not_hidden_s={f(nh, '%.3f')} comm_hidden_s={f(hid, '%.3f')} "
              f"hidden_fraction={f(frac, '%.3f')}")
    for key in ("c", "d"):
        if tok[key] and tok["b"]:
            print(f"world 2 vs 1 process x 2 threads: ({key})/(b) = {tok[key] / tok['b']:.2f}x"
                  + (f" (steady {steady[key] / steady['b']:.2f}x)"
                     if steady[key] and steady["b"] else ""))
    if any(r.get("not_hidden") is not None and r.get("hidden") is None for r in ok["d"]):
        print("note: this traind does not report 'hidden behind backward' (built before the "
              "bucketed overlap): rebuild it")
    print("tok/s: median over the rounds of the `done:` line (the world's tokens over the whole run "
          "from set-up to the end, rendezvous and first step included); steady: the logged windows "
          "after the first (every --steps/3 steps); communication: rank 0's over the whole run, "
          "medians; hidden frac = hidden / (hidden + not hidden).")
    print(f"load average: start {' '.join('%.2f' % x for x in start_load)}, end {end_load}")
    if start_load[0] > 0.5:
        print(f"WARNING: loaded machine at the start (1-minute load {start_load[0]:.2f} > 0.5)")

    if not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    missing = [k for k in tok if tok[k] is None]
    missing += [f"{k} communication" for k in ("c", "d")
                if not any(r.get("not_hidden") is not None for r in ok[k])]
    if not any(r.get("hidden") is not None for r in ok["d"]):
        missing.append("d hidden-behind-backward")
    if ar.returncode != 0 or "RESULT allreduce world=2" not in ar.stdout:
        missing.append(f"allreduce_bench (exit {ar.returncode})")
    if missing:
        print(f"dp_scaling: missing {', '.join(missing)}")
        return 1
    if args.quick:
        print("dp_scaling: every row present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
