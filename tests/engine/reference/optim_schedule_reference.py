# Reference learning rates for the engine's schedules: torch.optim.lr_scheduler.LambdaLR driven by
# the formulas of transformers.optimization.get_{constant,linear,cosine}_schedule_with_warmup.
# Prints JSON {"<kind>/<warmup>/<total>": [lr used at optimizer step 0, 1, ...]} with base lr 1.
# Usage: /usr/bin/python3 optim_schedule_reference.py
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_reference import hf_lambda  # noqa: E402


def main():
    out = {}
    for kind in ("constant", "linear", "cosine"):
        for warmup, total in ((0, 10), (3, 10), (5, 7), (10, 10), (1, 1), (4, 20)):
            p = torch.nn.Parameter(torch.zeros(1))
            opt = torch.optim.SGD([p], lr=1.0)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, hf_lambda(kind, warmup, total))
            lrs = []
            for _ in range(total + 2):  # two past the end: the schedules clamp at 0
                lrs.append(opt.param_groups[0]["lr"])
                opt.step()
                sched.step()
            out["%s/%d/%d" % (kind, warmup, total)] = lrs
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
