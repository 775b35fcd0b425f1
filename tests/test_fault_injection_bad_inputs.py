"""Fault injection, part two: every bad input found in use ends in one line naming the key, file
(and row) or path, exit code 2, before any model loads, and leaves the run directory's earlier
files byte for byte as they were. Through the real command line, in process."""

from __future__ import annotations

from pathlib import Path

import pytest

from llds.cli import main
from test_fault_injection_inputs import (
    PREVIOUS_ROWS,
    assert_untouched,
    cli,
    error_line,
    inputs,  # noqa: F401 (a fixture)
    previous_run,  # noqa: F401 (a fixture)
    train,
)

LATIN1_QUESTION = '{"id": 1, "question": "Qui a \xe9crit Candide ?", "golden_answers": ["V"]}\n'


@pytest.fixture()
def no_model_load(monkeypatch):
    """Fail the test if a model starts to load: these checks must come first."""
    from llds.policy import setup
    from llds.train import build

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was found")

    monkeypatch.setattr(setup, "load_model", refuse)  # what `llds eval` imports when it runs
    monkeypatch.setattr(build, "load_model", refuse)  # what the trainer's builders call


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("optim.grad_clip=-1", "optim.grad_clip: Input should be greater than 0"),
        ("optim.grad_clip=0", "optim.grad_clip: Input should be greater than 0"),
        ("algo.clip_low=5", "algo.clip_low: Input should be less than 1"),
        ("eval_every=-5", "eval_every: Input should be greater than or equal to 0"),
        ("optim.betas=[0.9]", "optim.betas[1]"),
        ("optim.weight_decay=-1", "optim.weight_decay: Input should be greater than or equal"),
        ("threads=-1", "threads: Input should be greater than or equal to 1"),
        ("model.lora={rank: 4}", "model.lora.rank: unknown key"),
        ("prompts_per_step=1000", "prompts_per_step: 1000 questions per step, but data.train"),
    ],
)
def test_bad_training_settings(inputs, previous_run, capsys, no_model_load, override, named):  # noqa: F811
    rc, out = cli(train(inputs, previous_run, override), capsys)
    assert named in error_line(rc, out, "train")
    assert_untouched(previous_run)


def test_a_yaml_file_with_a_repeated_key(inputs, previous_run, tmp_path, capsys, no_model_load):  # noqa: F811
    cfg = tmp_path / "twice.yaml"
    cfg.write_text(f"base: {inputs / 'cfg.yaml'}\nsteps: 3\nseed: 1\nsteps: 4\n", encoding="utf-8")
    rc, out = cli(["train", "--config", str(cfg), f"run_dir={previous_run}"], capsys)
    assert f"{cfg}: line 4: key 'steps' appears twice" in error_line(rc, out, "train")
    assert_untouched(previous_run)


def test_a_run_dir_that_is_a_file(inputs, tmp_path, capsys, no_model_load):  # noqa: F811
    path = tmp_path / "run"
    path.write_text(PREVIOUS_ROWS, encoding="utf-8")
    rc, out = cli(train(inputs, path), capsys)
    assert f"run_dir={path}: exists and is not a directory" in error_line(rc, out, "train")
    assert path.read_text(encoding="utf-8") == PREVIOUS_ROWS


def test_a_training_file_that_is_not_utf8(inputs, previous_run, tmp_path, capsys, no_model_load):  # noqa: F811
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(LATIN1_QUESTION.encode("latin-1"))
    rc, out = cli(train(inputs, previous_run, f"data.train={data}"), capsys)
    assert f"{data} line 1: not UTF-8 text (byte 0xe9" in error_line(rc, out, "train")
    assert_untouched(previous_run)


def _eval(inputs: Path, *extra: str) -> list[str]:  # noqa: F811
    data = inputs / "world" / "test.jsonl"
    return ["eval", "--model", str(inputs / "model"), "--data", str(data), *extra]


def test_eval_of_a_file_that_is_not_utf8(inputs, tmp_path, capsys, no_model_load):  # noqa: F811
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(LATIN1_QUESTION.encode("latin-1"))
    corpus = inputs / "world" / "corpus.jsonl"
    args = ["eval", "--model", str(inputs / "model"), "--data", str(data)]
    rc, out = cli([*args, "--retriever", str(corpus)], capsys)
    assert f"{data} line 1: not UTF-8 text (byte 0xe9" in error_line(rc, out, "eval")


