# A numpy/torch reference of bitsandbytes' 4-bit quantization (quantize_4bit / dequantize_4bit with
# blocksize 64, compress_statistics = double quantization) as its CUDA kernels compute it in IEEE
# fp32 (csrc/kernels.cu: kQuantizeBlockwise, dQuantizeNF4, dQuantizeFP4, dQuantize,
# kDequantizeBlockwise), written independently of traind's code: the decision trees as counts of
# thresholds below the value, the 8-bit search transcribed vectorised.
# Usage: quant4_reference.py OUTDIR. Writes the cases' inputs and expected outputs as raw
# little-endian files OUTDIR/<case>.<field>.bin and one line per case in OUTDIR/manifest.txt:
#   <case> <input dtype f32|bf16|f16> <nf4|fp4> <double quant 0|1> <n> <offset as float.hex>
# Prints one summary line per case to stdout.
import os
import sys
from fractions import Fraction

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quant8_reference import create_dynamic_map  # noqa: E402

BLOCK, NESTED_BLOCK = 64, 256

# dQuantizeNF4's thresholds (kernels.cu, as float literals) in ascending order; the tree's code is
# the number of thresholds strictly below x (tree branches test x > t).
NF4_T_LITERALS = ["-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906",
                  "-0.33967943489551544", "-0.23460740596055984", "-0.13791173323988914",
                  "-0.045525018125772476", "0.03979014977812767", "0.1202552504837513",
                  "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
                  "0.5016634166240692", "0.6427869200706482", "0.8614784181118011"]
# dQuantizeFP4's thresholds on |x|, ascending, and the code of each interval (magnitudes 0, 1/192,
# 1/6, 1/4, 1/3, 1/2, 2/3, 1 are codes 0b000, 0b001, 0b110, 0b111, 0b100, 0b101, 0b010, 0b011).
FP4_T_LITERALS = ["0.00260417", "0.0859375", "0.20833333", "0.29166667", "0.4166667", "0.583333",
                  "0.8333333"]
FP4_INTERVAL_CODE = np.array([0, 1, 6, 7, 4, 5, 2, 3], dtype=np.uint8)
NF4_VALUES = ["-1.0", "-0.6961928009986877", "-0.5250730514526367", "-0.39491748809814453",
              "-0.28444138169288635", "-0.18477343022823334", "-0.09105003625154495", "0.0",
              "0.07958029955625534", "0.16093020141124725", "0.24611230194568634",
              "0.33791524171829224", "0.44070982933044434", "0.5626170039176941",
              "0.7229568362236023", "1.0"]
FP4_LUT = ["0.0", "0.005208333333", "0.66666667", "1.0", "0.33333333", "0.5", "0.16666667", "0.25"]


def float_literal(s):
    """The fp32 value of the C++ literal s + 'f': the decimal rounded once, to the nearest float.
    Not np.float32(float(s)): most thresholds are midpoints of two codes computed in double, so
    their double value sits exactly halfway between two floats and the decimal -> double -> float
    path rounds that tie to even, while the printed decimal lies a hair to one side of it."""
    exact = Fraction(s)
    f = np.float32(float(s))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    dist = [abs(Fraction(float(g)) - exact) for g in cands]
    best = min(range(3), key=lambda i: dist[i])
    assert sorted(dist)[0] < sorted(dist)[1], s  # no tie for the decimal itself
    if best != 1:
        DOUBLE_ROUNDED.append(s)
    return cands[best]


DOUBLE_ROUNDED = []  # literals whose decimal -> double -> float path gives another float


NF4_T = np.array([float_literal(s) for s in NF4_T_LITERALS], dtype=np.float32)
FP4_T = np.array([float_literal(s) for s in FP4_T_LITERALS], dtype=np.float32)
NF4_CODE = np.array([float_literal(s) for s in NF4_VALUES], dtype=np.float32)
FP4_MAG = np.array([float_literal(s) for s in FP4_LUT], dtype=np.float32)
assert np.all(np.diff(NF4_T) > 0) and np.all(np.diff(FP4_T) > 0)
DYNAMIC = create_dynamic_map(True).numpy().astype(np.float32)


def tree_codes(s, qtype):
    """4-bit codes of the scaled values s (float32); NaN fails every test: code 0."""
    if qtype == "nf4":
        return (s[..., None] > NF4_T).sum(axis=-1).astype(np.uint8)
    sign = np.where(s < 0, 8, 0).astype(np.uint8)
    k = (np.abs(s)[..., None] > FP4_T).sum(axis=-1)
    return sign + FP4_INTERVAL_CODE[k]


def code_values(c, qtype):
    if qtype == "nf4":
        return NF4_CODE[c]
    sign = (np.float32(1) - np.float32(2) * ((c & 8) >> 3)).astype(np.float32)  # +-1.0f
    return (FP4_MAG[c & 7] * sign).astype(np.float32)


