"""Fault injection, part four (files): a corpus `.jsonl.gz` cut short or not gzip at all, a model
directory whose `config.json` is cut short or names an architecture transformers does not
know, a model whose weights hold a NaN, and an index without its passages. Each is one line
naming the file (and what is wrong with it), exit code 2, no traceback, and nothing written.
Through the real command line, in process."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from test_fault_injection_bad_inputs import no_model_load  # noqa: F401 (a fixture)
from test_fault_injection_inputs import (
    assert_untouched,
    cli,
    error_line,
    inputs,  # noqa: F401 (a fixture)
    previous_run,  # noqa: F401 (a fixture)
    train,
)


def _gz_corpus(path: Path, rows: int) -> bytes:
    text = "".join(
        json.dumps({"id": str(i), "contents": f"passage {i}"}) + "\n" for i in range(rows)
    )
    return gzip.compress(text.encode())


def test_index_of_a_gz_corpus_cut_short(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl.gz"
    data = _gz_corpus(corpus, 5000)
    corpus.write_bytes(data[: len(data) // 2])
    rc, out = cli(["index", f"corpus={corpus}", "--out", str(tmp_path / "index")], capsys)
    line = error_line(rc, out, "index")
    assert f"{corpus}: the compressed data ends early after line " in line
    assert "EOFError" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl.gz"]


def test_index_of_plain_text_named_gz(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl.gz"
    corpus.write_text('{"id": "1", "contents": "plain"}\n', encoding="utf-8")
    rc, out = cli(["index", f"corpus={corpus}", "--out", str(tmp_path / "index")], capsys)
    assert f"{corpus}: not a gzip file, though its name ends in .gz" in error_line(rc, out, "index")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl.gz"]


def _model_copy(root: Path, tmp_path: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(root / "model", model)
    return model


def _eval(root: Path, model: Path) -> list[str]:
    world = root / "world"
    data, corpus = world / "test.jsonl", world / "corpus.jsonl"
    return ["eval", "--model", str(model), "--data", str(data), "--retriever", str(corpus)]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda cfg: {**cfg, "model_type": "llamma"},
            "config.json names model_type 'llamma', which transformers ",
        ),
        (
            lambda cfg: {k: v for k, v in cfg.items() if k != "model_type"},
            "config.json has no model_type",
        ),
    ],
)
def test_a_config_json_transformers_cannot_build(
    inputs,  # noqa: F811
    tmp_path,
    capsys,
    no_model_load,  # noqa: F811
    edit,
    named,
):
    model = _model_copy(inputs, tmp_path)
    config = model / "config.json"
    config.write_text(json.dumps(edit(json.loads(config.read_text(encoding="utf-8")))))
    rc, out = cli(_eval(inputs, model), capsys)
    line = error_line(rc, out, "eval")
    assert f"model: model directory '{model}': {named}" in line
    if "llamma" in named:
        assert "did you mean 'llama'?" in line
    assert len(out.splitlines()) == 1  # not 41 lines from transformers


def test_a_config_json_cut_short(inputs, tmp_path, capsys, no_model_load):  # noqa: F811
    model = _model_copy(inputs, tmp_path)
    config = model / "config.json"
    text = config.read_text(encoding="utf-8")
    config.write_text(text[: len(text) // 2], encoding="utf-8")
    rc, out = cli(_eval(inputs, model), capsys)
    line = error_line(rc, out, "eval")
    assert f"model: model directory '{model}': config.json is not valid JSON" in line
    assert "neither a model directory" not in line


def _poison(model: Path, value: float) -> str:
    """One weight of the saved model set to `value`; returns the tensor's name."""
    weights = model / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(k for k in tensors if k.endswith("weight") and tensors[k].dim() == 2)[0]
    tensors[name].view(-1)[7] = value
    save_file(tensors, weights, metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_eval_of_a_model_with_non_finite_weights(inputs, tmp_path, capsys, value):  # noqa: F811
    model = _model_copy(inputs, tmp_path)
    name = _poison(model, value)
    out_file = tmp_path / "results.json"
    rc, out = cli([*_eval(inputs, model), "--out", str(out_file)], capsys)
    line = error_line(rc, out, "eval")
    kind = "NaN" if value != value else "Inf"
    assert f"its weights are not finite ({name}: 1 {kind} of " in line
    assert not out_file.exists()  # not an EM of 0


def test_train_from_a_model_with_nan_weights(inputs, previous_run, tmp_path, capsys):  # noqa: F811
    """Training from it once ran every step with its updates skipped and saved a NaN
    checkpoint; now it stops at load, the earlier run untouched."""
    model = _model_copy(inputs, tmp_path)
    name = _poison(model, float("nan"))
    rc, out = cli(train(inputs, previous_run, f"model.path={model}"), capsys)
    assert f"its weights are not finite ({name}: 1 NaN of " in error_line(rc, out, "train")
    assert_untouched(previous_run)


@pytest.mark.parametrize("part", ["docs.jsonl", "docs.offsets.npy", "bm25"])
def test_serve_an_index_without_a_part(inputs, tmp_path, capsys, part):  # noqa: F811
    index = tmp_path / "index"
    corpus = inputs / "world" / "corpus.jsonl"
    assert cli(["index", f"corpus={corpus}", "--out", str(index)], capsys)[0] == 0
    target = index / part
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    from test_retrieval_server import free_port

    rc, out = cli(["serve-retriever", "--index", str(index), "--port", str(free_port())], capsys)
    line = error_line(rc, out, "serve-retriever")
    assert f"{index}: the index has no {part}" in line
    assert "build it again with `llds index`" in line


def test_serve_an_index_whose_passages_were_cut_short(inputs, tmp_path, capsys):  # noqa: F811
    index = tmp_path / "index"
    corpus = inputs / "world" / "corpus.jsonl"
    assert cli(["index", f"corpus={corpus}", "--out", str(index)], capsys)[0] == 0
    docs = index / "docs.jsonl"
    size = docs.stat().st_size
    docs.write_bytes(docs.read_bytes()[: size // 2])
    from test_retrieval_server import free_port

    rc, out = cli(["serve-retriever", "--index", str(index), "--port", str(free_port())], capsys)
    line = error_line(rc, out, "serve-retriever")
    assert f"{docs}: {size // 2} bytes, but docs.offsets.npy says {size}" in line


def test_a_finite_model_still_loads(inputs):  # noqa: F811
    """The check passes weights that are whole (and says nothing)."""
    from llds.models.hf import load_policy, nonfinite_weight

    model, _ = load_policy(inputs / "model")
    assert nonfinite_weight(model) is None
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("-inf")
    assert "1 Inf of" in nonfinite_weight(model)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_weight_scan_counts_nan_and_inf_in_every_float_dtype(tmp_path, dtype):
    """Read from the file's bytes before anything loads: NaN and Inf told apart, as torch counts
    them, in every float dtype; finite extremes (the largest value, -0.0) are not flagged."""
    from llds.models.hf import safetensors_nonfinite

    info = torch.finfo(dtype)
    values = torch.tensor([1.0, info.max, -info.max, -0.0, info.tiny], dtype=dtype)
    ints = torch.arange(4, dtype=torch.int32)  # integer tensors are not scanned
    save_file({"a": values, "b": ints}, tmp_path / "ok.safetensors")
    assert safetensors_nonfinite(tmp_path / "ok.safetensors") is None
    bad = values.clone().repeat(3)
    bad[[1, 4, 9]] = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=dtype)
    save_file({"a": values, "z.weight": bad}, tmp_path / "bad.safetensors")
    said = safetensors_nonfinite(tmp_path / "bad.safetensors")
    assert said is not None
    assert (
        f"(z.weight: {int(bad.isnan().sum())} NaN and {int(bad.isinf().sum())} Inf of 15 " in said
    )
