#!/usr/bin/python3
"""PyTorch eager peer of bert_table_bench: one row of the memory-anatomy guide's experiment with
HF BertForSequenceClassification's math written from torch primitives (no transformers package
here): embeddings word (padding_idx 0) + position + token type 0, LayerNorm; post-LN blocks with
separate query/key/value Linears, bidirectional attention with the extended mask added (all ones:
no padding), exact GELU; pooler tanh(dense(h[:, 0])); classifier; cross-entropy. No dropout (the
C++ side has none). Init as HF's _init_weights: Linear and Embedding N(0, 0.02), biases 0, padding
row 0, LayerNorm 1/0. The HF Trainer's defaults: AdamW lr 5e-5, betas (0.9, 0.999), eps 1e-8, no
weight decay, clip_grad_norm_ 1.0. Techniques the PyTorch way: a loop of micro-batches
((loss / k).backward() each) for accumulation, torch.utils.checkpoint per block
(use_reentrant=False), torch.autocast('cpu', dtype=torch.bfloat16) (logits to fp32 for the loss),
HF's Adafactor algorithm (tests/engine/reference/adafactor_reference.py, the Trainer's
optim="adafactor": lr 5e-5, no relative step, no parameter scale). 8-bit AdamW: no peer
(bitsandbytes has no CPU build for torch 1.13 here); mixtral (the C++ side's MoE row): no peer yet.
Peak memory: VmHWM after the steps (reset through /proc/self/clear_refs before the model exists),
and its growth over VmRSS before the model.
Usage: torch_bert_table.py --row ROW [--config tiny|base|large] [--batch B] [--accum K]
                           [--steps N] [--warmup N] [--threads N] [--seq T]
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "engine",
                                "reference"))
from adafactor_reference import step_param  # noqa: E402  (HF's Adafactor algorithm)

CONFIGS = {  # L, C, NH, H (intermediate), T
    "tiny": dict(L=4, C=256, NH=4, H=1024, T=128),
    "base": dict(L=12, C=768, NH=12, H=3072, T=512),
    "large": dict(L=24, C=1024, NH=16, H=4096, T=512),
}
V, P, TYPES, EPS, LR = 30522, 512, 2, 1e-12, 5e-5
ROWS = {  # (accumulation, checkpointing, bf16, optimizer)
    "baseline": (False, False, False, "adamw"), "accum": (True, False, False, "adamw"),
    "ckpt": (False, True, False, "adamw"), "bf16": (False, False, True, "adamw"),
    "adafactor": (False, False, False, "adafactor"),
    "adamw_8bit": (False, False, False, "adamw_8bit"),
    "all": (True, True, True, "adafactor"),
    "mixtral": None,
    "dense": None,
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


def make_params(cfg, gen):
    C, H, L = cfg["C"], cfg["H"], cfg["L"]

    def normal(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).requires_grad_(True)

    def zeros(*shape):
        return torch.zeros(*shape, requires_grad=True)

    def ones(*shape):
        return torch.ones(*shape, requires_grad=True)

    wte = torch.randn(V, C, generator=gen) * 0.02
    wte[0].zero_()  # padding_idx row
    p = {"wte": wte.requires_grad_(True), "wpe": normal(P, C), "wtt": normal(TYPES, C),
         "ln_w": ones(C), "ln_b": zeros(C), "layers": []}
    for _ in range(L):
        p["layers"].append({
            "q_w": normal(C, C), "q_b": zeros(C), "k_w": normal(C, C), "k_b": zeros(C),
            "v_w": normal(C, C), "v_b": zeros(C), "o_w": normal(C, C), "o_b": zeros(C),
            "ln1_w": ones(C), "ln1_b": zeros(C), "i_w": normal(H, C), "i_b": zeros(H),
            "d_w": normal(C, H), "d_b": zeros(C), "ln2_w": ones(C), "ln2_b": zeros(C)})
    p["pool_w"], p["pool_b"] = normal(C, C), zeros(C)
    p["cls_w"], p["cls_b"] = normal(2, C), zeros(2)
    return p


def all_params(p):
    out = [p["wte"], p["wpe"], p["wtt"], p["ln_w"], p["ln_b"]]
    for l in p["layers"]:
        out += list(l.values())
    return out + [p["pool_w"], p["pool_b"], p["cls_w"], p["cls_b"]]


def block(l, x, ext, B, T, C, NH):
    HS = C // NH

    def heads(t):
        return t.view(B, T, NH, HS).transpose(1, 2)

    q = heads(F.linear(x, l["q_w"], l["q_b"]))
    k = heads(F.linear(x, l["k_w"], l["k_b"]))
    v = heads(F.linear(x, l["v_w"], l["v_b"]))
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HS) + ext
    ctx = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2).reshape(B, T, C)
    x1 = F.layer_norm(F.linear(ctx, l["o_w"], l["o_b"]) + x, (C,), l["ln1_w"], l["ln1_b"], EPS)
    h = F.gelu(F.linear(x1, l["i_w"], l["i_b"]))
    return F.layer_norm(F.linear(h, l["d_w"], l["d_b"]) + x1, (C,), l["ln2_w"], l["ln2_b"], EPS)


def forward(p, cfg, B, ids, mask, labels, ckpt):
    T, C, NH = ids.shape[1], cfg["C"], cfg["NH"]
    x = (F.embedding(ids, p["wte"], padding_idx=0) + p["wpe"][:T][None] + p["wtt"][0][None, None])
    x = F.layer_norm(x, (C,), p["ln_w"], p["ln_b"], EPS)
    dtype = p["wte"].dtype  # HF: the model's dtype (fp32 under autocast too)
    ext = (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
    for l in p["layers"]:
        if ckpt:
            x = torch.utils.checkpoint.checkpoint(
                lambda x_, l_=l: block(l_, x_, ext, B, T, C, NH), x, use_reentrant=False)
        else:
            x = block(l, x, ext, B, T, C, NH)
    pooled = torch.tanh(F.linear(x[:, 0], p["pool_w"], p["pool_b"]))
    logits = F.linear(pooled, p["cls_w"], p["cls_b"])
    return F.cross_entropy(logits.float(), labels)


def run(config, row, batch, accum, steps, warmup, seq):
    if ROWS[row] is None:
        why = ("no MoE peer written yet" if row == "mixtral" else
               "the dense/MoE pair measures routing's cost inside traind")
        print(f"torch {config} row={row}: no peer: {why}")
        print(f"RESULT side=torch model={config} row={row} status=not_available "
              f"reason=\"{why}\"")
        return
    use_accum, ckpt, bf16, optim = ROWS[row]
    if optim == "adamw_8bit":
        print(f"torch {config} row={row}: no peer: bitsandbytes (AdamW8bit) has no CPU build for "
              f"torch {torch.__version__} here")
        print(f"RESULT side=torch model={config} row={row} status=not_available "
              f"reason=\"no bitsandbytes CPU build\"")
        return
    cfg = dict(CONFIGS[config])
    if seq:
        cfg["T"] = seq
    k = accum if use_accum else 1
    B, T = batch // k, cfg["T"]
    peak_reset = reset_peak_rss()
    rss0 = proc_status_bytes("VmRSS")
    print(f"torch bert-{config} row={row}: torch {torch.__version__} "
          f"threads={torch.get_num_threads()} L={cfg['L']} C={cfg['C']} NH={cfg['NH']} "
          f"H={cfg['H']} T={T} micro_batch={B} accum={k} ckpt={int(ckpt)} "
          f"autocast_bf16={int(bf16)} optim={optim} "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')} "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    gen = torch.Generator().manual_seed(1234)
    p = make_params(cfg, gen)
    params = all_params(p)
    n = sum(t.numel() for t in params)
    if optim == "adamw":
        opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                foreach=True)
        step_fn = opt.step
    else:  # the Trainer's optim="adafactor": Adafactor(lr, scale_parameter=False,
        #      relative_step=False), HF's algorithm per tensor
        acfg = dict(relative_step=False, warmup_init=False, scale_parameter=False, eps1=1e-30,
                    eps2=1e-3, decay_rate=-0.8, clip_threshold=1.0, beta1=None, weight_decay=0.0)
        states = [{} for _ in params]

        def step_fn():
            with torch.no_grad():
                for t, st in zip(params, states):
                    step_param(t, t.grad, st, acfg, LR, False)
    print(f"  params {n} ({4 * n / 1048576:.1f} MiB fp32)")
    ids = torch.randint(1, V, (k, B, T), generator=gen)
    labels = torch.randint(0, 2, (k, B), generator=gen)
    mask = torch.ones(B, T, dtype=torch.int64)
    times, first, loss, cpu0 = [], None, 0.0, 0.0
    for s in range(warmup + steps):
        if s == warmup:
            cpu0 = time.process_time()
        t0 = time.perf_counter()
        for t in params:
            t.grad = None
        loss_sum = 0.0
        for a in range(k):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                micro = forward(p, cfg, B, ids[a], mask, labels[a], ckpt)
            (micro / k).backward()
            loss_sum += micro.item()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        step_fn()
        sec = time.perf_counter() - t0
        if s >= warmup:
            times.append(sec)
        loss = loss_sum / k
        if first is None:
            first = loss
        print(f"  step {s}: {1e3 * sec:.1f} ms{' (warm-up)' if s < warmup else ''}, loss "
              f"{loss:.4f}, grad norm {float(norm):.4f}", flush=True)
    cpu_s = time.process_time() - cpu0
    hwm = proc_status_bytes("VmHWM")
    if not times:
        print(f"torch bert-{config} row={row}: loss {loss:.4f} (no timed steps)")
        return
    med = sorted(times)[len(times) // 2]
    samples = B * k
    print(f"  step median {1e3 * med:.1f} ms (min {1e3 * min(times):.1f}, max "
          f"{1e3 * max(times):.1f}, {len(times)} steps) for {samples} samples, loss {first:.4f} -> "
          f"{loss:.4f}\n  process RSS growth {(hwm - rss0) / 1048576:.1f} MiB, peak RSS "
          f"{hwm / 1048576:.1f} MiB"
          f"{'' if peak_reset else ' (VmHWM could not be reset: includes earlier peaks)'}")
    print(f"RESULT side=torch model={config} row={row} status=ok micro_batch={B} accum={k} "
          f"optim={optim} sample_ms={1e3 * med / samples:.3f} samples_s={samples / med:.4f} "
          f"cpu_ms_per_sample={1e3 * cpu_s / (samples * len(times)):.3f} "
          f"rss_bytes={hwm - rss0} hwm_bytes={hwm} loss={loss:.4f}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", required=True, choices=list(ROWS))
    ap.add_argument("--config", "--model", dest="config", default="large", choices=list(CONFIGS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=0)
    a = ap.parse_args()
    if a.batch < 1 or a.accum < 1 or a.batch % a.accum:
        ap.error("--batch must be a positive multiple of --accum")
    if a.seq < 0 or a.seq > P:
        ap.error("--seq must be in [0, 512]")
    torch.set_num_threads(a.threads)
    run(a.config, a.row, a.batch, a.accum, a.steps, a.warmup, a.seq)


if __name__ == "__main__":
    main()