def blockwise_absmax(x, bs):
    """max |x| per block of bs, the last block zero-padded (the kernel loads zeros past n)."""
    nb = -(-x.size // bs)
    xp = np.zeros(nb * bs, dtype=np.float32)
    xp[:x.size] = x
    blocks = xp.reshape(nb, bs)
    return blocks, np.abs(blocks).max(axis=1)


def quantize_4bit(x, qtype):
    blocks, absmax = blockwise_absmax(x, BLOCK)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.float32(1) / absmax
        s = (blocks * inv[:, None]).reshape(-1)
    c = tree_codes(s, qtype)[: 2 * ((x.size + 1) // 2)]
    packed = ((c[0::2] << 4) | c[1::2]).astype(np.uint8)  # element 2k: high nibble of byte k
    # How many elements x / absmax (true division) would code differently: the product matters.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = tree_codes((blocks / absmax[:, None]).reshape(-1), qtype)[: 2 * ((x.size + 1) // 2)]
    return packed, absmax, int((d != c).sum())


def dquantize8(code, x):
    """bitsandbytes' dQuantize<0> (the 8-bit blockwise search) over an array x."""
    pivot = np.full(x.shape, 127, dtype=np.int64)
    upper_pivot = np.full(x.shape, 255, dtype=np.int64)
    lower_pivot = np.zeros(x.shape, dtype=np.int64)
    lower = np.full(x.shape, -1.0, dtype=np.float32)
    upper = np.full(x.shape, 1.0, dtype=np.float32)
    val = code[pivot]
    i = 64
    while i > 0:
        gt = x > val
        lower_pivot = np.where(gt, pivot, lower_pivot)
        lower = np.where(gt, val, lower)
        upper_pivot = np.where(gt, upper_pivot, pivot)
        upper = np.where(gt, upper, val)
        pivot = np.where(gt, pivot + i, pivot - i)
        val = code[pivot]
        i >>= 1
    upper = np.where(upper_pivot == 255, code[255], upper).astype(np.float32)
    lower = np.where(lower_pivot == 0, code[0], lower).astype(np.float32)
    gt = x > val
    up_mid = ((upper + val) * np.float32(0.5)).astype(np.float32)
    lo_mid = ((lower + val) * np.float32(0.5)).astype(np.float32)
    q = np.where(gt, np.where(x > up_mid, upper_pivot, pivot),
                 np.where(x < lo_mid, lower_pivot, pivot))
    return q.astype(np.uint8)


def double_quant(absmax):
    """quantize_4bit's compress_statistics: offset = mean, quantize_blockwise(absmax - offset,
    blocksize=256) with the signed dynamic map. The mean: exact sum (fsum) / nb, rounded to fp32
    (traind's choice; torch's fp32 mean is printed alongside)."""
    import math
    offset = np.float32(math.fsum(float(v) for v in absmax) / absmax.size)
    d = (absmax - offset).astype(np.float32)
    blocks, nested = blockwise_absmax(d, NESTED_BLOCK)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.float32(1) / nested
        s = (blocks * inv[:, None]).reshape(-1)[: d.size]
    q = dquantize8(DYNAMIC, s)
    torch_mean = np.float32(torch.from_numpy(absmax).mean().item())
    return offset, q, nested, torch_mean


def dequantize_4bit(packed, absmax, n, qtype):
    c = np.empty(2 * packed.size, dtype=np.uint8)
    c[0::2], c[1::2] = packed >> 4, packed & 15
    v = code_values(c[:n], qtype)
    return (v * np.repeat(absmax, BLOCK)[:n]).astype(np.float32)


def to_dtype(x32, dtype):
    t = torch.from_numpy(x32)
    if dtype == "bf16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    if dtype == "f16":
        return t.to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    return x32


def from_dtype(raw, dtype):
    if dtype == "f32":
        return raw
    t = torch.from_numpy(raw.view(np.int16))
    t = t.view(torch.bfloat16 if dtype == "bf16" else torch.float16)
    return t.float().numpy()


def ulps(a, b):
    return abs(int(np.float32(a).view(np.int32)) - int(np.float32(b).view(np.int32)))


def threshold_values(qtype):
    """Each threshold t (and -t for FP4's magnitudes) with its two fp32 neighbours."""
    ts = NF4_T if qtype == "nf4" else np.concatenate([FP4_T, -FP4_T])
    vals = []
    for t in ts:
        vals += [np.nextafter(t, np.float32(-1)), t, np.nextafter(t, np.float32(1))]
    return np.array(vals, dtype=np.float32)


def cases(rng):
    """(name, dtype, float32 values) for each case; values already representable in dtype."""
    out = []
    n = BLOCK * 37
    out.append(("random", rng.standard_normal(n).astype(np.float32) * 0.02))
    w = rng.standard_normal(BLOCK * 5 + 17).astype(np.float32)  # odd n: a padded low nibble
    out.append(("odd_n", w))
    out.append(("n_mod_64_2", rng.standard_normal(BLOCK * 3 + 2).astype(np.float32)))
    out.append(("one_element", np.array([-0.3], dtype=np.float32)))
    z = rng.standard_normal(BLOCK * 4).astype(np.float32)
    z[BLOCK:2 * BLOCK] = 0.0  # an all-zero block: 0 * (1/0) is NaN -> code 0
    z[2 * BLOCK:3 * BLOCK] = -0.0
    z[3 * BLOCK + 5] = -0.0
    out.append(("zero_blocks", z))
    out.append(("all_zero_short", np.zeros(BLOCK + 3, dtype=np.float32)))
    # Thresholds exactly and +-1 ulp, with absmax 1 (x * 1/absmax is exact), then scaled by 4 (still
    # exact), then by a non-power-of-two absmax where x * (1/a) rounds (x = t * a rounded).
    for qtype in ("nf4", "fp4"):
        tv = threshold_values(qtype)
        per = BLOCK - 1
        chunks = [tv[i:i + per] for i in range(0, tv.size, per)]
        exact = np.concatenate([np.concatenate([[np.float32(1.0)], c]) for c in chunks])
        out.append(("ties_" + qtype, exact.astype(np.float32)))
        out.append(("ties_x4_" + qtype, (exact * np.float32(4)).astype(np.float32)))
        a = np.float32(0.7371)
        scaled = np.concatenate([np.concatenate([[a], (c * a).astype(np.float32)]) for c in chunks])
        # and 1-ulp neighbours of each scaled value, so some land on each side of the threshold
        nb = np.concatenate([np.concatenate([[a], np.nextafter((c * a).astype(np.float32),
                                                                np.float32(np.inf))])
                             for c in chunks])
        out.append(("ties_scaled_" + qtype, np.concatenate([scaled, nb]).astype(np.float32)))
    o = rng.standard_normal(BLOCK * 6).astype(np.float32) * 1e-3
    o[3] = 1e30  # huge outliers: the rest of their blocks scale to ~1e-33 -> codes of 0
    o[BLOCK + 7] = -3.0e38
    o[BLOCK + 8] = -1e-30
    o[2 * BLOCK + 1] = 65504.0
    o[3 * BLOCK:4 * BLOCK] = np.float32(1e-40) * rng.standard_normal(BLOCK).astype(np.float32)
    o[4 * BLOCK + 9] = np.float32(1.5e-45)  # denormals next to a normal absmax
    o[4 * BLOCK + 10] = -np.float32(3e-39)
    o[5 * BLOCK:6 * BLOCK] = 0.0
    o[5 * BLOCK + 2] = np.float32(1.4e-45)  # a block whose absmax is the smallest denormal
    out.append(("outliers_denormals", o))
    # double quantization: many blocks (nb not a multiple of 256), varied absmax scales
    big = rng.standard_normal(BLOCK * 601 + 33).astype(np.float32)
    big *= np.repeat(np.exp(rng.standard_normal(602)).astype(np.float32), BLOCK)[: big.size]
    out.append(("many_blocks", big))
    same = np.tile(np.concatenate([[np.float32(0.5)], rng.uniform(-0.5, 0.5, BLOCK - 1)]),
                   300).astype(np.float32)  # every absmax 0.5: absmax - offset is all zero
    out.append(("equal_absmax", same))
    return out


def main():
    outdir = sys.argv[1]
    print("literals where float(double(s)) != float(s):", " ".join(DOUBLE_ROUNDED))
    rng = np.random.default_rng(20261129)
    lines = []
    for name, x in cases(rng):
        for dtype in ("f32", "bf16", "f16"):
            # f16 has no 1e30: clip to its largest finite value (an infinite input is garbage in)
            raw = to_dtype(np.clip(x, -65504, 65504) if dtype == "f16" else x, dtype)
            xin = from_dtype(raw, dtype)  # the values the quantizer sees
            for qtype in ("nf4", "fp4"):
                for dq in (0, 1):
                    case = f"{name}.{dtype}.{qtype}.{dq}"
                    packed, absmax, div_diff = quantize_4bit(xin, qtype)
                    raw.tofile(os.path.join(outdir, case + ".x.bin"))
                    packed.tofile(os.path.join(outdir, case + ".codes.bin"))
                    offset = np.float32(0)
                    info = f"div_vs_mul_codes={div_diff}"
                    if dq:
                        offset, q, nested, torch_mean = double_quant(absmax)
                        q.tofile(os.path.join(outdir, case + ".qabsmax.bin"))
                        nested.tofile(os.path.join(outdir, case + ".nested.bin"))
                        code_q = DYNAMIC[q]
                        deq_absmax = ((code_q * np.repeat(nested, NESTED_BLOCK)[: q.size])
                                      .astype(np.float32) + offset).astype(np.float32)
                        info += f" offset_vs_torch_mean_ulps={ulps(offset, torch_mean)}"
                    else:
                        absmax.tofile(os.path.join(outdir, case + ".absmax.bin"))
                        deq_absmax = absmax
                    y = dequantize_4bit(packed, deq_absmax, xin.size, qtype)
                    y.tofile(os.path.join(outdir, case + ".deq_f32.bin"))
                    to_dtype(y, dtype).tofile(os.path.join(outdir, case + ".deq_in.bin"))
                    lines.append(f"{case} {dtype} {qtype} {dq} {xin.size} {float(offset).hex()}")
                    print(case, info)
    with open(os.path.join(outdir, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
