"""The SmolLM2-wiki LoRA study's driver (`experiments/smollm2_wiki_lora/run.py`, its
`decisions.py` and `tables.py`) and its GPU route (`gpu.py`): the pilot's rules on hand-made
logs, the decisions, the plan and its refusals, and tiny LoRA runs parked, carried and resumed
to the very rows of a run never stopped."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from conftest import comparable
from llds.policy.lora import ADAPTER_DIR, ADAPTER_WEIGHTS
from llds.runs.tracking import read_metrics
from smollm2_wiki_lora import decisions as D
from smollm2_wiki_lora import gpu as G
from smollm2_wiki_lora import protocol as P
from smollm2_wiki_lora import run as R
from smollm2_wiki_lora import tables as T

PILOT = P.STAGES["pilot"]
COPY = ["rollout.dtype=bfloat16", "rollout.attn_implementation=llds_grouped"]


def _arm(arm: str, preset: str, step: float, overrides=()) -> dict[str, Any]:
    return {
        "arm": arm,
        "name": arm,
        "preset": preset,
        "overrides": list(overrides),
        "median_s": {p: 1.0 for p in P.PHASES} | {"step": step},
        "mismatch_k3_kl": 1e-4 if overrides else None,
        "checkpoint_bytes": 2**20,
    }


def bench(path: Path, *arms: dict[str, Any]) -> Path:
    """A benchmark `--json` file with `arms`."""
    data = {"machine": "a test", "command": "python benchmarks/smollm2_lora_step.py --json x"}
    path.write_text(json.dumps({**data, "arms": list(arms)}), encoding="utf-8")
    return path


def pilot_rows(ems: dict[int, float], *, reward=None, skipped_at=None, steps=30) -> list[dict]:
    """A pilot log: `ems` dev EM at their steps, reward 0.4 (or `reward(step)`), and a skipped
    update from step `skipped_at` on."""
    rows = []
    for s in range(1, steps + 1):
        row = {"step": s, "reward/mean": 0.4 if reward is None else reward(s)}
        row["optim/skipped_total"] = int(skipped_at is not None and s >= skipped_at)
        if s in ems:
            row["eval/em"] = ems[s]
        rows.append(row)
    return rows


def commit_log(results: Path, stage: str, arm: str, seed: int, rows: list[dict]) -> None:
    path = results / "runs" / stage / R.arm_dir_name(arm) / f"seed{seed}" / "metrics.jsonl.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_the_pilot_rules_on_hand_made_logs() -> None:
    """Decision 2 by hand: lr1e-4 has the highest mean but its reward collapses; lr2e-5 and
    lr5e-5 tie at 13/68 (summed in different orders) and the lower rate is chosen; rank 4
    replaces 16 at an equal mean, not below it, and never when it is out."""
    # 0.6 for steps 1-15, then 0.1: the 10-step median is 0.1 (<= half the 0.6 peak) from the
    # window of steps 12-21 on, which holds six lows; steps 11-20 hold five: median 0.35
    collapsing = pilot_rows(
        {10: 30 / 68, 20: 30 / 68, 30: 30 / 68}, reward=lambda s: 0.6 if s <= 15 else 0.1
    )
    scores = {
        "lr2e-5": D.pilot_score(
            "lr2e-5", pilot_rows({10: 10 / 68, 20: 14 / 68, 30: 15 / 68}), PILOT
        ),
        "lr5e-5": D.pilot_score(
            "lr5e-5", pilot_rows({10: 13 / 68, 20: 13 / 68, 30: 13 / 68}), PILOT
        ),
        "lr1e-4": D.pilot_score("lr1e-4", collapsing, PILOT),
    }
    assert scores["lr1e-4"].collapse == 21
    assert scores["lr1e-4"].out == "its reward collapsed at step 21"
    assert scores["lr2e-5"].mean_em == pytest.approx(13 / 68) and scores["lr2e-5"].out is None
    assert D.choose_lr(scores) == "lr2e-5"
    # one more question at step 30 for lr5e-5: (13 + 13 + 14) / 3 / 68 > 13 / 68
    scores["lr5e-5"] = D.pilot_score(
        "lr5e-5", pilot_rows({10: 13 / 68, 20: 13 / 68, 30: 14 / 68}), PILOT
    )
    assert D.choose_lr(scores) == "lr5e-5"
    # ... unless it skipped an update for a non-finite loss
    skipped = pilot_rows({10: 13 / 68, 20: 13 / 68, 30: 14 / 68}, skipped_at=17)
    scores["lr5e-5"] = D.pilot_score("lr5e-5", skipped, PILOT)
    assert scores["lr5e-5"].out == "it skipped 1 update(s) for a non-finite loss"
    assert D.choose_lr(scores) == "lr2e-5"
    # the evaluations at step 0 and between the rule's steps are not read; a short log waits
    extra = pilot_rows({0: 1.0, 10: 0.1, 15: 1.0, 20: 0.2, 30: 0.3})
    assert D.pilot_score("x", extra, PILOT).mean_em == pytest.approx(0.2)
    assert D.pilot_score("x", pilot_rows({10: 0.1, 20: 0.2}, steps=25), PILOT).mean_em is None
    # rank: 4 at an equal mean (13/68 against 13/68, other sums), 16 below it or when 4 is out
    r16 = scores["lr2e-5"]
    equal = D.pilot_score("r4", pilot_rows({10: 12 / 68, 20: 13 / 68, 30: 14 / 68}), PILOT)
    below = D.pilot_score("r4", pilot_rows({10: 12 / 68, 20: 13 / 68, 30: 13 / 68}), PILOT)
    out = D.pilot_score("r4", pilot_rows({10: 0.5, 20: 0.5, 30: 0.5}, skipped_at=3), PILOT)
    assert [D.choose_rank(r16, s) for s in (equal, below, out)] == [4, 16, 16]


def test_decisions_from_the_benchmark_and_the_pilot_logs(tmp_path: Path, capsys) -> None:
    """Decision 1 is the LoRA arm with the shortest median step (full fine-tuning is not a
    choice; a tie goes to the arm listed first), recorded once; decisions 2 and 3 follow from
    the committed pilot logs as each becomes possible, and r4 is planned at the chosen rate."""
    results = tmp_path / "results"
    path = bench(
        tmp_path / "bench.json",
        _arm("full", "smollm2-wiki-rl", 50.0),
        _arm("lora", P.PRESET, 90.0),
        _arm("copy", P.PRESET, 80.0, COPY),
        _arm("shared", P.PRESET, 80.0, ["rollout.prefix_sharing=true"]),
    )
    R.main(["--decide-sampling", str(path), "--results", str(results)])
    made = json.loads((results / "decisions.json").read_text())["sampling"]
    assert (made["arm"], made["overrides"], made["bf16_copy"]) == ("copy", COPY, True)
    assert made["median_step_s"] == 80.0
    assert "**Chosen: copy** (median step 80.0 s" in (results / "decisions.md").read_text()
    R.main(["--decide-sampling", str(path), "--results", str(results)])  # the same: kept
    other = bench(tmp_path / "other.json", _arm("lora", P.PRESET, 70.0))
    with pytest.raises(SystemExit) as err:
        R.main(["--decide-sampling", str(other), "--results", str(results)])
    assert str(err.value) == (
        f"{results / 'decisions.json'}: decision 1 is recorded already (copy); it is not changed"
    )
    for bad, why in (
        (_arm("full", "smollm2-wiki-rl", 1.0), "no arm on the smollm2-wiki-lora"),
        ({"arm": "x", "preset": P.PRESET}, "arms[0] needs median_s.step"),
    ):
        with pytest.raises(SystemExit, match=re.escape(why)):
            D.sampling_decision({"arms": [bad]}, "b.json")

    # the three rank-16 runs complete: lr5e-5 has the highest mean, r4 is planned at its rate
    for arm, ems in (
        ("lr2e-5", (0.1, 0.1, 0.1)),
        ("lr5e-5", (0.2, 0.3, 0.1)),
        ("lr1e-4", (0.1, 0.2, 0.2)),
    ):
        commit_log(
            results, "pilot", arm, 100, pilot_rows(dict(zip((10, 20, 30), ems, strict=True)))
        )
    decisions = D.derive_decisions(results, PILOT)
    assert decisions["learning_rate"]["arm"] == "lr5e-5" and "rank" not in decisions
    inp = R.Inputs("model", tmp_path / "data", "index")
    r4 = R.plan(PILOT, inp, tmp_path / "work", results, decisions, 2)[-1]
    assert (r4["arm"], r4["run"]) == ("r4", True)
    assert (r4["config"].optim.lr, r4["config"].model.lora.r, r4["config"].model.lora.alpha) == (
        5e-5,
        4,
        8,
    )
    assert r4["config"].rollout.dtype == "bfloat16"  # decision 1 on every run
    # r4 complete, 0.2 on average as lr5e-5: rank 4; its median k3 KL 1e-3 (of 5e-4, 1e-3,
    # 2e-3 repeated) reaches the floor: truncated importance sampling
    rows = pilot_rows({10: 0.2, 20: 0.2, 30: 0.2})
    for i, row in enumerate(rows):
        row[P.K3_KEY] = (5e-4, 1e-3, 2e-3)[i % 3]
    commit_log(results, "pilot", "r4", 100, rows)
    decisions = D.derive_decisions(results, PILOT)
    assert decisions["rank"]["rank"] == 4 and decisions["rank"]["pilot_run"] == "r4"
    assert decisions["correction"]["k3_kl_median"] == 1e-3
    assert decisions["correction"]["overrides"] == list(D.TIS)
    text = (results / "decisions.md").read_text()
    assert "**Learning rate: 5e-05** (lr5e-5)" in text and "**Rank: 4**" in text
    assert "**truncated importance sampling, cap 2** (pilot run r4: median" in text
    # below the floor, or without a bf16 copy, nothing is corrected
    assert D.correction_decision(made, "r4", 9.9e-4)["overrides"] == []
    assert D.correction_decision({"bf16_copy": False}, "r4", 0.5)["overrides"] == []
    # a committed log that no longer gives the recorded decision stops the call in one line
    commit_log(results, "pilot", "lr2e-5", 100, pilot_rows({10: 0.9, 20: 0.9, 30: 0.9}))
    with pytest.raises(SystemExit, match=re.escape("decision (['optim.lr=5e-05']) differs from")):
        D.derive_decisions(results, PILOT)


def _readiness(path: Path, em: float, *, model: str, split: str = "dev") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"model": model, "split": split, "readiness": {"em": em, "questions": 68}}
    path.write_text(json.dumps(record), encoding="utf-8")
    return path


def test_amendment_1_adopts_a_lora_warm_start_from_10_of_68_on_dev(tmp_path: Path) -> None:
    """The LoRA warm start replaces the full one at greedy dev EM >= 0.191 - 0.048: 10/68
    (0.147) is adopted, 9/68 (0.132) is not, and the pilot refuses to keep the latter's
    readiness in one line; a full warm start needs no rule; dev only."""
    assert abs(D.ADOPT_EM - (0.191 - (0.191 * 0.809 / 68) ** 0.5)) < 1e-3
    lora = str(tmp_path / "w" / ADAPTER_DIR)
    assert D.warm_start_adopted({"split": "dev", "readiness": {"em": 10 / 68}}, "x")
    assert not D.warm_start_adopted({"split": "dev", "readiness": {"em": 9 / 68}}, "x")
    with pytest.raises(SystemExit, match="x: measured on 'test'; the rule reads dev"):
        D.warm_start_adopted({"split": "test", "readiness": {"em": 0.5}}, "x")
    with pytest.raises(SystemExit, match=r"x: no readiness\.em"):
        D.warm_start_adopted({"split": "dev"}, "x")
    results = tmp_path / "results"
    low = _readiness(tmp_path / "w" / "readiness.json", 9 / 68, model=lora)
    with pytest.raises(SystemExit) as err:
        R.readiness(results, low)
    assert "greedy dev EM 0.132, below amendment 1's 0.143" in str(err.value)
    assert "\n" not in str(err.value) and not (results / R.WARM_START).exists()
    R.readiness(results, _readiness(low, 10 / 68, model=lora))
    assert json.loads((results / R.WARM_START).read_text())["readiness"]["em"] == 10 / 68
    full = tmp_path / "full" / "readiness.json"
    R.readiness(tmp_path / "r2", _readiness(full, 0.05, model=str(tmp_path / "sft" / "model")))
    assert (tmp_path / "r2" / R.WARM_START).is_file()


def _dry_run(capsys, *args: str) -> list[dict]:
    capsys.readouterr()
    R.main([*args, "--dry-run"])
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def test_the_plan_its_order_and_the_refusals_before_the_decisions(tmp_path: Path, capsys) -> None:
    results, work = tmp_path / "results", tmp_path / "work"
    common = ["--results", str(results), "--work", str(work), "--data", str(tmp_path / "d")]
    for stage, missing in (("pilot", "decision 1"), ("study", "decision 1")):
        with pytest.raises(SystemExit) as err:
            R.main(["--stage", stage, *common, "--dry-run"])
        line = str(err.value)
        assert line.startswith(
            f"{stage}: not started: {results / 'decisions.json'} has no {missing}"
        )
        assert "\n" not in line
    with pytest.raises(SystemExit):
        R.main(["--stage", "pilot", "--parallel", "3", *common])
    assert "--parallel: 1 or 2" in capsys.readouterr().err

    D.decide_sampling(results, bench(tmp_path / "b.json", _arm("copy", P.PRESET, 9.0, COPY)))
    pilot = _dry_run(capsys, "--stage", "pilot", *common)
    assert [(r["arm"], r["seed"], r["run"]) for r in pilot] == [
        ("lr2e-5", 100, True),
        ("lr5e-5", 100, True),
        ("lr1e-4", 100, True),
        ("r4", 100, False),
    ]
    assert pilot[3]["config"] is None and "learning rate" in pilot[3]["waits"]
    for r, lr in zip(pilot[:3], (2e-5, 5e-5, 1e-4), strict=True):
        c = r["config"]
        assert (c["optim"]["lr"], c["model"]["lora"]["r"], c["model"]["lora"]["alpha"]) == (
            lr,
            16,
            32,
        )
        assert (c["steps"], c["eval_every"], c["seed"], c["algo"]["llds"]["enabled"]) == (
            30,
            10,
            100,
            False,
        )
        assert c["data"]["eval"] == str(tmp_path / "d" / "dev.jsonl")
        assert c["rollout"]["dtype"] == "bfloat16"  # decision 1
    with pytest.raises(SystemExit) as err:
        R.main(["--stage", "study", *common, "--dry-run"])
    assert "has no decision 2's learning rate" in str(err.value)
    assert "no decision 3" in str(err.value)

    rule = {"scores": {}, "rule": "by hand"}
    decisions = D.read_decisions(results) | {
        "learning_rate": {"arm": "lr1e-4", "lr": 1e-4, "overrides": ["optim.lr=0.0001"], **rule},
        "rank": {"rank": 16, "overrides": D.rank_overrides(16), "pilot_run": "lr1e-4", **rule},
        "correction": D.correction_decision(D.read_decisions(results)["sampling"], "lr1e-4", 2e-3),
    }
    D.write_decisions(results, decisions)
    commit_log(
        results, "study", "GRPO", 0, [{"step": s, "reward/mean": 0.5} for s in range(1, 121)]
    )
    commit_log(
        results, "study", "GRPO+LLDS", 1, [{"step": s, "reward/mean": 0.5} for s in range(1, 41)]
    )
    study = _dry_run(capsys, "--stage", "study", *common)
    assert [(r["arm"], r["seed"], r["committed_steps"], r["run"]) for r in study] == [
        ("GRPO", 0, 120, False),
        ("GRPO+LLDS", 0, 0, True),
        ("GRPO", 1, 0, True),
        ("GRPO+LLDS", 1, 40, True),
        ("GRPO", 2, 0, True),
        ("GRPO+LLDS", 2, 0, True),
    ]
    for r in study:
        c = r["config"]
        assert (c["steps"], c["eval_every"], c["seed"], c["optim"]["lr"]) == (
            120,
            40,
            r["seed"],
            1e-4,
        )
        assert c["algo"]["llds"]["enabled"] == (r["arm"] == "GRPO+LLDS")
        assert c["algo"]["rollout_correction"] == {"mode": "tis", "level": "token", "cap": 2.0}
        assert c["rollout"]["dtype"] == "bfloat16" and c["model"]["lora"]["r"] == 16
        assert c["data"]["eval"] == str(tmp_path / "d" / "test_transfer" / "eval.jsonl")
        assert c["run_dir"] == str(work / "study" / R.arm_dir_name(r["arm"]) / f"seed{r['seed']}")
    assert not work.exists()  # a dry run makes nothing


def test_the_study_answers_from_hand_made_evaluations(tmp_path: Path) -> None:
    """The yes rule and the permutation test on hand-made step-120 scores: warm test EM 0.2 on
    100 questions (one SE 0.04); GRPO's median 0.26 (+0.06 > 0.04 and >= 0.05): yes; every
    GRPO+LLDS seed above every GRPO seed and the medians 0.07 apart: higher in every seed, p
    = 2/20 = 0.10 (two of the 20 splits of six runs are as extreme)."""
    results = tmp_path / "results"

    def scores(test: float, transfer: float) -> dict:
        return {
            "overall": {"n": 200, "em": 0.0},
            "by_source": {
                "held-out": {"n": 100, "em": test},
                "transfer": {"n": 100, "em": transfer},
            },
        }

    step0 = results / "runs" / "study" / "step0"
    step0.mkdir(parents=True)
    (step0 / "eval.json").write_text(json.dumps({"0": scores(0.2, 0.5)}))
    grpo, llds = (0.25, 0.26, 0.30), (0.31, 0.33, 0.35)
    for arm, ems in (("GRPO", grpo), ("GRPO+LLDS", llds)):
        for seed, em in enumerate(ems):
            commit_log(
                results,
                "study",
                arm,
                seed,
                [{"step": s, "reward/mean": 0.5} for s in range(1, 121)],
            )
            base = results / "runs" / "study" / R.arm_dir_name(arm) / f"seed{seed}"
            (base / "eval.json").write_text(json.dumps({"120": scores(em, 0.5 + em - 0.2)}))
    summary = T.study_summary(results, P.STAGES["study"])
    assert summary["answer"] == "yes" and summary["warm_start"]["test_se"] == pytest.approx(0.04)
    assert summary["test"]["grpo_gain"] == pytest.approx(0.06)
    assert summary["test"]["at_step"] == {
        "GRPO": dict(zip("012", grpo, strict=True)),
        "GRPO+LLDS": dict(zip("012", llds, strict=True)),
    }
    assert summary["test"]["spread"]["GRPO"]["mean"] == pytest.approx(0.27)
    v = summary["test"]["llds_vs_grpo"]
    assert v["p"] == pytest.approx(0.1) and v["median_difference"] == pytest.approx(0.07)
    assert v["verdict"] == "higher in every seed (p = 0.10)" == summary["llds_answer"]
    # transfer: warm 0.5 (SE 0.05), GRPO's median +0.06: above one SE and 0.05: yes
    assert summary["transfer"]["grpo_improves"] == "yes"
    # every GRPO+LLDS seed above every GRPO seed, but the medians 0.042 apart (not > 0.05);
    # then one GRPO+LLDS seed below a GRPO seed: no difference measured either way
    for seed, em in enumerate((0.301, 0.302, 0.35)):
        path = results / "runs" / "study" / "GRPO_LLDS" / f"seed{seed}" / "eval.json"
        path.write_text(json.dumps({"120": scores(em, 0.6)}))
    v = T.study_summary(results, P.STAGES["study"])["test"]["llds_vs_grpo"]
    assert v["llds_above_grpo_in_every_seed"] and v["median_difference"] == pytest.approx(0.042)
    assert v["verdict"] == "no difference measured"
    (results / "runs" / "study" / "GRPO_LLDS" / "seed0" / "eval.json").write_text(
        json.dumps({"120": scores(0.29, 0.6)})
    )
    v = T.study_summary(results, P.STAGES["study"])["test"]["llds_vs_grpo"]
    assert not v["llds_above_grpo_in_every_seed"] and v["verdict"] == "no difference measured"
    # a GRPO seed short of step 120: no answer
    shutil.rmtree(results / "runs" / "study" / "GRPO" / "seed2")
    summary = T.study_summary(results, P.STAGES["study"])
    assert summary["answer"] == "incomplete" and summary["llds_answer"] == "incomplete"


SMOKE_BENCH = (_arm("lora", P.PRESET, 1.0),)
"""decision 1 for the tiny runs: the preset as committed (what gpu.py --smoke stands in)"""


def _adapter(run: Path, step: int) -> bytes:
    return (run / "checkpoints" / f"step_{step:06d}" / ADAPTER_DIR / ADAPTER_WEIGHTS).read_bytes()


def smoke_pilot_args(results: Path, work: Path) -> list[str]:
    """`run.py`'s arguments for the smoke pilot's first run, lr2e-5, on one thread."""
    return [
        *("--smoke", "--stage", "pilot", "--arms", "lr2e-5", "--threads", "1"),
        *("--results", str(results), "--work", str(work)),
    ]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[str, Any]:
    """The smoke pilot's first run, lr2e-5, through the driver without a stop."""
    root = tmp_path_factory.mktemp("straight")
    results, work = root / "results", root / "work"
    D.decide_sampling(results, bench(root / "b.json", *SMOKE_BENCH))
    R.main(smoke_pilot_args(results, work))
    run = work / "pilot" / "lr2e-5" / "seed100"
    return {"rows": comparable(read_metrics(run)), "adapter": _adapter(run, 2), "results": results}


