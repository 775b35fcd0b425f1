"""Fault injection on resuming: damaged checkpoints, a lost pointer, a changed config, a run
started again over an earlier one, and a retrieval service that goes away mid-run.

Each case goes through the real command line (in process) on a tiny run of 4 steps with
checkpoints at steps 2 and 4, and checks the exit code, the one message line (no traceback),
that every step is in metrics.jsonl exactly once, and that nothing of the earlier run is lost.
A resume must reproduce the uninterrupted run: the same metrics and bit-identical weights.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import comparable, write_run_inputs
from llds.cli import main
from llds.runs.tracking import read_metrics
from llds.train.checkpoint import (
    FORMAT_KEY,
    MANIFEST,
    TRAINER_STATE,
    checkpoint_problem,
    find_resumable,
)
from test_retrieval_server import free_port, start_server, stop, wait_ready

STEPS = [1, 2, 3, 4]
WEIGHTS = "model/model.safetensors"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, small_world, world_tokenizer) -> Path:
    """A world, a tiny model that searches often, and a 4-step config (checkpoints at 2, 4)."""
    root = tmp_path_factory.mktemp("resume_inputs")
    write_run_inputs(root, small_world, world_tokenizer, steps=4, save_every=2, threads=1)
    _save_searching_model(world_tokenizer, root / "model")
    return root


def _save_searching_model(tok, out: Path) -> None:
    """A tiny model whose every turn leans to `<search> ... </search>`, stored as plain
    weights: one embedding coordinate is a large constant, so after the final norm it acts as
    a bias on the output rows of the two search tags."""
    from llds.env.tags import SEARCH_CLOSE, SEARCH_OPEN
    from llds.models.tiny import save_tiny, tiny_causal_lm_for

    model = tiny_causal_lm_for(tok, hidden_size=64, num_layers=2, tie_word_embeddings=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 20.0
        head = model.get_output_embeddings().weight
        head[:, 0] = 0.0
        # the normed coordinate is about sqrt(64) = 8: logit biases of about 5.2 and 4.2, so
        # roughly a quarter of all turns (whose tokens are drawn alike) are valid searches
        head[tok.convert_tokens_to_ids(SEARCH_OPEN), 0] = 0.65
        head[tok.convert_tokens_to_ids(SEARCH_CLOSE), 0] = 0.53
    save_tiny(model, tok, out)


def train_args(inputs: Path, run: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(inputs / "cfg.yaml"), f"run_dir={run}", *extra]


def cli(args: list[str], capsys, caplog) -> tuple[int, str]:
    """`llds ARGS` in process: (exit code, everything printed and logged)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="llds"):
        rc = main(args)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err + caplog.text


def error_line(rc: int, output: str) -> str:
    assert rc == 2, output
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.startswith("llds train: error: ")]
    assert len(lines) == 1, output
    return lines[0]


