"""docs/configuration.md is generated from the config classes where it lists keys, so it
cannot drift: a key added, removed, renamed or re-documented without regenerating the page
(`python -m llds.commands._reference docs/configuration.md`) fails here."""

from __future__ import annotations

from pathlib import Path

from llds.commands._reference import COMMANDS, command_module, committed_reference, generated
from llds.config.cli import config_class
from llds.config.loader import preset_names
from llds.config.reference import all_keys, markdown, type_name
from llds.train.config import OptimConfig

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_committed_reference_is_the_generated_one() -> None:
    assert committed_reference(PAGE.read_text(encoding="utf-8")) == generated()


def test_the_reference_lists_every_key_of_every_command() -> None:
    text = generated()
    for name in COMMANDS:
        assert f"### `llds {name}`" in text
        for doc in all_keys(config_class(command_module(name))):
            assert f"| `{doc.key}` |" in text, doc.key


def test_every_preset_has_its_line() -> None:
    page = PAGE.read_text(encoding="utf-8")
    for name in preset_names():
        assert f"| `{name}` |" in page, name


def test_a_key_shows_its_type_default_range_and_help() -> None:
    table = markdown(OptimConfig, "optim")
    assert "| `lr` | float | `1e-06` | peak learning rate (> 0) |" in table
    assert "| `betas` | [float, float] | `[0.9, 0.999]` |" in table
    assert "| `grad_clip` | float \\| null | `1.0` |" in table
    assert "| `warmup_ratio` | float \\| null | `null` |" in table and "(in [0, 1))" in table
    assert type_name(dict[int, float]) == "{int: float}"
