# PyTorch reference for LoRA on the engine's gpt2 and llama models, written from torch primitives:
# every target Linear computes  y = x W^T (+ b) + (alpha / r) * (dropout(x) A^T) B^T  (PEFT's
# LoraLayer; GPT-2's Conv1D stores W as (in, out), A and B are still (r, in), (out, r)).
# dropout (case "dropout": {p, key, streams}): inverted dropout, x * mask / (1 - p), with the mask
# recomputed here from the engine's counter-based hash (backend/dropout_rng.h, reimplemented in
# numpy uint64 arithmetic) of (key, the adapter's stream, flat index into x (B*T, in)).
# Base weights are constants; the loss's gradient w.r.t. every A and B is computed in float64.
# Usage: /usr/bin/python3 lora_reference.py CASE_DIR
#   reads  CASE_DIR/case.json (arch, config, B, T, ids, targets, r, alpha, targets_modules,
#          optional dropout),
#          CASE_DIR/model.safetensors (base, HF names) and CASE_DIR/adapters.safetensors (PEFT names)
#   writes CASE_DIR/ref_grads.safetensors (d loss / d adapter, PEFT names) and CASE_DIR/ref.json
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import (causal_attention, read_safetensors, rms_norm, rotate_half,  # noqa: E402
                             write_safetensors)


M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(z):
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def dropout_mask(key, stream, n, p):
    """dropout_rng.h: DropoutKeep(DropoutBase(key, stream), i, p) for i < n, as 0/1."""
    with np.errstate(over="ignore"):
        base = mix64(np.uint64(key) ^ mix64(np.uint64(stream) + np.uint64(0x632BE59BD9B4E019)))
        i = np.arange(n, dtype=np.uint64)
        r = mix64(base + (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15))
    u = (r >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
    return u >= np.float32(p)


class Lora:
    def __init__(self, w, ad, r, alpha, targets, dropout=None):
        self.w, self.ad, self.scale, self.targets = w, ad, alpha / r, set(targets)
        self.dropout = dropout

    def linear(self, x, module, conv1d, bias=True):
        W = self.w[module + ".weight"]
        y = x @ W if conv1d else x @ W.t()
        if bias:
            y = y + self.w[module + ".bias"]
        if module.split(".")[-1] in self.targets:
            A = self.ad["base_model.model." + module + ".lora_A.weight"]
            B = self.ad["base_model.model." + module + ".lora_B.weight"]
            if self.dropout is not None and self.dropout["p"] > 0:
                d = self.dropout
                stream = d["streams"]["base_model.model." + module]
                keep = dropout_mask(int(d["key"]), stream, x.numel(), d["p"])
                mask = torch.from_numpy(keep.reshape(x.shape)).to(x.dtype)
                x = x * mask / (1.0 - d["p"])
            y = y + self.scale * ((x @ A.t()) @ B.t())
        return y


def gpt2_loss(m, cfg, ids, targets):
    w = m.w
    B, T = ids.shape
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    HS = C // NH
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][torch.arange(T)]
    for l in range(L):
        p = "transformer.h.%d." % l
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = m.linear(h, p + "attn.c_attn", True)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = [t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v)]
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + m.linear(y, p + "attn.c_proj", True)
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = F.gelu(m.linear(h, p + "mlp.c_fc", True), approximate="tanh")
        x = x + m.linear(h, p + "mlp.c_proj", True)
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    logits = x @ w["transformer.wte.weight"].t()
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)


def llama_loss(m, cfg, ids, targets, arch="llama"):
    """llama; qwen2 (q/k/v biases); mistral (sliding window); qwen3 (q_norm / k_norm before RoPE); gemma (embeddings times sqrt(C), x * (1 + w)
    norms, GeGLU with tanh GELU)."""
    w = m.w
    B, T = ids.shape
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    L, eps, theta = cfg["num_hidden_layers"], cfg["rms_norm_eps"], cfg["rope_theta"]
    HS = cfg.get("head_dim") or C // NH
    gemma = arch == "gemma"
    window = cfg.get("sliding_window") or 0  # mistral (qwen2 writes null: full attention)

    def norm(x, weight):
        return rms_norm(x, 1.0 + weight if gemma else weight, eps)

    dt = w["model.embed_tokens.weight"].dtype
    inv_freq = 1.0 / (theta ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    ang = torch.cat((ang, ang), dim=-1).to(dt)
    cos, sin = ang.cos(), ang.sin()
    x = w["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * torch.tensor(C ** 0.5, dtype=dt)
    for l in range(L):
        p = "model.layers.%d." % l
        # Biases where the file has them (qwen2's q/k/v; llama's attention_bias).
        lin = lambda t, name: m.linear(t, p + name, False, bias=p + name + ".bias" in w)  # noqa: E731
        h = norm(x, w[p + "input_layernorm.weight"])
        q = lin(h, "self_attn.q_proj").view(B, T, NH, HS)
        k = lin(h, "self_attn.k_proj").view(B, T, NKV, HS)
        if arch == "qwen3":
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = lin(h, "self_attn.v_proj").view(B, T, NKV, HS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        y = causal_attention(q, k, v, window).transpose(1, 2).reshape(B, T, NH * HS)
        x = x + lin(y, "self_attn.o_proj")
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate = lin(h, "mlp.gate_proj")
        act = F.gelu(gate, approximate="tanh") if gemma else F.silu(gate)
        g = act * lin(h, "mlp.up_proj")
        x = x + lin(g, "mlp.down_proj")
    x = norm(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    logits = x @ head.t()
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)


def main():
    d = sys.argv[1]
    with open(d + "/case.json") as f:
        case = json.load(f)
    dtype = torch.float64
    w = {k: v.to(dtype) for k, v in read_safetensors(d + "/model.safetensors").items()}
    ad = {k: v.to(dtype).requires_grad_(True)
          for k, v in read_safetensors(d + "/adapters.safetensors").items()}
    m = Lora(w, ad, case["r"], case["alpha"], case["target_modules"], case.get("dropout"))
    B, T = case["B"], case["T"]
    ids = torch.tensor(case["ids"], dtype=torch.int64).view(B, T)
    targets = torch.tensor(case["targets"], dtype=torch.int64).view(B, T)
    if case["arch"] == "gpt2":
        loss = gpt2_loss(m, case["config"], ids, targets)
    else:
        loss = llama_loss(m, case["config"], ids, targets, case["arch"])
    loss.backward()
    grads = {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in ad.items()}
    write_safetensors(d + "/ref_grads.safetensors", grads)
    with open(d + "/ref.json", "w") as f:
        json.dump({"loss_f64": loss.item()}, f)


if __name__ == "__main__":
    main()
