"""The aten ops of one training step, by part of the model (on the CPU: a proxy of the GPU's kernel launches where a
step is bound by the host; the triangle ops count as PyTorch's here, as one or two launches each on the GPU, and the
optimizer's foreach ops as many per-tensor ops).

    python tools/lab/step_ops.py [CONFIG] [key=value ...]      (default configs/ablation.yaml on .device/data/cache)
"""
import collections
import pathlib
import sys

import torch
from dataclasses import replace
from torch.utils._python_dispatch import TorchDispatchMode
from mini_of3.bench.trainrun import load
from mini_of3.model import build_model
from mini_of3.losses import compute_losses
from mini_of3.data import ProteinDataset, resolve_validation
args = sys.argv[1:]
config = args.pop(0) if args and not args[0].count("=") else "configs/ablation.yaml"
cfg = load(config, ["data.root=.device/data/cache", "data.cache_dir=.device/data/cache", "data.crop_size=64", *args])
cfg = replace(cfg, data=resolve_validation(pathlib.Path(cfg.data.root), cfg.data))
ds = ProteinDataset(cfg.data.root, cfg.data, "train", 0)
item = ds[0]
batch = {k: torch.as_tensor(v)[None] for k, v in item.items() if not isinstance(v, str)}
model = build_model(cfg.model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
SKIP = {"aten.view", "aten._unsafe_view", "aten.t", "aten.transpose", "aten.expand", "aten.permute", "aten.unsqueeze",
        "aten.squeeze", "aten.select", "aten.slice", "aten.detach", "aten.alias", "aten.empty", "aten.as_strided",
        "aten.split", "aten.unbind", "aten.reshape", "aten.empty_like", "aten.new_empty", "aten.lift_fresh",
        "aten.split_with_sizes", "aten.empty_strided"}
part = ["other"]
counts = collections.Counter(); ops = collections.defaultdict(collections.Counter)
class Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name not in SKIP:
            counts[part[0]] += 1; ops[part[0]][name] += 1
        return func(*args, **(kwargs or {}))
outer = ["forward"]
for name, child in model.named_children():
    child.register_forward_pre_hook(lambda m, a, n=name: part.__setitem__(0, outer[0] + ":" + n))
    child.register_forward_hook(lambda m, a, o: part.__setitem__(0, outer[0] + ":glue"))
g = torch.Generator().manual_seed(0)
for rep in range(2):
    counts.clear(); ops.clear()
    with Count():
        part[0] = outer[0] = "forward"
        out = model(batch, n_recycles=0, generator=g)
        part[0] = outer[0] = "losses"
        losses = compute_losses(out, batch, cfg.loss)
        loss = losses["loss"] if isinstance(losses, dict) else losses[0]
        part[0] = outer[0] = "backward"
        loss.backward()
        part[0] = outer[0] = "optimizer"
        opt.step(); opt.zero_grad(set_to_none=True)
print("total", sum(counts.values()))
for p, c in counts.most_common(): print(f"{c:6d} {p}")
for p, c in counts.most_common(3):
    print(p, ops[p].most_common(10))
