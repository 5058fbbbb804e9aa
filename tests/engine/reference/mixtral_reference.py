# PyTorch reference for the engine's mixtral model (HF MixtralForCausalLM semantics written from
# torch primitives; no transformers package here): llama attention (RMSNorm, RoPE, GQA) and
# MixtralSparseMoeBlock (router softmax, top-k, weights renormalised over the chosen k, each
# chosen expert's w2(silu(w1 x) * w3 x) weighted and summed), the cross-entropy plus, with
# output_router_logits, router_aux_loss_coef * load_balancing_loss_func over every layer's
# router logits (concatenated), as HF computes it.
# Usage: /usr/bin/python3 mixtral_reference.py CASE_DIR [CASE_DIR ...]
#   CASE_DIR/case.json: config, B, T, ids, targets, adam {lr, beta1, beta2, eps, weight_decay,
#   steps}; CASE_DIR/model.safetensors. Writes ref_f64.safetensors / ref_f32.safetensors
#   (gradients), ref_adamw.safetensors (weights after the AdamW steps, float64) and ref.json
#   (losses, the aux loss and the per-layer expert token counts).
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import (causal_attention, read_safetensors, rms_norm,  # noqa: E402
                             rotate_half, write_safetensors)


def load_balancing_loss(gate_logits, E, K):
    # transformers' load_balancing_loss_func without an attention mask.
    routing_weights = F.softmax(gate_logits, dim=-1)
    _, selected = torch.topk(routing_weights, K, dim=-1)
    expert_mask = F.one_hot(selected, E)
    tokens_per_expert = torch.mean(expert_mask.to(routing_weights.dtype), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * E


def mixtral_loss(w, cfg, ids, targets):
    B, T = ids.shape
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    L, eps, theta = cfg["num_hidden_layers"], cfg["rms_norm_eps"], cfg["rope_theta"]
    E, K = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    HS = C // NH
    dt = w["model.embed_tokens.weight"].dtype
    inv_freq = 1.0 / (theta ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    ang = torch.cat((ang, ang), dim=-1).to(dt)
    cos, sin = ang.cos(), ang.sin()
    x = w["model.embed_tokens.weight"][ids]
    router_logits, counts = [], []
    for l in range(L):
        p = "model.layers.%d." % l
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].t()).view(B, T, NH, HS).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].t()).view(B, T, NKV, HS).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].t()).view(B, T, NKV, HS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ w[p + "self_attn.o_proj.weight"].t()
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps).reshape(B * T, C)
        m = p + "block_sparse_moe."
        logits = h @ w[m + "gate.weight"].t()
        router_logits.append(logits)
        probs = F.softmax(logits, dim=1, dtype=dt)
        weights, selected = torch.topk(probs, K, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        layer_counts = []
        for e in range(E):
            tok, slot = torch.where(selected == e)
            layer_counts.append(int(tok.numel()))
            if tok.numel() == 0:
                continue
            xe = h[tok]
            ye = (F.silu(xe @ w[m + "experts.%d.w1.weight" % e].t())
                  * (xe @ w[m + "experts.%d.w3.weight" % e].t())) @ w[m + "experts.%d.w2.weight" % e].t()
            out = out.index_add(0, tok, ye * weights[tok, slot, None])
        counts.append(layer_counts)
        x = x + out.view(B, T, C)
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    ce = F.cross_entropy((x @ head.t()).reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)
    aux = load_balancing_loss(torch.cat(router_logits, dim=0), E, K)
    loss = ce
    if cfg.get("output_router_logits"):
        loss = ce + cfg["router_aux_loss_coef"] * aux
    return loss, aux, counts


def run_case(d):
    with open(os.path.join(d, "case.json")) as f:
        case = json.load(f)
    base = read_safetensors(os.path.join(d, "model.safetensors"))
    B, T = case["B"], case["T"]
    ids = torch.tensor(case["ids"], dtype=torch.int64).view(B, T)
    targets = torch.tensor(case["targets"], dtype=torch.int64).view(B, T)
    cfg = case["config"]
    out = {}
    for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
        w = {n: t.to(dtype).clone().requires_grad_(True) for n, t in base.items()}
        loss, aux, counts = mixtral_loss(w, cfg, ids, targets)
        loss.backward()
        out["loss_" + tag] = loss.item()
        out["aux_" + tag] = aux.item()
        out["counts_" + tag] = counts
        grads = {n: (t.grad if t.grad is not None else torch.zeros_like(t)) for n, t in w.items()}
        write_safetensors(os.path.join(d, "ref_%s.safetensors" % tag), grads)
    a = case["adam"]
    w = {n: t.to(torch.float64).clone().requires_grad_(True) for n, t in base.items()}
    opt = torch.optim.AdamW([{"params": [t for t in w.values() if t.dim() >= 2],
                              "weight_decay": a["weight_decay"]},
                             {"params": [t for t in w.values() if t.dim() < 2],
                              "weight_decay": 0.0}],
                            lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"])
    losses = []
    for _ in range(a["steps"]):
        opt.zero_grad()
        loss, _, _ = mixtral_loss(w, cfg, ids, targets)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    out["adam_losses"] = losses
    write_safetensors(os.path.join(d, "ref_adamw.safetensors"), {n: t.detach() for n, t in w.items()})
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    for d in sys.argv[1:]:
        run_case(d)
