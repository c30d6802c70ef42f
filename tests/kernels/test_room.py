"""The shape of the kernel room (mini_of3/kernels/), read from the source with ``ast``.

Each op ``<op>`` has ``<op>.py`` (public function, checks, custom ops), and may have ``<op>_host.py`` (tiles and
launchers), ``<op>_kernels.py`` (Triton kernels) and ``<op>_hopper.py`` (Gluon kernels for sm_90, their launch).
Shared by all: ``host.py`` (host-side helpers), ``primitives.py`` (device-side helpers) and ``reference.py`` (the
float64-capable references). An op's modules import only the shared
modules and their own op's modules; no module imports another module's private name (leading underscore) except
from its own op; the shared modules import no op; the kernels modules import only triton and ``primitives``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOM = Path(__file__).resolve().parents[2] / "mini_of3" / "kernels"
PACKAGE = "mini_of3.kernels"
SHARED = {"host", "primitives", "reference"}
ROLES = ("_host", "_kernels", "_hopper")


def op_of(module: str) -> str | None:
    """The op a module belongs to (its name without _host / _kernels), None for the shared modules and __init__."""
    if module in SHARED or module == "__init__":
        return None
    for suffix in ROLES:
        if module.endswith(suffix):
            return module[: -len(suffix)]
    return module


def room_imports(source: str) -> list[tuple[str, list[str], int]]:
    """(module of the room, names imported from it, line) for every import of a ``mini_of3.kernels`` module; a
    module imported whole gives no names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.append((alias.name[len(PACKAGE) + 1:].split(".")[0], [], node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module == PACKAGE:          # from mini_of3.kernels import <module or public name>
                for alias in node.names:
                    name = alias.name
                    module = name if (ROOM / f"{name}.py").exists() else "__init__"
                    found.append((module, [] if module == name else [name], node.lineno))
            elif node.module.startswith(PACKAGE + "."):
                found.append((node.module[len(PACKAGE) + 1:].split(".")[0], [a.name for a in node.names],
                              node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append(("<relative>", [a.name for a in node.names], node.lineno))
    return found


def other_imports(source: str) -> set[str]:
    """Top-level packages imported from outside the room."""
    packages = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            packages |= {a.name.split(".")[0] for a in node.names if not a.name.startswith(PACKAGE)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not node.module.startswith(PACKAGE):
            packages.add(node.module.split(".")[0])
    return packages


def violations(module: str, source: str) -> list[str]:
    """What the module imports against the rules of the room (see the module docstring)."""
    problems = []
    own = op_of(module)
    for target, names, line in room_imports(source):
        where = f"{module}.py:{line}"
        if target == "<relative>":
            problems.append(f"{where}: relative import {names} (write mini_of3.kernels.<module>)")
            continue
        same_op = own is not None and op_of(target) == own
        if module != "__init__" and target not in SHARED and not same_op:
            problems.append(f"{where}: imports the module {target} of another op")
        if module in SHARED and target not in SHARED:
            problems.append(f"{where}: a shared module imports the op module {target}")
        private = [n for n in names if n.startswith("_") and n != "__future__"]
        if private and not same_op:
            problems.append(f"{where}: imports private names {private} from {target}")
        if module.endswith("_kernels") and target != "primitives":
            problems.append(f"{where}: a kernels module imports {target} (only primitives)")
    if module.endswith("_kernels") or module == "primitives":
        outside = other_imports(source) - {"__future__", "triton"}
        if outside:
            problems.append(f"{module}.py: device-side code imports {sorted(outside)} (only triton)")
    return problems


def modules() -> list[str]:
    return sorted(p.stem for p in ROOM.glob("*.py"))


@pytest.mark.parametrize("module", modules())
def test_module_keeps_to_its_room(module):
    assert violations(module, (ROOM / f"{module}.py").read_text()) == []


def test_every_op_module_has_an_op_and_the_shared_modules_exist():
    """Every ``_host`` or ``_kernels`` module belongs to an op that has its public module."""
    names = set(modules())
    assert SHARED <= names
    for module in names:
        own = op_of(module)
        assert own is None or own in names, f"{module}.py has no op module {own}.py"


@pytest.mark.parametrize("module,source,problem", [
    ("transition", "from mini_of3.kernels.triangle_multiplication import weight_grad", "another op"),
    ("transition", "from mini_of3.kernels import triangle_attention_host as T", "another op"),
    ("transition", "import mini_of3.kernels.triangle_multiplication_kernels", "another op"),
    ("transition", "from mini_of3.kernels.host import _compiled", "private names"),
    ("transition_host", "from mini_of3.kernels.transition_kernels import _transition_fwd", None),
    ("transition_host", "from mini_of3.kernels.host import allocate, launch", None),
    ("transition_kernels", "from mini_of3.kernels.host import launch", "only primitives"),
    ("transition_kernels", "import torch", "only triton"),
    ("host", "from mini_of3.kernels import transition", "shared module imports"),
    ("transition", "from . import host", "relative import"),
])
def test_the_walker_finds_what_breaks_the_rules(module, source, problem):
    """The rules themselves, on made-up sources: each forbidden import is reported, the allowed ones are not."""
    found = violations(module, source)
    if problem is None:
        assert found == []
    else:
        assert any(problem in p for p in found), found
