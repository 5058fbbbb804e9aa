#!/usr/bin/python3
"""PyTorch peer of gpt2_step_bench: full fp32 GPT-2 training steps (zero_grad, forward, backward,
AdamW) written from torch primitives, same configs and init as the C++ bench, for tokens/s and MFU.
Run with Debian's /usr/bin/python3 (python3-torch 1.13). bench/run_all.sh sets OMP_WAIT_POLICY=PASSIVE
(PyTorch's best setting on 2-core machines) and the OPENBLAS_CORETYPE that both sides use.
Usage: torch_gpt2_step.py [--config tiny|small|llama_tiny|llama_small|all] [--steps N]
                          [--warmup N] [--threads N]
                          [--dtype fp32|bf16] [--seq T]
--dtype bf16: forward and loss under torch.autocast("cpu", bfloat16) (its matmuls, attention's
included, in bf16 with fp32 parameters and AdamW), MFU against torch's bf16 GEMM rate measured in
the same run. --seq T: the sequence length (the default: the config's).
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

CONFIGS = {
    "tiny": dict(L=4, C=256, NH=4, T=128, B=8, V=256, steps=30),
    "small": dict(L=6, C=384, NH=6, T=256, B=8, V=50304, steps=6),
    # The llama family at the same sizes (gpt2_step_bench's llama configs; the model is
    # torch_gpt2_table.py's HF LlamaForCausalLM math): 2 kv heads, SwiGLU width H, untied lm_head.
    "llama_tiny": dict(L=4, C=256, NH=4, NKV=2, H=688, T=128, B=8, V=256, steps=30, llama=True),
    "llama_small": dict(L=6, C=384, NH=6, NKV=2, H=1024, T=256, B=8, V=50304, steps=6,
                        llama=True),
}
LLAMA_CONFIGS = ("llama_tiny", "llama_small")
N_POSITIONS = 1024


def make_params(cfg, gen):
    L, C, V = cfg["L"], cfg["C"], cfg["V"]

    def normal(*shape, std=0.02):
        return (torch.randn(*shape, generator=gen) * std).requires_grad_()

    def const(shape, value):
        return torch.full(shape, value, dtype=torch.float32).requires_grad_()

    resid = 0.02 / math.sqrt(2 * L)
    p = {"wte": normal(V, C), "wpe": normal(N_POSITIONS, C), "lnf_w": const((C,), 1.0),
         "lnf_b": const((C,), 0.0), "layers": []}
    for _ in range(L):
        p["layers"].append({
            "ln1_w": const((C,), 1.0), "ln1_b": const((C,), 0.0),
            "qkv_w": normal(3 * C, C), "qkv_b": const((3 * C,), 0.0),
            "proj_w": normal(C, C, std=resid), "proj_b": const((C,), 0.0),
            "ln2_w": const((C,), 1.0), "ln2_b": const((C,), 0.0),
            "fc_w": normal(4 * C, C), "fc_b": const((4 * C,), 0.0),
            "fc2_w": normal(C, 4 * C, std=resid), "fc2_b": const((C,), 0.0),
        })
    return p


def all_params(p):
    out = [p["wte"], p["wpe"], p["lnf_w"], p["lnf_b"]]
    for layer in p["layers"]:
        out += list(layer.values())
    return out


def block(l, x, B, T, C, NH, mask):
    """One pre-LN GPT-2 block: causal attention and GELU(tanh) MLP, each with its residual."""
    HS = C // NH
    h = F.layer_norm(x, (C,), l["ln1_w"], l["ln1_b"], 1e-5)
    q, k, v = F.linear(h, l["qkv_w"], l["qkv_b"]).split(C, dim=2)
    q = q.view(B, T, NH, HS).transpose(1, 2)
    k = k.view(B, T, NH, HS).transpose(1, 2)
    v = v.view(B, T, NH, HS).transpose(1, 2)
    if mask is None:  # fused causal attention (torch >= 2.0; the CUDA peer, torch_gpu_step.py)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = att @ v
    y = y.transpose(1, 2).reshape(B, T, C)
    x = x + F.linear(y, l["proj_w"], l["proj_b"])
    h = F.layer_norm(x, (C,), l["ln2_w"], l["ln2_b"], 1e-5)
    h = F.gelu(F.linear(h, l["fc_w"], l["fc_b"]), approximate="tanh")
    return x + F.linear(h, l["fc2_w"], l["fc2_b"])


def forward(p, cfg, idx, tgt, mask):
    B, T, C, NH = cfg["B"], cfg["T"], cfg["C"], cfg["NH"]
    x = F.embedding(idx, p["wte"]) + p["wpe"][:T]
    for l in p["layers"]:
        x = block(l, x, B, T, C, NH, mask)
    x = F.layer_norm(x, (C,), p["lnf_w"], p["lnf_b"], 1e-5)
    logits = F.linear(x, p["wte"])  # tied lm_head
    return F.cross_entropy(logits.view(-1, cfg["V"]).float(), tgt.view(-1))


def training_flops(p, cfg):
    # Same count as Model::TrainingFlops: 6 * matmul params (no position table) + attention.
    n = sum(t.numel() for t in all_params(p)) - p["wpe"].numel()
    return (6.0 * n + 12.0 * cfg["L"] * cfg["T"] * cfg["C"]) * cfg["B"] * cfg["T"]


def sgemm_gflops(dtype=torch.float32):
    """(best wall GFLOP/s, GFLOP per process CPU-second) of torch.mm 1024^3 over 10 runs."""
    a = torch.full((1024, 1024), 0.5, dtype=dtype)
    b = torch.full((1024, 1024), 0.25, dtype=dtype)
    torch.mm(a, b)  # warm-up
    flops, best = 2 * 1024 ** 3, 1e30
    cpu0 = time.process_time()
    for _ in range(10):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return flops / best / 1e9, 10 * flops / (time.process_time() - cpu0) / 1e9


def llama_parts():
    """torch_gpt2_table's llama model (imported here: that module imports this one)."""
    import torch_gpt2_table as tt
    return tt


