# Shared I/O of the optimizer parity references (sgd_reference.py, adafactor_reference.py): the C++
# test writes case.json (parameter names/shapes/offsets/decay flags, configs, per-step lrs and
# gradient scales), init.bin (the flat fp32 parameters) and grads.bin (steps x flat fp32
# gradients); the reference writes out_<config index>.bin (the flat parameters after the steps).
import json
import os

import torch


def load(folder):
    with open(os.path.join(folder, "case.json")) as f:
        case = json.load(f)
    n = case["num_params"]
    init = torch.frombuffer(bytearray(open(os.path.join(folder, "init.bin"), "rb").read()),
                            dtype=torch.float32).clone()
    grads = torch.frombuffer(bytearray(open(os.path.join(folder, "grads.bin"), "rb").read()),
                             dtype=torch.float32).clone().view(case["steps"], n)
    return case, init, grads


def make_params(case, init):
    params = []
    for p in case["params"]:
        t = init[p["offset"]:p["offset"] + p["numel"]].clone().view(p["shape"])
        params.append(torch.nn.Parameter(t))
    return params


def set_grads(case, params, grads, step):
    scale = torch.tensor(case["grad_scales"][step], dtype=torch.float32)
    for p, info in zip(params, case["params"]):
        g = grads[step, info["offset"]:info["offset"] + info["numel"]].view(info["shape"])
        p.grad = (g * scale).clone()  # fp32 product, as the kernels form it


def write(folder, index, case, params):
    flat = torch.zeros(case["num_params"], dtype=torch.float32)
    for p, info in zip(params, case["params"]):
        flat[info["offset"]:info["offset"] + info["numel"]] = p.detach().reshape(-1)
    with open(os.path.join(folder, "out_%d.bin" % index), "wb") as f:
        f.write(flat.numpy().tobytes())
