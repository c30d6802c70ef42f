"""``python -m mini_of3.bench conditioning RUN [--mmcif DIR] [--ids A,B]``: does the denoiser use the trunk?

The diffusion module sees the trunk only through its conditioning (AF3 SI Alg 21: the trunk's single and pair
representations, beside the inputs' single features). For each entry (whole, every chain, from its mmCIF) the trunk
runs once with a checkpoint's EMA weights; the denoiser then denoises the same noisy, augmented copies of the true
Calpha (``--copies`` per noise level sigma / sigma_data in LEVELS; the same random draws in every arm) with the
context built from

- ``trunk``: the trunk's s and z (what training and sampling use),
- ``pair_zeroed``: the trunk's z replaced by zeros,
- ``trunk_zeroed``: s and z replaced by zeros (the inputs' single features kept).

Per arm and level: the training loss's weighted aligned MSE (:func:`mini_of3.losses.diffusion_mse_per_sample`,
about 1 for a denoiser that returns its noisy input); per arm: the mean lDDT-Calpha of ``--samples`` structures
sampled with that context. A denoiser that ignores the trunk scores the same in every arm; one that has learnt to
read it loses most at the noise levels where the structure must come from the trunk (sigma above sigma_data).

    python -m mini_of3.bench conditioning runs/fit4 --mmcif data/mmcif --ids 1L2Y,5I55,1PSM,1CRN

Writes ``<out>/conditioning[_tag].json`` (``"bench": "conditioning"``, one row per entry and arm: ``entry``,
``arm``, ``N``, ``step``, ``mse_by_level`` {level: loss}, ``sample_lddt_ca``) and prints the arms' means.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from mini_of3.bench.common import print_table, result_header, write_json
from mini_of3.bench.fit import parse_ids
from mini_of3.bench.score import add_sampling_options, find_entries, run_folder, sampling_device
from mini_of3.losses import diffusion_mse_per_sample
from mini_of3.metrics import lddt_ca
from mini_of3.model.diffusion import chain_interior
from mini_of3.model.model import MiniOF3
from mini_of3.model.sampler import centre_random_augmentation, randn, sample_diffusion

LEVELS = (0.05, 0.25, 1.0, 4.0, 16.0)            # sigma / sigma_data
ARMS = ("trunk", "pair_zeroed", "trunk_zeroed")


@torch.no_grad()
def contexts(model: MiniOF3, batch: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """The diffusion context of each arm (ARMS) from one trunk pass."""
    s_inputs, s, z = model.trunk(batch, model.cfg.n_recycles)
    prepare = model.diffusion.prepare
    return {"trunk": prepare(batch, s_inputs, s, z),
            "pair_zeroed": prepare(batch, s_inputs, s, torch.zeros_like(z)),
            "trunk_zeroed": prepare(batch, s_inputs, torch.zeros_like(s), torch.zeros_like(z))}


@torch.no_grad()
def denoising_mse(model: MiniOF3, batch: dict[str, torch.Tensor], context: dict[str, torch.Tensor],
                  levels=LEVELS, copies: int = 8, seed: int = 0) -> dict[float, float]:
    """{level: mean weighted aligned MSE} of denoising ``copies`` augmented copies of the true Calpha at noise
    sigma = level * sigma_data; the draws depend on ``seed`` and the level only, so every context sees the same."""
    sigma_data, dtype = model.cfg.sigma_data, model.coordinate_dtype
    mask, resolved = batch["token_mask"], batch["token_mask"] & batch["resolved"]
    B, N = mask.shape
    train_context = {**context, "interior": chain_interior(batch["residue_index"], batch["asym_id"], resolved)}
    out = {}
    for i, level in enumerate(levels):
        generator = torch.Generator(device=mask.device).manual_seed(seed * 1000 + i)
        x = centre_random_augmentation(batch["ca"].to(dtype)[:, None].expand(B, copies, N, 3), resolved, generator)
        sigma = torch.full((B, copies), level * sigma_data, device=mask.device, dtype=dtype)
        noisy = x + sigma[:, :, None, None] * randn((B, copies, N, 3), generator, mask.device, dtype)
        denoised = model.diffusion(noisy, sigma, train_context)
        out[level] = float(diffusion_mse_per_sample(denoised, batch["ca"], resolved, sigma, sigma_data).mean())
    return out


@torch.no_grad()
def sample_lddt(model: MiniOF3, batch: dict[str, torch.Tensor], context: dict[str, torch.Tensor], *, samples: int,
                steps: int, seed: int = 0) -> float:
    """Mean lDDT-Calpha of ``samples`` structures sampled with ``context`` (the same noise for every context)."""
    mask = batch["token_mask"]
    B, N = mask.shape
    generator = torch.Generator(device=mask.device).manual_seed(seed)
    x = sample_diffusion(lambda xn, t: model.diffusion(xn, t, context), (B, samples, N, 3), mask,
                         sigma_data=model.cfg.sigma_data, steps=steps, generator=generator,
                         dtype=model.coordinate_dtype)
    resolved = (batch["token_mask"] & batch["resolved"])[0]
    true = batch["ca"][0].to(x.dtype)
    return statistics.mean(float(lddt_ca(x[0, k], true, resolved)) for k in range(samples))


def main(argv: list[str] | None = None) -> None:
    from mini_of3.predict import load_model, read_query, to_batch

    parser = argparse.ArgumentParser(prog="python -m mini_of3.bench conditioning", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run folder (its latest checkpoint) or a checkpoint folder")
    parser.add_argument("--copies", type=int, default=8, help="noisy copies per entry and noise level")
    add_sampling_options(parser, samples=3, samples_help="structures sampled per entry and arm")
    args = parser.parse_args(argv)
    if args.copies < 1 or args.samples < 1 or (args.steps is not None and args.steps < 1):
        raise SystemExit(f"--copies, --samples and --steps must be >= 1, got {args.copies}, {args.samples}, "
                         f"{args.steps}")
    device = sampling_device(args)
    model, folder, state = load_model(args.run, device, prefer="latest")
    steps = args.steps or model.cfg.sampling_steps
    result = result_header("conditioning")
    result.update(checkpoint=str(folder), step=state.get("step"), levels=list(LEVELS), copies=args.copies,
                  samples=args.samples, steps=steps)
    for path in find_entries(Path(args.mmcif), parse_ids(args.ids) if args.ids else None, set()):
        query = read_query(path)
        batch = to_batch(query.features, device)
        for arm, context in contexts(model, batch).items():
            row = {"entry": query.name.upper(), "arm": arm, "N": len(query.features["restype"]),
                   "step": state.get("step"),
                   "mse_by_level": denoising_mse(model, batch, context, copies=args.copies, seed=args.seed),
                   "sample_lddt_ca": sample_lddt(model, batch, context, samples=args.samples, steps=steps,
                                                 seed=args.seed)}
            result["rows"].append(row)
        print(query.name.upper(), " ".join(f"{r['arm']} {r['sample_lddt_ca']:.3f}" for r in result["rows"]
                                           if r["entry"] == query.name.upper()), flush=True)
    if not result["rows"]:
        raise SystemExit(f"no entry to score in {args.mmcif} (check --mmcif and --ids)")
    means = [{"arm": arm, **{f"mse {level:g}": statistics.mean(r["mse_by_level"][level] for r in result["rows"]
                                                                if r["arm"] == arm) for level in LEVELS},
              "lddt": statistics.mean(r["sample_lddt_ca"] for r in result["rows"] if r["arm"] == arm)}
             for arm in ARMS]
    result["means"] = means
    out = Path(args.out) if args.out else run_folder(folder)
    name = f"conditioning{('_' + args.tag) if args.tag else ''}.json"
    write_json(result, out / name)
    print_table(means, [("arm", "arm", "s"), *((f"mse {lv:g}", f"MSE s/sd={lv:g}", ".3f") for lv in LEVELS),
                        ("lddt", "sample lDDT-Ca", ".3f")])
    print(f"\ncheckpoint {folder} (step {state.get('step')}); wrote {out / name}")


if __name__ == "__main__":
    main()
