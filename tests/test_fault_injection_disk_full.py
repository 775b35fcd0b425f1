"""A full disk, for real: `llds train` and `llds report` on a small tmpfs filled to a chosen
number of free bytes, so that the disk runs out at a given write (the lock file, the metrics
log, the checkpoint's weights, its optimizer state, the report). Each case ends in one line
naming the path and "no space left on device" with exit code 2; everything written before is
byte-identical, no temporary file or lock is left, and once space is freed the same command
resumes and finishes.

The tmpfs is mounted by the test (root may mount, as in CI); where mounting is not permitted
the tests are skipped, saying so. Injected errors are tested beside (test_fault_injection_resume).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import PAGE, leave_free, mounted_tmpfs, write_run_inputs
from llds.cli import main
from llds.runs.tracking import read_metrics
from llds.train.checkpoint import MANIFEST, OPTIM

DISK_BYTES = 24 << 20


@pytest.fixture
def disk(tmp_path: Path):
    """A fresh 24 MiB tmpfs at tmp_path/disk, unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "disk", DISK_BYTES) as mount:
        yield mount


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, small_world, world_tokenizer) -> Path:
    """A world, a tiny model and a config of checkpoints at every step (off the small disk)."""
    root = tmp_path_factory.mktemp("disk_full_inputs")
    write_run_inputs(
        root, small_world, world_tokenizer, steps=1, save_every=1, threads=1, keep_checkpoints=3
    )
    return root


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    """`llds ARGS` in this process: its exit code and everything it printed."""
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out + out.err


def train(inputs: Path, run: Path, steps: int, capsys) -> tuple[int, str]:
    args = ["train", "--config", str(inputs / "cfg.yaml"), f"run_dir={run}", f"steps={steps}"]
    return run_cli(args, capsys)


def one_line(rc: int, output: str, command: str = "train") -> str:
    assert rc == 2, output
    assert "Traceback" not in output
    lines = [x for x in output.splitlines() if x.startswith(f"llds {command}: error: ")]
    assert len(lines) == 1, output
    assert "no space left on device" in lines[0], lines[0]
    return lines[0]


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "filler"
    }


def sizes(run: Path) -> dict[str, int]:
    ckpt = run / "checkpoints" / "step_000001"
    total = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    return {
        "weights": (ckpt / "model" / "model.safetensors").stat().st_size,
        "checkpoint": total,
        "metrics": (run / "metrics.jsonl").stat().st_size,
    }


def leftovers(disk: Path) -> list[str]:
    return sorted(
        str(p.relative_to(disk))
        for p in disk.rglob("*")
        if p.name.startswith((".tmp", ".run.lock")) or p.name.endswith(".tmp")
    )


def fill_once_rewritten(disk: Path, log: Path) -> threading.Thread:
    """Fill the disk as soon as `log` has been rewritten (a new file at its path: what
    `llds train` does first on a resume), so that the next write that needs a page fails."""
    inode = log.stat().st_ino

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if log.stat().st_ino != inode:
                    leave_free(disk, 0)
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.001)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


# where the disk runs out -> the file the error line names
NAMED = {
    "start": ".run.lock",
    "metrics row": "run/metrics.jsonl",
    "checkpoint weights": "model.safetensors",
    "checkpoint optimizer": OPTIM,
}


@pytest.mark.parametrize("where", list(NAMED))
def test_train_on_a_full_disk_stops_with_one_line_and_resumes(inputs, disk, capsys, where) -> None:
    run = disk / "run"
    rc, out = train(inputs, run, 1, capsys)
    assert rc == 0, out
    before = snapshot(run)
    size = sizes(run)
    if where == "metrics row":
        filler = disk / "filler"
        watcher = fill_once_rewritten(disk, run / "metrics.jsonl")
    else:  # the step's metrics row fits, then its checkpoint (weights first) does not
        free = {
            "start": 0,
            "checkpoint weights": size["metrics"] * 3 + size["weights"] // 2,
            "checkpoint optimizer": size["metrics"] * 3 + size["weights"] + 8 * PAGE,
        }[where]
        filler = leave_free(disk, free)
    line = one_line(*train(inputs, run, 2, capsys))
    if where == "metrics row":
        watcher.join()
    assert f"{disk}/" in line and NAMED[where] in line, line
    if where.startswith("checkpoint"):
        assert "checkpoint" in line and "step_000002" in line, line
        assert [r["step"] for r in read_metrics(run)] == [1, 2]
    else:
        assert [r["step"] for r in read_metrics(run)] == [1]
    after = snapshot(run)
    for name, data in before.items():
        if name == "metrics.jsonl":  # the earlier rows byte for byte, perhaps one more row
            assert after[name].startswith(data), where
            assert after[name].endswith(b"\n")  # no torn row
        else:
            assert after[name] == data, (where, name)
    assert leftovers(disk) == []
    filler.unlink()
    rc, out = train(inputs, run, 2, capsys)
    assert rc == 0, out
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert (run / "checkpoints" / "step_000002").is_dir()
    assert leftovers(disk) == []


def test_report_on_a_full_disk_names_its_file(inputs, disk, tmp_path, capsys) -> None:
    run = tmp_path / "run"  # the run off the small disk, its report onto it
    assert train(inputs, run, 1, capsys)[0] == 0
    out = disk / "report"
    leave_free(disk, 0)
    rc = main(["report", str(run), "--out", str(out)])
    captured = capsys.readouterr()
    line = one_line(rc, captured.out + captured.err, "report")
    assert f"{out}/" in line, line
    assert leftovers(disk) == []
    assert not out.exists()  # the directory it made, empty, is gone


