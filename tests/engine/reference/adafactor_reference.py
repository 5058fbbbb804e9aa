# Adafactor written in PyTorch from the algorithm of HF transformers.optimization.Adafactor (torch
# 1.13 has none): factored row/column second moments over the last two dims for >= 2-D
# parameters, full second moment for vectors, RMS update clipping, relative step, parameter scale
# (RMS of the parameter before the step), optional first moment, weight decay on the parameters
# flagged "decay" only. float64 throughout (the exact algorithm, for an fp32 implementation to be
# judged against), on the tensors HF holds (optim_case.py: a padded vocabulary table is its V
# real rows, a Conv1D weight HF's transpose).
# Usage: adafactor_reference.py <folder> (case files: optim_case.py); each config holds HF's
# constructor arguments; "lr" in a config means relative_step=False with the per-step case lrs.
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optim_case  # noqa: E402


def rms(t):
    return t.norm(2) / (t.numel() ** 0.5)


def step_param(p, grad, state, cfg, lr_ext, decay):
    factored = grad.dim() >= 2
    if not state:
        state["step"] = 0
        if cfg["beta1"] is not None:
            state["exp_avg"] = torch.zeros_like(grad)
        if factored:
            state["row"] = torch.zeros(grad.shape[:-1], dtype=grad.dtype)
            state["col"] = torch.zeros(grad.shape[:-2] + grad.shape[-1:], dtype=grad.dtype)
        else:
            state["v"] = torch.zeros_like(grad)
    state["step"] += 1
    t = state["step"]
    if cfg["relative_step"]:
        min_step = 1e-6 * t if cfg["warmup_init"] else 1e-2
        rel = min(min_step, 1.0 / math.sqrt(t))
    else:
        rel = lr_ext
    scale = max(cfg["eps2"], rms(p.data)) if cfg["scale_parameter"] else 1.0
    lr = scale * rel
    beta2t = 1.0 - math.pow(t, cfg["decay_rate"])
    update = grad ** 2 + cfg["eps1"]
    if factored:
        row, col = state["row"], state["col"]
        row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
        col.mul_(beta2t).add_(update.mean(dim=-2), alpha=1.0 - beta2t)
        r = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
        c = col.unsqueeze(-2).rsqrt()
        update = torch.mul(r, c).mul_(grad)
    else:
        v = state["v"]
        v.mul_(beta2t).add_(update, alpha=1.0 - beta2t)
        update = v.rsqrt().mul_(grad)
    update.div_((rms(update) / cfg["clip_threshold"]).clamp_(min=1.0))
    update.mul_(lr)
    if cfg["beta1"] is not None:
        m = state["exp_avg"]
        m.mul_(cfg["beta1"]).add_(update, alpha=1 - cfg["beta1"])
        update = m
    if decay and cfg["weight_decay"] != 0:
        p.data.add_(p.data, alpha=-cfg["weight_decay"] * lr)
    p.data.add_(-update)


def main():
    folder = sys.argv[1]
    case, init, grads = optim_case.load(folder)
    for index, cfg in enumerate(case["configs"]):
        params = optim_case.make_params(case, init, torch.float64)
        states = [{} for _ in params]
        for step in range(case["steps"]):
            optim_case.set_grads(case, params, grads, step)
            with torch.no_grad():
                for p, st, info in zip(params, states, case["params"]):
                    step_param(p, p.grad, st, cfg, case["lrs"][step], info["decay"])
        optim_case.write(folder, index, case, params)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
