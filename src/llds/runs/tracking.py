"""One metrics dict per step -> metrics.jsonl (always), TensorBoard and W&B (when asked)."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
from pathlib import Path
from typing import IO, Any

from llds.errors import ConfigError, WriteFailedError
from llds.io import atomic_write, failing_writes_stop

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


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All complete rows of a run's metrics log (a torn last line from a crash is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


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
        kept = [r for r in read_metrics(self.run_dir) if r.get("step", 0) <= (resume_step or 0)]
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
