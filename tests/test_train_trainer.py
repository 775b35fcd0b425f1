"""The GRPO trainer on a tiny model: accumulation exactness, LLDS warning, non-finite guard,
and a SIGKILL + resume that reproduces the uninterrupted run."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import TRAIN_BASE as BASE
from conftest import make_tiny_model, tiny_trainer, write_run_inputs
from llds.errors import ConfigError
from llds.runs.tracking import read_metrics
from llds.train import policy_update
from llds.train import trainer as trainer_mod
from llds.train.config import load_config
from llds.train.policy_update import NonFiniteError
from llds.train.trainer import GRPOTrainer


def _trainer(tmp_path, world, tok, retriever, extra=(), seed=0):
    return tiny_trainer(tmp_path, world, tok, retriever, extra, seed=seed)


def test_two_steps_log_metrics_and_checkpoint(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    tr = _trainer(tmp_path, small_world, world_tokenizer, world_retriever, ["steps=2"])
    before = [p.detach().clone() for p in tr.model.parameters()]
    rows = tr.train()
    assert [r["step"] for r in rows] == [1, 2]
    logged = read_metrics(tmp_path)
    assert [r["step"] for r in logged] == [1, 2]
    for key in (
        "reward/mean",
        "policy/entropy",
        "policy/grad_norm",
        "llds/penalized_token_frac",
        "lld/logp_incorrect",
        "time/rollout",
        "rollout/valid_searches",
        "lld/disp_pos",
        "lld/frac_pos_fell",
        "lld/disp_neg",
    ):
        assert key in logged[-1]
    # the hidden-state similarity is sampled: steps 0, 10, 20, ... (0-based)
    assert "lld/hidden_cos_correct_incorrect" in logged[0]
    assert "lld/hidden_cos_correct_incorrect" not in logged[1]
    assert rows[0]["optim/updates"] == 2
    # no compiled decode step on a CPU by default: nothing compiled, nothing logged as such
    assert [r["time/rollout_compile"] for r in logged] == [0.0, 0.0]
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000002"


def test_micro_batching_does_not_change_the_gradient(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    """Accumulating over 1-row micro-batches must give the whole mini-batch's gradient."""
    grads = []
    for budget in (40, 100_000):  # one row per micro-batch vs the whole mini-batch at once
        tr = _trainer(
            tmp_path / str(budget),
            small_world,
            world_tokenizer,
            world_retriever,
            [
                "steps=1",
                f"optim.micro_batch_tokens={budget}",
                "algo.llds.coef=0.5",
                "algo.kl_coef=0.1",
                "algo.entropy_coef=0.01",
            ],
        )
        seen = []
        tr.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, seen=seen: seen.append(
                [p.grad.detach().clone() for g in opt.param_groups for p in g["params"]]
            )
        )
        tr.train()
        grads.append(seen)
    assert len(grads[0]) == len(grads[1]) == 2  # two mini-batches -> two optimizer steps
    for step_a, step_b in zip(*grads, strict=True):
        for a, b in zip(step_a, step_b, strict=True):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)
        assert any(a.abs().sum() > 0 for a in step_a)


