"""Typed evaluation results and where they are kept.

`evaluate()` returns an `EvalResult`; `llds eval --out`, the periodic evaluation during training,
the SFT warm start and the demo write it as JSON (`to_dict`), and `llds report` reads it back
(`read`), so every consumer sees the same fields with the same types. Every evaluation of a
run's model after `step` steps is kept at `RUN/eval/step_N.json` (`eval_file`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from llds.errors import DataFormatError
from llds.io import write_json

EVAL_DIR = "eval"


@dataclass(frozen=True)
class EvalRecord:
    """One question, answered greedily."""

    id: str
    source: str
    question: str
    golds: list[str]
    prediction: str | None
    em: float
    f1: float
    sub_em: float
    valid_searches: int
    answered: bool
    hops: int | None = None
    queries: list[str] = field(default_factory=list)
    response: str = ""


@dataclass(frozen=True)
class Scores:
    """Means over `n` records; NaN where `n == 0` (there is nothing to average)."""

    n: int
    em: float = math.nan
    f1: float = math.nan
    sub_em: float = math.nan
    valid_searches: float = math.nan
    answered: float = math.nan

    @classmethod
    def of(cls, records: Sequence[EvalRecord]) -> Scores:
        n = len(records)
        if n == 0:
            return cls(0)
        return cls(
            n=n,
            em=sum(r.em for r in records) / n,
            f1=sum(r.f1 for r in records) / n,
            sub_em=sum(r.sub_em for r in records) / n,
            valid_searches=sum(r.valid_searches for r in records) / n,
            answered=sum(r.answered for r in records) / n,
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self) if self.n else {"n": 0}


@dataclass(frozen=True)
class EvalResult:
    """Scores overall, per data source and per hop count, and every record."""

    overall: Scores
    by_source: dict[str, Scores]
    by_hops: dict[str, Scores]
    records: list[EvalRecord]

    @classmethod
    def of(cls, records: Sequence[EvalRecord]) -> EvalResult:
        by_source: dict[str, list[EvalRecord]] = defaultdict(list)
        by_hops: dict[str, list[EvalRecord]] = defaultdict(list)
        for r in records:
            by_source[r.source].append(r)
            if r.hops is not None:
                by_hops[str(r.hops)].append(r)
        return cls(
            overall=Scores.of(records),
            by_source={k: Scores.of(v) for k, v in sorted(by_source.items())},
            by_hops={k: Scores.of(v) for k, v in sorted(by_hops.items())},
            records=list(records),
        )

    def em_by_hops(self, hops: Sequence[str]) -> dict[str, float]:
        """EM per hop count, NaN for hop counts with no question."""
        return {h: self.by_hops[h].em if h in self.by_hops else math.nan for h in hops}

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_dict(),
            "by_source": {k: v.to_dict() for k, v in self.by_source.items()},
            "by_hops": {k: v.to_dict() for k, v in self.by_hops.items()},
            "records": [asdict(r) for r in self.records],
        }

    def write(self, path: str | Path) -> Path:
        """Write as JSON, atomically."""
        write_json(path, self.to_dict())
        return Path(path)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> EvalResult:
        """Inverse of `to_dict`; `where` (a file name) is named in every error. `by_source`,
        `by_hops` and `records` may be missing (summaries keep only the scores)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("overall"), Mapping):
            raise DataFormatError(f"{where}: expected an object with an 'overall' object")
        return cls(
            overall=_scores(data["overall"], f"{where}: overall"),
            by_source=_score_map(data.get("by_source", {}), f"{where}: by_source"),
            by_hops=_score_map(data.get("by_hops", {}), f"{where}: by_hops"),
            records=[
                _record(r, f"{where}: records[{i}]")
                for i, r in enumerate(_list(data.get("records", []), f"{where}: records"))
            ],
        )

    @classmethod
    def read(cls, path: str | Path) -> EvalResult:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{p}: not valid JSON ({exc})") from exc
        return cls.from_dict(data, str(p))


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise DataFormatError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _scores(value: Any, where: str) -> Scores:
    if not isinstance(value, Mapping):
        raise DataFormatError(f"{where}: expected an object, got {type(value).__name__}")
    n = value.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise DataFormatError(f"{where}.n: expected a count, got {n!r}")
    kwargs: dict[str, Any] = {"n": n}
    for f in fields(Scores):
        if f.name == "n" or (n == 0 and f.name not in value):
            continue
        v = value.get(f.name)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise DataFormatError(f"{where}.{f.name}: expected a number, got {v!r}")
        kwargs[f.name] = float(v)
    return Scores(**kwargs)


def _score_map(value: Any, where: str) -> dict[str, Scores]:
    if not isinstance(value, Mapping):
        raise DataFormatError(f"{where}: expected an object, got {type(value).__name__}")
    return {str(k): _scores(v, f"{where}.{k}") for k, v in value.items()}


def _record(value: Any, where: str) -> EvalRecord:
    if not isinstance(value, Mapping):
        raise DataFormatError(f"{where}: expected an object, got {type(value).__name__}")
    names = {f.name for f in fields(EvalRecord)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise DataFormatError(f"{where}: unknown field(s) {unknown}")
    try:
        return EvalRecord(**value)
    except TypeError as exc:  # a required field is missing
        raise DataFormatError(f"{where}: {exc}") from None


def eval_file(run_dir: str | Path, step: int) -> Path:
    """Where an evaluation of a run's model after `step` steps is kept: `RUN/eval/step_N.json`.

    The one convention for every evaluation (periodic ones during training, the demo's final
    ones, a warm start's at step 0), so `llds report` finds held-out EM for any run."""
    return Path(run_dir) / EVAL_DIR / f"step_{step:06d}.json"


def eval_files(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Every evaluation kept for a run, as (step, file), by step."""
    out = []
    for p in (Path(run_dir) / EVAL_DIR).glob("step_*.json"):
        digits = p.stem.removeprefix("step_")
        if digits.isdigit():
            out.append((int(digits), p))
    return sorted(out)


def latest_eval_file(run_dir: str | Path) -> Path | None:
    """The evaluation of the highest step kept for a run, or None."""
    files = eval_files(run_dir)
    return files[-1][1] if files else None
