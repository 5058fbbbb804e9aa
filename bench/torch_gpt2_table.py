#!/usr/bin/python3
"""PyTorch eager peer of gpt2_table_bench: one row of the techniques table (issue 4) with the same
model, init, AdamW settings and batch split as the C++ side. Techniques the PyTorch way: a loop of
micro-batches (loss / k, backward each) for accumulation, torch.utils.checkpoint per block for
checkpointing, torch.autocast('cpu', dtype=torch.bfloat16) for bf16 (logits cast to fp32 for the
loss). Peak memory: growth of the process's resident set (VmHWM after the steps minus VmRSS before
the model exists, VmHWM reset through /proc/self/clear_refs): tensors, allocator caches and library
workspaces, everything the row made resident. Run with /usr/bin/python3 (python3-torch 1.13).
Usage: torch_gpt2_table.py --row baseline|accum|ckpt|bf16|all [--model tiny|small] [--batch B]
                           [--accum K] [--steps N] [--warmup N] [--threads N]
"""
import argparse
import os
import re
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_step import all_params, block, make_params  # noqa: E402  (same model and init)

MODELS = {
    "tiny": dict(L=4, C=256, NH=4, T=128, V=256),
    "small": dict(L=6, C=384, NH=6, T=256, V=50304),
}
ROWS = {  # (accumulation, checkpointing, bf16)
    "baseline": (False, False, False), "accum": (True, False, False),
    "ckpt": (False, True, False), "bf16": (False, False, True), "all": (True, True, True),
}


def proc_status_bytes(key):
    m = re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read())
    return 1024 * int(m.group(1)) if m else -1


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def forward(p, cfg, B, idx, tgt, mask, ckpt):
    T, C, NH = cfg["T"], cfg["C"], cfg["NH"]
    x = F.embedding(idx, p["wte"]) + p["wpe"][:T]
    for l in p["layers"]:
        if ckpt:
            x = torch.utils.checkpoint.checkpoint(
                lambda x_, l_=l: block(l_, x_, B, T, C, NH, mask), x, use_reentrant=False)
        else:
            x = block(l, x, B, T, C, NH, mask)
    x = F.layer_norm(x, (C,), p["lnf_w"], p["lnf_b"], 1e-5)
    logits = F.linear(x, p["wte"])  # tied lm_head
    return F.cross_entropy(logits.float().view(-1, cfg["V"]), tgt.view(-1))


def run(model, row, batch, accum, steps, warmup):
    cfg = MODELS[model]
    use_accum, ckpt, bf16 = ROWS[row]
    k = accum if use_accum else 1
    B, T = batch // k, cfg["T"]
    peak_reset = reset_peak_rss()
    rss0 = proc_status_bytes("VmRSS")
    print(f"torch {model} row={row}: torch {torch.__version__} threads={torch.get_num_threads()} "
          f"micro_batch={B} accum={k} ckpt={int(ckpt)} autocast_bf16={int(bf16)} "
          f"mkldnn={int(torch.backends.mkldnn.is_available())} "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')} "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    gen = torch.Generator().manual_seed(1234)
    p = make_params(dict(cfg, B=B), gen)
    decay = [t for t in all_params(p) if t.dim() >= 2]
    no_decay = [t for t in all_params(p) if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    ids = torch.randint(0, cfg["V"], (k * B * T + 1,), generator=gen)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    times, first, loss, cpu0 = [], None, 0.0, 0.0
    for s in range(warmup + steps):
        if s == warmup:
            cpu0 = time.process_time()  # CPU seconds of all threads of the process
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for a in range(k):
            idx = ids[a * B * T:(a + 1) * B * T].view(B, T)
            tgt = ids[a * B * T + 1:(a + 1) * B * T + 1].view(B, T)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                micro = forward(p, cfg, B, idx, tgt, mask, ckpt)
            (micro / k).backward()
            loss_sum += micro.item()
        opt.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
        loss = loss_sum / k
        if first is None:
            first = loss
    cpu_s = time.process_time() - cpu0
    hwm = proc_status_bytes("VmHWM")
    if not times:
        print(f"torch {model} row={row}: loss {loss:.4f} (no timed steps)")
        return
    med = sorted(times)[len(times) // 2]
    samples = B * k
    print(f"  step median {1e3 * med:.1f} ms (min {1e3 * min(times):.1f}, max "
          f"{1e3 * max(times):.1f}, {len(times)} steps) for {samples} samples, loss {first:.4f} -> "
          f"{loss:.4f}\n  process RSS growth {(hwm - rss0) / 1048576:.1f} MiB"
          f"{'' if peak_reset else ' (VmHWM could not be reset: includes earlier peaks)'}")
    print(f"RESULT side=torch model={model} row={row} status=ok micro_batch={B} accum={k} "
          f"sample_ms={1e3 * med / samples:.3f} samples_s={samples / med:.3f} "
          f"cpu_ms_per_sample={1e3 * cpu_s / (samples * len(times)):.3f} "
          f"rss_bytes={hwm - rss0} loss={loss:.4f}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", required=True, choices=list(ROWS))
    ap.add_argument("--model", default="small", choices=list(MODELS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.batch < 1 or a.accum < 1 or a.batch % a.accum:
        ap.error("--batch must be a positive multiple of --accum")
    torch.set_num_threads(a.threads)
    run(a.model, a.row, a.batch, a.accum, a.steps, a.warmup)


if __name__ == "__main__":
    main()
