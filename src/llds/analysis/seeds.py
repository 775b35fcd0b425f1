"""One value per seed, summarised without hiding the seeds: the median of the known values,
and the median, mean and one standard error beside every seed's own value."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence


def median_over_seeds(values: Iterable[float | None]) -> float | None:
    """The median of the known values, or None."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def seed_spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median, mean and one standard error of the mean (sample s.d. / sqrt(n)) over the seeds'
    known values: the per-seed values are always printed beside these, so the spread is never
    hidden."""
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "mean": None, "se": None}
    se = statistics.stdev(known) / math.sqrt(len(known)) if len(known) > 1 else None
    return {"median": median_over_seeds(known), "mean": statistics.mean(known), "se": se}


def spread_md(values: Sequence[float | None], spread: Mapping[str, float | None]) -> str:
    """A table cell: every seed's value, then their median and mean +- SE (`seed_spread`)."""
    each = " / ".join("-" if v is None else f"{v:.3f}" for v in values)
    if spread["median"] is None:
        return each or "-"
    se = "" if spread["se"] is None else f" ± {spread['se']:.3f}"
    return f"{each}; median {spread['median']:.3f}, mean {spread['mean']:.3f}{se}"