def test_eval_at_a_dead_retriever_url(inputs, capsys, no_model_load):  # noqa: F811
    from test_retrieval_server import free_port

    url = f"http://127.0.0.1:{free_port()}/retrieve"
    rc, out = cli(_eval(inputs, "--retriever", url), capsys)
    line = error_line(rc, out, "eval")
    assert f"retriever: the retrieval service at {url} does not answer" in line


def test_sft_at_a_dead_retriever_url_before_its_model(inputs, tmp_path, capsys, monkeypatch):  # noqa: F811
    """`llds sft` with a corpus URL nobody answers: one line naming the key, before the model
    (or the tiny model and its tokenizer) is made."""
    import llds.sft.warm_start as sft_mod
    from test_retrieval_server import free_port

    def refuse(*args, **kwargs):
        raise AssertionError("the model was made before the dead URL was found")

    monkeypatch.setattr(sft_mod, "model_and_tokenizer", refuse)
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    out = tmp_path / "sft"
    args = ["sft", "--config", "sft-demo", f"world={inputs / 'world'}", f"corpus={url}"]
    rc, output = cli([*args, "--out", str(out)], capsys)
    line = error_line(rc, output, "sft")
    assert f"corpus: the retrieval service at {url} does not answer" in line
    assert not out.exists()


def test_eval_out_that_is_a_directory(inputs, tmp_path, capsys, no_model_load):  # noqa: F811
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    (out_dir / "kept.json").write_text("{}", encoding="utf-8")
    corpus = inputs / "world" / "corpus.jsonl"
    rc, out = cli(_eval(inputs, "--retriever", str(corpus), "--out", str(out_dir)), capsys)
    assert f"out: {out_dir} is a directory" in error_line(rc, out, "eval")
    assert [p.name for p in out_dir.iterdir()] == ["kept.json"]


def test_index_of_a_corpus_that_is_not_utf8(tmp_path, capsys):
    corpus = tmp_path / "latin1.jsonl"
    corpus.write_bytes('{"id": "1", "contents": "\xe9t\xe9"}\n'.encode("latin-1"))
    rc, out = cli(["index", "--corpus", str(corpus), "--out", str(tmp_path / "i")], capsys)
    assert "line 1: not UTF-8 text (byte 0xe9" in error_line(rc, out, "index")
    assert not (tmp_path / "i").exists()


def test_grad_clip_null_trains_without_clipping(inputs, tmp_path):  # noqa: F811
    """`optim.grad_clip: null` turns clipping off: the run trains, and with a tiny clip the
    same step's weights differ (clipping acted there and nowhere else)."""
    from safetensors.torch import load_file

    runs = {}
    for name, clip in (("off", "null"), ("tiny", "1e-6")):
        run = tmp_path / name
        assert main(train(inputs, run, "steps=2", "save_every=2", f"optim.grad_clip={clip}")) == 0
        runs[name] = load_file(run / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    assert any(not (runs["off"][k] == runs["tiny"][k]).all() for k in runs["off"])


@pytest.mark.parametrize(
    ("command", "key"),
    [
        ("world", "out"),
        ("demo", "out"),
        ("report", "out"),
        ("probe", "out"),
        ("sft", "out"),
        ("index", "out"),
    ],
)
def test_an_output_directory_that_is_a_file(
    inputs,  # noqa: F811
    tmp_path,
    capsys,
    no_model_load,
    command,
    key,
):
    """An existing file where a command writes its directory: one line naming the key and the
    path, before any work (no model loads, no data is prepared); the file and its folder stay as
    they were. (`llds train`'s run_dir: `test_a_run_dir_that_is_a_file`.)"""
    folder = tmp_path / "outputs"
    folder.mkdir()
    taken = folder / "taken"
    taken.write_text("keep me\n", encoding="utf-8")
    world = inputs / "world"
    args = {
        "world": ["world", "--out", str(taken)],
        "demo": ["demo", "--out", str(taken), "--skip-train"],
        "report": ["report", str(inputs), "--out", str(taken)],
        "probe": [
            "probe",
            "--model",
            str(inputs / "model"),
            "--data",
            str(world / "test.jsonl"),
            "--retriever",
            str(world / "corpus.jsonl"),
            "--out",
            str(taken),
        ],
        "sft": ["sft", "--config", "sft-demo", f"world={world}", "--out", str(taken)],
        "index": ["index", f"corpus={world / 'corpus.jsonl'}", "--out", str(taken)],
    }[command]
    rc, out = cli(args, capsys)
    line = error_line(rc, out, command)
    assert f"{key}={taken}: exists and is not a directory" in line
    assert taken.read_text(encoding="utf-8") == "keep me\n"
    assert sorted(p.name for p in folder.iterdir()) == ["taken"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["num_train=0"], "num_train: Input should be greater than or equal to 1, got 0"),
        (["num_test=0"], "num_test: Input should be greater than or equal to 1, got 0"),
    ],
)
def test_an_empty_world_split_is_refused(tmp_path, capsys, args, named):
    rc, out = cli(["world", "--out", str(tmp_path / "world"), *args], capsys)
    assert named in error_line(rc, out, "world")
    assert not (tmp_path / "world").exists()