def test_a_parked_lora_run_resumes_through_the_driver_bit_identically(straight, tmp_path) -> None:
    """A tiny LoRA run stopped after step 1 of 2, parked (its newest checkpoint only: the
    adapter, AdamW state, RNG and step), its work folder gone: the driver unparks it, resumes
    it to the straight run's rows and adapter bytes, and retires the archive."""
    results, work = tmp_path / "results", tmp_path / "work"
    D.decide_sampling(results, bench(tmp_path / "b.json", *SMOKE_BENCH))
    shutil.copytree(
        straight["results"] / "runs" / "pilot" / "step0", results / "runs" / "pilot" / "step0"
    )
    smoke = P.SMOKE_STAGES["pilot"]
    inp = R.smoke_inputs(work / "smoke-inputs")
    first = R.plan(smoke, inp, work, results, D.read_decisions(results), 1, ["lr2e-5"])[0]
    left, taken = R.train_in_process([first["config"]], max_steps=1)
    assert taken == 1 and len(left) == 1
    common = smoke_pilot_args(results, work)
    R.main([*common, "--park"])
    archive = results / "parked" / "pilot" / "lr2e-5" / "seed100.tar.gz"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert {n.split("/")[1] for n in names if n.startswith("checkpoints/")} == {"step_000001"}
    assert {n.split("/")[-1] for n in names if n.startswith("checkpoints/step_000001/")} >= {
        ADAPTER_DIR,
        ADAPTER_WEIGHTS,
        "optim.pt",
        "trainer_state.json",
        "manifest.json",
    }
    assert not any(n.startswith("checkpoints/step_000001/model") for n in names)  # no merged
    assert "metrics.jsonl" in names and "checkpoints/latest" not in names
    log = results / "runs" / "pilot" / "lr2e-5" / "seed100" / "metrics.jsonl.gz"
    assert [r["step"] for r in P.stage_rows(results, "pilot", "lr2e-5", 100)] == [1]

    shutil.rmtree(work / "pilot")  # a new machine
    R.main(common)
    run = work / "pilot" / "lr2e-5" / "seed100"
    assert comparable(read_metrics(run)) == straight["rows"]
    assert _adapter(run, 2) == straight["adapter"]
    assert not archive.exists()  # complete: retired
    machines = [json.loads(x) for x in (log.parent / "machines.jsonl").open()]
    assert [m["from_step"] for m in machines] == [1]


