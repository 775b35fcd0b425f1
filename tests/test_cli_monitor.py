"""`llds monitor replay`: the alarms of any run folder (native, TRL, veRL) with the run's own
saved monitor settings or others, as text or one JSON object per line. In-process through
`llds.cli.main`.

The log: reward 0.2 for steps 1-20, 0.6 to step 60, 0.3 after (`reward_fall` fires at step 66,
as counted in tests/test_monitor_registry.py), and the sampler's mean |log-prob difference|
0.03 to step 40, 0.12 after (`sampler_mismatch` at step 45).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llds.cli import main
from llds.io import write_json, write_jsonl
from llds.monitor.alarms import scan_alarms

STEPS = 100
LINE_KEYS = ["step", "kind", "severity", "mechanism", "message"]


def reward(step: int) -> float:
    return 0.2 if step <= 20 else 0.6 if step <= 60 else 0.3


def native_rows() -> list[dict[str, Any]]:
    return [
        {
            "step": s,
            "reward/mean": reward(s),
            "mismatch/abs_logp_diff_mean": 0.03 if s <= 40 else 0.12,
        }
        for s in range(1, STEPS + 1)
    ]


def native_run(root: Path, monitor: dict[str, Any] | None = None) -> Path:
    """A run directory; with `monitor`, a checkpoint's trainer state whose saved config has
    that monitor section (where the trainer keeps its config)."""
    run = root / "run"
    write_jsonl(run / "metrics.jsonl", native_rows())
    if monitor is not None:
        state = run / "checkpoints" / "step_000100" / "trainer_state.json"
        write_json(state, {"config": {"steps": STEPS, "monitor": monitor}})
    return run


def replay(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["monitor", "replay", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def json_alarms(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_json_lines_are_the_monitors_alarms(tmp_path, capsys) -> None:
    run = native_run(tmp_path)
    rc, out, err = replay([str(run), "--json"], capsys)
    assert rc == 0, err
    lines = json_alarms(out)
    assert all(list(line) == LINE_KEYS for line in lines)
    assert lines == [a.to_line() for a in scan_alarms(native_rows())]
    by_kind = {line["kind"]: line for line in lines}
    assert by_kind["sampler_mismatch"]["step"] == 45
    assert by_kind["sampler_mismatch"]["mechanism"] == "mismatch"
    assert by_kind["reward_fall"]["step"] == 66
    assert by_kind["reward_fall"]["severity"] == "warning"
    assert "the defaults (the run saved no config)" in err


def test_text_output_ends_with_the_counts(tmp_path, capsys) -> None:
    rc, out, _ = replay([str(native_run(tmp_path))], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert any(
        line.startswith("step    45  warning   sampler_mismatch [mismatch]: ") for line in lines
    )
    n = len(scan_alarms(native_rows()))
    assert lines[-1].startswith(f"{n} alarm(s) over {STEPS} logged steps: ")


def test_the_runs_saved_settings_then_the_file_then_overrides(tmp_path, capsys) -> None:
    saved = {"alarms": {"reward_fall": {"enabled": False}}}
    run = native_run(tmp_path, monitor=saved)
    rc, out, err = replay([str(run), "--json"], capsys)
    assert rc == 0, err
    kinds = {a["kind"] for a in json_alarms(out)}
    assert "reward_fall" not in kinds and "sampler_mismatch" in kinds
    assert "the monitor section of" in err and "trainer_state.json" in err
    # a training-config file: its monitor section is read, its other keys are not
    other = tmp_path / "train.yaml"
    monitor = {"alarms": {"reward_fall": {"enabled": True, "fall": 0.8}}}
    other.write_text(yaml.safe_dump({"steps": 5, "model": {"path": "x"}, "monitor": monitor}))
    rc, out, _ = replay([str(run), "--config", str(other), "--json"], capsys)
    assert rc == 0 and "reward_fall" not in {a["kind"] for a in json_alarms(out)}  # 0.8: none
    rc, out, _ = replay(
        [str(run), "--config", str(other), "monitor.alarms.reward_fall.fall=0.5", "--json"],
        capsys,
    )
    assert [a["step"] for a in json_alarms(out) if a["kind"] == "reward_fall"] == [66]


def test_a_bad_setting_is_one_line_naming_the_file_and_key(tmp_path, capsys) -> None:
    run = native_run(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"monitor": {"alarms": {"void_turns": {"rise": 0.5}}}}))
    rc, out, err = replay([str(run), "--config", str(bad)], capsys)
    assert rc == 2 and out == ""
    assert err.startswith(f"llds monitor replay: error: {bad}: monitor.alarms.void_turns.rise: ")
    assert len(err.strip().splitlines()) == 1
    none = tmp_path / "none.yaml"
    none.write_text("steps: 5\n")
    rc, _, err = replay([str(run), "--config", str(none)], capsys)
    assert rc == 2 and "no `monitor:` section" in err


def test_trl_and_verl_folders_replay_like_the_native_log(tmp_path, capsys) -> None:
    expected = [a.to_line() for a in scan_alarms(native_rows())]
    trl = tmp_path / "trl_out"
    history = [
        {
            "step": r["step"],
            "reward": r["reward/mean"],
            "sampling/sampling_logp_difference/mean": r["mismatch/abs_logp_diff_mean"],
        }
        for r in native_rows()
    ]
    write_json(trl / "trainer_state.json", {"log_history": history})
    verl = tmp_path / "verl" / "exp.jsonl"
    write_jsonl(
        verl,
        [
            {"step": r["step"], "data": {"critic/score/mean": r["reward/mean"]}}
            for r in native_rows()
        ],
    )
    rc, out, err = replay([str(trl), "--json"], capsys)
    assert rc == 0, err
    assert json_alarms(out) == expected and "(trl log)" in err
    rc, out, err = replay([str(verl), "--json"], capsys)
    assert rc == 0, err
    assert json_alarms(out) == [a for a in expected if a["kind"] != "sampler_mismatch"]


def test_monitor_without_a_word_lists_its_words(capsys) -> None:
    assert main(["monitor"]) == 2
    assert "replay" in capsys.readouterr().err
    assert main(["monitor", "--help"]) == 0
    assert "replay" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["monitor", "replay", "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "monitor.alarms.reward_fall.fall (float; default 0.5)" in shown
