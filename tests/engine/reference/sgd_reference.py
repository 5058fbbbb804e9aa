# torch.optim.SGD (PyTorch 1.13, single-tensor path) over the parameters of case.json for each
# config {"momentum", "dampening", "nesterov", "weight_decay"}; weight decay only on the
# parameters flagged "decay" (two param groups). Usage: sgd_reference.py <folder> (optim_case.py).
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optim_case  # noqa: E402


def main():
    folder = sys.argv[1]
    case, init, grads = optim_case.load(folder)
    for index, cfg in enumerate(case["configs"]):
        params = optim_case.make_params(case, init)
        decay = [p for p, i in zip(params, case["params"]) if i["decay"]]
        other = [p for p, i in zip(params, case["params"]) if not i["decay"]]
        groups = [{"params": decay, "weight_decay": cfg["weight_decay"]},
                  {"params": other, "weight_decay": 0.0}]
        opt = torch.optim.SGD(groups, lr=case["lrs"][0], momentum=cfg["momentum"],
                              dampening=cfg["dampening"], nesterov=cfg["nesterov"])
        for step in range(case["steps"]):
            for g in opt.param_groups:
                g["lr"] = case["lrs"][step]
            optim_case.set_grads(case, params, grads, step)
            opt.step()
        optim_case.write(folder, index, case, params)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
