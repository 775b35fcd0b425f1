"""The collapse corpus's generators (`experiments/collapse_corpus/`): each mechanism's cause,
applied as the corpus applies it (a branch resumed from its trunk's checkpoint with the cause's
settings allowed), takes effect at its onset step and not before, against the control branch
of the same trunk."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from conftest import tiny_trainer
from llds.retrieval.faults import DegradeConfig, DegradingRetriever, degraded_share
from llds.runs.tracking import read_metrics

HERE = Path(__file__).resolve().parents[1] / "experiments" / "collapse_corpus"
ONSET, END = 2, 4


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


corpus = _load("corpus")
S = corpus.S

TINY = [f"save_every={ONSET}", "rollout.max_turns=2", "diagnostics.hidden_similarity_every=0"]


@pytest.fixture(scope="module")
def trunk(tmp_path_factory, small_world, world_tokenizer, world_retriever) -> Path:
    """Steps 1..ONSET of the recipe, with its checkpoint at ONSET."""
    root = tmp_path_factory.mktemp("corpus") / "trunk"
    t = tiny_trainer(root, small_world, world_tokenizer, world_retriever, [*TINY, f"steps={ONSET}"])
    t.train()
    return root


def _branch(root: Path, trunk: Path, world, tok, retriever, overrides, allow):
    """The branch of `trunk` in `root`, trained to END; returns (trainer, rows by step)."""
    corpus.copy_trunk(trunk, root, onset=ONSET)
    t = tiny_trainer(
        root,
        world,
        tok,
        retriever,
        [*TINY, f"steps={END}", *overrides],
        resume=True,
        allow_config_change=list(allow) or None,
    )
    t.train()
    return t, {r["step"]: r for r in read_metrics(root)}


@pytest.fixture(scope="module")
def control(trunk, tmp_path_factory, small_world, world_tokenizer, world_retriever):
    root = tmp_path_factory.mktemp("corpus") / "none"
    return _branch(root, trunk, small_world, world_tokenizer, world_retriever, [], [])[1]


def _cause(name, strength, trunk, tmp_path, world, tok, retriever):
    cause = S.CAUSES[name]
    return _branch(
        tmp_path / name,
        trunk,
        world,
        tok,
        retriever,
        cause.overrides(strength, onset=ONSET),
        cause.allow,
    )


def _same_trunk(rows, control):
    """Steps 1..ONSET are the trunk's in both branches, row for row."""
    for step in range(1, ONSET + 1):
        assert rows[step] == control[step]
    assert max(rows) == END and max(control) == END


def test_lr_climbs_from_the_onset(
    trunk, control, tmp_path, small_world, world_tokenizer, world_retriever
):
    _, rows = _cause("lr", "10", trunk, tmp_path, small_world, world_tokenizer, world_retriever)
    _same_trunk(rows, control)
    base = control[ONSET]["lr"]
    assert control[END]["lr"] == pytest.approx(base)
    # LambdaLR's factor at step k is the line through the points at k (0-based steps done):
    # step ONSET + 1 trains with factor(ONSET) = 1, then 1 + 9 / LR_RAMP per step
    assert rows[ONSET + 1]["lr"] == pytest.approx(base * (1 + 9 / S.LR_RAMP))
    assert rows[END]["lr"] == pytest.approx(base * (1 + 9 * (END - ONSET) / S.LR_RAMP))


def test_mismatch_samples_from_a_lagging_copy(
    trunk, control, tmp_path, small_world, world_tokenizer, world_retriever
):
    # sync_every=2: the copy is made fresh at the resume (step ONSET + 1 samples the policy's
    # own weights), is not refreshed after step 3's update (3 % 2), so step 4 samples a copy one
    # update behind
    t, rows = _cause(
        "mismatch", "2", trunk, tmp_path, small_world, world_tokenizer, world_retriever
    )
    _same_trunk(rows, control)
    assert t.sampler.is_copy
    kl = "mismatch/k3_kl"
    assert all(kl not in control[s] for s in control)
    assert all(kl not in rows[s] for s in range(1, ONSET + 1))
    assert abs(rows[ONSET + 1][kl]) < 1e-6  # fresh copy: the same policy
    assert rows[END][kl] > 1e-4  # one update behind


