"""A training run's progress: one line per step.

On a terminal the line is rich's live bar, redrawn in place after every step; elsewhere (a log
file, CI, a pipe) a live bar would only be printed once, at the end and cut to 80 columns, so
each step prints one plain line instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    """Shows steps `done + 1 .. total` as they finish; does nothing when not `enabled`."""

    def __init__(
        self, total: int, done: int, *, enabled: bool, console: Console | None = None
    ) -> None:
        self.total = total
        self.console = console or Console()
        self.enabled = enabled
        live = enabled and self.console.is_terminal
        self.bar = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            disable=not live,
            transient=False,
        )
        self.task = self.bar.add_task("", total=total, completed=done)

    def __enter__(self) -> StepProgress:
        self.bar.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.bar.__exit__(kind, exc, tb)

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        """Step `step` has finished with `metrics`."""
        if not self.enabled:
            return
        if self.bar.disable:
            line = f"step {step}/{self.total} | {summary(metrics)}"
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self.bar.update(self.task, completed=step, description=summary(metrics))


def summary(m: dict[str, Any]) -> str:
    """The few numbers worth a glance after a step (the rest is in metrics.jsonl)."""

    def f(key: str, fmt: str = ".3f") -> str:
        v = m.get(key)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    return (
        f"reward {f('reward/mean')} | searches {f('rollout/valid_searches', '.2f')} | "
        f"logp+ {f('lld/logp_correct')} | disp+ {f('lld/disp_correct')} | "
        f"H {f('policy/entropy')} | |g| {f('policy/grad_norm', '.2f')} | "
        f"{f('time/step', '.1f')}s"
    )


class PhaseTimes:
    """Wall-clock seconds of a step's phases: `with times("rollout"): ...`, then
    `times.metrics()` gives `time/<phase>` for each and `time/step` since it was made.

    Each phase is also a `torch.profiler` range named `llds/<phase>`, so a profile of a run
    (`torch.profiler.profile`, `logging.profile_step`) shows which phase each kernel belongs to;
    with no profiler running a range costs about 10 microseconds (five per step)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            with torch.profiler.record_function(f"llds/{phase}"):
                yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        out = {f"time/{phase}": s for phase, s in self.seconds.items()}
        out["time/step"] = time.perf_counter() - self.started
        return out
