"""Broken model directories, through the real command line: a directory without its tokenizer,
a `model.safetensors` cut short, no weights, a mistyped local path, and a hub id that is not in
the local cache while the hub is off or out of reach. Each command that loads a model (train,
eval, probe, sft) refuses it before any work, in one line naming the key and the problem, at
once (no hub lookups for a path; one short request for a hub id, not transformers' 50 s of
retries), writing nothing."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
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


HUB_RUN = """
import json, sys
from llds.cli import main
code = main(%r)
heavy = [m for m in ("torch", "transformers") if m in sys.modules]
print(json.dumps({"code": code, "heavy": heavy}))
"""


@pytest.mark.parametrize(
    ("name", "hub"),
    [
        ("train", "offline"),
        ("train", "unreachable"),
        ("eval", "offline"),
        ("probe", "unreachable"),
        ("sft", "offline"),
    ],
)
def test_a_hub_id_not_in_the_cache_is_one_line_at_once(
    inputs,  # noqa: F811
    previous_run,  # noqa: F811
    tmp_path,
    name,
    hub,
) -> None:
    """An empty Hugging Face cache, and the hub either switched off (`HF_HUB_OFFLINE=1`) or
    at an address where nothing listens: once 50 s and 24 lines of transformers' retries."""
    from test_retrieval_server import free_port

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_HUB_CACHE"] = str(tmp_path / "hf-cache")
    if hub == "offline":
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
    out = previous_run if name == "train" else tmp_path / "out"
    args = command(name, inputs, "llds-test/no-such-model", out)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, "-c", HUB_RUN % (args,)], env=env, capture_output=True, text=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert (result["code"], result["heavy"]) == (2, []), proc.stderr
    [line] = proc.stderr.strip().splitlines()
    key = "model.path" if name == "train" else "model"
    assert line.startswith(
        f"llds {name}: error: {key}: 'llds-test/no-such-model' is not in the local Hugging "
        f"Face cache ({tmp_path / 'hf-cache'}), and "
    ), line
    why = "HF_HUB_OFFLINE is set" if hub == "offline" else f"{env.get('HF_ENDPOINT')} cannot be"
    assert why in line and "`hf download llds-test/no-such-model`" in line, line
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    assert cpu < 2.5, f"{cpu:.2f} s of CPU before the line"
    if name == "train":
        assert_untouched(previous_run)
    else:
        assert not out.exists()


CACHED = """
from llds.models.hf import check_model_source, load_policy
check_model_source("model.path", "llds-test/tiny")
model, tokenizer = load_policy("llds-test/tiny")
print(type(model).__name__, tokenizer.__class__.__name__)
"""


def test_a_cached_hub_id_passes_and_loads_offline(inputs, tmp_path) -> None:  # noqa: F811
    """A hub id in the cache's layout (refs/main -> snapshots/<commit>/) passes the check, and
    it is where transformers itself loads it from, with the hub off."""
    cache = tmp_path / "hf-cache"
    repo = cache / "models--llds-test--tiny"
    commit = "0" * 40
    shutil.copytree(inputs / "model", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CACHED], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "ForCausalLM" in proc.stdout