def run(name, cfg, steps, warmup, foreach, bf16=False):
    gen = torch.Generator().manual_seed(1234)
    llama = cfg.get("llama", False)
    if llama:
        tt = llama_parts()
        p = tt.make_llama_params(cfg, gen)
        params = tt.llama_all_params(p)
        # Model::TrainingFlops: the untied input embedding is no matmul; lm_head is.
        n_matmul = sum(t.numel() for t in params) - p["embed"].numel()
        flops = (6.0 * n_matmul + 12.0 * cfg["L"] * cfg["T"] * cfg["C"]) * cfg["B"] * cfg["T"]

        def fwd(idx, tgt, mask):
            return tt.llama_forward(p, cfg, cfg["B"], idx, tgt, mask, False)
    else:
        p = make_params(cfg, gen)
        params = all_params(p)
        flops = training_flops(p, cfg)

        def fwd(idx, tgt, mask):
            return forward(p, cfg, idx, tgt, mask)
    decay = [t for t in params if t.dim() >= 2]
    no_decay = [t for t in params if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)
    B, T = cfg["B"], cfg["T"]
    ids = torch.randint(0, cfg["V"], (B * T + 1,), generator=gen)
    idx, tgt = ids[:-1].view(B, T), ids[1:].view(B, T)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    gemm, gemm_cpu = sgemm_gflops()
    # A bf16 step's MFU is against the bf16 GEMM (what autocast's matmuls run).
    gemm16, gemm16_cpu = sgemm_gflops(torch.bfloat16) if bf16 else (gemm, gemm_cpu)
    times, first, loss, cpu0 = [], None, None, 0.0
    for s in range(warmup + steps):
        if s == warmup:
            cpu0 = time.process_time()  # CPU seconds of all threads of the process
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(idx, tgt, mask)
        loss.backward()
        opt.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
        if first is None:
            first = loss.item()
    if not times:
        print(f"torch {name}: loss {loss.item():.4f} (no timed steps)")
        return
    med = sorted(times)[len(times) // 2]
    cpu_per_step = (time.process_time() - cpu0) / len(times)
    tok_s = B * T / med
    achieved = flops / med / 1e9
    mfu_cpu = flops / cpu_per_step / 1e9 / gemm_cpu
    print(f"torch {name}: torch {torch.__version__} threads={torch.get_num_threads()} "
          f"foreach={foreach} OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')} "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"  step median {1e3 * med:.2f} ms (min {1e3 * min(times):.2f}, max {1e3 * max(times):.2f}, "
          f"{len(times)} steps), {tok_s:.0f} tok/s, loss {first:.4f} -> {loss.item():.4f}")
    print(f"  process CPU time {cpu_per_step:.2f} s/step: {B * T / cpu_per_step:.0f} tokens per "
          f"CPU-second")
    print(f"  model FLOPs/step {flops:.3g}, achieved {achieved:.1f} GFLOP/s, "
          f"sgemm 1024^3 {gemm:.1f} GFLOP/s, MFU {100 * achieved / gemm:.1f}%; by CPU time: "
          f"{flops / cpu_per_step / 1e9:.1f} GFLOP/CPU-s vs sgemm {gemm_cpu:.1f}, "
          f"MFU {100 * mfu_cpu:.1f}%")
    mfu16_cpu = flops / cpu_per_step / 1e9 / gemm16_cpu
    if bf16:
        print(f"  bf16 GEMM 1024^3 {gemm16:.1f} GFLOP/s: MFU {100 * achieved / gemm16:.1f}%; by CPU "
              f"time {gemm16_cpu:.1f} GFLOP/CPU-s, MFU {100 * mfu16_cpu:.1f}%")
    print(f"RESULT side=torch config={name} dtype={'bf16' if bf16 else 'f32'} seq={T} "
          f"tok_s={tok_s:.1f} step_ms={1e3 * med:.3f} "
          f"sgemm_gflops={gemm:.1f} mfu={achieved / gemm:.4f} "
          f"tok_per_cpu_s={B * T / cpu_per_step:.1f} mfu_cpu={mfu_cpu:.4f} "
          f"gemm_gflops={gemm16:.1f} gemm_mfu={achieved / gemm16:.4f} gemm_mfu_cpu={mfu16_cpu:.4f}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="all", choices=["tiny", "small", "all", *LLAMA_CONFIGS],
                    help="all: tiny and small (gpt2); name a llama config to run it")
    ap.add_argument("--steps", type=int, default=-1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--foreach", type=int, default=1, help="AdamW foreach implementation (1/0)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--seq", type=int, default=0, help="sequence length (0: the config's)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for name, cfg in CONFIGS.items():
        if a.config == name or (a.config == "all" and name not in LLAMA_CONFIGS):
            cfg = dict(cfg, T=a.seq) if a.seq > 0 else cfg
            run(name, cfg, a.steps if a.steps >= 0 else cfg["steps"], a.warmup, bool(a.foreach),
                a.dtype == "bf16")


if __name__ == "__main__":
    main()
