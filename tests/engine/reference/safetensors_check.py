# Independent safetensors reader for tests: parses a file with json + numpy only (the
# `safetensors` package is not available) and prints {"metadata", "tensors": {name: {dtype, shape,
# values}}, "data_start_aligned"} as JSON. Usage: safetensors_check.py FILE
import json
import struct
import sys

import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def main(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out = {"metadata": header.pop("__metadata__", {}), "tensors": {},
           "data_start_aligned": (8 + n) % 8 == 0}
    for name, e in header.items():
        b, end = e["data_offsets"]
        buf = data[b:end]
        if e["dtype"] == "BF16":  # numpy has no bfloat16: widen the 16 bits to float32
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=np.dtype(DTYPES[e["dtype"]]).newbyteorder("<"))
        assert arr.size == int(np.prod(e["shape"])), name
        out["tensors"][name] = {"dtype": e["dtype"], "shape": e["shape"],
                                "values": arr.reshape(-1).tolist()}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
