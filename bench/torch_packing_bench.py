#!/usr/bin/python3
"""PyTorch eager peer of packing_bench: the same tiny llama-like model (HF LlamaForCausalLM's math
from torch primitives, torch_gpt2_table.py's: RMSNorm, rotary GQA attention, SwiGLU, untied
lm_head; vocabulary 256, d128, 4 heads, 2 kv heads, SwiGLU 384), AdamW(lr 1e-4, betas (0.9, 0.95),
weight decay 0.1 on >= 2-D weights), trained on the micro-batches packing_bench wrote (ids,
targets with -1 for no loss, doc_start, positions per token), one micro-batch a step, the loss the
mean over the step's loss tokens.
  --mode padding: one example a row, right-padded: the causal mask, positions 0..T-1 (what HF
                  does with right padding).
  --mode packing: several examples a row: the block-diagonal causal mask (query i sees key j when
                  doc_start[i] <= j <= i) and each token's position within its example (what
                  HF does with position_ids and a 4-D mask), dense attention as in padding.
Prints loss-bearing tokens per second as `RESULT side=torch mode=M ... loss_tok_s=X`.
Run with /usr/bin/python3 (python3-torch 1.13).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_table import (LLAMA_RMS_EPS, LLAMA_ROPE_THETA, llama_all_params,  # noqa: E402
                              make_llama_params, rms_norm, rotate_half)


def block(l, x, cfg, mask, cos, sin):
    """One HF LlamaDecoderLayer with a (B, 1, T, T) mask (True: masked) and (B, 1, T, HS) cos/sin."""
    B, T, C = x.shape
    NH, NKV = cfg["NH"], cfg["NKV"]
    HS = C // NH
    h = rms_norm(x, l["ln1_w"], LLAMA_RMS_EPS)
    q = F.linear(h, l["q_w"]).view(B, T, NH, HS).transpose(1, 2)
    k = F.linear(h, l["k_w"]).view(B, T, NKV, HS).transpose(1, 2)
    v = F.linear(h, l["v_w"]).view(B, T, NKV, HS).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(NH // NKV, dim=1)
    v = v.repeat_interleave(NH // NKV, dim=1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
    att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    x = x + F.linear(y, l["o_w"])
    h = rms_norm(x, l["ln2_w"], LLAMA_RMS_EPS)
    h = F.silu(F.linear(h, l["gate_w"])) * F.linear(h, l["up_w"])
    return x + F.linear(h, l["down_w"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", required=True)
    ap.add_argument("--mode", required=True, choices=["padding", "packing"])
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    B, T = a.batch, a.seq
    cfg = dict(L=a.layers, C=128, NH=4, NKV=2, H=384, T=T, V=256)
    HS = cfg["C"] // cfg["NH"]
    batches = json.load(open(a.batches))
    gen = torch.Generator().manual_seed(1234)
    p = make_llama_params(cfg, gen)
    params = llama_all_params(p)
    opt = torch.optim.AdamW([{"params": [t for t in params if t.dim() >= 2], "weight_decay": 0.1},
                             {"params": [t for t in params if t.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    inv_freq = 1.0 / (LLAMA_ROPE_THETA ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    ar = torch.arange(T)
    causal = ar[None, :] > ar[:, None]  # (T, T): key after query
    times, tokens, first, last = [], 0, None, 0.0
    print(f"torch packing_bench mode={a.mode}: torch {torch.__version__} "
          f"threads={torch.get_num_threads()} T={T} B={B} L={a.layers}")
    for s in range(a.warmup + a.steps):
        mb = batches[s % len(batches)]
        t0 = time.perf_counter()
        idx = torch.tensor(mb["ids"], dtype=torch.int64).view(B, T)
        tgt = torch.tensor(mb["targets"], dtype=torch.int64).view(B, T)
        if a.mode == "packing":
            ds = torch.tensor(mb["doc_start"], dtype=torch.int64).view(B, T)
            pos = torch.tensor(mb["positions"], dtype=torch.int64).view(B, T)
            mask = (causal[None] | (ar[None, None, :] < ds[:, :, None]))[:, None]  # (B, 1, T, T)
        else:
            pos = ar[None].expand(B, T)
            mask = causal[None, None]
        ang = pos[..., None].float() * inv_freq
        ang = torch.cat((ang, ang), dim=-1)[:, None]  # (B, 1, T, HS)
        cos, sin = ang.cos(), ang.sin()
        opt.zero_grad(set_to_none=True)
        x = F.embedding(idx, p["embed"])
        for l in p["layers"]:
            x = block(l, x, cfg, mask, cos, sin)
        x = rms_norm(x, p["norm_w"], LLAMA_RMS_EPS)
        logits = F.linear(x, p["lm_head"])
        n = int((tgt != -1).sum())
        loss = F.cross_entropy(logits.float().view(-1, cfg["V"]), tgt.view(-1), ignore_index=-1,
                               reduction="sum") / max(n, 1)
        loss.backward()
        opt.step()
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
            tokens += n
        last = loss.item()
        if first is None:
            first = last
    total = sum(times)
    print(f"  step mean {1e3 * total / len(times):.1f} ms ({len(times)} steps), "
          f"{B * T * len(times) / total:.0f} tok/s, loss {first:.4f} -> {last:.4f}")
    print(f"RESULT side=torch mode={a.mode} T={T} B={B} step_ms={1e3 * total / len(times):.2f} "
          f"loss_tok_s={tokens / total:.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
