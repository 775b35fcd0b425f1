"""Fault injection, part four (outputs): no command destroys what it did not write. An output
that is, holds or contains an input the command reads is refused always; the working directory
and a non-empty folder that is not the command's own earlier output are refused unless
`--overwrite`. Each refusal is one line, exit code 2, before any work, and every file that was
there before is byte for byte as it was. Through the real command line, in process."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from test_fault_injection_bad_inputs import no_model_load  # noqa: F401 (a fixture)
from test_fault_injection_inputs import cli, error_line, inputs  # noqa: F401 (a fixture)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below `folder`, by relative path."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture()
def world(inputs, tmp_path) -> Path:  # noqa: F811
    """A copy of the test world (corpus.jsonl, train.jsonl, test.jsonl, world.json)."""
    copy = tmp_path / "W"
    shutil.copytree(inputs / "world", copy)
    return copy


def test_index_into_the_world_folder_it_reads(world, capsys):
    before = snapshot(world)
    corpus = world / "corpus.jsonl"
    rc, out = cli(["index", f"corpus={corpus}", "--out", str(world)], capsys)
    line = error_line(rc, out, "index")
    assert f"out={world}: holds the input corpus={corpus}" in line
    assert snapshot(world) == before
    assert sorted(p.name for p in world.parent.iterdir()) == ["W"]  # no temp folder beside it


def test_index_into_the_working_directory(world, capsys, monkeypatch):
    """The issue's `cd dir; llds index corpus=corpus.jsonl --out "$PWD"`, and `--out .`."""
    monkeypatch.chdir(world)
    before = snapshot(world)
    for out_arg in (str(world), "."):
        rc, out = cli(["index", "corpus=corpus.jsonl", "--out", out_arg], capsys)
        assert f"out={out_arg}: holds the input corpus=corpus.jsonl" in error_line(rc, out, "index")
        assert snapshot(world) == before


def test_index_into_the_working_directory_that_holds_no_input(world, tmp_path, capsys, monkeypatch):
    here = tmp_path / "project"
    here.mkdir()
    (here / "notes.txt").write_text("mine\n", encoding="utf-8")
    monkeypatch.chdir(here)
    corpus = world / "corpus.jsonl"
    rc, out = cli(["index", f"corpus={corpus}", "--out", "."], capsys)
    line = error_line(rc, out, "index")
    assert "out=.: is the working directory" in line and "--overwrite" in line
    assert snapshot(here) == {"notes.txt": b"mine\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["W", "project"]  # no `..xxxx.tmp/`


def test_index_into_a_folder_of_other_files_needs_overwrite(world, tmp_path, capsys):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work\n", encoding="utf-8")
    corpus = world / "corpus.jsonl"
    rc, out = cli(["index", f"corpus={corpus}", "--out", str(folder)], capsys)
    line = error_line(rc, out, "index")
    assert f"out={folder}: a folder with 1 entry (thesis.tex), not an earlier output of " in line
    assert snapshot(folder) == {"thesis.tex": b"years of work\n"}
    # --overwrite replaces it by writing beside and swapping in (given as `docs/.`: a name
    # without a last part once had no "beside")
    rc = cli(["index", f"corpus={corpus}", "--out", f"{folder}/.", "--overwrite"], capsys)[0]
    assert rc == 0
    assert (folder / "meta.json").is_file() and not (folder / "thesis.tex").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["W", "docs"]
    # its own earlier output is rebuilt without --overwrite
    assert cli(["index", f"corpus={corpus}", "--out", str(folder)], capsys)[0] == 0


def test_an_output_that_contains_an_input(world, capsys):
    """`--out` a folder above the input (here the world's parent): refused even with
    --overwrite, which is for the command's own kind of output only."""
    parent = world.parent
    before = snapshot(parent)
    corpus = world / "corpus.jsonl"
    rc, out = cli(["index", f"corpus={corpus}", "--out", str(parent), "--overwrite"], capsys)
    assert f"out={parent}: contains the input corpus={corpus}" in error_line(rc, out, "index")
    assert snapshot(parent) == before


def test_index_write_corpus_over_its_own_input(world, tmp_path, capsys):
    corpus = world / "corpus.jsonl"
    before = corpus.read_bytes()
    args = ["index", f"corpus={corpus}", f"write_corpus={corpus}", "--out", str(tmp_path / "i")]
    rc, out = cli(args, capsys)
    assert f"write_corpus={corpus}: is the input corpus={corpus}" in error_line(rc, out, "index")
    assert corpus.read_bytes() == before
    assert not (tmp_path / "i").exists()


def test_world_into_a_folder_of_other_files(tmp_path, capsys):
    folder = tmp_path / "home"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text("my own corpus\n", encoding="utf-8")
    rc, out = cli(["world", "--out", str(folder)], capsys)
    line = error_line(rc, out, "world")
    assert f"out={folder}: a folder with 1 entry (corpus.jsonl), not an earlier output" in line
    assert snapshot(folder) == {"corpus.jsonl": b"my own corpus\n"}


def test_eval_results_over_its_own_data(inputs, world, capsys, no_model_load):  # noqa: F811
    data = world / "test.jsonl"
    before = data.read_bytes()
    args = ["eval", "--model", str(inputs / "model"), "--data", str(data)]
    rc, out = cli([*args, "--retriever", str(world / "corpus.jsonl"), "--out", str(data)], capsys)
    assert f"out={data}: is the input data[0]={data}" in error_line(rc, out, "eval")
    assert data.read_bytes() == before


def test_train_into_the_world_folder(inputs, world, capsys, no_model_load):  # noqa: F811
    before = snapshot(world)
    args = ["train", "--config", str(inputs / "cfg.yaml"), f"run_dir={world}"]
    rc, out = cli([*args, f"data.train={world / 'train.jsonl'}"], capsys)
    assert f"run_dir={world}: holds the input data.train=" in error_line(rc, out, "train")
    assert snapshot(world) == before


def test_sft_into_the_world_folder_it_reads(world, capsys):
    """`llds sft` replaces its output folder whole (a saved model): into the world it learns
    from, that would delete the world."""
    before = snapshot(world)
    rc, out = cli(["sft", "--config", "sft-demo", f"world={world}", "--out", str(world)], capsys)
    assert f"out={world}: is the input world={world}" in error_line(rc, out, "sft")
    assert snapshot(world) == before


def test_probe_into_the_world_folder_it_reads(inputs, world, capsys, no_model_load):  # noqa: F811
    before = snapshot(world)
    args = ["probe", "--model", str(inputs / "model"), "--data", str(world / "test.jsonl")]
    rc, out = cli([*args, "--retriever", str(world / "corpus.jsonl"), "--out", str(world)], capsys)
    assert f"out={world}: holds the input data[0]={world / 'test.jsonl'}" in error_line(
        rc, out, "probe"
    )
    assert snapshot(world) == before


def test_report_into_the_run_it_reads(tmp_path, capsys):
    """`llds report RUN --out RUN` would replace the run's folder by the report's."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n', encoding="utf-8")
    before = snapshot(run)
    rc, out = cli(["report", str(run), "--out", str(run)], capsys)
    assert f"out={run}: is the input runs[0]={run}" in error_line(rc, out, "report")
    assert snapshot(run) == before
