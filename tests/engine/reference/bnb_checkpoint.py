# An independent writer of the folder transformers saves from a bitsandbytes 4-bit model
# (save_pretrained of an AutoModel loaded with BitsAndBytesConfig(load_in_4bit=True)), written from
# bitsandbytes' serialization as documented by its QuantState.as_dict(packed=True) and
# Linear4bit's state dict, with the quantizer of quant4_reference.py (a numpy model of
# bitsandbytes' kernels; the double-quantization offset is the exactly summed mean rounded to
# fp32, see there), and the reference of a merged export of such a base.
#
# write SRC DST QTYPE DQ COMPUTE: SRC is a full-precision HF folder (config.json,
#   model.safetensors); DST gets config.json with quantization_config (BitsAndBytesConfig.to_dict's
#   keys) and model.safetensors where every block linear weight <m>.weight (llama's q/k/v/o and
#   gate/up/down; gpt2's c_attn/c_proj/c_fc, Conv1D weights transposed to (out, in) first) is
#     <m>.weight                          U8  (ceil(n/2), 1)  codes, element 2k in the high nibble
#     <m>.weight.absmax                   F32 (nb,), or U8 (nb,) with double quantization
#     <m>.weight.quant_map                F32 (16,)  get_4bit_type(QTYPE)
#     <m>.weight.nested_absmax            F32 (ceil(nb/256),)       (double quantization)
#     <m>.weight.nested_quant_map         F32 (256,) the signed dynamic map (double quantization)
#     <m>.weight.quant_state.bitsandbytes__<QTYPE>  U8 JSON bytes: quant_type, blocksize, dtype,
#                                         shape, then nested_blocksize, nested_dtype, nested_offset
#   and every other tensor as SRC holds it.
# merge DIR ADAPTERS SCALE DTYPE OUT: the merged model of DIR's 4-bit base and a PEFT adapter file,
#   as traind's peft.merge defines it: each quantized weight dequantized (fp32), plus
#   SCALE * B @ A (summed in float64, rounded to fp32, added in fp32), rounded once to DTYPE
#   (bf16 | f16 | f32); the other tensors rounded to DTYPE. Written to OUT under the HF names.
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quant4_reference import (DYNAMIC, NESTED_BLOCK, double_quant, dequantize_4bit,  # noqa: E402
                              quantize_4bit)

NP = {"F32": np.float32, "U8": np.uint8, "I64": np.int64, "I32": np.int32}
LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
          "c_attn", "c_proj", "c_fc"}
