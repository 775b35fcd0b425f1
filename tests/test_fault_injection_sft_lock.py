"""Fault injection (locks): one `llds sft` per output folder. A second `llds sft` into the `--out`
of one that is training stops before any work with one line naming the folder and the first's
PID, exit code 2, and changes no file; the first goes on and writes its model. Through the real
command line, as two processes (the lock is the one `llds train` takes, `llds.train.lock`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llds.cli import main
from llds.train.lock import lock_path

TINY = ["tiny=true", "tokenizer_vocab=400", "hidden=32", "layers=1", "threads=1", "progress=false"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` (hidden ones too: the lock file), by relative path."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def llds(*args: str) -> list[str]:
    return [sys.executable, "-m", "llds.cli", *args]


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    assert main(["world", "--out", str(out), "num_entities=40", "num_train=12", "num_test=4"]) == 0
    return out


@pytest.mark.slow
def test_a_second_llds_sft_into_one_out_stops_with_one_line(world_dir, tmp_path):
    root = tmp_path / "runs"
    out = root / "sft"
    args = ["sft", f"world={world_dir}", *TINY, "steps=300", "batch_size=2", "--out", str(out)]
    first = subprocess.Popen(llds(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "sft_metrics.jsonl").is_file():  # the first one is training
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        first.send_signal(signal.SIGSTOP)  # hold its files still while the second one tries
        before = snapshot(root)
        second = subprocess.run(llds(*args), capture_output=True, text=True, timeout=300)
        after = snapshot(root)
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=600)

    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith(f"llds sft: error: out {out} is in use by another process ")
    assert f"(PID {first.pid} since " in lines[0] and str(lock_path(out)) in lines[0]
    assert "model written" not in second.stdout
    assert ".sft.lock" in before and after == before  # nothing of the first's changed
    # the first was not disturbed: it finishes, writes its model and lets the lock go
    assert first.returncode == 0, stderr
    assert f"model written to {out / 'model'}" in stdout
    assert (out / "model" / "model.safetensors").is_file()
    assert not lock_path(out).exists()


def test_an_interrupted_sft_output_is_its_own_and_may_be_written_again(world_dir, tmp_path):
    """A folder holding only `sft_metrics.jsonl` (a run stopped mid-way) is an earlier output of
    `llds sft`, not a stranger's folder: the same command writes it again (under the lock)."""
    out = tmp_path / "sft"
    out.mkdir()
    (out / "sft_metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n', encoding="utf-8")
    rc = main(["sft", f"world={world_dir}", *TINY, "steps=2", "batch_size=2", "--out", str(out)])
    assert rc == 0
    assert len((out / "sft_metrics.jsonl").read_text().splitlines()) == 2
    assert (out / "model" / "model.safetensors").is_file()
    assert not lock_path(out).exists()
