"""Training runs in their own processes: several runs side by side on one machine.

Each run is `llds.train.run(cfg)` in a spawned process with one torch thread, its output in a
log file; the caller polls `Process.is_alive()` and reads progress from the run's metrics.
Used by the demo (GRPO and GRPO+LLDS at once) and the studies in `experiments/`.

A run never outlives the process that started it: killed, that process leaves no orphan that
keeps writing into the run directory (where a restarted run would then resume from the
orphan's checkpoints). The child checks every `ORPHAN_POLL_S` seconds and stops as a crash
does; its checkpoints are atomic, so starting the run again resumes from the last one.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path

from llds.logs import setup_logging
from llds.train.config import TrainConfig

ORPHAN_POLL_S = 1.0
ORPHAN_EXIT_CODE = 3


def _stop_when_orphaned(parent_pid: int, poll_s: float) -> None:
    """Body of the child's watchdog thread: end the process once its parent is gone (the OS
    then makes another process its parent)."""
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    logging.getLogger("llds.train").error(
        "the process that started this run (pid %d) is gone: stopping; the last checkpoint is "
        "kept, and starting the run again resumes from it",
        parent_pid,
    )
    logging.shutdown()
    os._exit(ORPHAN_EXIT_CODE)


def _run_logged(cfg: TrainConfig, log_path: str, parent_pid: int) -> None:
    from llds.train import run

    threading.Thread(
        target=_stop_when_orphaned, args=(parent_pid, ORPHAN_POLL_S), daemon=True
    ).start()
    with (
        open(log_path, "w", encoding="utf-8") as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),  # progress bars of model loading go to the log too
    ):
        setup_logging(cfg.logging.verbose, stream=log)
        try:
            run(cfg)
        except Exception:
            # the queue's error points at this log: the reason must be in it, not only on the
            # starter's stderr, where multiprocessing prints it once the redirect has ended
            traceback.print_exc(file=log)
            raise


def start_run(cfg: TrainConfig, log_path: str | Path) -> BaseProcess:
    """Start `llds.train.run(cfg)` in a new process (one thread, spawned: no state shared with
    this one) writing its output to `log_path`; returns the started process."""
    # read by the child before torch creates its thread pools (spawned children inherit it)
    os.environ["OMP_NUM_THREADS"] = "1"
    if cfg.threads is None:
        cfg.threads = 1
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    proc = multiprocessing.get_context("spawn").Process(
        target=_run_logged, args=(cfg, str(log_path), os.getpid()), name=Path(cfg.run_dir).name
    )
    proc.start()
    return proc


def run_queue(
    jobs: Sequence[tuple[TrainConfig, str | Path]],
    parallel: int,
    *,
    poll_s: float = 2.0,
    deadline: float | None = None,
    on_poll: Callable[[], None] | None = None,
) -> list[Path]:
    """Run every `(config, log file)` through `start_run`, at most `parallel` at a time, until
    all have finished; a run that fails stops the queue with an error naming its log. Runs
    still going when the queue stops (a failure, Ctrl-C, the deadline) are terminated, not left
    behind.

    `deadline` (a `time.monotonic()` value) stops the queue early, for a machine lent for a
    fixed time: the runs still going are terminated (each keeps its last checkpoint, so starting
    it again resumes) and those not started stay so. `on_poll` is called after every poll (to
    write tables as the runs go). Returns the run directories that did not finish."""
    from llds.errors import UserInputError

    pending = list(jobs)
    running: list[tuple[BaseProcess, Path, Path]] = []
    try:
        while pending or running:
            while pending and len(running) < max(1, parallel):
                cfg, log = pending.pop(0)
                print(f"start {cfg.run_dir} (log: {log})", flush=True)
                running.append((start_run(cfg, log), Path(log), Path(cfg.run_dir)))
            time.sleep(poll_s)
            for entry in list(running):
                proc, log, _ = entry
                if not proc.is_alive():
                    proc.join()
                    running.remove(entry)
                    if proc.exitcode:
                        raise UserInputError(f"a run failed (exit code {proc.exitcode}); see {log}")
            if on_poll is not None:
                on_poll()
            if deadline is not None and time.monotonic() >= deadline and (pending or running):
                stopped = [run_dir for _, _, run_dir in running]
                print(f"deadline: stopping {len(stopped)} running, {len(pending)} not started")
                return stopped + [Path(cfg.run_dir) for cfg, _ in pending]
        return []
    finally:
        for proc, _, _ in running:
            if proc.is_alive():
                proc.terminate()
            proc.join()