def test_no_grad_passes_take_their_own_token_budget(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    """`optim.logprob_micro_batch_tokens` cuts the reference, pi_old and diagnostic passes; the
    update keeps `optim.micro_batch_tokens`; the gradients agree with a run that uses one
    budget for everything (the passes add up to the same log-probs)."""
    from llds.policy import forward

    budgets: dict[str, list[int]] = {"update": [], "no-grad": []}
    plan = forward.plan_micro_batches

    def spy(kind):
        def planned(batch, rows, budget):
            budgets[kind].append(budget)
            return plan(batch, rows, budget)

        return planned

    monkeypatch.setattr(policy_update, "plan_micro_batches", spy("update"))
    monkeypatch.setattr(forward, "plan_micro_batches", spy("no-grad"))
    grads = []
    for extra in (["optim.logprob_micro_batch_tokens=100000"], []):
        for seen in budgets.values():
            seen.clear()
        tr = _trainer(
            tmp_path / str(len(extra)),
            small_world,
            world_tokenizer,
            world_retriever,
            ["steps=1", "optim.micro_batch_tokens=40", "algo.kl_coef=0.1", *extra],
        )
        seen_grads: list[list[torch.Tensor]] = []
        tr.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, out=seen_grads: out.append(
                [p.grad.detach().clone() for g in opt.param_groups for p in g["params"]]
            )
        )
        tr.train()
        grads.append(seen_grads)
        assert budgets["update"] and set(budgets["update"]) == {40}
        # the reference pass and the displacement pass at least
        assert len(budgets["no-grad"]) >= 2
        assert set(budgets["no-grad"]) == ({100000} if extra else {40})
    # the first optimizer step's gradients (later ones start from weights that Adam's
    # sign-like first step has moved apart by any rounding difference)
    for a, b in zip(grads[0][0], grads[1][0], strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_single_turn_training_needs_no_retriever(tmp_path, small_world, world_tokenizer):
    """`rollout.max_turns=0` is plain single-turn GRPO: no retriever is configured or opened."""
    no_retriever = [o for o in BASE if not o.startswith(("retriever.", "rollout.max_turns"))]
    with pytest.raises(ConfigError, match=r"retriever\.source"):
        load_config(None, [*no_retriever, "rollout.max_turns=1"])
    cfg = load_config(
        None,
        [
            *no_retriever,
            f"run_dir={tmp_path}",
            "steps=1",
            "rollout.max_turns=0",
            "rollout.min_turn_tokens=12",
        ],
    )
    tr = GRPOTrainer(
        cfg,
        model=make_tiny_model(world_tokenizer),
        tokenizer=world_tokenizer,
        train_examples=small_world.train,
        resume=False,
    )
    assert tr.retriever is None
    before = [p.detach().clone() for p in tr.model.parameters()]
    (row,) = tr.train()
    assert row["rollout/valid_searches"] == 0 and row["rollout/turns"] == 1
    assert row["rollout/response_tokens"] == 12  # fixed-length turns
    assert row["optim/updates"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))


def test_nonfinite_updates_are_skipped_then_stop(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    real = policy_update.grpo_objective

    def poisoned(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(policy_update, "grpo_objective", poisoned)
    tr = _trainer(
        tmp_path,
        small_world,
        world_tokenizer,
        world_retriever,
        ["steps=2", "optim.max_nonfinite_in_a_row=2"],
    )
    before = [p.detach().clone() for p in tr.model.parameters()]
    with pytest.raises(NonFiniteError, match="2 non-finite"):
        tr.train()
    assert tr.updater.skipped_updates == 2
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))


def test_old_log_probs_from_the_rollout_give_the_recomputed_update(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    """pi_old taken from the sampling passes (fp32) must train exactly like the recompute.

    Without LLDS: its hinge at d = 0 on the first optimizer step turns rounding noise into a
    gradient, which is why `auto` recomputes when LLDS is on (checked below)."""
    # nonzero advantages, so the policy loss and LLDS really depend on pi_old
    monkeypatch.setattr(
        trainer_mod, "group_advantages", lambda r, g, **k: torch.linspace(-0.5, 1.0, len(r))
    )
    runs = {}
    for mode in ("auto", "rollout", "recompute"):
        tr = _trainer(
            tmp_path / mode,
            small_world,
            world_tokenizer,
            world_retriever,
            [
                "steps=1",
                f"algo.old_logprobs={mode}",
                "algo.llds.enabled=false",
                "algo.kl_coef=0.1",
                "algo.entropy_coef=0.01",
            ],
        )
        grads: list[list[torch.Tensor]] = []
        tr.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, grads=grads: grads.append(
                [p.grad.detach().clone() for g in opt.param_groups for p in g["params"]]
            )
        )
        (row,) = tr.train()
        runs[mode] = (row, grads)
    assert runs["auto"][0]["policy/old_logprobs_from_rollout"] == 1.0
    assert runs["rollout"][0]["policy/old_logprobs_from_rollout"] == 1.0
    assert runs["recompute"][0]["policy/old_logprobs_from_rollout"] == 0.0
    ref_row, ref_grads = runs["recompute"]
    assert abs(ref_row["policy/pg_loss"]) > 1e-3 and len(ref_grads) == 2
    keys = (
        "policy/pg_loss",
        "policy/approx_kl",
        "policy/ratio_mean",
        "policy/kl",
        "policy/clip_frac_high",
        "policy/entropy",
        "lld/logp_incorrect",
        "policy/grad_norm",
    )
    for mode in ("auto", "rollout"):
        row, grads = runs[mode]
        for key in keys:
            assert row[key] == pytest.approx(ref_row[key], rel=1e-4, abs=1e-6), key
        for step, ref_step in zip(grads, ref_grads, strict=True):  # both optimizer steps
            for a, b in zip(step, ref_step, strict=True):
                assert torch.allclose(a, b, rtol=1e-3, atol=1e-6)