def test_tool_degrades_searches_from_the_onset(
    trunk, control, tmp_path, small_world, world_tokenizer, world_retriever
):
    t, rows = _cause("tool", "1", trunk, tmp_path, small_world, world_tokenizer, world_retriever)
    _same_trunk(rows, control)
    assert isinstance(t.retriever, DegradingRetriever) and t.retriever.step == END
    cfg = DegradeConfig(kind="shuffled", start_step=ONSET + 1, ramp_steps=4)
    assert [degraded_share(cfg, s) for s in range(1, 7)] == [0, 0, 0.25, 0.5, 0.75, 1.0]


def test_degraded_searches_get_another_querys_passages_or_none(small_world, world_retriever):
    queries = [q.question for q in small_world.train[:6]]
    honest = world_retriever.search(queries, 2)
    for kind in ("shuffled", "empty"):
        faulty = DegradingRetriever(world_retriever, DegradeConfig(kind=kind, start_step=3))
        faulty.at_step(2)  # before the onset: the retriever as it is
        assert faulty.search(queries, 2) == honest and faulty.degraded == 0
        faulty.at_step(3)  # fraction 1 at once: every search degraded
        got = faulty.search(queries, 2)
        assert faulty.degraded == faulty.searches == len(queries)
        want = [honest[(i + 1) % len(queries)] for i in range(len(queries))]
        assert got == (want if kind == "shuffled" else [[] for _ in queries])


def test_a_partial_share_degrades_the_same_searches_every_time(small_world, world_retriever):
    queries = [q.question for q in small_world.train[:40]]
    cfg = DegradeConfig(kind="empty", start_step=1, fraction=0.5)
    runs = []
    for _ in range(2):
        faulty = DegradingRetriever(world_retriever, cfg)
        faulty.at_step(5)
        runs.append([len(h) == 0 for h in faulty.search(queries, 2)])
    assert runs[0] == runs[1] and 8 <= sum(runs[0]) <= 32  # about half of 40, and repeatable


def test_entropy_bonus_changes_the_update_from_the_onset(
    trunk, control, tmp_path, small_world, world_tokenizer, world_retriever
):
    t, rows = _cause(
        "entropy", "0.05", trunk, tmp_path, small_world, world_tokenizer, world_retriever
    )
    _same_trunk(rows, control)
    assert t.cfg.algo.entropy_coef == 0.05
    first = ONSET + 1  # the same rollouts as the control's, a different loss
    assert rows[first]["rollout/response_tokens"] == control[first]["rollout/response_tokens"]
    assert rows[first]["policy/grad_norm"] != control[first]["policy/grad_norm"]


def test_every_cause_run_has_a_split_and_the_held_out_mechanism_is_whole():
    assert S.split_of("tool", 0) == S.split_of("tool", 7) == "heldout"
    assert S.split_of("none", 0) == "tune" and S.split_of("none", 4) == "judge"
    assert S.split_of("lr", 3) == "tune" and S.split_of("lr", 4) == "judge"
    assert S.split_of("none", 8) == "tune" and S.split_of("none", 16) == "judge"
    assert S.mechanism_of("mismatch+tis") == "none"


collect = _load("corpus_collect")


def test_the_committed_tables_recompute_from_the_committed_logs():
    """manifest.csv, summary.json and pilot.json are what the collector computes from the
    committed logs (never edited by hand)."""
    import csv
    import json
    from dataclasses import asdict

    pilot = collect.pilot_outcomes(S.RUNS / "pilot")
    assert pilot, "the pilot's logs are committed"
    committed = json.loads((S.HERE / "pilot.json").read_text())
    assert committed == json.loads(
        json.dumps({"runs": [asdict(o) for o in pilot], "choice": collect.pilot_choice(pilot)})
    )
    if not (S.HERE / "manifest.csv").is_file():
        return  # the corpus's own runs are not committed yet: the pilot is all there is
    outcomes = collect.corpus_outcomes(S.RUNS)
    with (S.HERE / "manifest.csv").open(newline="", encoding="utf-8") as f:
        assert list(csv.DictReader(f)) == collect.manifest_rows(outcomes)
    signals = collect.signal_table(S.RUNS, outcomes)
    summary = json.loads(json.dumps({**collect.summary(outcomes), "signals": signals}))
    assert json.loads((S.HERE / "summary.json").read_text()) == summary


