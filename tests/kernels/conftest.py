"""Set-up of every kernel test: outputs are allocated filled with NaN (MINI_OF3_POISON=1), so an element a kernel
forgot to write fails the comparison against the float64 reference."""
import pytest


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setenv("MINI_OF3_POISON", "1")