def test_auto_recomputes_old_log_probs_for_noisy_llds_or_low_precision(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    """`auto` takes pi_old from the rollout unless its rounding could matter: LLDS evaluated on
    the first optimizer step (the authors' behaviour) or a low-precision compute dtype."""
    from llds.algo.llds_in_force import LLDSInForce
    from llds.train.step_logprobs import old_logprobs_from_rollout

    tr = _trainer(tmp_path, small_world, world_tokenizer, world_retriever)
    known = SimpleNamespace(rollout_logprobs=torch.zeros(1, 1), rollout_entropy=torch.zeros(1, 1))

    def from_rollout(batch, mixed=False, coef=None, copy=False):
        llds = tr.cfg.algo.llds
        if coef is not None:
            llds = dataclasses.replace(llds, enabled=True, coef=coef)
        return old_logprobs_from_rollout(
            tr.cfg.algo, batch, sampled_by_copy=copy, llds=LLDSInForce(llds), mixed_precision=mixed
        )

    assert tr.cfg.algo.llds.enabled and tr.cfg.algo.llds.first_update == "zero"
    assert from_rollout(known)  # LLDS is exactly 0 on the first step anyway
    tr.cfg.algo.llds.first_update = "computed"
    assert not from_rollout(known)
    tr.cfg.algo.llds.enabled = False
    assert from_rollout(known)
    assert not from_rollout(known, coef=0.3)  # a rollback turned LLDS on
    assert not from_rollout(SimpleNamespace(rollout_logprobs=None, rollout_entropy=None))
    assert not from_rollout(known, copy=True)  # a sampling copy's numbers are not the policy's
    assert not from_rollout(known, mixed=True)
    tr.cfg.algo.old_logprobs = "rollout"
    assert from_rollout(known, mixed=True)


# --------------------------------------------------------------------- kill and resume
def _train_cmd(cfg: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "llds.cli", "train", "--config", str(cfg), f"run_dir={run_dir}"]


def _comparable(rows):
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows
    ]


