"""Where a run stands: the counters a checkpoint's ``trainer_state.json`` keeps so that a resumed run goes on
exactly (step, data position, non-finite streak, time spent in steps, validation results, wandb run id)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class RunState:
    step: int = 0                    # optimizer steps done
    epoch: int = 0                   # data position: the sampler's epoch ...
    consumed: int = 0                # ... and the examples this rank used in it
    nonfinite_total: int = 0         # steps skipped for a non-finite loss or gradient, over the run
    nonfinite_in_row: int = 0        # ... and the current streak of them
    train_s: float = 0.0             # seconds in training steps (compiling left out), resumed parts included
    best: dict | None = None         # {"step", "lddt_ca"} of the best validation
    first_val: dict | None = None    # the first validation of the run (step 0: the untrained model)
    last_val: dict | None = None
    wandb_id: str | None = None

    def saved(self) -> dict:
        """The fields as trainer_state.json keeps them."""
        return dataclasses.asdict(self)

    @classmethod
    def restored(cls, saved: dict) -> "RunState":
        """The state of a checkpoint's trainer_state.json (keys it lacks keep their defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in names})

    def record_validation(self, metrics: dict) -> None:
        """Keep a validation of the current step: the first of the run, the last, and the best by lDDT-Calpha."""
        self.first_val = self.first_val or {"step": self.step, **metrics}
        self.last_val = {"step": self.step, **metrics}
        lddt = metrics["lddt_ca"]
        if lddt is not None and (self.best is None or lddt > self.best["lddt_ca"]):
            self.best = {"step": self.step, "lddt_ca": lddt}
