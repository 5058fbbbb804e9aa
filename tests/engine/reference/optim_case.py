# Shared I/O of the optimizer parity references (sgd_reference.py, adafactor_reference.py): the C++
# test writes case.json (parameter names/shapes/offsets/decay flags, configs, per-step lrs and
# gradient scales), init.bin (the flat fp32 parameters) and grads.bin (steps x flat fp32
# gradients); the reference writes out_<config index>.bin (the flat parameters after the steps).
# A parameter may say its HF form: "hf_shape" (a padded vocabulary table: the view's first
# prod(hf_shape) elements are the tensor HF has, the rest padding the reference never sees and
# writes as 0) and "transposed" (a GPT-2 Conv1D weight: the view (OC, C) is HF's (C, OC)
# transposed). The references then run on exactly the tensors HF would hold.
import json
import math
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


def _to_hf(flat, info):
    # The view's values as the tensor HF holds (a copy).
    shape = info["shape"]
    if info.get("transposed", False):
        return flat[info["offset"]:info["offset"] + info["numel"]].view(shape).t().contiguous()
    hf = info.get("hf_shape", shape)
    live = math.prod(hf)
    return flat[info["offset"]:info["offset"] + live].clone().view(hf)


def _from_hf(t, info):
    # The HF tensor back as the view's live elements, flat.
    if info.get("transposed", False):
        return t.t().reshape(-1)
    return t.reshape(-1)


def make_params(case, init, dtype=torch.float32):
    return [torch.nn.Parameter(_to_hf(init, p).to(dtype)) for p in case["params"]]


def set_grads(case, params, grads, step):
    scale = torch.tensor(case["grad_scales"][step], dtype=torch.float32)
    for p, info in zip(params, case["params"]):
        g = _to_hf(grads[step], info)
        p.grad = (g * scale).to(p.dtype)  # fp32 product, as the kernels form it


def write(folder, index, case, params):
    flat = torch.zeros(case["num_params"], dtype=torch.float32)
    for p, info in zip(params, case["params"]):
        v = _from_hf(p.detach().to(torch.float32), info)
        flat[info["offset"]:info["offset"] + v.numel()] = v
    with open(os.path.join(folder, "out_%d.bin" % index), "wb") as f:
        f.write(flat.numpy().tobytes())
