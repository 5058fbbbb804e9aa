#!/usr/bin/python3
"""PyTorch peer of optim_bench: optimizer step time per parameter for torch.optim.AdamW and
torch.optim.SGD (foreach=True and foreach=False; the C++ side takes the faster) and HF transformers'
Adafactor algorithm (transformers is not installed here: the same per-tensor torch code as
tests/engine/reference/adafactor_reference.py, which is what HF runs), on the same GPT-2 parameter
shapes as the C++ side. No 8-bit peer: bitsandbytes has no CPU build for torch 1.13 here.
Usage: torch_optim_bench.py [--model tiny|small] [--threads N] [--steps N] [--warmup N]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "engine",
                                "reference"))
from adafactor_reference import step_param  # noqa: E402


def shapes(L, C, V):
    out = [(V, C), (1024, C)]
    for _ in range(L):
        out += [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (4 * C, C), (4 * C,),
                (C, 4 * C), (C,)]
    return out + [(C,), (C,)]


def median_step(warmup, steps, fn):
    t = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        fn()
        if s >= warmup:
            t.append(time.perf_counter() - t0)
    t.sort()
    return t[len(t) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    L, C, V = (4, 256, 256) if a.model == "tiny" else (6, 384, 50304)
    gen = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen) * 0.02) for s in shapes(L, C, V)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 0.02
    n = sum(p.numel() for p in params)
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]

    def report(name, sec, foreach=None):
        variant = "" if foreach is None else (" foreach" if foreach else " single_tensor")
        print("RESULT side=torch opt=%s ns_per_param=%.4f step_ms=%.3f%s"
              % (name, 1e9 * sec / n, 1e3 * sec, variant), flush=True)

    for foreach in (True, False):
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), foreach=foreach)
        report("adamw", median_step(a.warmup, a.steps, opt.step), foreach)
        del opt
        opt = torch.optim.SGD(groups, lr=1e-4, momentum=0.9, foreach=foreach)
        report("sgd", median_step(a.warmup, a.steps, opt.step), foreach)
        del opt
    cfg = dict(relative_step=True, warmup_init=False, scale_parameter=True, eps1=1e-30, eps2=1e-3,
               decay_rate=-0.8, clip_threshold=1.0, beta1=None, weight_decay=0.0)
    states = [{} for _ in params]

    def adafactor_step():
        with torch.no_grad():
            for p, st in zip(params, states):
                step_param(p, p.grad, st, cfg, 0.0, False)

    report("adafactor", median_step(a.warmup, a.steps, adafactor_step))


if __name__ == "__main__":
    main()
