"""Where a profiled step's time goes: per phase (`PhaseTimes`' `llds/<phase>` ranges), the
time spent in matrix-product kernels and the time spent in everything else.

Why: whether a step can still be made much faster without changing what it computes depends on
how much of it is arithmetic. The matrix products (linear layers, attention) are the step's
arithmetic; a step whose time is mostly in them gains little from removing host overhead, and
the step's time minus theirs bounds what removing all other work could save.

`write_step_profile` keeps one profiled step of a run (`logging.profile_step`): its trace and,
on a CPU, its split.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds.io import failing_writes_stop, silent_write_failed, write_json

DENSE_KERNELS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
"""Matrix products whose FLOPs the profiler counts (`with_flops=True`)."""

MATRIX_KERNELS = DENSE_KERNELS | frozenset(
    {
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_cudnn_attention_backward",
    }
)
"""Operators whose own (self) time is a matrix product: dense layers and attention kernels.
The math fallback of attention runs as `bmm` and is counted by it."""

PHASE_PREFIX = "llds/"


@dataclass(frozen=True)
class PhaseSplit:
    """Seconds of one phase: its wall time, and the self time of its matrix-product kernels
    (of which `dense_seconds` in those whose FLOPs are counted, `dense_flops`)."""

    seconds: float
    matrix_seconds: float
    dense_seconds: float
    dense_flops: float

    @property
    def dense_gflops(self) -> float:
        """The rate the dense products reached (GFLOP/s; 0 without any)."""
        return self.dense_flops / self.dense_seconds / 1e9 if self.dense_seconds else 0.0

    @property
    def other_seconds(self) -> float:
        return max(self.seconds - self.matrix_seconds, 0.0)


def split_by_phase(events: Iterable[Any]) -> dict[str, PhaseSplit]:
    """`{phase: PhaseSplit}` from a CPU profile's `events()` (torch's `FunctionEvent`s): each
    matrix-product kernel counts towards the `llds/<phase>` range that encloses its start on
    its thread; kernels outside every phase go to `"other"`, whose seconds are theirs alone."""
    events = list(events)
    ranges = [
        (e.thread, e.time_range.start, e.time_range.end, e.name[len(PHASE_PREFIX) :])
        for e in events
        if e.name.startswith(PHASE_PREFIX)
    ]
    wall: dict[str, float] = {}
    for _, start, end, phase in ranges:
        wall[phase] = wall.get(phase, 0.0) + (end - start) / 1e6
    matrix: dict[str, float] = {}
    dense: dict[str, float] = {}
    flops: dict[str, float] = {}
    for e in events:
        if e.name not in MATRIX_KERNELS:
            continue
        at = e.time_range.start
        around = [(t, p) for t, s, end, p in ranges if s <= at < end]
        # its own thread's range first (a backward may run on another thread: then any range)
        phase = next((p for t, p in around if t == e.thread), around[0][1] if around else "other")
        own = e.self_cpu_time_total / 1e6
        matrix[phase] = matrix.get(phase, 0.0) + own
        if e.name in DENSE_KERNELS:
            dense[phase] = dense.get(phase, 0.0) + own
            flops[phase] = flops.get(phase, 0.0) + float(getattr(e, "flops", 0) or 0)
    phases = list(wall) + [p for p in matrix if p not in wall]
    return {
        p: PhaseSplit(
            seconds=wall.get(p, matrix.get(p, 0.0)),
            matrix_seconds=matrix.get(p, 0.0),
            dense_seconds=dense.get(p, 0.0),
            dense_flops=flops.get(p, 0.0),
        )
        for p in phases
    }


def summary_line(split: dict[str, PhaseSplit], step_seconds: float) -> str:
    """`"65% of 39.02 s in matrix products (rollout 45%, update 76%)"`: the step's share, then
    each phase's, in the order the phases ran (those under 1% of the step left out)."""
    matrix = sum(p.matrix_seconds for p in split.values())
    parts = [
        f"{name} {p.matrix_seconds / p.seconds:.0%}"
        for name, p in split.items()
        if name != "other" and p.seconds > 0.01 * step_seconds
    ]
    share = matrix / step_seconds if step_seconds > 0 else 0.0
    return f"{share:.0%} of {step_seconds:.2f} s in matrix products ({', '.join(parts)})"


def write_step_profile(
    prof: Any, directory: Path, step: int, step_seconds: float, *, split: bool
) -> tuple[Path, dict[str, PhaseSplit] | None]:
    """Write a finished `torch.profiler.profile`'s trace to `directory/step_N.pt.trace.json`
    and, with `split`, its phases to `step_N.phases.json` (both atomically: a failed write
    leaves no partial file); returns the trace's path and the split."""
    trace = directory / f"step_{step:06d}.pt.trace.json"
    partial = directory / f".{trace.name}.tmp"
    kept = "the run's log and checkpoints are intact; resume to go on"
    with failing_writes_stop(trace, kept):
        directory.mkdir(parents=True, exist_ok=True)
        try:
            prof.export_chrome_trace(str(partial))
            # the exporter reports a failed write (a full disk) only in its own log
            if not _ends_a_json_object(partial):
                raise silent_write_failed(trace, kept)
            os.replace(partial, trace)
        finally:
            partial.unlink(missing_ok=True)
            # the exporter writes to `<path>.tmp` first, and leaves it behind when it fails
            partial.with_name(partial.name + ".tmp").unlink(missing_ok=True)
    if not split:
        return trace, None
    phases = split_by_phase(prof.events())
    write_json(
        directory / f"step_{step:06d}.phases.json",
        {
            "step": step,
            "seconds": step_seconds,
            "phases": {name: dataclasses.asdict(p) for name, p in phases.items()},
        },
    )
    return trace, phases


def _ends_a_json_object(path: Path) -> bool:
    """Whether `path` exists and its last non-blank byte closes a JSON object: a trace cut
    short by a full disk does not (the whole file is not parsed: a trace can be large)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64))
            return f.read().rstrip().endswith(b"}")
    except FileNotFoundError:
        return False
