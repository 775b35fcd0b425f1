"""The collapse alarms inside TRL's trainer: built from the same monitor settings as the native
trainer (`llds_monitor_config`: a YAML file's `monitor:` section), fed with what TRL logs, and
written to OUTPUT_DIR/alarms.jsonl as the native trainer writes them; and the veRL driver's
helper on veRL's metric names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llds.errors import ConfigError
from llds.monitor.alarms import scan_alarms

pytest.importorskip("trl")  # the `trl` extra (installed by `make test`)

from conftest import make_tiny_model
from llds.integrations.trl import (
    LLDSGRPOConfig,
    LLDSGRPOTrainer,
    search_r1_reward,
    search_r1_rows,
)

STEPS = 100


def reward(step: int) -> float:
    return 0.2 if step <= 20 else 0.6 if step <= 60 else 0.3


def diff(step: int) -> float:
    return 0.03 if step <= 40 else 0.12


def native_rows() -> list[dict[str, Any]]:
    return [
        {"step": s, "reward/mean": reward(s), "mismatch/abs_logp_diff_mean": diff(s)}
        for s in range(1, STEPS + 1)
    ]


def settings(tmp_path: Path, **more: Any) -> LLDSGRPOConfig:
    return LLDSGRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        steps_per_generation=2,
        max_steps=2,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        **more,
    )


def trainer(tmp_path, tokenizer, world, args: LLDSGRPOConfig) -> LLDSGRPOTrainer:
    from datasets import Dataset

    rows = search_r1_rows(world.train[:4], "Question: {question}\nAnswer: ")
    return LLDSGRPOTrainer(
        model=make_tiny_model(tokenizer, seed=0),
        reward_funcs=search_r1_reward(),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )


def test_trl_logs_raise_the_native_alarms_into_alarms_jsonl(tmp_path, world_tokenizer, small_world):
    config = tmp_path / "monitor.yaml"
    config.write_text(yaml.safe_dump({"monitor": {"alarms": {"entropy_drift": {"low": 0.1}}}}))
    t = trainer(
        tmp_path, world_tokenizer, small_world, settings(tmp_path, llds_monitor_config=str(config))
    )
    assert t.llds_alarm_monitor is not None
    assert t.llds_alarm_monitor.monitor.config.alarms.entropy_drift.low == 0.1
    t.model.train()
    for s in range(1, STEPS + 1):  # what TRL's log receives each logging step
        t.state.global_step = s
        t.log({"reward": reward(s), "sampling/sampling_logp_difference/mean": diff(s)})
    t.log({"train_runtime": 1.0, "train_loss": 0.1})  # the closing summary is not a step
    lines = (tmp_path / "out" / "alarms.jsonl").read_text(encoding="utf-8").splitlines()
    written = [json.loads(line) for line in lines]
    assert {w.pop("action") for w in written} == {"warn"}
    expected = [a.to_dict() for a in scan_alarms(native_rows())]
    assert written == json.loads(json.dumps(expected))
    assert {w["kind"] for w in written} >= {"sampler_mismatch", "reward_fall"}
    assert t.llds_alarm_monitor.monitor.tracker.count == STEPS


def test_alarms_off_and_a_bad_monitor_file(tmp_path, world_tokenizer, small_world):
    t = trainer(tmp_path, world_tokenizer, small_world, settings(tmp_path, llds_alarms=False))
    assert t.llds_alarm_monitor is None
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"monitor": {"rearm_steps": 0}}))
    with pytest.raises(ConfigError, match=r"bad\.yaml: monitor\.rearm_steps: "):
        settings(tmp_path, llds_monitor_config=str(bad))


def test_verl_driver_helper_maps_verl_names():
    from llds.integrations.verl import alarm_monitor

    monitor = alarm_monitor()
    raised = []
    for s in range(1, STEPS + 1):
        raised += monitor.update(s, {"critic/score/mean": reward(s), "timing_s/step": 3.0})
    expected = [a for a in scan_alarms(native_rows()) if a.kind != "sampler_mismatch"]
    assert raised == expected
