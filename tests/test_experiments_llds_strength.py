"""The LLDS-strength study's driver (`experiments/llds_strength/run.py`): which runs a call
starts (`--dry-run`) when some logs are already committed and the work folder is new."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from conftest import comparable, planned_runs, tiny_trainer, write_run_inputs
from llds.analysis.machine import cpu_name
from llds.runs.folder_archive import pack_folder
from llds.runs.tracking import read_metrics

STUDY = Path(__file__).resolve().parents[1] / "experiments" / "llds_strength"


def _log(results: Path, arm: str, seed: int, steps: int) -> None:
    path = results / "runs" / arm / f"seed{seed}" / "metrics.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(
            json.dumps({"step": s, "reward/mean": 0.5}) + "\n" for s in range(1, steps + 1)
        )


def test_a_run_complete_in_the_committed_logs_is_not_run_again(tmp_path: Path) -> None:
    """On a new machine (empty work folder) a run whose committed log reaches step 50 is
    skipped; one whose log stops earlier, or has none, runs."""
    results = tmp_path / "results"
    _log(results, "lam0", 1, 50)
    _log(results, "lam0.2", 1, 22)
    args = ["--theorem", tmp_path / "theorem", "--work", tmp_path / "work"]
    args += ["--results", results, "--arms", "lam0", "lam0.2", "--seeds", "1", "2"]
    plan = {(r["arm"], r["seed"]): r for r in planned_runs(STUDY / "run.py", *args)}
    assert list(plan) == [("lam0", 1), ("lam0.2", 1), ("lam0", 2), ("lam0.2", 2)]
    assert {k: (r["committed_steps"], r["run"]) for k, r in plan.items()} == {
        ("lam0", 1): (50, False),
        ("lam0.2", 1): (22, True),
        ("lam0", 2): (0, True),
        ("lam0.2", 2): (0, True),
    }
    assert all(r["config"]["steps"] == 50 for r in plan.values())


def _study(tmp_path: Path, lam: float | None) -> Path:
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"answers": {"confirmation_lambda": lam}}), encoding="utf-8")
    return path


def test_the_confirmation_runs_grpo_against_rule_5s_lambda_in_pairs(tmp_path: Path) -> None:
    """`confirm.py` reads rule 5's lambda from the study's tables and plans seed 1 of both arms,
    then seed 2, ..., each 300 steps; a committed complete log is not run again."""
    results = tmp_path / "confirm"
    _log(results, "lam0", 1, 300)
    args = ["--theorem", tmp_path / "theorem", "--work", tmp_path / "work", "--results", results]
    args += ["--study", _study(tmp_path, 0.6), "--seeds", "1", "2", "3"]
    plan = planned_runs(STUDY / "confirm.py", *args)
    assert [(r["arm"], r["seed"]) for r in plan] == [
        (arm, seed) for seed in (1, 2, 3) for arm in ("lam0", "lam0.6")
    ]
    assert [r["run"] for r in plan] == [False, True, True, True, True, True]
    assert {r["config"]["steps"] for r in plan} == {300}
    assert {r["config"]["optim"]["micro_batch_tokens"] for r in plan} == {4096}
    assert {r["config"]["optim"]["logprob_micro_batch_tokens"] for r in plan} == {16384}
    assert {r["config"]["algo"]["llds"]["coef"] for r in plan if r["arm"] == "lam0.6"} == {0.6}
    assert plan[3]["config"]["run_dir"] == str(tmp_path / "work" / "lam0.6" / "seed2")


def test_the_confirmation_waits_for_the_dose_response(tmp_path: Path) -> None:
    cmd = [sys.executable, str(STUDY / "confirm.py"), "--study", str(_study(tmp_path, None))]
    done = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "confirmation_lambda is null" in done.stderr


def test_the_figures_draw_from_the_committed_results(tmp_path: Path) -> None:
    """figures.py draws the study's two figures and the confirmation's runs (complete or not)
    from what is committed, into `--out`."""
    done = subprocess.run(
        [sys.executable, str(STUDY / "figures.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for name in ("lambda", "minibatch", "confirmation"):
        png = tmp_path / f"llds-strength-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def _confirm(*args: str | Path) -> str:
    cmd = [sys.executable, str(STUDY / "confirm.py"), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_parked_run_resumes_on_a_new_machine_as_if_never_stopped(
    tmp_path: Path, small_world, world_tokenizer, world_retriever
) -> None:
    """`--park` archives an unfinished run with its newest checkpoint only; on a new machine
    (its work folder gone) `--unpark` brings it back, and it resumes to the very rows of a run
    that never stopped. A work folder already there is left as it is."""
    world = (small_world, world_tokenizer, world_retriever)
    straight = tmp_path / "straight"
    tiny_trainer(straight, *world, ["save_every=1", "steps=4"]).train()
    work, results = tmp_path / "work", tmp_path / "results"
    run = work / "lam0" / "seed1"
    tiny_trainer(run, *world, ["save_every=1", "steps=3"]).train()
    (run / "train-1.log").write_text("a training process's console\n", encoding="utf-8")
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == [
        "step_000002",
        "step_000003",
    ]
    common = ["--work", work, "--results", results, "--study", _study(tmp_path, 0.6)]
    common += ["--seeds", "1"]

    out = _confirm(*common, "--park")
    archive = results / "parked" / "lam0" / "seed1.tar.gz"
    assert f"lam0 seed 1: parked at step_000003 in {archive}" in out
    assert "lam0.6" not in out  # never started: nothing to park
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert {n.split("/")[1] for n in names if n.startswith("checkpoints/")} == {"step_000003"}
    assert "metrics.jsonl" in names
    assert "checkpoints/latest" not in names and "train-1.log" not in names
    assert (results / "runs" / "lam0" / "seed1" / "metrics.jsonl.gz").is_file()  # logs copied

    shutil.rmtree(work)
    out = _confirm(*common, "--unpark")
    assert f"lam0 seed 1: unparked from {archive}" in out
    assert (run / "checkpoints" / "latest").read_text(encoding="utf-8").strip() == "step_000003"
    assert sorted(p.name for p in (work / "lam0").iterdir()) == ["seed1"]  # no temp folder
    tiny_trainer(run, *world, ["save_every=1", "steps=4"], resume=True).train()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    assert comparable(read_metrics(run)) == comparable(read_metrics(straight))

    assert "unparked" not in _confirm(*common, "--unpark")  # never over a work folder
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]


def test_another_warm_start_stops_the_runs_with_one_line(
    tmp_path: Path, small_world, world_tokenizer
) -> None:
    """A model whose held-out EM is not the theorem study's stops the driver before any run,
    naming the model and the machine; with no model on disk, the committed archive is unpacked
    first (here a tiny random model's, so the check still stops it)."""
    made = tmp_path / "made"
    write_run_inputs(made, small_world, world_tokenizer)
    theorem, work = tmp_path / "theorem", tmp_path / "work"
    shutil.copytree(made / "world", theorem / "world")
    archive = pack_folder(made / "model", tmp_path / "warm.tar.gz")
    cmd = [sys.executable, str(STUDY / "confirm.py"), "--part", "a", "--theorem", str(theorem)]
    cmd += ["--work", str(work), "--results", str(tmp_path / "results"), "--seeds", "1"]
    cmd += ["--study", str(_study(tmp_path, 0.6))]

    done = subprocess.run(
        [*cmd, "--warm-archive", str(tmp_path / "none.tar.gz")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0 and not (theorem / "model").exists()
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"{theorem / 'model'}: no warm start there (no model.safetensors) and no archive"
        )
    )

    done = subprocess.run(
        [*cmd, "--warm-archive", str(archive)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode != 0
    assert f"warm start: unpacked {archive} into {theorem / 'model'}" in done.stdout
    assert sorted(p.name for p in (theorem / "model").iterdir()) == sorted(
        p.name for p in (made / "model").iterdir()
    )
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{theorem / 'model'}: not the theorem study's warm start (held-out EM")
    assert "CPU kernels" in line and f"{archive} holds the verified one" in line
    assert not (work / "lam0").exists()  # no run started


def _report(path: Path, sha256: str, met: bool = True) -> Path:
    path.write_text(
        json.dumps({"model_sha256": sha256, "stopped_on_conditions": met}), encoding="utf-8"
    )
    return path


def test_part_b_knows_its_warm_start_by_the_sha256_its_report_records(
    tmp_path: Path, small_world, world_tokenizer
) -> None:
    """Part B (CONFIRMATION.md, amendment 1) unpacks the committed warm start and checks its
    weights against the report's `model_sha256`, whatever its held-out EM: another model, or a
    build that missed the warm-start conditions, stops it with one line before any run; the
    reported one passes, and each run queued is noted with this machine in `machines.jsonl`."""
    made = tmp_path / "made"
    write_run_inputs(made, small_world, world_tokenizer)
    digest = hashlib.sha256((made / "model" / "model.safetensors").read_bytes()).hexdigest()
    archive = pack_folder(made / "model", tmp_path / "warm.tar.gz")
    theorem, work, results = tmp_path / "theorem", tmp_path / "work", tmp_path / "results"
    shutil.copytree(made / "world", theorem / "world")
    cmd = [sys.executable, str(STUDY / "confirm.py"), "--theorem", str(theorem)]
    cmd += ["--work", str(work), "--results", str(results), "--seeds", "1"]
    cmd += ["--study", str(_study(tmp_path, 0.6)), "--warm-archive", str(archive)]

    def confirm(report: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*cmd, "--warm-report", str(report)],
            capture_output=True,
            text=True,
            timeout=600,
        )

    other = confirm(_report(tmp_path / "other.json", "0" * 64))
    assert other.returncode != 0 and "Traceback" not in other.stderr
    assert other.stderr.strip().splitlines()[-1] == (
        f"{theorem / 'model'}: not the warm start {tmp_path / 'other.json'} describes (weights "
        f"sha256 {digest[:16]}, the report's {'0' * 16}); unpack the committed archive instead, "
        "stopping"
    )
    missed = confirm(_report(tmp_path / "missed.json", digest, met=False))
    assert missed.returncode != 0
    assert "did not meet the warm-start conditions" in missed.stderr.strip().splitlines()[-1]
    assert not work.exists()  # no run queued

    for arm in ("lam0", "lam0.6"):  # both runs complete: the check runs, nothing trains
        _log(results, arm, 1, 300)
    done = confirm(_report(tmp_path / "report.json", digest))
    assert done.returncode == 0, done.stderr
    assert f"sha256 {digest[:16]}, as {tmp_path / 'report.json'} records" in done.stdout
    assert not (work / "lam0").exists()
    kept = json.loads((results / "warm_start.json").read_text(encoding="utf-8"))
    assert kept["model_sha256"] == digest and set(kept) == {"held_out_em", "model_sha256"}
    em = kept["held_out_em"]
    summary = json.loads((results / "summary.json").read_text(encoding="utf-8"))
    assert summary["warm_em"] == em and summary["part"].startswith("part B")
    assert {r["em"]["0"] for by in summary["runs"].values() for r in by.values()} == {em}

    # lam0's log now incomplete: it is queued (and fails at once, its corpus gone) after a row
    # naming this machine and its starting point is written
    shutil.rmtree(results / "runs" / "lam0")
    (theorem / "world" / "corpus.jsonl").unlink()
    failed = confirm(tmp_path / "report.json")
    assert failed.returncode != 0
    rows = [json.loads(x) for x in (work / "lam0" / "seed1" / "machines.jsonl").open()]
    assert [r["from_step"] for r in rows] == [0]
    assert rows[0]["machine"].startswith(cpu_name())
    assert "(1 torch threads," in rows[0]["machine"]  # the run's, not the driver's
    assert not (work / "lam0.6").exists()  # complete: not queued


def test_the_committed_confirmation_tables_recompute_from_the_committed_logs(
    tmp_path: Path,
) -> None:
    """Each part's `summary.md` and `summary.json` are what `confirm.py --collect` writes from
    the committed logs alone (a new machine: no work folder)."""
    parts = {"a": STUDY / "results" / "confirm", "b": STUDY / "results" / "confirm_b"}
    checked = 0
    for part, committed in parts.items():
        if not (committed / "summary.md").is_file():
            continue
        results = tmp_path / part
        shutil.copytree(committed, results)
        for name in ("summary.md", "summary.json"):
            (results / name).unlink()
        _confirm("--part", part, "--collect", "--work", tmp_path / "none", "--results", results)
        for name in ("summary.md", "summary.json"):
            assert (results / name).read_text(encoding="utf-8") == (committed / name).read_text(
                encoding="utf-8"
            ), (part, name)
        checked += 1
    assert checked >= 1  # part A's tables are committed