def test_the_collapse_rule_censors_and_names_abrupt_collapses():
    def rows(rewards):
        return [{"step": i + 1, "reward/mean": r} for i, r in enumerate(rewards)]

    healthy = [0.6] * 100
    # falls to 0 from step 71; by hand, the 10-step median is 0.3 (half the peak) at step 75,
    # 14 steps after a cause at 61: abrupt; 35 steps logged after it: not censored
    fast = [0.6] * 70 + [0.0] * 40
    o = collect.outcome("r", "lr", 0, rows(fast), S.ONSET + 1)
    assert o.collapse == 75 and o.abrupt and not o.censored and o.collapsed
    # the same fall with fewer than 30 steps after the collapse step: censored
    o = collect.outcome("r", "lr", 0, rows([0.6] * 70 + [0.0] * 20), S.ONSET + 1)
    assert o.censored and not o.collapsed
    # a fall 54 steps after the onset (collapse step 115), 35 steps logged after: neither
    o = collect.outcome("r", "lr", 0, rows([0.6] * 110 + [0.0] * 40), S.ONSET + 1)
    assert o.collapse == 115 and o.collapsed and not o.abrupt
    # a trunk that had already collapsed before the onset is not usable
    o = collect.outcome("r", "lr", 0, rows([0.6] * 20 + [0.0] * 80), S.ONSET + 1)
    assert not o.onset_healthy
    assert collect.outcome("r", "none", 0, rows(healthy), None).collapse is None


def test_the_lld_share_is_pooled_over_responses_not_averaged_over_steps():
    rows = [
        {"step": 1, "lld/frac_pos_fell": 1.0, "lld/pos_responses": 1.0},
        {"step": 2, "lld/frac_pos_fell": 0.0, "lld/pos_responses": 9.0},
        {"step": 3, "lld/frac_pos_fell": 0.5, "lld/pos_responses": 0.0},
    ]
    assert collect.pooled_share(rows, 1, 3) == pytest.approx(0.1)  # 1 of 10, not 0.5
    assert collect.pooled_share(rows, 3, 3) is None


def _gz_log(path: Path, steps: int) -> None:
    path.mkdir(parents=True)
    rows = "".join(json.dumps({"step": s, "reward/mean": 0.5}) + "\n" for s in range(1, steps + 1))
    (path / "metrics.jsonl.gz").write_bytes(gzip.compress(rows.encode()))


def test_a_committed_branch_is_not_run_again_nor_a_trunk_with_nothing_left(tmp_path, monkeypatch):
    """A new checkout has no work folder: the committed logs tell which runs are done."""
    monkeypatch.setattr(S, "RUNS", tmp_path)
    monkeypatch.setattr(S, "WORK", tmp_path / "work")  # no run has started here
    _gz_log(tmp_path / "lr" / "seed0", S.STEPS)
    _gz_log(tmp_path / "none" / "seed0", S.STEPS - 1)  # cut short: runs again
    for arm in ("mismatch", "mismatch_tis", "tool", "entropy"):
        _gz_log(tmp_path / arm / "seed0", S.STEPS)
    trunks, branches = corpus.corpus_jobs([0], list(S.ARMS))
    done = {Path(b[0]).parent.name for b in branches if corpus._committed(b, False)}
    assert done == {"lr", "mismatch", "mismatch_tis", "tool", "entropy"}
    assert not corpus._committed(trunks[0], False)  # a trunk is never "committed"
    started = []
    monkeypatch.setattr(corpus, "ProcessPoolExecutor", _Recorder(started))
    corpus.execute(trunks, branches, 1)
    assert started == [trunks[0][0], S.branch_dir("none", 0).as_posix()]
    started.clear()
    corpus.execute(*corpus.corpus_jobs([8], ["none"]), 1)  # a healthy seed: trunk and control
    assert started == [S.trunk_dir(8).as_posix(), S.branch_dir("none", 8).as_posix()]
    _gz_log(tmp_path / "none" / "seed8", S.STEPS)
    started.clear()
    corpus.execute(*corpus.corpus_jobs([8], ["none"]), 1)
    assert started == []  # nothing left: the trunk does not run either


