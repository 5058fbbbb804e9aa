#!/usr/bin/python3
"""PyTorch eager peer of gpt2_table_bench: one row of the techniques table (issue 4) with the same
model, init, AdamW settings and batch split as the C++ side. Techniques the PyTorch way: a loop of
micro-batches (loss / k, backward each) for accumulation, torch.utils.checkpoint per block for
checkpointing, torch.autocast('cpu', dtype=torch.bfloat16) for bf16 (logits cast to fp32 for the
loss). Peak memory: growth of the process's resident set (VmHWM after the steps minus VmRSS before
the model exists, VmHWM reset through /proc/self/clear_refs): tensors, allocator caches and library
workspaces, everything the row made resident. Run with /usr/bin/python3 (python3-torch 1.13).
--arch llama: HF LlamaForCausalLM's math from torch primitives (RMSNorm, rotary embeddings in HF's
rotate-half convention with inv_freq and angles in fp32, grouped-query attention by
repeat_interleave, SwiGLU gate/up/down MLP, no biases, untied lm_head), initialised like traind's
llama (normal 0.02; o_proj and down_proj 0.02 / sqrt(2L); norms 1), same AdamW and batch split.
Usage: torch_gpt2_table.py --row baseline|accum|ckpt|bf16|all [--arch gpt2|llama]
                           [--model tiny|small] [--batch B] [--accum K] [--steps N] [--warmup N]
                           [--threads N]
"""
import argparse
import math
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
# Same sizes as MODELS plus GQA (NKV kv heads) and the SwiGLU width H; gpt2_table_bench's kModels.
LLAMA_MODELS = {
    "tiny": dict(L=4, C=256, NH=4, NKV=2, H=688, T=128, V=256),
    "small": dict(L=6, C=384, NH=6, NKV=2, H=1024, T=256, V=50304),
}
LLAMA_RMS_EPS = 1e-6
LLAMA_ROPE_THETA = 10000.0
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


def make_llama_params(cfg, gen):
    L, C, NH, NKV, H, V = cfg["L"], cfg["C"], cfg["NH"], cfg["NKV"], cfg["H"], cfg["V"]
    HS = C // NH

    def normal(*shape, std=0.02):
        return (torch.randn(*shape, generator=gen) * std).requires_grad_()

    def ones(n):
        return torch.ones(n, dtype=torch.float32).requires_grad_()

    resid = 0.02 / math.sqrt(2 * L)
    p = {"embed": normal(V, C), "norm_w": ones(C), "layers": []}
    for _ in range(L):
        p["layers"].append({
            "ln1_w": ones(C), "q_w": normal(NH * HS, C), "k_w": normal(NKV * HS, C),
            "v_w": normal(NKV * HS, C), "o_w": normal(C, NH * HS, std=resid), "ln2_w": ones(C),
            "gate_w": normal(H, C), "up_w": normal(H, C), "down_w": normal(C, H, std=resid),
        })
    p["lm_head"] = normal(V, C)  # untied
    return p


def llama_all_params(p):
    out = [p["embed"], p["norm_w"], p["lm_head"]]
    for layer in p["layers"]:
        out += list(layer.values())
    return out


def rms_norm(x, w, eps):
    # HF LlamaRMSNorm: the variance in fp32, back to the input dtype before the weight.
    dt = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(dt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(T, HS, theta):
    # HF LlamaRotaryEmbedding: inv_freq and the angles in fp32 whatever the compute dtype.
    inv_freq = 1.0 / (theta ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


def llama_block(l, x, B, T, cfg, mask, cos, sin):
    """One HF LlamaDecoderLayer: RMSNorm, rotary GQA causal attention, RMSNorm, SwiGLU MLP."""
    C, NH, NKV = cfg["C"], cfg["NH"], cfg["NKV"]
    HS = C // NH
    h = rms_norm(x, l["ln1_w"], LLAMA_RMS_EPS)
    q = F.linear(h, l["q_w"]).view(B, T, NH, HS).transpose(1, 2)
    k = F.linear(h, l["k_w"]).view(B, T, NKV, HS).transpose(1, 2)
    v = F.linear(h, l["v_w"]).view(B, T, NKV, HS).transpose(1, 2)
    c, s = cos.to(q.dtype), sin.to(q.dtype)
    q = q * c + rotate_half(q) * s
    k = k * c + rotate_half(k) * s
    k = k.repeat_interleave(NH // NKV, dim=1)
    v = v.repeat_interleave(NH // NKV, dim=1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
    att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    x = x + F.linear(y, l["o_w"])
    h = rms_norm(x, l["ln2_w"], LLAMA_RMS_EPS)
    h = F.silu(F.linear(h, l["gate_w"])) * F.linear(h, l["up_w"])
    return x + F.linear(h, l["down_w"])


def llama_forward(p, cfg, B, idx, tgt, mask, ckpt):
    T, C = cfg["T"], cfg["C"]
    cos, sin = rope_cos_sin(T, C // cfg["NH"], LLAMA_ROPE_THETA)
    x = F.embedding(idx, p["embed"])
    for l in p["layers"]:
        if ckpt:
            x = torch.utils.checkpoint.checkpoint(
                lambda x_, l_=l: llama_block(l_, x_, B, T, cfg, mask, cos, sin), x,
                use_reentrant=False)
        else:
            x = llama_block(l, x, B, T, cfg, mask, cos, sin)
    x = rms_norm(x, p["norm_w"], LLAMA_RMS_EPS)
    logits = F.linear(x, p["lm_head"])  # untied
    return F.cross_entropy(logits.float().view(-1, cfg["V"]), tgt.view(-1))


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


def run(arch, model, row, batch, accum, steps, warmup):
    llama = arch == "llama"
    cfg = LLAMA_MODELS[model] if llama else MODELS[model]
    name = f"llama {model}" if llama else model
    use_accum, ckpt, bf16 = ROWS[row]
    k = accum if use_accum else 1
    B, T = batch // k, cfg["T"]
    peak_reset = reset_peak_rss()
    rss0 = proc_status_bytes("VmRSS")
    print(f"torch {name} row={row}: torch {torch.__version__} threads={torch.get_num_threads()} "
          f"micro_batch={B} accum={k} ckpt={int(ckpt)} autocast_bf16={int(bf16)} "
          f"mkldnn={int(torch.backends.mkldnn.is_available())} "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')} "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    gen = torch.Generator().manual_seed(1234)
    p = make_llama_params(cfg, gen) if llama else make_params(dict(cfg, B=B), gen)
    params = llama_all_params(p) if llama else all_params(p)
    fwd = llama_forward if llama else forward
    decay = [t for t in params if t.dim() >= 2]
    no_decay = [t for t in params if t.dim() < 2]
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
                micro = fwd(p, cfg, B, idx, tgt, mask, ckpt)
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
        print(f"torch {name} row={row}: loss {loss:.4f} (no timed steps)")
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
          f"rss_bytes={hwm - rss0} loss={loss:.4f}{' arch=llama' if llama else ''}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", required=True, choices=list(ROWS))
    ap.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"])
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
    run(a.arch, a.model, a.row, a.batch, a.accum, a.steps, a.warmup)


if __name__ == "__main__":
    main()
