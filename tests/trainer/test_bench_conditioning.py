"""``python -m mini_of3.bench conditioning``: the denoiser with the trunk's outputs as they are and zeroed."""
import json

import pytest
import torch

from mini_of3.bench import conditioning
from mini_of3.config import ModelConfig
from mini_of3.model.model import MiniOF3
from mini_of3.predict import mmcif_query, to_batch

from .helpers import TINY_MODEL


def randomised_model(seed: int = 0) -> MiniOF3:
    """A tiny model with every parameter drawn at random (the zero-initialised residual updates would hide the
    trunk from the denoiser)."""
    torch.manual_seed(seed)
    model = MiniOF3(ModelConfig(**{**TINY_MODEL, "pair_dropout": 0.0, "n_recycles": 0})).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def test_each_arm_changes_only_what_it_names(entry_path):
    """pair_zeroed differs from trunk in the pair context alone, trunk_zeroed from pair_zeroed in the single context
    alone (bitwise); with random weights each change moves the denoising error."""
    model = randomised_model()
    batch = to_batch(mmcif_query(entry_path("1L2Y")).features, torch.device("cpu"))
    ctx = conditioning.contexts(model, batch)
    assert torch.equal(ctx["trunk"]["s"], ctx["pair_zeroed"]["s"])
    assert not torch.equal(ctx["trunk"]["z"], ctx["pair_zeroed"]["z"])
    assert torch.equal(ctx["pair_zeroed"]["z"], ctx["trunk_zeroed"]["z"])
    assert torch.equal(ctx["pair_zeroed"]["biases"], ctx["trunk_zeroed"]["biases"])
    assert not torch.equal(ctx["pair_zeroed"]["s"], ctx["trunk_zeroed"]["s"])
    mse = {arm: conditioning.denoising_mse(model, batch, c, levels=(0.25, 4.0), copies=2) for arm, c in ctx.items()}
    assert mse["trunk"] != mse["pair_zeroed"] != mse["trunk_zeroed"]
    again = conditioning.denoising_mse(model, batch, ctx["trunk"], levels=(0.25, 4.0), copies=2)
    assert again == mse["trunk"]                               # the same draws for every call


def test_bench_conditioning_writes_a_row_per_entry_and_arm(reference_run, shared_mmcif, tmp_path, capsys):
    ids = [i for i in ("1CRN", "1L2Y") if (shared_mmcif / f"{i}.cif.gz").is_file()]
    if not ids:
        pytest.skip(f"neither 1CRN nor 1L2Y in {shared_mmcif}")
    conditioning.main([str(reference_run), "--mmcif", str(shared_mmcif), "--ids", ",".join(ids), "--copies", "2",
                       "--samples", "2", "--steps", "3", "--device", "cpu", "--out", str(tmp_path), "--tag", "t"])
    result = json.loads((tmp_path / "conditioning_t.json").read_text())
    assert result["bench"] == "conditioning" and result["copies"] == 2 and result["steps"] == 3
    assert [(r["entry"], r["arm"]) for r in result["rows"]] == [(i, a) for i in ids for a in conditioning.ARMS]
    for row in result["rows"]:
        assert sorted(map(float, row["mse_by_level"])) == list(conditioning.LEVELS)
        assert all(v >= 0 for v in row["mse_by_level"].values()) and 0 <= row["sample_lddt_ca"] <= 1
    assert [m["arm"] for m in result["means"]] == list(conditioning.ARMS)
    assert "trunk_zeroed" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--copies, --samples and --steps must be >= 1"):
        conditioning.main([str(reference_run), "--copies", "0"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no entry to score"):
        conditioning.main([str(reference_run), "--mmcif", str(empty), "--device", "cpu", "--out", str(tmp_path)])
