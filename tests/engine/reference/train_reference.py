# PyTorch reference for the engine's Trainer: trains a gpt2/llama model (the torch-primitive model
# of model_reference.py) with torch.optim.AdamW (decay on >= 2-D tensors only; or "optim":
# "adafactor", HF's Adafactor with the arguments of "adafactor"), HF's lr schedules
# with warmup applied through LambdaLR, and torch.nn.utils.clip_grad_norm_, on the exact batches
# of JOBSPEC.md (shuffle: false). Evaluates the mean validation loss at the end.
# Usage: /usr/bin/python3 train_reference.py CASE_DIR
#   reads  CASE_DIR/case.json: arch, config, data_file, format ("text" bytes | "uint16"),
#          train_tokens (the train/validation split point), seq_len, micro_batch, accum, steps,
#          lr, schedule, warmup, weight_decay, beta1, beta2, eps, max_grad_norm, threads, eval
#          and CASE_DIR/init.safetensors (initial weights, HF names)
#   writes CASE_DIR/ref_final.safetensors (final weights, HF names) and CASE_DIR/ref.json
#          {"losses": [...], "grad_norms": [...], "lrs": [...], "eval_loss": x or null}
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from adafactor_reference import step_param  # noqa: E402
from model_reference import gpt2_loss, llama_loss, read_safetensors, write_safetensors  # noqa: E402


def hf_lambda(kind, warmup, total):
    # transformers.optimization: get_{constant,linear,cosine}_schedule_with_warmup (num_cycles 0.5).
    def f(step):
        if step < warmup:
            return float(step) / float(max(1, warmup))
        if kind == "constant":
            return 1.0
        if kind == "linear":
            return max(0.0, float(total - step) / float(max(1, total - warmup)))
        progress = float(step - warmup) / float(max(1, total - warmup))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))
    return f


class AdafactorRef(torch.optim.Optimizer):
    # case["optim"] == "adafactor": HF transformers' Adafactor (adafactor_reference.step_param) with
    # the constructor arguments of case["adafactor"], weight decay on >= 2-D tensors only; the
    # scheduled lr is the external lr when relative_step is off.
    def __init__(self, params, case):
        super().__init__(list(params.values()), {"lr": case["lr"]})
        self.cfg = dict(case["adafactor"])
        self.cfg["weight_decay"] = case["weight_decay"]

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                step_param(p, p.grad, self.state[p], self.cfg, group["lr"], p.dim() >= 2)


def load_tokens(case):
    with open(case["data_file"], "rb") as f:
        raw = f.read()
    if case["format"] == "text":
        return torch.tensor(list(raw), dtype=torch.int64)
    return torch.frombuffer(bytearray(raw), dtype=torch.int16).to(torch.int64) & 0xFFFF


def windows(tokens, T, first, count):
    ids = torch.stack([tokens[(first + b) * T:(first + b) * T + T] for b in range(count)])
    tg = torch.stack([tokens[(first + b) * T + 1:(first + b) * T + T + 1] for b in range(count)])
    return ids, tg


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "case.json")) as f:
        case = json.load(f)
    torch.set_num_threads(case.get("threads", 1))
    cfg, T, B, accum = case["config"], case["seq_len"], case["micro_batch"], case["accum"]
    arch = case["arch"]
    loss_fn = gpt2_loss if arch == "gpt2" else (
        lambda w, c, i, t: llama_loss(w, c, i, t, arch))  # noqa: E731
    tokens = load_tokens(case)
    train, val = tokens[:case["train_tokens"]], tokens[case["train_tokens"]:]
    W = (len(train) - 1) // T

    init = read_safetensors(os.path.join(d, "init.safetensors"))
    params = {k: torch.nn.Parameter(v.to(torch.float32).clone()) for k, v in init.items()}
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    if case.get("optim", "adamw") == "adafactor":
        opt = AdafactorRef(params, case)
    else:
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": case["weight_decay"]},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=case["lr"], betas=(case["beta1"], case["beta2"]), eps=case["eps"])
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, hf_lambda(case["schedule"], case["warmup"], case["steps"]))

    losses, norms, lrs = [], [], []
    batch = 0
    for _ in range(case["steps"]):
        opt.zero_grad(set_to_none=False)
        total = 0.0
        for _ in range(accum):
            order = [(batch * B + b) % W for b in range(B)]
            batch += 1
            ids = torch.stack([train[w * T:w * T + T] for w in order])
            tg = torch.stack([train[w * T + 1:w * T + T + 1] for w in order])
            loss = loss_fn(params, cfg, ids, tg)
            (loss / accum).backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), case["max_grad_norm"]) \
            if case["max_grad_norm"] > 0 else None
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        losses.append(total / accum)
        norms.append(float(norm) if norm is not None else None)

    eval_loss = None
    if case.get("eval", True):
        Wv = (len(val) - 1) // T
        s = 0.0
        with torch.no_grad():
            for first in range(0, Wv, B):
                n = min(B, Wv - first)
                ids, tg = windows(val, T, first, n)
                s += loss_fn(params, cfg, ids, tg).item() * n
        eval_loss = s / Wv if Wv > 0 else None
    write_safetensors(os.path.join(d, "ref_final.safetensors"), params)
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump({"losses": losses, "grad_norms": norms, "lrs": lrs, "eval_loss": eval_loss}, f)


if __name__ == "__main__":
    main()
