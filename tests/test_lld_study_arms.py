"""The LLD study's arms are override files of one recipe: each variant must change exactly the
one setting its name says against GRPO+LLDS, or the study compares more than it claims."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import lld_study

EXPECTED = {
    "GRPO": {"algo.llds.enabled": False},
    "GRPO+LLDS": {},
    "GRPO+LLDS-MA": {"algo.llds.mask_answer": True},
    "GRPO+LLDS-lam0.1": {"algo.llds.coef": 0.1},
    "GRPO+LLDS-lam0.01": {"algo.llds.coef": 0.01},
    "GRPO+LLDS-token": {"algo.llds.gate": "token"},
    "GRPO+LLDS-response": {"algo.llds.gate": "response"},
}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config(tmp_path: Path, arm: str) -> dict[str, Any]:
    cfg = lld_study.arm_config(tmp_path / "warm", tmp_path / "out", arm, 0)
    flat = _flat(dataclasses.asdict(cfg))
    flat.pop("run_dir")
    return flat


@pytest.mark.parametrize("arm", list(EXPECTED))
def test_each_arm_changes_only_what_its_name_says(tmp_path: Path, arm: str) -> None:
    assert set(lld_study.ARMS) == set(EXPECTED) and set(lld_study.COLORS) == set(EXPECTED)
    reference, config = _config(tmp_path, "GRPO+LLDS"), _config(tmp_path, arm)
    changed = {k: v for k, v in config.items() if v != reference[k]}
    assert changed == EXPECTED[arm]
    # the recipe itself: LLDS at lambda 0.2 on the action gate, 10 optimizer steps per batch
    assert reference["algo.llds.coef"] == 0.2 and reference["algo.llds.gate"] == "action"
    assert reference["optim.mini_batches"] == 10


def test_run_folders_of_the_arms_are_distinct(tmp_path: Path) -> None:
    dirs = {lld_study.run_dir(tmp_path, arm, 0) for arm in lld_study.ARMS}
    assert len(dirs) == len(lld_study.ARMS)