class _Recorder:
    """A stand-in pool that records which run folders would start, and starts none."""

    def __init__(self, started: list[str]):
        self.started = started

    def __call__(self, *args, **kwargs):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, run_dir, *rest):
        from concurrent.futures import Future

        self.started.append(str(run_dir))
        fut: Future = Future()
        fut.set_result(run_dir)
        return fut


def test_the_lld_runs_are_the_protocols(capsys):
    """lld.py's plan: the pilot's two settings on seeds 100-101 (GRPO only), the arms on seeds
    0-7, 300 steps, KL off, the paper's 10 mini-batches in rollout order, the second view,
    prefix sharing on."""
    lld = _load("lld")
    seen = {}
    for argv in (["--pilot", "a"], ["--pilot", "b"], ["--setting", "b"]):
        lld.main([*argv, "--dry-run"])
        seen[argv[1] + argv[0]] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    for name, runs in seen.items():
        for r in runs:
            c = r["config"]
            assert (c["steps"], c["algo"]["kl_coef"], c["eval_every"]) == (300, 0.0, 10)
            assert (c["optim"]["mini_batches"], c["optim"]["minibatch_order"]) == (10, "rollout")
            assert c["optim"]["lr"] == (3e-4 if name == "a--pilot" else 9e-4)
            assert c["data"]["eval_limit"] == 60
            assert c["rollout"]["prefix_sharing"] is True  # amendment 3
    assert [(r["arm"], r["seed"]) for r in seen["a--pilot"]] == [("lam0", 100), ("lam0", 101)]
    arms = {(r["arm"], r["config"]["algo"]["llds"]["enabled"]) for r in seen["b--setting"]}
    assert arms == {("lam0", False), ("lam0.6", True), ("lam2", True)}
    assert sorted({r["seed"] for r in seen["b--setting"]}) == list(range(8))
    coef = {r["arm"]: r["config"]["algo"]["llds"]["coef"] for r in seen["b--setting"]}
    assert (coef["lam0.6"], coef["lam2"]) == (0.6, 2.0)


def _lld_log(run_dir: Path, fall: int | None, steps: int = 80, fell: float = 0.25) -> None:
    """A committed lld log: reward 0.8 (falling to 0.1 from step `fall`), 4 pushed-up responses
    a step of which a share `fell` lost likelihood, entropy 0.5, gradient norm = step."""
    rows = [
        {
            "step": s,
            "reward/mean": 0.1 if fall is not None and s >= fall else 0.8,
            "lld/frac_pos_fell": fell,
            "lld/pos_responses": 4.0,
            "policy/entropy": 0.5,
            "policy/grad_norm": float(s),
        }
        for s in range(1, steps + 1)
    ]
    run_dir.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (run_dir / "metrics.jsonl.gz").write_bytes(gzip.compress(text.encode()))