@pytest.mark.parametrize("command", ["world", "report", "index", "eval"])
def test_an_output_on_a_read_only_disk_is_refused_before_any_work(
    inputs, disk, capsys, command
) -> None:
    """A real read-only file system (root may write anywhere else): the output directory is
    named as not writable before any work, and nothing is made."""
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    out = disk / "out"
    args = {
        "world": ["world", "--out", str(out)],
        "report": ["report", str(inputs), "--out", str(out)],
        "index": ["index", f"corpus={inputs / 'world' / 'corpus.jsonl'}", "--out", str(out)],
        "eval": [
            "eval",
            *("--model", str(inputs / "model"), "--data", str(inputs / "world" / "test.jsonl")),
            *("--retriever", str(inputs / "world" / "corpus.jsonl")),
            *("--out", str(out / "eval.json")),
        ],
    }[command]
    rc = main(args)
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert rc == 2 and "Traceback" not in output
    why = f"not writable ({disk} is not); give a directory you can write"
    assert output.strip() == f"llds {command}: error: out={out}: {why}"
    assert not out.exists()


def _pages(path: Path) -> int:
    return -(-path.stat().st_size // PAGE)


def test_a_full_disk_at_the_checkpoint_manifest(inputs, disk, capsys) -> None:
    """The disk runs out at the last file a checkpoint writes, its manifest. The free space is
    set from step 1's checkpoint, file by file in whole pages (tmpfs allocates pages), less the
    manifest's; since a step's row and files may round to a page more or less, a few amounts
    around that are tried, each with the same invariants, and one of them must end at the
    manifest."""
    run = disk / "run"
    assert train(inputs, run, 1, capsys)[0] == 0
    ckpt = run / "checkpoints" / "step_000001"
    files = [p for p in ckpt.rglob("*") if p.is_file() and p.name != MANIFEST]
    need = sum(_pages(p) for p in files) + 2 * _pages(run / "metrics.jsonl") + 2
    named = []
    for extra in range(-2, 4):
        before = snapshot(run)
        filler = leave_free(disk, (need + extra) * PAGE)
        rc, out = train(inputs, run, 2, capsys)
        filler.unlink()
        if rc == 0:  # it fitted: take step 2 back out and try one page less
            named.append("fits")
            break
        line = one_line(rc, out)
        named.append(line)
        for name, data in before.items():
            if name != "metrics.jsonl":
                assert snapshot(run)[name] == data, name
        assert leftovers(disk) == []
    assert any(f"{MANIFEST})" in line for line in named), named
    assert train(inputs, run, 2, capsys)[0] in (0,)  # and it resumes once space is back


def test_a_full_disk_at_the_periodic_evaluation(inputs, disk, capsys) -> None:
    """The disk fills the moment the run has started (its log rewritten), with an evaluation
    due at the next step: the evaluation's file is the first write that needs a page."""
    run = disk / "run"
    assert train(inputs, run, 1, capsys)[0] == 0
    before = snapshot(run)
    watcher = fill_once_rewritten(disk, run / "metrics.jsonl")
    args = ["train", "--config", str(inputs / "cfg.yaml"), f"run_dir={run}", "steps=2"]
    args += ["eval_every=1", f"data.eval={inputs / 'world' / 'test.jsonl'}"]
    rc = main([*args, "--allow-config-change", "all"])
    out = capsys.readouterr()
    watcher.join()
    line = one_line(rc, out.out + out.err)
    assert f"{run}/eval/step_000002.json could not be written" in line, line
    for name, data in before.items():
        if name == "metrics.jsonl":
            assert snapshot(run)[name].startswith(data)
        else:
            assert snapshot(run)[name] == data, name
    assert leftovers(disk) == []
    (disk / "filler").unlink()
    rc = main([*args, "--allow-config-change", "all"])
    capsys.readouterr()
    assert rc == 0 and (run / "eval" / "step_000002.json").is_file()


def test_a_full_disk_at_the_profiled_step(inputs, disk, capsys) -> None:
    """Step 2 profiled, no checkpoint due, and room on the disk for the step's log rows but not
    for its trace (a few MB): torch's exporter only logs that it failed, so the trace is checked
    before it is kept. One line naming it, and nothing half-written."""
    run = disk / "run"
    assert train(inputs, run, 1, capsys)[0] == 0
    before = snapshot(run)
    room = 256 << 10
    filler = leave_free(disk, room)
    args = ["train", "--config", str(inputs / "cfg.yaml"), f"run_dir={run}", "steps=3"]
    args += ["logging.profile_step=2", "save_every=100"]
    line = one_line(*run_cli(args, capsys))
    assert f"{run}/profile/step_000002.pt.trace.json could not be written" in line, line
    assert "the run's log and checkpoints are intact" in line, line
    assert not (run / "profile" / "step_000002.pt.trace.json").exists()
    for name, data in before.items():
        if name == "metrics.jsonl":
            assert snapshot(run)[name].startswith(data)
        else:
            assert snapshot(run)[name] == data, name
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert leftovers(disk) == []
    filler.unlink()
    rc, out = run_cli(args, capsys)
    assert rc == 0, out
    assert (run / "profile" / "step_000002.pt.trace.json").stat().st_size > room  # the premise
    assert (run / "profile" / "step_000002.phases.json").is_file()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
