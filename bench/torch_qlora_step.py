#!/usr/bin/python3
"""PyTorch eager peer of qlora_bench: the same llama-shaped model (HF LlamaForCausalLM's math from
torch primitives, torch_packing_bench.py's block; untied lm_head), LoRA r 16 (alpha 32) on every
projection with the base frozen, AdamW(lr 1e-3, weight decay 0.1) on the adapters, one fixed
micro-batch a step, fp32 (bf16 matmuls on a CPU without bf16 arithmetic are no fair peer).
  --mode lora:  the base weights as fp32 tensors.
  --mode qlora: each block weight stored as bitsandbytes does (NF4 codes two a byte, an fp32
                absmax per block of 64) and dequantized before every use (forward, and the
                backward's input gradient through autograd), which is what bitsandbytes'
                Linear4bit does off CUDA: dequantize_4bit, then the matmul.
Prints `RESULT side=torch model=M mode=X step_ms=... tok_s=...`. Run with /usr/bin/python3
(python3-torch 1.13) and the same --threads as qlora_bench.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_table import LLAMA_RMS_EPS, LLAMA_ROPE_THETA, rms_norm, rotate_half  # noqa: E402

SHAPES = {"tiny": dict(L=4, C=256, H=688, NH=4, T=128, V=256),
          "small": dict(L=6, C=512, H=1376, NH=8, T=256, V=32000)}
NF4 = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                    0.7229568362236023, 1.0])
NF4_MID = (NF4[1:] + NF4[:-1]) / 2


class Quant4:
    """A weight in NF4 as bitsandbytes stores it (blocks of 64, packed codes, fp32 absmax)."""

    def __init__(self, w):
        self.shape = w.shape
        blocks = w.reshape(-1, 64)
        self.absmax = blocks.abs().amax(dim=1)
        codes = torch.bucketize(blocks / self.absmax[:, None], NF4_MID).to(torch.uint8).reshape(-1)
        self.packed = (codes[0::2] << 4) | codes[1::2]

    def dequantize(self):
        codes = torch.stack((self.packed >> 4, self.packed & 15), dim=1).reshape(-1).long()
        return (NF4[codes].reshape(-1, 64) * self.absmax[:, None]).reshape(self.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--mode", required=True, choices=["lora", "qlora"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = SHAPES[a.model]
    L, C, H, NH, T, V = cfg["L"], cfg["C"], cfg["H"], cfg["NH"], cfg["T"], cfg["V"]
    HS, B, r, scale = C // NH, a.batch, 16, 32 / 16
    gen = torch.Generator().manual_seed(1234)
    resid = 0.02 / math.sqrt(2 * L)
    names = {"q": (C, C, 0.02), "k": (C, C, 0.02), "v": (C, C, 0.02), "o": (C, C, resid),
             "gate": (H, C, 0.02), "up": (H, C, 0.02), "down": (C, H, resid)}
    layers, adapters = [], []
    for _ in range(L):
        layer = {"ln1": torch.ones(C), "ln2": torch.ones(C)}
        for n, (out, inp, std) in names.items():
            w = torch.randn(out, inp, generator=gen) * std
            layer[n] = Quant4(w) if a.mode == "qlora" else w
            A = (torch.rand(r, inp, generator=gen) * 2 - 1) / math.sqrt(inp)
            layer[n + "_A"] = A.requires_grad_()
            layer[n + "_B"] = torch.zeros(out, r).requires_grad_()
            adapters += [layer[n + "_A"], layer[n + "_B"]]
        layers.append(layer)
    embed, lm_head = torch.randn(V, C, generator=gen) * 0.02, torch.randn(V, C, generator=gen) * 0.02
    norm_w = torch.ones(C)
    opt = torch.optim.AdamW(adapters, lr=1e-3, weight_decay=0.1, foreach=True)
    idx = torch.randint(0, V, (B, T + 1), generator=gen)
    inp, tgt = idx[:, :-1], idx[:, 1:]
    inv_freq = 1.0 / (LLAMA_ROPE_THETA ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    ang = torch.arange(T)[:, None].float() * inv_freq
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos(), ang.sin()
    mask = torch.arange(T)[None, :] > torch.arange(T)[:, None]

    def lin(layer, n, x):
        w = layer[n]
        w = w.dequantize() if isinstance(w, Quant4) else w
        return F.linear(x, w) + scale * F.linear(F.linear(x, layer[n + "_A"]), layer[n + "_B"])

    times, first, last = [], None, 0.0
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        x = F.embedding(inp, embed)
        for l in layers:
            h = rms_norm(x, l["ln1"], LLAMA_RMS_EPS)
            q = lin(l, "q", h).view(B, T, NH, HS).transpose(1, 2)
            k = lin(l, "k", h).view(B, T, NH, HS).transpose(1, 2)
            v = lin(l, "v", h).view(B, T, NH, HS).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            att = F.softmax(((q @ k.transpose(-2, -1)) / math.sqrt(HS)).masked_fill(mask, float("-inf")), -1)
            x = x + lin(l, "o", (att @ v).transpose(1, 2).reshape(B, T, C))
            h = rms_norm(x, l["ln2"], LLAMA_RMS_EPS)
            x = x + lin(l, "down", F.silu(lin(l, "gate", h)) * lin(l, "up", h))
        logits = F.linear(rms_norm(x, norm_w, LLAMA_RMS_EPS), lm_head)
        loss = F.cross_entropy(logits.view(-1, V), tgt.reshape(-1))
        loss.backward()
        opt.step()
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
        last = loss.item()
        first = last if first is None else first
    times.sort()
    med = times[len(times) // 2]
    print(f"torch qlora_bench model={a.model} mode={a.mode}: torch {torch.__version__} "
          f"threads={torch.get_num_threads()} B={B} T={T}, loss {first:.4f} -> {last:.4f}")
    print(f"RESULT side=torch model={a.model} mode={a.mode} step_ms={1e3 * med:.1f} "
          f"tok_s={B * T / med:.0f}")


if __name__ == "__main__":
    main()
