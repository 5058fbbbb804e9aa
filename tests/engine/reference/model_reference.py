# PyTorch reference for the engine's gpt2 and llama-like models (llama, mistral, qwen2, qwen3,
# gemma), written from torch primitives (no transformers package here): loss and every parameter
# gradient, in float64 and in float32.
# Usage: /usr/bin/python3 model_reference.py CASE_DIR [CASE_DIR ...]  (one torch start for all)
#   each CASE_DIR: reads  CASE_DIR/case.json (arch, config, B, T, ids, targets) and CASE_DIR/model.safetensors
#   writes CASE_DIR/ref_f64.safetensors and ref_f32.safetensors (gradients under the HF names,
#          stored as F32; the f64 values are rounded once) and CASE_DIR/ref.json (both losses).
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "I64": torch.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        raw = bytearray(blob[8 + n + b:8 + n + e])
        t = torch.frombuffer(raw, dtype=DTYPES[meta["dtype"]]) if e > b else torch.zeros(0)
        out[name] = t.reshape(meta["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def causal_attention(q, k, v, window=0):
    # q (B,NH,T,HS); k, v (B,NH,T,HS) after GQA expansion. window > 0: HF Mistral's sliding
    # window, key j visible to query i iff j <= i and i - j < window.
    T, HS = q.shape[2], q.shape[3]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if window:
        mask = mask & ~torch.ones(T, T, dtype=torch.bool).tril(-window)
    att = att.masked_fill(~mask, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def gpt2_loss(w, cfg, ids, targets):
    B, T = ids.shape
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    HS = C // NH
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][torch.arange(T)]
    for l in range(L):
        p = "transformer.h.%d." % l
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: (C, 3C)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = [t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v)]
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + (h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    logits = x @ w["transformer.wte.weight"].t()
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_inv_freq(cfg, HS):
    """HF's inv_freq (modeling_rope_utils: default, linear, llama3), in float32 as transformers."""
    theta = cfg["rope_theta"]
    inv_freq = 1.0 / (theta ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        return inv_freq / rs["factor"]
    if kind == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
        is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama)
    return inv_freq


def llama_loss(w, cfg, ids, targets, arch="llama"):
    """llama, mistral (sliding window), qwen2 (q/k/v biases); llama's attention_bias and head_dim;
    qwen3 (q_norm, k_norm: RMSNorm over each head of q and k before RoPE); gemma (embeddings times
    sqrt(hidden_size) in the model dtype, RMSNorm as x * (1 + w), GeGLU with tanh GELU)."""
    B, T = ids.shape
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    L, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    HS = cfg.get("head_dim") or C // NH
    window = cfg.get("sliding_window") or 0
    dt = w["model.embed_tokens.weight"].dtype
    # HF computes inv_freq and the angles in float32 whatever the model dtype.
    inv_freq = rope_inv_freq(cfg, HS)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    ang = torch.cat((ang, ang), dim=-1).to(dt)
    cos, sin = ang.cos(), ang.sin()
    gemma = arch == "gemma"

    def norm(x, weight):
        return rms_norm(x, 1.0 + weight if gemma else weight, eps)

    x = w["model.embed_tokens.weight"][ids]
    if gemma:  # GemmaModel: normalizer = torch.tensor(hidden_size**0.5, dtype=hidden_states.dtype)
        x = x * torch.tensor(C ** 0.5, dtype=dt)
    for l in range(L):
        p = "model.layers.%d." % l
        h = norm(x, w[p + "input_layernorm.weight"])
        def proj(name):
            y = h @ w[p + "self_attn." + name + ".weight"].t()
            bias = w.get(p + "self_attn." + name + ".bias")
            return y if bias is None else y + bias
        q = proj("q_proj").view(B, T, NH, HS)
        k = proj("k_proj").view(B, T, NKV, HS)
        if arch == "qwen3":  # Qwen3Attention: q_norm / k_norm over head_dim, before RoPE
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = proj("v_proj").view(B, T, NKV, HS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        y = causal_attention(q, k, v, window).transpose(1, 2).reshape(B, T, NH * HS)
        y = y @ w[p + "self_attn.o_proj.weight"].t()
        if p + "self_attn.o_proj.bias" in w:
            y = y + w[p + "self_attn.o_proj.bias"]
        x = x + y
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].t()
        act = F.gelu(gate, approximate="tanh") if gemma else F.silu(gate)
        g = act * (h @ w[p + "mlp.up_proj.weight"].t())
        x = x + g @ w[p + "mlp.down_proj.weight"].t()
    x = norm(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    logits = x @ head.t()
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)


def run(case, weights, dtype):
    w = {k: v.to(dtype).requires_grad_(True) for k, v in weights.items()}
    B, T = case["B"], case["T"]
    ids = torch.tensor(case["ids"], dtype=torch.int64).view(B, T)
    targets = torch.tensor(case["targets"], dtype=torch.int64).view(B, T)
    if case["arch"] == "gpt2":
        loss = gpt2_loss(w, case["config"], ids, targets)
    else:
        loss = llama_loss(w, case["config"], ids, targets, case["arch"])
    loss.backward()
    grads = {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in w.items()}
    return loss.item(), grads


def main():
    torch.set_num_threads(1)
    for d in sys.argv[1:]:
        run_case(d)


def run_case(d):
    with open(d + "/case.json") as f:
        case = json.load(f)
    weights = read_safetensors(d + "/model.safetensors")
    loss64, g64 = run(case, weights, torch.float64)
    loss32, g32 = run(case, weights, torch.float32)
    write_safetensors(d + "/ref_f64.safetensors", g64)
    write_safetensors(d + "/ref_f32.safetensors", g32)
    with open(d + "/ref.json", "w") as f:
        json.dump({"loss_f64": loss64, "loss_f32": loss32}, f)


if __name__ == "__main__":
    main()
