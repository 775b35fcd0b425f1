"""Broken model directories, through the real command line: a directory without its tokenizer,
a `model.safetensors` cut short, no weights, and a mistyped local path. Each command that loads
a model (train, eval, probe, sft) refuses it before any work, in one line naming the key and
the problem, at once (no hub lookups for a path), writing nothing."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from llds.models.hf import safetensors_problem
from test_fault_injection_inputs import (
    assert_untouched,
    cli,
    error_line,
    inputs,  # noqa: F401 (a fixture)
    previous_run,  # noqa: F401 (a fixture)
)


def broken_copy(root: Path, tmp_path: Path, how: str) -> Path:
    """A copy of the tiny model directory, broken as `how` says."""
    model = tmp_path / f"model-{how}"
    shutil.copytree(root / "model", model)
    if how == "no tokenizer":
        for f in model.iterdir():
            if f.name.startswith(("tokenizer", "vocab", "merges", "special_tokens")):
                f.unlink()
    elif how == "truncated weights":
        weights = model / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) * 2 // 3])
    elif how == "no weights":
        (model / "model.safetensors").unlink()
    return model


WHY = {
    "no tokenizer": "has no tokenizer",
    "truncated weights": "model.safetensors is truncated",
    "no weights": "has no weights",
}


def command(name: str, root: Path, model: str, out: Path) -> list[str]:
    world = root / "world"
    if name == "train":
        return [
            "train",
            "--config",
            str(root / "cfg.yaml"),
            f"run_dir={out}",
            f"model.path={model}",
        ]
    if name == "sft":
        return ["sft", f"--model={model}", f"world={world}", f"out={out}"]
    data, corpus = str(world / "test.jsonl"), str(world / "corpus.jsonl")
    target = str(out / "eval.json") if name == "eval" else str(out)
    return [name, "--model", model, "--data", data, "--retriever", corpus, "--out", target]


@pytest.mark.parametrize("how", list(WHY))
@pytest.mark.parametrize("name", ["train", "eval", "probe", "sft"])
def test_a_broken_model_directory_is_one_line_before_any_work(
    inputs,  # noqa: F811
    previous_run,  # noqa: F811
    tmp_path,
    capsys,
    name,
    how,
) -> None:
    model = broken_copy(inputs, tmp_path, how)
    out = previous_run if name == "train" else tmp_path / "out"
    rc, output = cli(command(name, inputs, str(model), out), capsys)
    line = error_line(rc, output, name)
    assert output.strip().splitlines() == [line]  # nothing printed before it
    key = "model.path" if name == "train" else "model"
    assert line.startswith(f"llds {name}: error: {key}: ") and WHY[how] in line, line
    assert str(model) in line
    if name == "train":
        assert_untouched(previous_run)
    else:
        assert not out.exists()


@pytest.mark.parametrize("name", ["train", "eval", "probe", "sft"])
@pytest.mark.parametrize("typo", ["{root}/modle", "./no-such-model", "{rel}/modle"])
def test_a_mistyped_local_path_is_named_at_once(
    inputs,  # noqa: F811
    previous_run,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
    name,
    typo,
) -> None:
    """`runs/modle` (one slash, but `runs/` is here) is a path, not a hub id: no lookup."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    model = typo.format(root=inputs, rel="runs")
    out = previous_run if name == "train" else tmp_path / "out"
    started = time.perf_counter()
    rc, output = cli(command(name, inputs, model, out), capsys)
    line = error_line(rc, output, name)
    assert time.perf_counter() - started < 3
    assert output.strip().splitlines() == [line]
    assert f"{model!r} does not exist" in line or f"{model} does not exist" in line, line
    if name == "train":
        assert_untouched(previous_run)
    else:
        assert not out.exists()


def test_safetensors_header_check_by_hand(tmp_path) -> None:
    import json
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    whole = struct.pack("<Q", len(header)) + header + b"\0" * 16
    f = tmp_path / "m.safetensors"
    f.write_bytes(whole)
    assert safetensors_problem(f) is None
    f.write_bytes(whole[:-1])
    assert "tensors need" in safetensors_problem(f)
    f.write_bytes(whole[:20])
    assert "header alone needs" in safetensors_problem(f)
    f.write_bytes(b"\1\2")
    assert "no safetensors header" in safetensors_problem(f)