def steps_of(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run)]


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt / WEIGHTS)


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run directory, by relative path (to show that nothing changed)."""
    return {
        p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()
    }


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> Path:
    """The uninterrupted 4-step run every case starts from (copied) and is compared with."""
    run = tmp_path_factory.mktemp("reference") / "run"
    assert main(train_args(inputs, run)) == 0
    assert steps_of(run) == STEPS
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "latest",
        "step_000002",
        "step_000004",
    ]
    return run


@pytest.fixture()
def run(reference, tmp_path) -> Path:
    """A copy of the reference run to damage."""
    copy = tmp_path / "run"
    shutil.copytree(reference, copy)
    return copy


# ----------------------------------------------------------------------- damaged checkpoints


@pytest.mark.parametrize("name", [WEIGHTS, "optim.pt", "trainer_state.json"])
def test_truncated_newest_checkpoint_resumes_from_the_one_before(
    inputs, reference, run, capsys, caplog, name
) -> None:
    newest = run / "checkpoints" / "step_000004"
    truncate(newest / name)
    (run / "alarms.jsonl").write_text(
        '{"step": 1, "kind": "kept"}\n{"step": 3, "kind": "redone"}\n', encoding="utf-8"
    )
    (run / "eval").mkdir()
    for step in (2, 4):
        (run / "eval" / f"step_{step:06d}.json").write_text("{}", encoding="utf-8")

    rc, out = cli(train_args(inputs, run), capsys, caplog)
    assert rc == 0, out
    assert "Traceback" not in out
    assert f"checkpoint {newest} is damaged ({name} has " in out
    assert "resuming from step_000002" in out
    assert steps_of(run) == STEPS  # steps 3 and 4 once each, although they were logged before
    assert comparable(read_metrics(run)) == comparable(read_metrics(reference))
    assert_same_weights(weights(newest), weights(reference / "checkpoints" / "step_000004"))
    # nothing lost: the damaged checkpoint is kept beside the new one
    kept = run / "checkpoints" / "damaged-step_000004"
    assert (kept / name).read_bytes() != (newest / name).read_bytes()
    assert checkpoint_problem(newest) is None
    alarms = [json.loads(line)["kind"] for line in (run / "alarms.jsonl").open()]
    assert alarms == ["kept"]  # the alarm of the redone step 3 is gone
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["step_000002.json"]


def test_checkpoint_without_manifest_still_loads_and_is_checked(
    inputs, reference, run, capsys, caplog
) -> None:
    """Checkpoints of older versions have no manifest and no recorded format: they resume, and a
    damaged one is still found by loading every tensor."""
    for ckpt in (run / "checkpoints").glob("step_*"):
        make_legacy(ckpt)
    assert checkpoint_problem(run / "checkpoints" / "step_000004") is None
    truncate(run / "checkpoints" / "step_000004" / "optim.pt")
    rc, out = cli(train_args(inputs, run), capsys, caplog)
    assert rc == 0, out
    assert "step_000004 is damaged (optim.pt does not load" in out
    assert steps_of(run) == STEPS
    assert_same_weights(
        weights(run / "checkpoints" / "step_000004"),
        weights(reference / "checkpoints" / "step_000004"),
    )


def make_legacy(ckpt: Path) -> None:
    """What a checkpoint of a version before manifests looks like: no manifest, no format."""
    (ckpt / MANIFEST).unlink()
    state = json.loads((ckpt / TRAINER_STATE).read_text(encoding="utf-8"))
    del state[FORMAT_KEY]
    (ckpt / TRAINER_STATE).write_text(json.dumps(state, indent=2), encoding="utf-8")


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, other content
    path.write_bytes(bytes(data))


def test_a_lost_manifest_with_a_changed_byte_is_not_resumed(
    inputs, reference, run, capsys, caplog
) -> None:
    """A checkpoint of this format always has a manifest: without one, nothing vouches for its
    weights, so it is skipped (kept aside) and the run resumes from the one before."""
    newest = run / "checkpoints" / "step_000004"
    (newest / MANIFEST).unlink()
    flip_last_byte(newest / WEIGHTS)
    assert checkpoint_problem(newest).startswith(f"{MANIFEST} is missing, and this checkpoint")
    rc, out = cli(train_args(inputs, run), capsys, caplog)
    assert rc == 0, out
    assert "resuming from step_000002" in out
    assert_same_weights(weights(newest), weights(reference / "checkpoints" / "step_000004"))


def test_a_legacy_checkpoint_with_non_finite_weights_is_refused(reference, tmp_path) -> None:
    from safetensors.torch import save_file

    ckpt = tmp_path / "step_000004"
    shutil.copytree(reference / "checkpoints" / "step_000004", ckpt)
    make_legacy(ckpt)
    assert checkpoint_problem(ckpt) is None
    tensors = weights(ckpt)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(ckpt / WEIGHTS), metadata={"format": "pt"})
    assert checkpoint_problem(ckpt) == f"{WEIGHTS}: tensor {name} has non-finite values"


def test_leftover_staging_directories_are_removed_on_resume(
    inputs, reference, run, capsys, caplog
) -> None:
    """A writer killed mid-checkpoint leaves `.tmp_step_N`: the next resume removes it."""
    leftover = run / "checkpoints" / ".tmp_step_000006"
    (leftover / "model").mkdir(parents=True)
    (leftover / "model" / "half.bin").write_bytes(b"x" * 1000)
    rc, out = cli(train_args(inputs, run, "steps=4"), capsys, caplog)
    assert rc == 0, out
    assert not leftover.exists()
    assert "removed .tmp_step_000006" in out


def test_a_changed_byte_or_a_broken_manifest_is_found(reference, tmp_path) -> None:
    ckpt = tmp_path / "step_000004"
    shutil.copytree(reference / "checkpoints" / "step_000004", ckpt)
    flip_last_byte(ckpt / WEIGHTS)
    assert checkpoint_problem(ckpt) == f"{WEIGHTS} does not match its SHA-256 in the manifest"
    (ckpt / MANIFEST).write_text('{"format": 1, "files": {', encoding="utf-8")
    assert checkpoint_problem(ckpt).startswith(f"{MANIFEST} is unreadable")
    shutil.rmtree(ckpt / "model")
    make_legacy(ckpt)
    assert checkpoint_problem(ckpt) == "no *.safetensors weights"
    assert find_resumable(tmp_path) == (None, [(ckpt, "no *.safetensors weights")])


def test_no_valid_checkpoint_refuses_to_start_over(inputs, run, tmp_path, capsys, caplog) -> None:
    for step in (2, 4):
        truncate(run / "checkpoints" / f"step_{step:06d}" / "optim.pt")
    before = snapshot(run)
    rc, out = cli(train_args(inputs, run), capsys, caplog)
    line = error_line(rc, out)
    assert f"{run} holds an earlier run (metrics.jsonl up to step 4, checkpoints" in line
    assert "no valid checkpoint (damaged: step_000004: optim.pt has" in line
    assert "--no-resume" in line
    assert snapshot(run) == before
    # an earlier run that never reached a checkpoint is refused the same way
    logged_only = tmp_path / "logged_only"
    logged_only.mkdir()
    shutil.copy(run / "metrics.jsonl", logged_only / "metrics.jsonl")
    rc, out = cli(train_args(inputs, logged_only), capsys, caplog)
    assert "holds an earlier run (metrics.jsonl up to step 4) but no checkpoint" in error_line(
        rc, out
    )
    assert snapshot(logged_only) == {"metrics.jsonl": before["metrics.jsonl"]}


def test_lost_pointer_is_recovered_by_scanning(inputs, reference, run, capsys, caplog) -> None:
    (run / "checkpoints" / "latest").unlink()
    first_four = (run / "metrics.jsonl").read_bytes()
    rc, out = cli(train_args(inputs, run, "steps=5"), capsys, caplog)
    assert rc == 0, out
    assert "named nothing (missing); resuming from step_000004" in out
    assert steps_of(run) == [*STEPS, 5]
    assert (run / "metrics.jsonl").read_bytes().startswith(first_four)  # steps 1-4 untouched
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000005"


# ----------------------------------------------------------------------- config changes


def test_changed_config_is_refused_with_the_keys(inputs, run, capsys, caplog) -> None:
    before = snapshot(run)
    changed = ["optim.lr=0.01", "rollout.group_size=4"]
    rc, out = cli(train_args(inputs, run, *changed), capsys, caplog)
    line = error_line(rc, out)
    assert "changed config: rollout.group_size: 3 -> 4, optim.lr: 0.001 -> 0.01. " in line
    assert "add --allow-config-change rollout.group_size,optim.lr (or all" in line
    assert "run_dir" not in line  # the copy lives elsewhere: always allowed
    # allowing one key still refuses the other, and names only it
    args = train_args(inputs, run, *changed, "--allow-config-change", "optim.lr")
    line = error_line(*cli(args, capsys, caplog))
    assert "rollout.group_size: 3 -> 4" in line and "optim.lr" not in line
    args = train_args(inputs, run, "--allow-config-change", "optim.lrr")
    assert "optim.lrr is not a config key" in error_line(*cli(args, capsys, caplog))
    assert snapshot(run) == before


def test_allowed_lr_change_takes_effect(inputs, reference, run, caplog) -> None:
    from llds.train.config import load_config
    from llds.train.trainer import GRPOTrainer

    cfg = load_config(inputs / "cfg.yaml", [f"run_dir={run}", "optim.lr=0.01", "steps=6"])
    with caplog.at_level(logging.INFO, logger="llds"):
        tr = GRPOTrainer(cfg, allow_config_change="optim.lr")
    assert "config changes (allowed): optim.lr: 0.001 -> 0.01" in caplog.text
    assert "steps: 4 -> 6 (always allowed)" in caplog.text
    assert tr.step == 4
    assert [g["lr"] for g in tr.optimizer.param_groups] == [0.01]
    tr.train()
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [*STEPS, 5, 6]
    assert [r["lr"] for r in rows] == [0.001] * 4 + [0.01] * 2
    assert comparable(rows[:4]) == comparable(read_metrics(reference))
    assert "floating-point environment" not in caplog.text  # same machine, same kernels


def test_resume_under_other_cpu_kernels_warns_and_goes_on(
    inputs, reference, run, caplog, monkeypatch
) -> None:
    from llds.policy.float_env import float_environment
    from llds.train import resume
    from llds.train.config import load_config
    from llds.train.trainer import GRPOTrainer

    saved = json.loads((run / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    here = float_environment()
    assert saved["float_env"] == {**here, "threads": 1}  # the config's one thread
    other = "AVX512" if here["cpu_kernels"] == "AVX2" else "AVX2"
    monkeypatch.setattr(
        resume, "float_environment", lambda: {**saved["float_env"], "cpu_kernels": other}
    )
    cfg = load_config(inputs / "cfg.yaml", [f"run_dir={run}", "steps=5"])
    with caplog.at_level(logging.INFO, logger="llds"):
        tr = GRPOTrainer(cfg)
    kernels = saved["float_env"]["cpu_kernels"]
    assert f"another floating-point environment (cpu_kernels: {kernels} -> {other})" in caplog.text
    assert f"ATEN_CPU_CAPABILITY={kernels.lower()} selects the checkpoint's" in caplog.text
    assert tr.step == 4
    tr.train()
    assert steps_of(run) == [*STEPS, 5]


# ----------------------------------------------------------------------- --no-resume


def test_no_resume_moves_the_earlier_run_aside(inputs, reference, run, capsys, caplog) -> None:
    before = snapshot(run)
    rc, out = cli([*train_args(inputs, run, "steps=2"), "--no-resume"], capsys, caplog)
    assert rc == 0, out
    (aside,) = run.parent.glob("run.old-*")
    assert f"moved the earlier run in {run} to {aside}; starting at step 0" in out
    assert snapshot(aside) == before  # the earlier run, whole
    assert steps_of(run) == [1, 2]
    assert comparable(read_metrics(run)) == comparable(read_metrics(reference)[:2])
    assert_same_weights(
        weights(run / "checkpoints" / "step_000002"),
        weights(reference / "checkpoints" / "step_000002"),
    )


def test_a_resume_without_its_starting_model_says_why_it_needs_it(
    inputs, tmp_path, capsys, caplog
) -> None:
    """The start model deleted after a checkpoint was written: the resume stops before any
    work, in one line that says the run still loads it (once 47 lines of hub retries for a
    hub id, and nothing about the reference model)."""
    model = tmp_path / "start-model"
    shutil.copytree(inputs / "model", model)
    run = tmp_path / "run"
    assert cli(train_args(inputs, run, f"model.path={model}", "steps=2"), capsys, caplog)[0] == 0
    before = snapshot(run)
    model.rename(tmp_path / "moved-away")
    rc, out = cli(train_args(inputs, run, f"model.path={model}"), capsys, caplog)
    assert error_line(rc, out).endswith(
        f"model.path: {model} does not exist (paths are relative to the working directory); "
        f"the run in {run} resumes from its checkpoint but still loads its starting model (the "
        "KL reference, and a LoRA run's base)"
    )
    assert snapshot(run) == before
    args = [*train_args(inputs, run, f"model.path={model}"), "--no-resume"]  # not a resume
    rc, out = cli(args, capsys, caplog)
    assert "resumes from its checkpoint" not in error_line(rc, out)
    assert snapshot(run) == before


# ----------------------------------------------------------------------- retriever outage


class Outage:
    """Kills the retrieval server at the first search after `after_step` steps are logged, from
    inside that search call (so the kill lands mid-run, deterministically), and restarts it on
    the same port `restart_after` seconds later (never when None)."""

    def __init__(self, corpus: Path, run: Path, after_step: int, restart_after: float | None):
        self.corpus, self.run, self.after_step = corpus, run, after_step
        self.restart_after = restart_after
        self.port = free_port()
        self.procs = [start_server(corpus, self.port)]
        wait_ready(self.procs[0], self.port)
        self.killed_at: int | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def before_search(self) -> None:
        if self.killed_at is not None or len(read_metrics(self.run)) < self.after_step:
            return
        self.killed_at = len(read_metrics(self.run))
        self.procs[-1].kill()
        self.procs[-1].wait(timeout=10)
        if self.restart_after is not None:
            self.thread = threading.Thread(target=self._restart)
            self.thread.start()

    def _restart(self) -> None:
        time.sleep(self.restart_after or 0.0)
        self.restart()

    def restart(self) -> None:
        self.procs.append(start_server(self.corpus, self.port))
        wait_ready(self.procs[-1], self.port)

    def close(self) -> None:
        if self.thread is not None:
            self.thread.join()
        for proc in self.procs:
            stop(proc)


@pytest.fixture()
def outage(monkeypatch):
    from llds.retrieval.client import HTTPRetriever

    made: list[Outage] = []
    search = HTTPRetriever.search

    def searching(self, queries, k):
        for o in made:
            o.before_search()
        return search(self, queries, k)

    monkeypatch.setattr(HTTPRetriever, "search", searching)

    def make(*args, **kwargs) -> Outage:
        made.append(Outage(*args, **kwargs))
        return made[-1]

    yield make
    for o in made:
        o.close()


def test_retriever_outage_is_ridden_out_or_stops_cleanly(
    inputs, tmp_path, capsys, caplog, outage
) -> None:
    corpus = inputs / "world" / "corpus.jsonl"
    more = ["prompts_per_step=4"]  # 12 rollouts a step: some search in every step
    # killed after step 2 and back 0.5 s later: the run waits for it and finishes
    rode = tmp_path / "rode_out"
    o = outage(corpus, rode, after_step=2, restart_after=0.5)
    args = train_args(
        inputs, rode, *more, f"retriever.source={o.url}", "retriever.retry_seconds=60"
    )
    rc, out = cli(args, capsys, caplog)
    assert rc == 0, out
    assert o.killed_at in (2, 3) and len(o.procs) == 2  # killed mid-run, then restarted
    assert "retrieval request failed" in out
    assert steps_of(rode) == STEPS

    # killed after step 2 for longer than retry_seconds: the run stops with one line
    stopped = tmp_path / "stopped"
    o = outage(corpus, stopped, after_step=2, restart_after=None)
    args = train_args(
        inputs, stopped, *more, f"retriever.source={o.url}", "retriever.retry_seconds=1"
    )
    started = time.monotonic()
    line = error_line(*cli(args, capsys, caplog))
    assert time.monotonic() - started < 60
    done = o.killed_at
    assert done in (2, 3)
    assert f"retriever {o.url}/retrieve did not answer for retriever.retry_seconds=1s" in line
    assert f"during step {done + 1}" in line and f"metrics.jsonl up to step {done}" in line
    assert line.endswith("resume with the same command")
    assert steps_of(stopped) == STEPS[:done]
    assert find_resumable(stopped / "checkpoints") == (stopped / "checkpoints/step_000002", [])

    # the service is back: the same command resumes, and the run equals the one that rode it out
    o.restart()
    rc, out = cli(args, capsys, caplog)
    assert rc == 0, out
    assert steps_of(stopped) == STEPS
    assert comparable(read_metrics(stopped)) == comparable(read_metrics(rode))
    assert_same_weights(
        weights(stopped / "checkpoints" / "step_000004"),
        weights(rode / "checkpoints" / "step_000004"),
    )


def test_a_full_disk_while_checkpointing_stops_with_one_line_and_resumes(
    inputs, reference, run, capsys, caplog, monkeypatch
) -> None:
    """ENOSPC while a checkpoint is written: one line naming it, no partial directory left, the
    earlier checkpoints byte for byte as they were; once space is back the same command resumes
    and redoes the lost steps once each."""
    import errno

    from llds.train import checkpoint as checkpoint_mod

    before = snapshot(run / "checkpoints")
    metrics_before = (run / "metrics.jsonl").read_bytes()
    real_write_json = checkpoint_mod.write_json

    def full_disk(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint_mod, "write_json", full_disk)
    rc, out = cli(train_args(inputs, run, "steps=6"), capsys, caplog)
    line = error_line(rc, out)
    assert (
        "checkpoint " in line
        and "step_000006 could not be written (no space left on device" in line
    )
    assert not list((run / "checkpoints").glob(".tmp_*"))
    assert snapshot(run / "checkpoints") == before
    assert (run / "metrics.jsonl").read_bytes().startswith(metrics_before)

    monkeypatch.setattr(checkpoint_mod, "write_json", real_write_json)
    rc, out = cli(train_args(inputs, run, "steps=6"), capsys, caplog)
    assert rc == 0, out
    assert steps_of(run) == [*STEPS, 5, 6]
