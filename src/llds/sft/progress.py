"""The SFT loop's progress: a live bar on a terminal, log lines elsewhere.

A warm start's steps take milliseconds to a second, so a line per step (as `llds train` prints
one) would bury a log file under hundreds of lines: off a terminal the `llds.sft` logger gets
one line every `1/LINES` of the run and one at its last step; on a terminal rich's bar is
redrawn after every step. The numbers of every step are in `sft_metrics.jsonl` either way.
"""

from __future__ import annotations

import logging
import math
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

log = logging.getLogger("llds.sft")

LINES = 20
"""log lines a run prints off a terminal (plus one at its last step)"""


class SFTProgress(Progress):
    """Shows steps 1..`total` as they finish (`with SFTProgress(...) as bar: bar.step_done(...)`);
    does nothing when not `enabled`."""

    def __init__(self, total: int, *, enabled: bool, console: Console | None = None) -> None:
        console = console or Console()
        super().__init__(
            TextColumn("[bold]SFT"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not (enabled and console.is_terminal),
        )
        self.total, self.enabled = total, enabled
        self.every = max(1, math.ceil(total / LINES))
        self.started = time.perf_counter()
        self.task = self.add_task("", total=total, loss="-")

    def step_done(self, step: int, loss: float, lr: float) -> None:
        """Step `step` (1-based) has finished with `loss` at learning rate `lr`."""
        if not self.enabled:
            return
        if not self.disable:
            self.update(self.task, completed=step, loss=f"{loss:.4f}")
        elif step % self.every == 0 or step == self.total:
            elapsed = time.perf_counter() - self.started
            log.info(
                "SFT step %d/%d | loss %.4f | lr %.2e | %.0f s", step, self.total, loss, lr, elapsed
            )
