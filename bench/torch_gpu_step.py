#!/usr/bin/env python3
"""PyTorch eager peer of `gpt2_step_bench --device cuda:0`: the same GPT-2 training step (zero_grad,
forward, backward, AdamW) from torch_gpt2_step.py's model, on a CUDA device, plus the device's
measured bf16 GEMM rate (the MFU denominator for both sides). Needs torch >= 2.0 with CUDA (the GPU
machine's python3, not Debian's CPU torch).

Precision: fp32 | tf32 (fp32 with TF32 matmuls) | bf16 (torch.autocast bf16, fp32 master weights,
loss on fp32 logits: what HF Trainer's --bf16 does). Attention: sdpa (F.scaled_dot_product_attention,
is_causal; HF's default) or math (explicit masked softmax).
Usage: torch_gpu_step.py [--config small|gpt2] [--precision fp32|tf32|bf16] [--attn sdpa|math]
                         [--batch B] [--seq T] [--steps N] [--warmup N] [--optim foreach|fused]
       torch_gpu_step.py --peak        (bf16 8192^3 matmul TFLOP/s only)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_step import all_params, forward, make_params, training_flops  # noqa: E402

CONFIGS = {
    "tiny": dict(L=4, C=256, NH=4, T=128, B=8, V=256, steps=30),
    "small": dict(L=6, C=384, NH=6, T=256, B=8, V=50304, steps=30),
    "gpt2": dict(L=12, C=768, NH=12, T=1024, B=8, V=50304, steps=20),
}


def median_ms(fn, warmup, reps):
    """Median milliseconds of fn() over `reps` runs timed with CUDA events, after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def peak_bf16_tflops(n=8192):
    """bf16 n^3 matmul rate on random data, rotating among three input pairs (not the cache)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    pairs = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g),
              torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)) for _ in range(3)]
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    i = [0]

    def one():
        a, b = pairs[i[0] % 3]
        i[0] += 1
        torch.matmul(a, b, out=out)

    ms = median_ms(one, 3, 10)
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def run(name, cfg, a):
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    gen = torch.Generator().manual_seed(1234)
    p = make_params(cfg, gen)

    def to_dev(t):
        return t.detach().to(dev).requires_grad_()
    p = {k: (to_dev(v) if torch.is_tensor(v) else [{kk: to_dev(vv) for kk, vv in l.items()} for l in v])
         for k, v in p.items()}
    params = all_params(p)
    decay = [t for t in params if t.dim() >= 2]
    no_decay = [t for t in params if t.dim() < 2]
    kw = {"fused": True} if a.optim == "fused" else {"foreach": True}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, **kw)
    B, T = cfg["B"], cfg["T"]
    ids = torch.randint(0, cfg["V"], (B * T + 1,), generator=gen)
    idx, tgt = ids[:-1].view(B, T).to(dev), ids[1:].view(B, T).to(dev)
    mask = None if a.attn == "sdpa" else torch.triu(
        torch.ones(T, T, dtype=torch.bool, device=dev), diagonal=1)
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = forward(p, cfg, idx, tgt, mask)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # a host sync per step, as the trainer's loss read

    torch.cuda.reset_peak_memory_stats()
    steps = a.steps if a.steps >= 0 else cfg["steps"]
    med = median_ms(step, a.warmup, steps) * 1e-3
    tok_s = B * T / med
    flops = training_flops(p, cfg)
    achieved = flops / med / 1e12
    peak_mem = torch.cuda.max_memory_allocated()
    print(f"torch {name}: torch {torch.__version__} {torch.cuda.get_device_name()} "
          f"precision={a.precision} attn={a.attn} optim={a.optim} B={B} T={T}")
    print(f"  step median {1e3 * med:.2f} ms ({steps} steps), {tok_s:.0f} tok/s, "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, {achieved:.1f} model TFLOP/s, "
          f"peak allocated {peak_mem / 2**20:.0f} MiB")
    print(f"RESULT side=torch config={name} precision={a.precision} attn={a.attn} tok_s={tok_s:.1f} "
          f"step_ms={1e3 * med:.3f} model_tflops={achieved:.2f} loss={losses[-1]:.4f} "
          f"peak_mib={peak_mem / 2**20:.0f}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="gpt2", choices=list(CONFIGS))
    ap.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "math"])
    ap.add_argument("--optim", default="foreach", choices=["foreach", "fused"])
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--steps", type=int, default=-1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_gpu_step.py: torch sees no CUDA device")
    if a.peak:
        t = peak_bf16_tflops()
        print(f"PEAK bf16_matmul_8192_tflops={t:.1f} device={torch.cuda.get_device_name()!r}")
        return
    cfg = dict(CONFIGS[a.config])
    if a.batch:
        cfg["B"] = a.batch
    if a.seq:
        cfg["T"] = a.seq
    run(a.config, cfg, a)


if __name__ == "__main__":
    main()
