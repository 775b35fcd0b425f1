"""A retriever that gets worse from a training step on: a fault to inject on purpose.

Search agents fail when search stops helping (a stale or mis-routed index shard, a service that
answers with nothing under load), and a run's monitor should tell that apart from the policy's
own failure modes. `DegradingRetriever` wraps any retriever and, from `start_step` on, degrades
a share of the searches that rises linearly over `ramp_steps`: a degraded query gets another
query's passages (`shuffled`: well-formed but irrelevant) or none (`empty`). Which searches are
degraded is a pure function of the step, the search call within the step and the query's
position, so a resumed run degrades the same ones.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from llds.config.schema import section
from llds.retrieval.base import Hit, Retriever

DegradeKind = Literal["none", "shuffled", "empty"]


@section(key="retriever.degrade")
class DegradeConfig:
    """Degrade the retriever from a step on (fault injection; off by default)."""

    kind: DegradeKind = "none"
    """`shuffled`: a degraded query gets the passages of the next query of the same search batch
    (irrelevant to it); `empty`: it gets none. `none`: the retriever as it is"""
    start_step: int = Field(default=1, ge=1)
    """the first training step (as logged, from 1) whose searches are degraded"""
    ramp_steps: int = Field(default=0, ge=0)
    """steps over which the degraded share rises linearly to `fraction`; 0 = at once"""
    fraction: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    """share of searches degraded once the ramp is over"""


def degraded_share(cfg: DegradeConfig, step: int) -> float:
    """The share of step `step`'s searches that `cfg` degrades (0 before `start_step`)."""
    if cfg.kind == "none" or step < cfg.start_step:
        return 0.0
    if cfg.ramp_steps == 0:
        return cfg.fraction
    return cfg.fraction * min(1.0, (step - cfg.start_step + 1) / cfg.ramp_steps)


def _is_degraded(share: float, step: int, call: int, row: int) -> bool:
    """A stable coin for search `row` of call `call` within step `step` (crc32, not `hash`,
    which Python salts per process)."""
    return zlib.crc32(f"{step}:{call}:{row}".encode()) < share * 2**32


class DegradingRetriever:
    """`base` with `cfg`'s fault; the trainer tells it the step (`at_step`) before each one."""

    def __init__(self, base: Retriever, cfg: DegradeConfig) -> None:
        self.base, self.cfg = base, cfg
        self.step, self._calls = 0, 0
        self.degraded, self.searches = 0, 0
        """searches degraded and made since the last `at_step` (the step's own counts)"""

    def at_step(self, step: int) -> None:
        """Searches from now on belong to training step `step` (as logged, from 1)."""
        self.step, self._calls = step, 0
        self.degraded, self.searches = 0, 0

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        hits = self.base.search(queries, k)
        share, call = degraded_share(self.cfg, self.step), self._calls
        self._calls += 1
        self.searches += len(queries)
        if share == 0.0:
            return hits
        out: list[list[Hit]] = []
        for i, row in enumerate(hits):
            if not _is_degraded(share, self.step, call, i):
                out.append(row)
                continue
            self.degraded += 1
            other = (i + 1) % len(hits)
            shuffled = self.cfg.kind == "shuffled" and queries[other] != queries[i]
            out.append(list(hits[other]) if shuffled else [])
        return out

    def __getattr__(self, name: str):
        # the wrapped retriever's other attributes (a URL, a close()) stay reachable
        return getattr(self.base, name)