def test_the_lld_tables_follow_the_protocol(tmp_path):
    """The pilot's rule, the manifest rows, Fisher's test and the death spiral's windows, on
    logs built by hand (collapse rule: the 10-step median at or below half its peak to the end,
    so a fall at step f collapses at f + 5)."""
    C = _load("lld_collect")
    res = tmp_path / "setting_b"
    _lld_log(res / "runs" / "lam0" / "seed0", fall=40)
    _lld_log(res / "runs" / "lam0" / "seed5", fall=20)
    _lld_log(res / "runs" / "lam0.6" / "seed0", fall=None, fell=0.5)
    _lld_log(res / "runs" / "lam0.6" / "seed5", fall=None, steps=40)  # still running
    runs = C.read_runs(tmp_path, res, steps=80)
    by = {(r.arm, r.seed): r for r in runs}
    assert by["lam0", 0].collapse == 45 and by["lam0", 0].collapsed and not by["lam0", 0].abrupt
    assert by["lam0", 5].collapse == 25 and by["lam0", 5].abrupt  # 24 steps after the onset
    assert not by["lam0.6", 0].collapsed and not by["lam0.6", 5].finished
    rows = C.manifest_rows(runs, {"lam0": "lld", "lam0.6": "lld+llds"})
    assert [(r["run"], r["split"], r["collapse_step"], r["cause_step"]) for r in rows] == [
        ("setting_b/runs/lam0/seed0", "tune", "45", "1"),
        ("setting_b/runs/lam0/seed5", "judge", "25", "1"),
        ("setting_b/runs/lam0.6/seed0", "tune", "", "1"),
    ]
    table = C.collapses_per_arm(runs, ["lam0", "lam0.6"])
    assert table["lam0"] == {"runs": 2, "collapsed": 2}
    # 2 of 2 against 0 of 1: the two-sided Fisher p is 1/3 (hypergeometric, by hand)
    assert table["lam0.6"]["fisher_p_vs_grpo"] == pytest.approx(1 / 3)
    assert table["lam0.6"]["prevents"] is False
    spiral = C.death_spiral(tmp_path, runs)
    first = spiral[0]
    assert (first["seed"], first["collapse"]) == (0, 45)
    w = first["20 before"]  # steps 25-44
    assert w["grpo"]["policy/grad_norm"] == pytest.approx(sum(range(25, 45)) / 20)
    assert w["grpo"]["lld_share_pooled"] == pytest.approx(0.25)
    assert w["llds_arms_same_seed"]["lld_share_pooled"] == pytest.approx(0.5)
    assert w["runs_not_collapsed"]["lld_share_pooled"] == pytest.approx(0.5)
    assert first["50 before"]["grpo"]["policy/grad_norm"] == pytest.approx(sum(range(1, 45)) / 44)


def test_amendment_5_stops_a_run_after_50_steps_at_a_quarter_of_its_peak(tmp_path):
    """The stop rule by hand: reward 0.8 to step 20, then 0.2 (a quarter of the 0.8 peak, "at
    or below" counts): it holds at step 70, the 50th low step; one step above a quarter starts
    the count again; a peak under 0.2 never holds. A run it stopped counts as finished (and
    collapsed), a run that reached its last step is never marked stopped."""
    C = _load("lld_collect")
    steps = list(range(1, 201))
    dead = [0.8 if s <= 20 else 0.2 for s in steps]
    assert C.dead_step(steps, dead) == 70
    assert C.dead_step(steps[:69], dead[:69]) is None  # causal: one step short
    broken = [0.21 if s == 60 else r for s, r in zip(steps, dead, strict=True)]
    assert C.dead_step(steps, broken) == 110
    assert C.dead_step(steps, [0.19 if s <= 20 else 0.0 for s in steps]) is None  # no peak
    res = tmp_path / "setting_b"
    _lld_log(res / "runs" / "lam0" / "seed1", fall=20, steps=72)  # 0.1 from step 20: 69
    _lld_log(res / "runs" / "lam0" / "seed2", fall=20, steps=68)  # rule not yet held
    _lld_log(res / "runs" / "lam0" / "seed3", fall=20, steps=80)  # ran to its last step
    by = {r.seed: r for r in C.read_runs(tmp_path, res, steps=80)}
    assert (by[1].finished, by[1].stopped, by[1].collapsed, by[1].collapse) == (True, 69, True, 25)
    assert (by[2].finished, by[2].stopped) == (False, None)
    assert (by[3].finished, by[3].stopped) == (True, None)
    page = "\n".join(C.runs_markdown("x", list(by.values())))
    assert "25 (stopped by amendment 5 at step 69)" in page
    assert "- (running: logged to step 68)" not in page and "(running: logged to step 68)" in page


