# PyTorch reference for the engine's bert model (HF BertForSequenceClassification and
# BertForMaskedLM semantics, written from torch primitives: there is no transformers package here):
# the loss and every parameter gradient in float64 and float32, and the weights after 3 AdamW
# steps (torch.optim.AdamW, weight decay on >= 2-D tensors only) in float64.
# HF semantics followed: embeddings = word (nn.Embedding with padding_idx = pad_token_id: no
# gradient into that row from the lookup) + position (0..T-1) + token type 0, then LayerNorm;
# post-LN blocks; the extended attention mask (1 - mask) * finfo.min added to the scores of every
# query; exact GELU; pooler tanh(dense(h[:, 0])); MLM transform dense -> gelu -> LayerNorm, decoder
# tied to the word embeddings plus cls.predictions.bias; cross-entropy with ignore_index -1 (mean).
# Usage: /usr/bin/python3 bert_reference.py CASE_DIR [CASE_DIR ...]
#   CASE_DIR/case.json: config, head, B, T, ids, mask, targets, adam {lr, beta1, beta2, eps,
#   weight_decay, steps}; CASE_DIR/model.safetensors (HF names).
#   Writes ref_f64.safetensors, ref_f32.safetensors (gradients), ref_adamw.safetensors (weights
#   after the steps, f64 rounded once) and ref.json (losses).
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import read_safetensors, write_safetensors  # noqa: E402


def bert_loss(w, cfg, head, ids, mask, targets, B, T):
    C = cfg["hidden_size"]
    NH = cfg["num_attention_heads"]
    HS = C // NH
    eps = cfg["layer_norm_eps"]
    L = cfg["num_hidden_layers"]
    dtype = w["bert.embeddings.word_embeddings.weight"].dtype

    def ln(x, name):
        return F.layer_norm(x, (C,), w[name + ".weight"], w[name + ".bias"], eps)

    def lin(x, name):
        return x @ w[name + ".weight"].t() + w[name + ".bias"]

    pos = torch.arange(T)
    x = (F.embedding(ids, w["bert.embeddings.word_embeddings.weight"],
                     padding_idx=cfg["pad_token_id"])
         + w["bert.embeddings.position_embeddings.weight"][pos][None]
         + w["bert.embeddings.token_type_embeddings.weight"][0][None, None])
    x = ln(x, "bert.embeddings.LayerNorm")
    ext = (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
    for l in range(L):
        p = "bert.encoder.layer.%d." % l

        def heads(t):
            return t.view(B, T, NH, HS).transpose(1, 2)

        q = heads(lin(x, p + "attention.self.query"))
        k = heads(lin(x, p + "attention.self.key"))
        v = heads(lin(x, p + "attention.self.value"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(HS) + ext
        ctx = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x1 = ln(lin(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        hmid = F.gelu(lin(x1, p + "intermediate.dense"))
        x = ln(lin(hmid, p + "output.dense") + x1, p + "output.LayerNorm")
    if head == "sequence_classification":
        pooled = torch.tanh(lin(x[:, 0], "bert.pooler.dense"))
        logits = lin(pooled, "classifier")
        return F.cross_entropy(logits, targets[:B], ignore_index=-1)
    t = F.gelu(lin(x, "cls.predictions.transform.dense"))
    u = ln(t, "cls.predictions.transform.LayerNorm")
    logits = u @ w["bert.embeddings.word_embeddings.weight"].t() + w["cls.predictions.bias"]
    return F.cross_entropy(logits.reshape(B * T, -1), targets, ignore_index=-1)


def run(case_dir):
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    base = read_safetensors(os.path.join(case_dir, "model.safetensors"))
    B, T = case["B"], case["T"]
    ids = torch.tensor(case["ids"], dtype=torch.int64).view(B, T)
    mask = torch.tensor(case["mask"], dtype=torch.int64).view(B, T)
    targets = torch.tensor(case["targets"], dtype=torch.int64)
    out = {}
    for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
        w = {n: t.to(dtype).clone().requires_grad_(True) for n, t in base.items()}
        loss = bert_loss(w, case["config"], case["head"], ids, mask, targets, B, T)
        loss.backward()
        out["loss_" + tag] = loss.item()
        write_safetensors(os.path.join(case_dir, "ref_%s.safetensors" % tag),
                          {n: t.grad for n, t in w.items()})
    # AdamW steps on the same batch, float64.
    a = case["adam"]
    w = {n: t.to(torch.float64).clone().requires_grad_(True) for n, t in base.items()}
    decay = [t for t in w.values() if t.dim() >= 2]
    no_decay = [t for t in w.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"])
    losses = []
    for _ in range(a["steps"]):
        opt.zero_grad()
        loss = bert_loss(w, case["config"], case["head"], ids, mask, targets, B, T)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    out["adam_losses"] = losses
    write_safetensors(os.path.join(case_dir, "ref_adamw.safetensors"),
                      {n: t.detach() for n, t in w.items()})
    with open(os.path.join(case_dir, "ref.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    torch.manual_seed(0)
    for d in sys.argv[1:]:
        run(d)
