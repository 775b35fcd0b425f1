"""What `llds report` reads about a run besides its metrics: saved settings and held-out EM."""

from __future__ import annotations

import pytest

from llds.errors import DataFormatError
from llds.io import write_json, write_yaml
from llds.report.run_info import (
    differing_keys,
    format_setting,
    held_out,
    load_config,
    resolve_model_dir,
    settings_rows,
)


def _eval(path, em, n=40):
    scores = {"em": em, "f1": em, "sub_em": em, "valid_searches": 1.0, "answered": 1.0}
    write_json(path, {"overall": {"n": n, **scores}})


def test_config_from_yaml_else_newest_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert load_config(run) is None
    for step, lr in ((10, 1e-5), (20, 2e-5)):
        state = {"step": step, "config": {"optim": {"lr": lr}}}
        write_json(run / "checkpoints" / f"step_{step:06d}" / "trainer_state.json", state)
    assert load_config(run) == {"optim": {"lr": 2e-5}}
    write_yaml(run / "config.yaml", {"optim": {"lr": 3e-5}})
    assert load_config(run) == {"optim": {"lr": 3e-5}}
    (run / "config.yaml").write_text("- just a list\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"config\.yaml"):
        load_config(run)


def test_differences_ignore_run_dir_and_count_missing_keys():
    a = {"run_dir": "a", "seed": 0, "algo": {"llds": {"enabled": False}}}
    b = {"run_dir": "b", "seed": 0, "algo": {"llds": {"enabled": True}}, "model": {"lora": None}}
    assert differing_keys([a, b]) == ["algo.llds.enabled", "model.lora"]
    assert differing_keys([a, None]) == []  # one config: nothing to compare
    rows = settings_rows([a, b])
    assert ("seed", "seed", False) in rows
    assert ("algo.llds.enabled", "LLDS regularizer", True) in rows
    assert format_setting(True) == "on" and format_setting(2e-5) == "2e-05"


def test_warm_start_found_after_the_tree_moved(tmp_path):
    """The config holds paths relative to where training ran; the tree has since moved."""
    moved = tmp_path / "elsewhere"
    config = {"run_dir": "runs/demo/grpo", "model": {"path": "runs/demo/sft/model"}}
    (moved / "sft" / "model").mkdir(parents=True)
    _eval(moved / "sft" / "eval" / "step_000000.json", 0.3)
    _eval(moved / "grpo" / "eval" / "step_000050.json", 0.6)
    assert resolve_model_dir(moved / "grpo", config) == moved / "sft" / "model"
    held = held_out(moved / "grpo", config, last_step=50)
    assert held.baseline is not None and held.baseline.em == pytest.approx(0.3)
    assert held.baseline_label == "warm start"
    assert [(p.step, p.em) for p in held.points] == [(50, pytest.approx(0.6))]


def test_own_step_zero_eval_wins_and_checkpoint_start(tmp_path):
    other = tmp_path / "first"
    (other / "checkpoints" / "step_000030" / "model").mkdir(parents=True)
    _eval(other / "eval" / "step_000030.json", 0.45)
    run = tmp_path / "second"
    config = {"run_dir": str(run), "model": {"path": str(other / "checkpoints/step_000030/model")}}
    held = held_out(run, config, last_step=10)
    assert held.baseline is not None and held.baseline.em == pytest.approx(0.45)
    assert held.points == ()
    _eval(run / "eval" / "step_000000.json", 0.5)
    held = held_out(run, config, last_step=10)
    assert held.baseline_label == "step-0 evaluation" and held.baseline.em == pytest.approx(0.5)


def test_hub_model_and_legacy_eval(tmp_path):
    run = tmp_path / "old"
    _eval(run / "eval.json", 0.2)
    held = held_out(run, {"model": {"path": "Qwen/Qwen2.5-3B"}}, last_step=120)
    assert held.baseline is None
    assert [(p.step, p.em) for p in held.points] == [(120, pytest.approx(0.2))]
    _eval(run / "eval" / "step_000060.json", 0.0, n=0)  # scored nothing: not a point
    assert held_out(run, None, last_step=120).points == ()


def test_a_studys_eval_json_by_step(tmp_path):
    """The studies write `RUN/eval.json` as `{"step_N": {scores}}`: each is a held-out point,
    the newest the run's evaluation, and the whole run folder reports."""
    from llds.io import write_jsonl
    from llds.report.html import load_eval, write_report

    run = tmp_path / "seed1"
    scores = {"answered": 1.0, "f1": 0.7, "n": 200, "sub_em": 0.7, "valid_searches": 1.8}
    write_json(
        run / "eval.json",
        {"step_000050": {**scores, "em": 0.75}, "step_000025": {**scores, "em": 0.74}},
    )
    ho = held_out(run, None, last_step=60)
    assert [(p.step, p.em, p.n) for p in ho.points] == [(25, 0.74, 200), (50, 0.75, 200)]
    assert load_eval(run, 60).overall.em == 0.75
    write_jsonl(run / "metrics.jsonl", [{"step": s, "reward/mean": 0.5} for s in range(1, 61)])
    page = write_report([run], tmp_path / "report").read_text(encoding="utf-8")
    assert (
        "<b>seed1</b>: evaluated after markers only, too few points for a line; steps 25, 50"
        in page
    )
    write_json(run / "eval.json", {"step_000050": {"em": 0.75}})  # no count: named
    with pytest.raises(DataFormatError, match=r"eval\.json: step_000050: overall\.n"):
        held_out(run, None, last_step=60)


def test_every_committed_eval_json_is_read():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "experiments"
    folders = sorted({p.parent for p in root.rglob("eval.json")})
    assert len(folders) >= 39
    for folder in folders:
        assert held_out(folder, None, last_step=300).points, folder