def test_the_supervisor_stops_a_dead_run_with_every_process_under_it(tmp_path):
    """Real processes: the driver stand-in logs a run whose reward fell (the rule holds at step
    70), starts a grandchild and sleeps; the supervisor sees the rule, stops the whole process
    group (the grandchild too), reports the dead run once and starts the driver again, which
    now ends by itself: its exit code is returned."""
    import os
    import subprocess

    L = _load("lld")
    run = tmp_path / "lam0" / "seed1"
    marker, pids = tmp_path / "started-once", tmp_path / "grandchild.pid"
    rows = [{"step": s, "reward/mean": 0.8 if s <= 20 else 0.2} for s in range(1, 81)]
    script = f"""
import json, pathlib, subprocess, sys, time
marker, run = pathlib.Path({str(marker)!r}), pathlib.Path({str(run)!r})
if marker.exists():
    sys.exit(3)
marker.touch()
run.mkdir(parents=True)
(run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in {rows!r}))
g = subprocess.Popen(["sleep", "600"])
pathlib.Path({str(pids)!r}).write_text(str(g.pid))
time.sleep(600)
"""
    dead: list[tuple[str, int]] = []

    def watched():
        return [] if dead else [("lam0", 1, run)]

    code = L.supervise(
        [sys.executable, "-c", script], watched, lambda a, s: dead.append((a, s)), poll_s=0.2
    )
    assert code == 3 and dead == [("lam0", 1)]
    grandchild = int(pids.read_text())
    for _ in range(50):  # the group was signalled; the zombie is reaped by init shortly
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        state = subprocess.run(["ps", "-o", "stat=", "-p", str(grandchild)], capture_output=True)
        if state.stdout.strip().startswith(b"Z"):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"grandchild {grandchild} still runs")


def test_the_lld_pilot_rule_takes_the_first_setting_that_kills_every_seed(tmp_path):
    C = _load("lld_collect")
    for setting, falls in (("a", (None, 20)), ("b", (20, 20))):
        for seed, fall in zip((100, 101), falls, strict=True):
            _lld_log(tmp_path / setting / "runs" / "lam0" / f"seed{seed}", fall=fall)
    pilot = {s: C.read_runs(tmp_path, tmp_path / s, steps=80) for s in ("a", "b")}
    assert C.setting_choice(pilot, ["a", "b"])["setting"] == "b"  # (a) killed one seed only
    assert C.setting_choice({"a": pilot["a"]}, ["a"])["setting"] == "a"  # ... the first with one
    unfinished = {"a": C.read_runs(tmp_path, tmp_path / "a", steps=100)}
    assert C.setting_choice(unfinished, ["a", "b"])["setting"] is None


def test_the_lld_pilot_choice_is_made_early_only_when_no_ending_can_change_it(tmp_path):
    C = _load("lld_collect")
    for seed in (100, 101):  # (a) finished without a collapse in either seed
        _lld_log(tmp_path / "a" / "runs" / "lam0" / f"seed{seed}", fall=None)
    # (b) still running, one seed fallen: whatever it shows, the rule ends at (b)
    _lld_log(tmp_path / "b" / "runs" / "lam0" / "seed100", fall=20, steps=60)
    _lld_log(tmp_path / "b" / "runs" / "lam0" / "seed101", fall=None, steps=40)
    pilot = {s: C.read_runs(tmp_path, tmp_path / s, steps=80) for s in ("a", "b")}
    assert not any(r.finished for r in pilot["b"])
    forced = C.setting_choice(pilot, ["a", "b"])
    assert forced["setting"] == "b" and "every way the unfinished runs of (b)" in forced["why"]
    assert C.setting_choice({"a": pilot["a"]}, ["a", "b"])["setting"] == "b"  # (b) not begun
    # with a third setting after (b), a fall in (b) or in (c) decides: undecided
    assert C.setting_choice(pilot, ["a", "b", "c"]) == {
        "setting": None,
        "why": "setting (b) not finished",
    }
    # (a) unfinished: its runs could still collapse and make (a) the choice
    one_open = {"a": C.read_runs(tmp_path, tmp_path / "a", steps=100), "b": pilot["b"]}
    assert C.setting_choice(one_open, ["a", "b"])["setting"] is None
