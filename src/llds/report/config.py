"""The settings of `llds report`: which runs, their labels, and where the report goes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from llds.config.schema import section


def _comma_list(value: Any) -> Any:
    """`"grpo,llds"` (the command-line form) -> `["grpo", "llds"]`; so does `["grpo,llds"]`
    (a repeated `--labels`); other values pass (a label holds no comma)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        return value
    return [part.strip() for item in items for part in item.split(",")]


Label = Annotated[str, Field(min_length=1)]


@section
class ReportConfig:
    """`llds report`: an HTML report comparing runs (reward, likelihoods, displacement, phases,
    alarms)."""

    runs: list[str] = dataclasses.field(default_factory=list)
    """runs to compare: native run directories, TRL output directories (trainer_state.json),
    veRL metrics logs (file-logger .jsonl, or a directory of TensorBoard event files); on the
    command line, every positional that is not a KEY=VALUE override"""
    out: str | None = None
    """output directory; null: RUN_DIR/report for one run, ./llds_report otherwise"""
    labels: Annotated[list[Label] | None, BeforeValidator(_comma_list)] = None
    """one label per run, e.g. [grpo, llds] (or `grpo,llds`); null: from the directory names"""

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        return [] if self.runs else [("runs", "required (one or more run directories)")]

    def out_dir(self) -> Path:
        """Where the report goes."""
        if self.out is not None:
            return Path(self.out)
        if len(self.runs) != 1:
            return Path("llds_report")
        run = Path(self.runs[0])  # a veRL metrics log is a file: its report goes beside it
        return (run.parent if run.is_file() else run) / "report"
