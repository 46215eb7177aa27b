"""Loads an `asgd export` safetensors file into the equivalent torch.nn
module (bench/torch_compute.py) with load_state_dict(strict=True) and
prints, as JSON, its accuracy on a dataset's official test set, normalised
as the file's metadata says. Reads the format by hand (8-byte header
length, JSON header, raw tensors) so that it needs only numpy and torch.
Usage: load_safetensors.py FILE DATA_DIR. Exit 77: python3-torch missing."""
import gzip
import json
import os
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"python3-torch is not installed: {e}", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import torch_compute  # noqa: E402

DTYPES = {"F32": np.float32, "I64": np.int64}


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        array = np.frombuffer(raw[base + begin:base + end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors, meta


def read_idx(path):
    opener = gzip.open if os.path.exists(path + ".gz") else open
    data = opener(path + ".gz" if os.path.exists(path + ".gz") else path, "rb").read()
    dims = data[3]
    shape = struct.unpack_from(">" + "I" * dims, data, 4)
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    path, data_dir = sys.argv[1], sys.argv[2]
    tensors, meta = read_safetensors(path)
    model = torch_compute.build_model(torch, meta["model"])
    model.load_state_dict(tensors, strict=True)
    model.eval()
    images = read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte")).astype(np.float32) / 255.0
    labels = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte")).astype(np.int64)
    x = (torch.from_numpy(images) - float(meta["input_mean"])) / float(meta["input_stddev"])
    x = x.view(-1, 784) if meta["model"] == "mlp" else x.view(-1, 1, 28, 28)
    with torch.no_grad():
        predicted = torch.cat([model(x[i:i + 1000]).argmax(1) for i in range(0, len(x), 1000)])
    accuracy = (predicted == torch.from_numpy(labels)).float().mean().item()
    print(json.dumps({"model": meta["model"], "accuracy": accuracy, "tensors": len(tensors)}))


if __name__ == "__main__":
    main()