def test_a_config_that_is_a_directory(tmp_path, capsys):
    rc, out = cli(["world", "--config", str(tmp_path), "--out", str(tmp_path / "w")], capsys)
    line = error_line(rc, out, "world")
    assert f"config file {tmp_path} is a directory" in line
    assert "does not exist" not in line


def test_probe_with_a_missing_data_file_loads_no_model_and_leaves_no_folder(
    inputs,  # noqa: F811
    tmp_path,
    capsys,
    no_model_load,
):
    out = tmp_path / "probe"
    missing = tmp_path / "missing.jsonl"
    world = inputs / "world"
    rc, printed = cli(
        [
            "probe",
            "--model",
            str(inputs / "model"),
            "--data",
            str(missing),
            "--retriever",
            str(world / "corpus.jsonl"),
            "--out",
            str(out),
        ],
        capsys,
    )
    assert str(missing) in error_line(rc, printed, "probe")
    assert not out.exists()


def test_train_at_a_dead_retriever_url(inputs, previous_run, capsys, no_model_load):  # noqa: F811
    """A dead service is found at once (no retries, no model load), the earlier run untouched;
    the retries of `retriever.retry_seconds` are for a service that answered and then stops."""
    import time

    from test_retrieval_server import free_port

    url = f"http://127.0.0.1:{free_port()}/retrieve"
    start = time.monotonic()
    rc, out = cli(train(inputs, previous_run, f"retriever.source={url}"), capsys)
    line = error_line(rc, out, "train")
    assert f"retriever.source: the retrieval service at {url} does not answer" in line
    assert time.monotonic() - start < 30
    assert "retrying" not in out.lower()
    assert_untouched(previous_run)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_print_config_shows_required_keys_not_set_yet(capsys) -> None:
    """`--print-config` prints what it has, as its help says; the required keys still to set
    are marked (the config still runs nothing and refuses nothing it can print)."""
    rc, out, err = _run(["train", "--print-config", "steps=3"], capsys)
    assert rc == 0, err
    assert "steps: 3" in out.splitlines()
    absent = [line for line in out.splitlines() if line.startswith("# not set yet: ")]
    assert [line.split(":")[1].strip() for line in absent] == [
        "model.path",
        "data.train",
        "retriever.source",
    ]
    # once set, nothing is marked; and a run without them is still refused by name
    rc, out, _ = _run(["train", "--config", "organism", "--print-config"], capsys)
    assert rc == 0 and "# not set yet" not in out
    rc, out, err = _run(["train", "steps=3"], capsys)
    assert rc == 2 and err.startswith("llds train: error: model.path: required")


def test_a_preset_hint_only_for_the_inputs_its_command_makes(tmp_path, capsys, monkeypatch):
    """Through the CLI: the organism preset's own missing world names the command that makes
    it; a user's own missing file (the same preset, `data.train` overridden) gets no hint."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(["train", "--config", "organism"], capsys)
    assert rc == 2 and out == ""
    assert err.strip().endswith("make it with `llds demo --skip-train --out runs/demo`")
    rc, out, err = _run(["train", "--config", "organism", "data.train=mine.jsonl"], capsys)
    assert rc == 2 and err.strip() == (
        "llds train: error: data.train: mine.jsonl does not exist (paths are relative to the "
        "working directory)"
    )
