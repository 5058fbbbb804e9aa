# PyTorch reference for QLoRA: LoRA (lora_reference.py's model, written from torch primitives) on
# a frozen base whose blocks' linear weights are dequantize(quantize(W)) by quant4_reference.py's
# bitsandbytes-semantics quantizer (NF4 or FP4, blocks of 64, optional double quantization of the
# absmax), each weight quantized on its own in its nn.Linear (out, in) layout (GPT-2's Conv1D
# weights transposed first, as transformers' bitsandbytes integration does); embeddings, norms,
# biases and the lm head as given. Then `steps` AdamW steps on the adapters (torch.optim.AdamW,
# float32 like the engine's fp32 compute, every adapter decayed), one batch per step.
# Usage: /usr/bin/python3 qlora_reference.py CASE_DIR
#   reads  CASE_DIR/case.json (arch, config, B, T, r, alpha, target_modules, quant_type nf4|fp4,
#          double_quant, lr, betas, eps, weight_decay, batches: [{ids, targets}, ...]),
#          CASE_DIR/model.safetensors (the full-precision base, HF names) and
#          CASE_DIR/adapters.safetensors (the adapters before the first step, PEFT names)
#   writes CASE_DIR/ref_base.safetensors (the dequantized base, HF names),
#          CASE_DIR/ref_adapters.safetensors (after the steps) and CASE_DIR/ref.json (losses)
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lora_reference import Lora, gpt2_loss, llama_loss  # noqa: E402
from model_reference import read_safetensors, write_safetensors  # noqa: E402
from quant4_reference import (DYNAMIC, NESTED_BLOCK, double_quant, dequantize_4bit,  # noqa: E402
                              quantize_4bit)

LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
          "c_attn", "c_proj", "c_fc"}


def quantized(name):
    """A block's linear weight (the lm head, embeddings, norms and biases are not)."""
    parts = name.split(".")
    in_block = "layers" in parts or "h" in parts
    return in_block and parts[-1] == "weight" and parts[-2] in LINEAR


def qdq(w, qtype, dq):
    """dequantize(quantize(w)) of one (out, in) weight, float32."""
    x = w.reshape(-1).astype(np.float32)
    packed, absmax, _ = quantize_4bit(x, qtype)
    if dq:
        offset, q, nested, _ = double_quant(absmax)
        absmax = ((DYNAMIC[q] * np.repeat(nested, NESTED_BLOCK)[: q.size]).astype(np.float32)
                  + offset).astype(np.float32)
    return dequantize_4bit(packed, absmax, x.size, qtype).reshape(w.shape)


def main():
    d = sys.argv[1]
    with open(d + "/case.json") as f:
        case = json.load(f)
    conv1d = case["arch"] == "gpt2"
    base = {}
    for k, v in read_safetensors(d + "/model.safetensors").items():
        w = v.to(torch.float32).numpy()
        if quantized(k):
            w = qdq(w.T if conv1d else w, case["quant_type"], case["double_quant"])
            w = np.ascontiguousarray(w.T if conv1d else w)
        base[k] = torch.from_numpy(np.array(w, dtype=np.float32))
    write_safetensors(d + "/ref_base.safetensors", base)
    dtype = torch.float32
    w = {k: v.to(dtype) for k, v in base.items()}
    ad = {k: v.to(dtype).clone().requires_grad_(True)
          for k, v in read_safetensors(d + "/adapters.safetensors").items()}
    names = sorted(ad)
    opt = torch.optim.AdamW([ad[k] for k in names], lr=case["lr"], betas=tuple(case["betas"]),
                            eps=case["eps"], weight_decay=case["weight_decay"])
    m = Lora(w, ad, case["r"], case["alpha"], case["target_modules"])
    B, T = case["B"], case["T"]
    losses = []
    for batch in case["batches"]:
        ids = torch.tensor(batch["ids"], dtype=torch.int64).view(B, T)
        targets = torch.tensor(batch["targets"], dtype=torch.int64).view(B, T)
        opt.zero_grad()
        if conv1d:
            loss = gpt2_loss(m, case["config"], ids, targets)
        else:
            loss = llama_loss(m, case["config"], ids, targets, case["arch"])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    write_safetensors(d + "/ref_adapters.safetensors", {k: v.detach() for k, v in ad.items()})
    with open(d + "/ref.json", "w") as f:
        json.dump({"losses": losses}, f)


if __name__ == "__main__":
    main()
