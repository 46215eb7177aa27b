"""Computes a model's loss, gradients and BatchNorm buffers with PyTorch for
the torch_equivalence test, from what the test wrote: case.json (model name,
batch shape, our parameter layout and buffer names) and raw float32/int32
files. Loads our parameters into bench/torch_compute.py's torch.nn module BY
NAME, so a name that does not map fails here. Prints one JSON object with the
largest differences. Exit 77: python3-torch is missing (the test skips)."""
import json
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"python3-torch is not installed: {e}", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import torch_compute  # noqa: E402


def main():
    folder = sys.argv[1]
    case = json.load(open(os.path.join(folder, "case.json")))
    load = lambda name, dt: np.fromfile(os.path.join(folder, name), dtype=dt)
    params, grads = load("params.f32", np.float32), load("grads.f32", np.float32)
    buffers = load("buffers.f32", np.float32)
    x = torch.from_numpy(load("x.f32", np.float32).reshape(case["x_shape"]))
    y = torch.from_numpy(load("y.i32", np.int32).astype(np.int64))

    model = torch_compute.build_model(torch, case["model"], channels=case["x_shape"][1])
    named = dict(model.named_parameters())
    unmatched = sorted(set(named) - {e["name"] for e in case["layout"]})
    if unmatched:
        raise SystemExit(f"torch parameters with no asgd counterpart: {unmatched}")
    with torch.no_grad():
        for e in case["layout"]:
            if e["name"] not in named:
                raise SystemExit(f"asgd parameter {e['name']} has no torch counterpart")
            p = named[e["name"]]
            if list(p.shape) != e["shape"]:
                raise SystemExit(f"{e['name']}: torch shape {list(p.shape)}, asgd {e['shape']}")
            p.copy_(torch.from_numpy(params[e["offset"]:e["offset"] + e["size"]].copy()).view_as(p))
    inp = x.view(x.shape[0], -1) if case["model"] == "mlp" else x
    # Inference with our running statistics (those after our training step):
    # the logits an exported model gives in PyTorch. The fresh statistics
    # are put back for the training step below, which starts from them as
    # ours did.
    logits_rel = None
    if os.path.exists(os.path.join(folder, "logits.f32")):
        torch_buffers = dict(model.named_buffers())
        fresh = {k: v.clone() for k, v in torch_buffers.items()}
        offset = 0
        with torch.no_grad():
            for b in case["buffers"]:
                torch_buffers[b["name"]].copy_(
                    torch.from_numpy(buffers[offset:offset + b["size"]].copy()).view_as(torch_buffers[b["name"]]))
                offset += b["size"]
            model.eval()
            ours = load("logits.f32", np.float32)
            theirs = model(inp).numpy().ravel()
            logits_rel = float(np.abs(ours - theirs).max() / max(1e-6, float(np.abs(theirs).max())))
            for k, v in fresh.items():
                torch_buffers[k].copy_(v)
    model.train()
    loss = F.cross_entropy(model(inp), y)
    loss.backward()

    def rel(ours, ref):
        return float(np.abs(ours - ref).max() / max(1e-6, float(np.abs(ref).max())))

    out = {"loss_ours": case["loss"], "loss_torch": loss.item(), "grad_rel": {}, "buffer_rel": {},
           "logits_rel": logits_rel}
    for e in case["layout"]:
        ref = named[e["name"]].grad.numpy().ravel()
        out["grad_rel"][e["name"]] = rel(grads[e["offset"]:e["offset"] + e["size"]], ref)
    torch_buffers = dict(model.named_buffers())
    offset = 0
    for b in case["buffers"]:
        if b["name"] not in torch_buffers:
            raise SystemExit(f"asgd buffer {b['name']} has no torch counterpart")
        ref = torch_buffers[b["name"]].numpy().ravel()
        out["buffer_rel"][b["name"]] = rel(buffers[offset:offset + b["size"]], ref)
        offset += b["size"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
