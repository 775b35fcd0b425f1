"""The demo evaluates each arm's newest checkpoint that passes its manifest check: a damaged
newer one is passed over, and a run with none is an error that names every problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llds.demo import final_checkpoint
from llds.errors import UserInputError
from llds.train.checkpoint import TRAINER_STATE, publish_checkpoint, stage_checkpoint


def _publish(root: Path, step: int) -> Path:
    tmp = stage_checkpoint(root, step)
    (tmp / TRAINER_STATE).write_text(json.dumps({"step": step}), encoding="utf-8")
    (tmp / "weights.bin").write_bytes(bytes(range(256)) * 4)
    return publish_checkpoint(root, step, tmp, keep=5)


def test_the_newest_intact_checkpoint_is_evaluated(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    older, newer = _publish(root, 2), _publish(root, 4)
    assert final_checkpoint(tmp_path) == newer
    (newer / "weights.bin").write_bytes(b"torn")  # a crash while the files were copied
    assert final_checkpoint(tmp_path) == older


def test_no_intact_checkpoint_names_each_problem(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="none written"):
        final_checkpoint(tmp_path)
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        (_publish(root, step) / "weights.bin").write_bytes(b"torn")
    with pytest.raises(UserInputError, match=r"step_000004: weights\.bin has 4 bytes.*step_000002"):
        final_checkpoint(tmp_path)