@pytest.mark.slow
def test_sigkill_and_resume_reproduces_uninterrupted_run(tmp_path, small_world, world_tokenizer):
    cfg = write_run_inputs(tmp_path, small_world, world_tokenizer)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    straight = tmp_path / "straight"
    subprocess.run(_train_cmd(cfg, straight), check=True, env=env, capture_output=True, timeout=600)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _train_cmd(cfg, killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline:
        if latest.is_file() and latest.read_text().strip() == "step_000002":
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert len(read_metrics(killed)) < 6  # it really was interrupted

    subprocess.run(_train_cmd(cfg, killed), check=True, env=env, capture_output=True, timeout=600)
    a, b = _comparable(read_metrics(straight)), _comparable(read_metrics(killed))
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            va, vb = ra[k], rb[k]
            if isinstance(va, float) and isinstance(vb, float):
                assert vb == pytest.approx(va, abs=1e-6, rel=1e-6), (ra["step"], k)
            else:
                assert va == vb, (ra["step"], k)


# --------------------------------------------------------------------- alarm policies
def _decay_alarm(step: int, since: int):
    from llds.monitor.alarms import Alarm

    return Alarm(
        step,
        "likelihood_decay",
        "warning",
        "correct-response likelihood fell",
        {"since_step": since},
    )


def test_on_alarm_stop_saves_and_stops(tmp_path, small_world, world_tokenizer, world_retriever):
    from llds.train.trainer import CollapseAlarmStop

    tr = _trainer(
        tmp_path,
        small_world,
        world_tokenizer,
        world_retriever,
        ["steps=2", "diagnostics.on_alarm=stop"],
    )
    tr.train()
    with pytest.raises(CollapseAlarmStop, match="likelihood_decay"):
        tr._on_alarms([_decay_alarm(2, 1)])
    logged = (tmp_path / "alarms.jsonl").read_text().strip().splitlines()
    assert json.loads(logged[-1])["action"] == "stop"


def test_on_alarm_rollback_restores_and_turns_llds_on(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    tr = _trainer(
        tmp_path,
        small_world,
        world_tokenizer,
        world_retriever,
        [
            "steps=3",
            "save_every=1",
            "keep_checkpoints=5",
            "diagnostics.on_alarm=rollback",
            "algo.llds.enabled=false",
            "diagnostics.rollback_llds_coef=0.3",
        ],
    )
    tr.train(steps=1)
    at_step1 = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.train(steps=2)
    assert tr.step == 3
    assert any(not torch.equal(v, at_step1[k]) for k, v in tr.model.state_dict().items())
    tr._on_alarms([_decay_alarm(3, 1)])
    assert tr.step == 1 and tr.rollbacks == 1
    assert tr.llds_settings.enabled and tr.llds_settings.active_coef == 0.3  # LLDS on, at 0.3
    assert not tr.cfg.algo.llds.enabled  # and the config is left as the user wrote it
    assert all(torch.equal(v, at_step1[k]) for k, v in tr.model.state_dict().items())
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    assert [r["step"] for r in read_metrics_file(tmp_path / "metrics.rollback1.jsonl")] == [1, 2, 3]
    rows = tr.train(steps=1)  # training goes on from the restored state, LLDS now active
    assert rows[0]["step"] == 2 and "llds/loss" in rows[0]


def test_rollback_passes_over_a_damaged_checkpoint(
    tmp_path, small_world, world_tokenizer, world_retriever, caplog
):
    """The newest checkpoint at or before the rollback's step is damaged (a weight file cut
    short): the rollback takes the one before, as resume would, and the run goes on."""
    tr = _trainer(
        tmp_path,
        small_world,
        world_tokenizer,
        world_retriever,
        ["steps=3", "save_every=1", "keep_checkpoints=5", "diagnostics.on_alarm=rollback"],
    )
    tr.train(steps=1)
    at_step1 = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.train(steps=2)
    weights = tmp_path / "checkpoints" / "step_000002" / "model" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with caplog.at_level("WARNING", logger="llds.train"):
        tr._on_alarms([_decay_alarm(3, 2)])  # back to step <= 2: step 2 is damaged
    assert tr.step == 1 and tr.rollbacks == 1
    assert all(torch.equal(v, at_step1[k]) for k, v in tr.model.state_dict().items())
    assert "passes over checkpoint step_000002" in caplog.text
    rows = tr.train(steps=1)
    assert rows[0]["step"] == 2


def read_metrics_file(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_context_capped_rollouts_are_counted(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    tr = _trainer(
        tmp_path,
        small_world,
        world_tokenizer,
        world_retriever,
        ["steps=1", "rollout.max_total_tokens=40", "rollout.max_turn_tokens=30"],
    )
    batches = []
    generate = tr.engine.generate
    tr.engine.generate = lambda reqs: batches.append(generate(reqs)) or batches[-1]
    (row,) = tr.train()
    capped = sum(e.context_capped for e in batches[0].episodes)
    assert capped > 0
    assert row["rollout/context_capped"] == capped


def _has_run_of_five(text: str) -> bool:
    """An independent check: some punctuation character (not a tag's bracket or slash) five
    times in a row."""
    from itertools import groupby

    return any(
        len(list(g)) >= 5 for ch, g in groupby(text) if not ch.isalnum() and ch not in " \n\t<>/_"
    )


def test_punctuation_runs_in_rollouts_are_counted(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    tr = _trainer(tmp_path, small_world, world_tokenizer, world_retriever, ["steps=1"])
    batches = []
    generate = tr.engine.generate

    def padded(reqs):
        batch = generate(reqs)
        # as a degenerate policy writes them: two rollouts padded, one with a run of four only
        batch.episodes[0].action_texts = ["<search> river of X))))) </search>"]
        batch.episodes[1].action_texts = ["<answer> Kulban", ")))))))) </answer>"]
        batch.episodes[2].action_texts = ["<answer> Kulban)))) </answer>"]
        batches.append(batch)
        return batch

    tr.engine.generate = padded
    (row,) = tr.train()
    eps = batches[0].episodes
    expected = sum(_has_run_of_five(" ".join(e.action_texts)) for e in eps) / len(eps)
    assert _has_run_of_five(" ".join(eps[1].action_texts))
    assert not _has_run_of_five(" ".join(eps[2].action_texts))
    assert expected >= 2 / len(eps)
    assert row["rollout/punct_run_frac"] == pytest.approx(expected)


@pytest.mark.slow
def test_background_runs_are_library_calls(tmp_path, small_world, world_tokenizer):
    """`run_queue` / `start_run`: two runs side by side in spawned processes equal the same run
    in this one; a run that fails stops the queue with an error naming its log."""
    from llds.errors import UserInputError
    from llds.train.background import run_queue

    cfg_path = write_run_inputs(tmp_path, small_world, world_tokenizer, steps=2, save_every=2)
    jobs = [
        (load_config(cfg_path, [f"run_dir={tmp_path / name}"]), tmp_path / f"{name}.log")
        for name in ("a", "b")
    ]
    run_queue(jobs, parallel=2, poll_s=0.2)
    broken = load_config(cfg_path, [f"run_dir={tmp_path / 'x'}", "model.path=/no/such/model"])
    with pytest.raises(UserInputError, match=r"exit code \d+\); see .*x\.log"):
        run_queue([(broken, tmp_path / "x.log")], parallel=1, poll_s=0.2)
    assert "/no/such/model" in (tmp_path / "x.log").read_text(encoding="utf-8")
    here = GRPOTrainer(load_config(cfg_path, [f"run_dir={tmp_path / 'here'}"]), resume=False)
    rows = here.train()
    for name in ("a", "b"):
        logged = read_metrics(tmp_path / name)
        assert [r["step"] for r in logged] == [1, 2]
        assert logged[-1]["reward/mean"] == rows[-1]["reward/mean"]
        assert logged[-1]["policy/pg_loss"] == pytest.approx(rows[-1]["policy/pg_loss"], abs=1e-6)


@pytest.mark.slow
def test_a_queue_stops_at_its_deadline(tmp_path, small_world, world_tokenizer):
    """`run_queue(deadline=...)`: the running run is terminated (no child left), the one not
    started stays so, both are returned as unfinished; `on_poll` runs at every poll."""
    import multiprocessing
    import time

    from llds.train.background import run_queue

    cfg_path = write_run_inputs(tmp_path, small_world, world_tokenizer, steps=100_000)
    jobs = [
        (load_config(cfg_path, [f"run_dir={tmp_path / name}"]), tmp_path / f"{name}.log")
        for name in ("long", "queued")
    ]
    polls: list[float] = []
    start = time.monotonic()
    left = run_queue(
        jobs, parallel=1, poll_s=0.2, deadline=start + 3.0, on_poll=lambda: polls.append(1.0)
    )
    assert left == [tmp_path / "long", tmp_path / "queued"]
    assert 3.0 <= time.monotonic() - start < 60
    assert len(polls) >= 10
    assert multiprocessing.active_children() == []
    assert not (tmp_path / "queued").exists()


_STARTER = """
import sys, time
from llds.train.background import start_run
from llds.train.config import load_config

if __name__ == "__main__":
    cfg = load_config(sys.argv[1], [f"run_dir={sys.argv[2]}", "steps=100000", "save_every=5"])
    print(start_run(cfg, sys.argv[3]).pid, flush=True)
    time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie no one reaped yet counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_a_background_run_stops_when_its_starter_is_killed(tmp_path, small_world, world_tokenizer):
    """SIGKILL the process that started a run: the run must not go on as an orphan writing
    into its run directory; it stops within seconds, its checkpoints intact."""
    cfg_path = write_run_inputs(tmp_path, small_world, world_tokenizer)
    starter = tmp_path / "starter.py"
    starter.write_text(_STARTER, encoding="utf-8")
    run, log = tmp_path / "run", tmp_path / "run.log"
    parent = subprocess.Popen(
        [sys.executable, str(starter), str(cfg_path), str(run), str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.time() + 300
    while len(read_metrics(run)) < 6 and time.time() < deadline:  # it trains
        time.sleep(0.2)
    assert len(read_metrics(run)) >= 6 and not _gone(child)
    parent.kill()
    parent.wait()
    deadline = time.time() + 60
    while not _gone(child) and time.time() < deadline:
        time.sleep(0.2)
    assert _gone(child)
    steps = len(read_metrics(run))
    time.sleep(2)
    assert len(read_metrics(run)) == steps  # nothing more is written
    text = log.read_text(encoding="utf-8")
    assert f"(pid {parent.pid}) is gone: stopping" in text
    # the run resumes from what it left: a checkpoint that verifies
    from llds.train.checkpoint import find_resumable

    ckpt, damaged = find_resumable(run / "checkpoints")
    assert ckpt is not None and not damaged


def test_probe_and_hidden_similarity_leave_training_unchanged(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    """The periodic probe runs on a copy and forks the random streams; the similarity pass is
    a no-grad forward: the trained weights are bit for bit those of a run without them."""
    params = {}
    for name, extra in (
        ("off", ["diagnostics.hidden_similarity_every=0"]),
        ("on", ["diagnostics.probe_every=1", "diagnostics.probe_questions=3"]),
    ):
        tr = _trainer(
            tmp_path / name, small_world, world_tokenizer, world_retriever, ["steps=2", *extra]
        )
        rows = tr.train()
        params[name] = [p.detach().clone() for p in tr.model.parameters()]
        if name == "on":
            assert all(r["probe/questions"] <= 3 for r in rows)
            assert "lld/hidden_cos_correct_incorrect" in rows[0]
        else:
            assert "probe/questions" not in rows[0]
    assert all(torch.equal(a, b) for a, b in zip(params["off"], params["on"], strict=True))


def test_hidden_similarity_comes_from_the_displacement_pass(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    """The similarity's pooled states come from the displacement's forward (no second pass):
    every logged value agrees with a run that measures them in a pass of their own, and the
    trained weights are the same bit for bit."""
    from llds.train import diagnostics as diag_mod

    separate_calls: list[int] = []
    pooled_alone = diag_mod.pooled_response_hidden

    def spy(*args, **kwargs):
        separate_calls.append(1)
        return pooled_alone(*args, **kwargs)

    monkeypatch.setattr(diag_mod, "pooled_response_hidden", spy)
    measure = diag_mod.Diagnostics.after_update

    def mixed_groups(self, batch, *args):
        # a tiny random model answers nothing right: mark every other response correct (read
        # by the diagnostics only, after the update) so that every group is mixed
        for i, episode in enumerate(batch.episodes):
            episode.em = float(i % 2)
        return measure(self, batch, *args)

    monkeypatch.setattr(diag_mod.Diagnostics, "after_update", mixed_groups)
    runs = {}
    for name in ("one pass", "two passes"):
        if name == "two passes":
            monkeypatch.setattr(diag_mod, "batched_log_probs_and_hidden", lambda *a, **k: None)
        extra = ["steps=3", "diagnostics.hidden_similarity_every=1"]
        tr = _trainer(tmp_path / name, small_world, world_tokenizer, world_retriever, extra)
        runs[name] = (tr.train(), [p.detach().clone() for p in tr.model.parameters()])
        if name == "one pass":
            assert separate_calls == []
    assert len(separate_calls) == 3
    (fused, w1), (alone, w2) = runs["one pass"], runs["two passes"]
    assert all(torch.equal(a, b) for a, b in zip(w1, w2, strict=True))
    key = "lld/hidden_cos_correct_incorrect"
    values = [(a.get(key), b.get(key)) for a, b in zip(fused, alone, strict=True)]
    assert all(a is not None and a == a for a, _ in values)  # measured every step (not NaN)
    assert [a for a, _ in values] == pytest.approx([b for _, b in values], abs=1e-5)
    for a, b in zip(fused, alone, strict=True):
        for k in a:
            if k.startswith("lld/") and k != key and isinstance(a[k], float) and a[k] == a[k]:
                assert a[k] == pytest.approx(b[k], abs=1e-5), k


def test_probe_settings_are_checked_by_name():
    with pytest.raises(ConfigError, match=r"diagnostics\.probe_lr"):
        load_config(None, [*BASE, "diagnostics.probe_every=5", "diagnostics.probe_lr=0"])
    with pytest.raises(ConfigError, match=r"diagnostics\.probe_every"):
        load_config(None, [*BASE, "diagnostics.probe_every=-1"])
