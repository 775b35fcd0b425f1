"""One writer per run directory: a second process is refused by name; a dead holder's lock is
taken over with a warning naming its PID."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from llds.train.lock import RunDirectoryLocked, RunLock, is_current, lock_path

HOLD = textwrap.dedent(
    """
    import sys, time
    from llds.train.lock import RunLock
    lock = RunLock(sys.argv[1]).acquire()
    print("held", flush=True)
    time.sleep(120)
    """
)


def _holder(run_dir):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_lock_file_sits_beside_the_run_directory(tmp_path):
    assert lock_path(tmp_path / "runs" / "grpo") == tmp_path / "runs" / ".grpo.lock"


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    try:
        with pytest.raises(RunDirectoryLocked, match=rf"in use .*PID {proc.pid} since"):
            RunLock(run_dir).acquire()
    finally:
        proc.kill()
        proc.wait()


def test_a_dead_holders_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with caplog.at_level(logging.WARNING, logger="llds.train"), RunLock(run_dir):
        assert f"PID {os.getpid()}" in lock_path(run_dir).read_text()
    assert f"PID {proc.pid}" in caplog.text and "ended without releasing" in caplog.text
    assert not lock_path(run_dir).exists()  # a clean release leaves no file behind
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="llds.train"), RunLock(run_dir):
        pass
    assert "ended without releasing" not in caplog.text


def test_a_clean_release_removes_the_file_and_a_late_opener_locks_the_new_one(tmp_path):
    run_dir = tmp_path / "run"
    path = lock_path(run_dir)
    with RunLock(run_dir):
        assert path.exists()
        late = os.open(path, os.O_RDWR)  # opened while held, as a second process might
    assert not path.exists()
    # the file it opened is gone from the path: locking it would exclude nobody
    assert not is_current(late, path)
    with RunLock(run_dir):  # a new file at the path, the one every later process sees
        fresh = os.open(path, os.O_RDWR)
        assert is_current(fresh, path)
        os.close(fresh)
    os.close(late)
    assert not path.exists()


def test_released_on_exceptions(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(KeyError), RunLock(run_dir):
        raise KeyError("boom")
    start = time.monotonic()
    with RunLock(run_dir):
        pass
    assert time.monotonic() - start < 5


@pytest.mark.slow
def test_a_second_llds_train_on_one_run_dir_stops_with_one_line(
    tmp_path, small_world, world_tokenizer, capsys
):
    """Two `llds train` on one run_dir: the second stops at once with one line naming the
    first's PID, exit code 2, and leaves the first's files as they were."""
    from conftest import write_run_inputs
    from llds.cli import main

    cfg = write_run_inputs(tmp_path / "in", small_world, world_tokenizer, steps=400, threads=1)
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "llds.cli", "train", "--config", str(cfg), f"run_dir={run_dir}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "metrics.jsonl").is_file():  # the first one is training
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        first.send_signal(signal.SIGSTOP)  # hold its files still while the second one tries
        before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
        capsys.readouterr()  # only what the second run prints
        rc = main(["train", "--config", str(cfg), f"run_dir={run_dir}"])
        err = capsys.readouterr().err.strip().splitlines()
        after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
        first.wait()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("llds train: error: run_dir ")
    assert f"PID {first.pid} since" in err[0]
    assert after == before


def test_acquire_starts_again_when_the_file_it_locked_was_removed(tmp_path, monkeypatch):
    """The race the check is for: the holder removes the file between our open and our lock."""
    import llds.train.lock as lock_module

    run_dir = tmp_path / "run"
    real = lock_module.is_current
    seen: list[bool] = []

    def removed_once(fd, path):
        if not seen:
            os.unlink(path)  # the previous holder's clean release, just after our open
        seen.append(real(fd, path))
        return seen[-1]

    monkeypatch.setattr(lock_module, "is_current", removed_once)
    with RunLock(run_dir):
        assert seen[:2] == [False, True]  # the stale file was let go, the new one locked
        assert f"PID {os.getpid()}" in lock_path(run_dir).read_text()
