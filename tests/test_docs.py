"""The docs name what exists: every `mini_of3.x.y` name in docs/tour.md (and in the other user-facing docs)
resolves by import, every repository path they name is there, and every local link and image points to a file."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]     # docs/lab/ is the log: it cites history
NAME = re.compile(r"`(mini_of3(?:\.\w+)+)[`(]")
PATH = re.compile(r"`((?:mini_of3|tests|tools|configs|data)/[\w./-]+\.(?:py|yaml|txt|md))`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def resolve(dotted: str):
    """The object a dotted name means: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(dotted)


def names(path: Path) -> list[str]:
    return sorted(set(NAME.findall(path.read_text())))


def test_the_tour_names_a_function_for_every_algorithm_it_walks_through():
    text = (REPO / "docs" / "tour.md").read_text()
    for algorithm in ("Alg 1 ", "Alg 3)", "Alg 11)", "Alg 12, 13", "Alg 14, 15", "Alg 17", "Alg 18", "Alg 19",
                      "Alg 20", "Alg 21", "Alg 22", "Alg 23", "Alg 24", "Alg 25", "Alg 26", "Alg 27", "Alg 28",
                      "Alg 31"):
        assert algorithm in text, algorithm
    assert len(names(REPO / "docs" / "tour.md")) >= 40


@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: p.name)
def test_every_dotted_name_resolves(doc):
    missing = []
    for dotted in names(doc):
        try:
            resolve(dotted)
        except (ImportError, AttributeError) as err:
            missing.append(f"{dotted} ({type(err).__name__}: {err})")
    assert not missing, missing


@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: p.name)
def test_every_path_and_local_link_exists(doc):
    paths = PATH.findall(doc.read_text())
    links = [link for link in LINK.findall(doc.read_text()) if "://" not in link]
    missing = [p for p in paths if not (REPO / p).exists()]
    missing += [link for link in links if not (doc.parent / link).exists()]
    assert not missing, missing