TORCH_NAME = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def read(path):
    """name -> (dtype, shape, raw bytes)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        out[name] = (meta["dtype"], meta["shape"], blob[8 + n + b:8 + n + e])
    return out


def write(path, tensors):
    header, chunks, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def to_f32(dtype, raw):
    if dtype == "F32":
        return np.frombuffer(raw, dtype=np.float32).copy()
    t = torch.frombuffer(bytearray(raw), dtype=torch.int16)
    return t.view(torch.bfloat16 if dtype == "BF16" else torch.float16).float().numpy()


def from_f32(x, dtype):
    if dtype == "F32":
        return np.ascontiguousarray(x, dtype=np.float32).tobytes()
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.to(torch.bfloat16 if dtype == "BF16" else torch.float16).view(torch.int16).numpy().tobytes()


def quantized(name):
    parts = name.split(".")
    return ("layers" in parts or "h" in parts) and parts[-1] == "weight" and parts[-2] in LINEAR


def quant_map(qtype):
    """get_4bit_type: the list as a float32 tensor divided by its largest magnitude."""
    if qtype == "nf4":
        data = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
    else:
        data = [0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0]
    t = torch.tensor(data, dtype=torch.float32)
    return (t / t.abs().max()).numpy()


def write_folder(src, dst, qtype, dq, compute):
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    arch = config.get("model_type")
    tensors = read(os.path.join(src, "model.safetensors"))
    out = {}
    for name, (dtype, shape, raw) in tensors.items():
        if not quantized(name):
            out[name] = (dtype, shape, raw)
            continue
        w = to_f32(dtype, raw).reshape(shape)
        if arch == "gpt2":  # Conv1D (in, out): quantized as the (out, in) Linear it becomes
            w = np.ascontiguousarray(w.T)
        x = w.reshape(-1)
        packed, absmax, _ = quantize_4bit(x, qtype)
        out[name] = ("U8", [packed.size, 1], packed.tobytes())
        state = {"quant_type": qtype, "blocksize": 64, "dtype": TORCH_NAME[dtype], "shape": list(w.shape)}
        if dq:
            offset, q, nested, _ = double_quant(absmax)
            out[name + ".absmax"] = ("U8", [q.size], q.astype(np.uint8).tobytes())
            out[name + ".nested_absmax"] = ("F32", [nested.size], nested.astype(np.float32).tobytes())
            out[name + ".nested_quant_map"] = ("F32", [256], DYNAMIC.astype(np.float32).tobytes())
            state.update({"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": float(offset)})
        else:
            out[name + ".absmax"] = ("F32", [absmax.size], absmax.astype(np.float32).tobytes())
        out[name + ".quant_map"] = ("F32", [16], quant_map(qtype).tobytes())
        blob = json.dumps(state).encode("utf-8")
        out[name + ".quant_state.bitsandbytes__" + qtype] = ("U8", [len(blob)], blob)
    write(os.path.join(dst, "model.safetensors"), out)
    config["quantization_config"] = {
        "_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": compute,
        "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": qtype,
        "bnb_4bit_use_double_quant": bool(dq), "llm_int8_enable_fp32_cpu_offload": False,
        "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None, "llm_int8_threshold": 6.0,
        "load_in_4bit": True, "load_in_8bit": False, "quant_method": "bitsandbytes"}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {dst}: {sum(quantized(n) for n in tensors)} weights in {qtype}"
          f"{' (double quant)' if dq else ''}, {len(out)} tensors")


def dequantized(tensors, name):
    """The fp32 (out, in) weight of a 4-bit entry, from its stored state."""
    qtype = [k for k in tensors if k.startswith(name + ".quant_state.bitsandbytes__")][0].split("__")[-1]
    state = json.loads(tensors[name + ".quant_state.bitsandbytes__" + qtype][2].decode("utf-8"))
    shape = state["shape"]
    n = int(np.prod(shape))
    packed = np.frombuffer(tensors[name][2], dtype=np.uint8)
    if "nested_offset" in state:
        q = np.frombuffer(tensors[name + ".absmax"][2], dtype=np.uint8)
        nested = np.frombuffer(tensors[name + ".nested_absmax"][2], dtype=np.float32)
        code = np.frombuffer(tensors[name + ".nested_quant_map"][2], dtype=np.float32)
        prod = (code[q] * np.repeat(nested, NESTED_BLOCK)[: q.size]).astype(np.float32)
        absmax = (prod + np.float32(state["nested_offset"])).astype(np.float32)
    else:
        absmax = np.frombuffer(tensors[name + ".absmax"][2], dtype=np.float32)
    return dequantize_4bit(packed, absmax, n, qtype).reshape(shape)


def merge(folder, adapters_path, scale, dtype, out_path):
    tensors = read(os.path.join(folder, "model.safetensors"))
    adapters = read(adapters_path)
    st = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[dtype]
    out = {}
    for name, (dt, shape, raw) in tensors.items():
        if any(s in name for s in (".absmax", ".quant_map", ".nested_", ".quant_state.")):
            continue
        if dt == "U8":
            w = dequantized(tensors, name)
            module = name[: -len(".weight")]
            a = adapters.get("base_model.model." + module + ".lora_A.weight")
            if a is not None:
                b = adapters["base_model.model." + module + ".lora_B.weight"]
                A = to_f32(a[0], a[2]).reshape(a[1]).astype(np.float64)
                B = to_f32(b[0], b[2]).reshape(b[1]).astype(np.float64)
                delta = (scale * (B @ A)).astype(np.float32)
                w = (w + delta).astype(np.float32)
            shape = list(w.shape)
        else:
            w = to_f32(dt, raw).reshape(shape)
        out[name] = (st, shape, from_f32(w, st))
    write(out_path, out)
    print(f"wrote {out_path}: {len(out)} tensors in {st}")


def main():
    if sys.argv[1] == "write":
        write_folder(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1", sys.argv[6])
    elif sys.argv[1] == "merge":
        merge(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5], sys.argv[6])
    else:
        raise SystemExit("usage: bnb_checkpoint.py write SRC DST QTYPE DQ COMPUTE | merge DIR ADAPTERS SCALE DTYPE OUT")


if __name__ == "__main__":
    main()
