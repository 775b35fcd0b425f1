"""The tuning grid (PROTOCOL.md, "Detectors and the grid") and its replay through the library.

A cell is one registered detector at one setting of its own keys. Detectors keep no shared state
but the phase detector's label (whose settings stay fixed), so one replay of a run with every
detector at its k-th cell gives every detector's alarms at that cell: `replay_cells` makes
max-cells replays per run instead of one per cell. Every cell's settings pass through the
config system (`llds.monitor.replay.monitor_config_from`), so a cell is a setting a user can
write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llds.monitor.alarms import scan_alarms
from llds.monitor.replay import monitor_config_from
from llds.monitor.settings import BUILT_IN_ALARMS, MonitorConfig

Setting = Mapping[str, float]
Grid = Mapping[str, Sequence[Setting]]

GRID: dict[str, tuple[Setting, ...]] = {
    "displacement_decay": ({},),
    "likelihood_decay": ({},),
    "collapse": ({},),
    "reward_collapse": ({},),
    "entropy_spike": ({},),
    "grad_norm_spike": ({},),
    "ratio_spike": ({},),
    "nonfinite": ({},),
    "search_decline": ({}, {"decline": 0.9}, {"decline": 0.6}),
    "sampler_mismatch": ({}, {"rise": 1.5}, {"rise": 3.0}),
    "void_turns": ({}, {"rise": 1.5}, {"rise": 3.0}),
    "entropy_drift": (
        {},
        {"high": 1.5},
        {"high": 3.0},
        {"low": 0.5},
        {"low": 0.5, "high": 1.5},
        {"low": 0.5, "high": 3.0},
    ),
    "lr_divergence": ({}, {"grad_growth": 1.5}, {"grad_growth": 3.0}),
    "reward_fall": ({}, {"fall": 0.3}, {"fall": 0.7}),
}
"""The protocol's 29 cells, by detector in the registry's order, each detector's defaults first
(`{}`: the defaults when the protocol was written, `PROTOCOL_DEFAULTS`); `stagnation` (info) is
not a candidate."""
PROTOCOL_DEFAULTS: dict[str, Setting] = {
    "entropy_drift": {"high": 2.0},
    "lr_divergence": {"grad_growth": 2.0},
}
"""The library's defaults when the protocol was written, where the freeze has moved them since
(the library's defaults are frozen.yaml's now): every cell of these detectors starts from them,
so that the grid stays the protocol's and replaying it reproduces the committed choice."""


@dataclass(frozen=True, order=True)
class Cell:
    """One detector at one setting: the `index`-th of its grid (0: its defaults)."""

    detector: str
    index: int
    overrides: tuple[tuple[str, float], ...] = ()

    @property
    def label(self) -> str:
        said = ", ".join(f"{k}={v:g}" for k, v in self.overrides)
        return f"{self.detector}[{said or 'defaults'}]"

    def as_settings(self) -> dict[str, Any]:
        """The detector's section under `monitor.alarms.<name>` for this cell."""
        return {"enabled": True, **PROTOCOL_DEFAULTS.get(self.detector, {}), **dict(self.overrides)}


def cells_of(grid: Grid) -> list[Cell]:
    """Every cell, detector by detector in the grid's order."""
    return [
        Cell(name, i, tuple(sorted(setting.items())))
        for name, settings in grid.items()
        for i, setting in enumerate(settings)
    ]


def monitor_section(cells: Sequence[Cell], disable_others: bool = True) -> dict[str, Any]:
    """The `monitor` section that runs exactly `cells` (at most one per detector): a built-in
    under `alarms`, a detector registered elsewhere under `extra_alarms`; with
    `disable_others`, every other built-in switched off."""
    names = [c.detector for c in cells]
    if len(set(names)) != len(names):
        raise ValueError(f"one cell per detector, got {names}")
    alarms: dict[str, Any] = (
        {name: {"enabled": False} for name in BUILT_IN_ALARMS} if disable_others else {}
    )
    extra: dict[str, Any] = {}
    for c in cells:
        if c.detector in BUILT_IN_ALARMS:
            alarms[c.detector] = c.as_settings()
        else:
            extra[c.detector] = dict(c.overrides)
    section: dict[str, Any] = {"alarms": alarms}
    if extra:
        section["extra_alarms"] = extra
    return section


def position_config(grid: Grid, k: int) -> MonitorConfig:
    """The monitor running every detector of `grid` at its `k`-th cell (a detector with fewer
    cells, and every built-in outside the grid, off)."""
    at_k = [c for c in cells_of(grid) if c.index == k]
    return monitor_config_from(monitor_section(at_k), f"tuning grid position {k}")


def replay_cells(rows: Sequence[Mapping[str, Any]], grid: Grid) -> dict[Cell, tuple[int, ...]]:
    """Every cell's alarm steps on one run's rows, by the library's replay (`scan_alarms`)."""
    cells = cells_of(grid)
    out: dict[Cell, tuple[int, ...]] = {}
    for k in range(max(c.index for c in cells) + 1):
        alarms = scan_alarms(rows, position_config(grid, k))
        for c in cells:
            if c.index == k:
                out[c] = tuple(a.step for a in alarms if a.kind == c.detector)
    return out
