"""One metrics dict per step -> metrics.jsonl (always), TensorBoard and W&B (when asked)."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import importlib
import json
import logging
import math
import os
import time
import zlib
from pathlib import Path
from typing import IO, Any

from llds.errors import ConfigError, DataFormatError, WriteFailedError
from llds.io import atomic_write, failing_writes_stop

logger = logging.getLogger("llds.runs")

METRICS_FILE = "metrics.jsonl"


def check_trackers(*, tensorboard: bool, wandb: bool) -> None:
    """Import the trackers a run asks for, so that a missing package stops it before anything
    is written (a ConfigError naming the key and the install command)."""
    if tensorboard:
        _require("torch.utils.tensorboard", "logging.tensorboard", "tensorboard", "tensorboard")
    if wandb:
        _require("wandb", "logging.wandb", "wandb", "'llds[wandb]'")


def _require(module: str, key: str, package: str, install: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{key}=true needs the {package} package: pip install {install} (or set {key}=false)"
        ) from None


@dataclasses.dataclass(frozen=True)
class MetricsLog:
    """What a metrics log holds: its intact rows and the lines that are not rows."""

    path: Path
    rows: list[dict[str, Any]]
    damaged: list[tuple[int, str]]
    """`(line number, why)` of each line that is not a metrics row, but a torn last line"""
    torn: bool = False
    """the last line was cut short (a crash while it was written): expected, dropped quietly"""
    cut_short: str | None = None
    """why a compressed log ends before its end (a copy cut short), else None"""
    restarts: list[tuple[int, int, int, int]] = dataclasses.field(default_factory=list)
    """`(line number, step, the step before it, rows dropped)` where the steps go back (a
    second run appended to the log): the later rows replace the earlier ones from that step on,
    as a resume cuts its log back"""

    @property
    def whole(self) -> bool:
        """Whether every line was read (a torn last line aside) and the steps only go up."""
        return not self.damaged and not self.restarts and self.cut_short is None

    def problem(self) -> str:
        """The damage in words, for one line: which lines, why, what was kept."""
        parts = [f"line {n}: {why}" for n, why in self.damaged[:3]]
        if len(self.damaged) > 3:
            parts.append(f"and {len(self.damaged) - 3} more")
        parts += [
            f"line {n}: step {step} after step {before}, the {dropped} earlier row(s) from step "
            f"{step} on dropped for the later ones"
            for n, step, before, dropped in self.restarts[:3]
        ]
        if len(self.restarts) > 3:
            parts.append(f"and {len(self.restarts) - 3} more")
        if self.cut_short:
            parts.append(self.cut_short)
        what = [f"{len(self.damaged)} damaged line(s) skipped"] if self.damaged else []
        what += [f"steps go back at {len(self.restarts)} line(s)"] if self.restarts else []
        return (
            f"{self.path}: {', '.join(what) or 'cut short'} ({'; '.join(parts)}); "
            f"{len(self.rows)} intact row(s) read"
        )


def _row_problem(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """A log line as a row, else `(None, why)`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
    try:
        row = json.loads(text)
    except ValueError:
        return None, "not JSON"
    step = row.get("step") if isinstance(row, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        return None, "not a metrics row (no integer step)"
    return row, ""


def read_log(path: str | Path) -> MetricsLog:
    """Every intact row of a metrics log (`metrics.jsonl`, or a `.gz` copy), and which lines
    are not rows: a damaged line costs only itself, never the rows after it. Where the steps
    go back, the later rows replace the earlier ones from that step on (named too). A missing
    file is an empty log; a file named `.gz` that is not gzip is one `DataFormatError` naming it."""
    file = Path(path)
    rows: list[dict[str, Any]] = []
    damaged: list[tuple[int, str]] = []
    restarts: list[tuple[int, int, int, int]] = []
    torn = False
    cut_short = None
    if not file.is_file():
        return MetricsLog(file, rows, damaged)
    line_no = 0
    try:
        with gzip.open(file, "rb") if file.suffix == ".gz" else file.open("rb") as handle:
            for line_no, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                row, why = _row_problem(raw.strip())
                if row is not None:
                    if rows and row["step"] <= rows[-1]["step"]:
                        before, dropped = rows[-1]["step"], 0
                        while rows and rows[-1]["step"] >= row["step"]:
                            rows.pop()
                            dropped += 1
                        restarts.append((line_no, row["step"], before, dropped))
                    rows.append(row)
                elif raw.endswith(b"\n"):
                    damaged.append((line_no, why))
                else:
                    torn = True  # the last line, without its newline: a write cut short
    except gzip.BadGzipFile:
        raise DataFormatError(f"{file}: not a gzip file (its name ends in .gz)") from None
    except (EOFError, zlib.error) as exc:
        what = "ends early" if isinstance(exc, EOFError) else "is damaged"
        cut_short = f"the compressed data {what} after line {line_no}"
    return MetricsLog(file, rows, damaged, torn, cut_short, restarts)


_told: set[tuple[str, int, int]] = set()
"""The damaged logs already named in this process (path, size, mtime): each is named once."""


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All intact rows of a run's metrics log: a torn last line from a crash is skipped
    quietly; a damaged line in the middle is skipped and named in one warning (once per
    process), with the count of rows read."""
    return rows_of(read_log(Path(run_dir) / METRICS_FILE))


def rows_of(log: MetricsLog) -> list[dict[str, Any]]:
    """The rows of `log`, its damage named in one warning (once per process and file state)."""
    if not log.whole:
        stat = log.path.stat()
        seen = (str(log.path.absolute()), stat.st_size, stat.st_mtime_ns)
        if seen not in _told:
            _told.add(seen)
            logger.warning("%s", log.problem())
    return log.rows


def _keep_original(path: Path) -> Path:
    """A copy of a damaged log beside it (`metrics.jsonl.damaged-<time>`), before it is
    repaired: nothing it held is lost."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    copy = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 2
    while copy.exists():
        copy = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
        n += 1
    with atomic_write(copy, "wb") as f:
        f.write(path.read_bytes())
    return copy


def _cut_back(handle: IO[str], path: Path, size: int) -> IO[str]:
    """Drop a torn row: the log cut back to `size` bytes, reopened for appending (the buffered
    part of the row that did not fit is discarded with the old handle)."""
    with contextlib.suppress(OSError):  # its buffer held the row that did not fit
        handle.close()
    os.truncate(path, size)
    return path.open("a", encoding="utf-8")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


class MetricsLogger:
    """Appends metric rows; on resume, first cuts the log back to the checkpointed step."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "llds",
        resume_step: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        check_trackers(tensorboard=tensorboard, wandb=wandb)  # before the log is rewritten
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        earlier = read_log(self.path)
        if not earlier.whole:  # never rewritten without a copy of what it held
            copy = _keep_original(self.path)
            logger.warning(
                "%s; the log goes on from its intact rows up to step %d, the original is kept "
                "as %s",
                earlier.problem(),
                resume_step or 0,
                copy.name,
            )
        kept = [r for r in earlier.rows if r["step"] <= (resume_step or 0)]
        with atomic_write(self.path, "w", encoding="utf-8") as f:
            for row in kept:
                f.write(json.dumps(row) + "\n")
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(
                log_dir=str(self.run_dir / "tensorboard"), purge_step=(resume_step or 0) + 1
            )
        self._wandb = None
        if wandb:
            import wandb as wandb_lib

            os.environ.setdefault("WANDB_MODE", "offline")
            self._wandb = wandb_lib.init(
                project=wandb_project, dir=str(self.run_dir), config=config or {}, resume="allow"
            )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        end = self._file.tell()
        kept = f"the rows before step {step} are intact: free space, then run the same command"
        try:
            with failing_writes_stop(self.path, kept):
                self._file.write(json.dumps(row) + "\n")
                self._file.flush()
                os.fsync(self._file.fileno())
        except WriteFailedError:
            self._file = _cut_back(self._file, self.path, end)
            raise
        numeric = {k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