def test_gpu_smoke_round_trip_carries_the_runs_under_the_limit(straight, tmp_path) -> None:
    """State in (the decisions), one step, state out with the unfinished run parked at step 1;
    that state in again, one step: the run completes to the straight run's rows, its archive
    retired; each state under 64 MiB and each call's progress written."""
    start = tmp_path / "start"
    D.decide_sampling(start, bench(tmp_path / "b.json", *SMOKE_BENCH))
    state0 = tmp_path / "state0.tar"
    with tarfile.open(state0, "w") as tar:
        tar.add(start / "decisions.json", arcname="decisions.json")
    common = ["--smoke", "--budget-s", "600", "--reserve-s", "1"]
    G.main(
        [
            *common,
            "--resume",
            str(state0),
            "--out",
            str(tmp_path / "d1"),
            "--results",
            str(tmp_path / "o1"),
            "--max-steps",
            "1",
        ]
    )
    state1 = tmp_path / "o1" / "state.tar"
    assert state1.stat().st_size < G.STATE_LIMIT
    with tarfile.open(state1) as tar:
        names = set(tar.getnames())
        log = tar.extractfile("runs/pilot/lr2e-5/seed100/metrics.jsonl.gz").read()
    assert "parked/pilot/lr2e-5/seed100.tar.gz" in names and "decisions.json" in names
    assert [json.loads(x)["step"] for x in gzip.decompress(log).splitlines()] == [1]
    events = [json.loads(x)["event"] for x in (tmp_path / "o1" / "progress.jsonl").open()]
    assert events[0] == "start" and events[-1] == "done" and "step 0 evaluation" in events

    G.main(
        [
            *common,
            "--resume",
            str(state1),
            "--out",
            str(tmp_path / "d2"),
            "--results",
            str(tmp_path / "o2"),
            "--max-steps",
            "1",
        ]
    )
    state2 = tmp_path / "o2" / "state.tar"
    assert state2.stat().st_size < G.STATE_LIMIT
    back = tmp_path / "back"
    with tarfile.open(state2) as tar:
        assert not any(n.startswith("parked/") for n in tar.getnames())
        tar.extractall(back, filter="data")
    rows = P.stage_rows(back, "pilot", "lr2e-5", 100)
    assert comparable(rows) == straight["rows"]
    machines = [json.loads(x) for x in (back / "runs/pilot/lr2e-5/seed100/machines.jsonl").open()]
    assert [m["from_step"] for m in machines] == [0, 1]
    assert "Rank: not yet." in (back / "pilot.md").read_text()
    with tarfile.open(tmp_path / "o2" / "logs.tar.gz") as tar:
        assert "runs/pilot/lr2e-5/seed100/metrics.jsonl.gz" in tar.getnames()


def test_the_state_carries_the_parked_runs_that_fit_in_order(tmp_path: Path) -> None:
    """Two parked runs of 40 and 30 MiB: the first in the protocol's order is carried, the
    second left behind and named."""
    results = tmp_path / "results"
    order = [("study/GRPO", 0), ("study/GRPO_LLDS", 0)]
    for (arm, seed), mib in zip(order[::-1], (30, 40), strict=True):
        path = R.parked_archive(results, arm, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            f.truncate(mib * 2**20)
    (results / "decisions.json").write_text("{}")
    kept, behind = G.state_members(results, order[::-1])
    assert [p.relative_to(results).as_posix() for p in kept] == [
        "decisions.json",
        "parked/study/GRPO_LLDS/seed0.tar.gz",
    ]
    assert behind == ["study/GRPO/seed0.tar.gz"]
    kept, behind = G.state_members(results, order)
    assert kept[-1] == R.parked_archive(results, "study/GRPO", 0)
    assert behind == ["study/GRPO_LLDS/seed0.tar.gz"]
