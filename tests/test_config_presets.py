"""Config inheritance (`base:`), shipped presets loaded by name from any directory, and a wheel
that carries them."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from llds.cli import main
from llds.config.loader import preset_names, read_yaml
from llds.errors import ConfigError, UserInputError
from llds.train.config import check_inputs, load_config

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_base_chain_merges_deepest_first(tmp_path):
    _write(tmp_path / "a.yaml", "steps: 1\nseed: 7\noptim:\n  lr: 1.0e-3\n  mini_batches: 2\n")
    _write(tmp_path / "sub" / "b.yaml", "base: ../a.yaml\nsteps: 2\noptim:\n  lr: 5.0e-4\n")
    c = _write(tmp_path / "c.yaml", "base: sub/b.yaml\nsteps: 3\n")
    data = read_yaml(c)
    assert data == {"steps": 3, "seed": 7, "optim": {"lr": 5.0e-4, "mini_batches": 2}}


def test_base_cycle_names_the_files(tmp_path):
    _write(tmp_path / "a.yaml", "base: b.yaml\nsteps: 1\n")
    _write(tmp_path / "b.yaml", "base: a.yaml\nsteps: 2\n")
    with pytest.raises(ConfigError, match=r"a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        read_yaml(tmp_path / "a.yaml")
    _write(tmp_path / "self.yaml", "base: self.yaml\n")
    with pytest.raises(ConfigError, match=r"self\.yaml -> .*self\.yaml"):
        read_yaml(tmp_path / "self.yaml")


def test_missing_base_and_bad_base_are_named(tmp_path):
    f = _write(tmp_path / "a.yaml", "base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"nowhere\.yaml does not exist .*relative to"):
        read_yaml(f)
    g = _write(tmp_path / "g.yaml", "base: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"g\.yaml: base must be"):
        read_yaml(g)


def test_presets_by_name_and_as_bases(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository
    names = preset_names()
    assert {"organism", "collapse", "search-r1-qwen2.5-3b"} <= set(names)
    organism, collapse = load_config("organism"), load_config("collapse")
    assert collapse.optim.lr == 5.0e-4 and organism.optim.lr == 2.0e-4
    # collapse is organism plus the learning rate (and its own run directory)
    assert organism.rollout == collapse.rollout and organism.algo == collapse.algo
    assert organism.data == collapse.data and organism.steps == collapse.steps
    mine = _write(tmp_path / "mine.yaml", "base: organism\nsteps: 5\n")
    assert load_config(mine).steps == 5 and load_config(mine).optim.lr == 2.0e-4
    with pytest.raises(ConfigError, match=r"not a shipped preset \(collapse, "):
        load_config("organsim")


def test_a_preset_names_the_command_that_makes_its_missing_inputs(
    tmp_path, monkeypatch, capsys, world_tokenizer
):
    from conftest import make_tiny_model
    from llds.models.tiny import save_tiny

    monkeypatch.chdir(tmp_path)  # a fresh directory: nothing made yet
    cfg = load_config("organism")
    with pytest.raises(UserInputError) as err:
        check_inputs(cfg)
    assert str(err.value) == (
        "data.train: runs/demo/world/train.jsonl does not exist (paths are relative to the "
        "working directory); make it with `llds demo --skip-train --out runs/demo`"
    )
    assert main(["train", "--config", "organism"]) == 2  # before any model is loaded
    assert "make it with `llds demo --skip-train --out runs/demo`" in capsys.readouterr().err
    # a file of the user's own is not something the preset's command makes: no hint
    with pytest.raises(UserInputError) as err:
        check_inputs(load_config("organism", ["data.train=my/questions.jsonl"]))
    assert str(err.value) == (
        "data.train: my/questions.jsonl does not exist (paths are relative to the working "
        "directory)"
    )
    for made in ("world/train.jsonl", "world/test.jsonl", "world/corpus.jsonl"):
        _write(tmp_path / "runs" / "demo" / made, "")
    with pytest.raises(UserInputError, match=r"^model\.path: runs/demo/sft/model does not"):
        check_inputs(cfg)
    model = tmp_path / "runs" / "demo" / "sft" / "model"
    model.mkdir(parents=True)  # there, but empty: not a model directory
    with pytest.raises(UserInputError, match=r"^model\.path: .*has no config\.json"):
        check_inputs(cfg)
    save_tiny(make_tiny_model(world_tokenizer), world_tokenizer, model)
    check_inputs(cfg)  # every input there


def test_inputs_that_are_not_local_paths_are_not_checked(tmp_path, monkeypatch):
    """A URL and a `trivia:` list are left to their readers; a hub id is looked up in the local
    Hugging Face cache only (here a cache holding it)."""
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)
    repo = tmp_path / "hf-cache" / "models--Qwen--Qwen2.5-3B-Instruct"
    _write(repo / "snapshots" / ("0" * 40) / "config.json", "{}")
    _write(repo / "refs" / "main", "0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    cfg = load_config(
        None,
        [
            "model.path=Qwen/Qwen2.5-3B-Instruct",  # a hub id
            "data.train=trivia:worldcapitals",
            "retriever.source=http://127.0.0.1:8000/retrieve",
        ],
    )
    check_inputs(cfg)
    cfg = load_config(None, ["model.path=smollm2", "data.train=q.jsonl", "rollout.max_turns=0"])
    with pytest.raises(UserInputError) as err:
        check_inputs(cfg)
    assert str(err.value) == (
        "data.train: q.jsonl does not exist (paths are relative to the working directory)"
    )


def test_every_preset_with_local_inputs_says_how_to_make_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in preset_names():
        if name.startswith(("sft-", "world-")):
            continue
        cfg = load_config(name)
        try:
            check_inputs(cfg)
        except UserInputError as exc:
            if name.startswith("search-r1-"):  # the paper's data: a download, not a command
                assert "relative to the working directory" in str(exc), name
            else:
                assert cfg.make_inputs and f"make it with `{cfg.make_inputs}`" in str(exc), name


@pytest.mark.slow
def test_wheel_ships_presets(tmp_path):
    """Build a wheel, install it in a scratch venv, run a preset by name from elsewhere."""
    dist = tmp_path / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("llds-*.whl")
    scratch = tmp_path / "venv"
    venv.create(scratch, with_pip=False)
    site = next((scratch / "lib").glob("python*/site-packages"))
    # the dependencies come from this environment (a plain path: its .pth files, among them
    # an editable install of this repository, are not processed)
    deps = next(p for p in sys.path if p.endswith("site-packages"))
    (site / "deps.pth").write_text(deps + "\n")
    py = scratch / "bin" / "python"
    # --target: install even though this environment has llds (pip then ignores installed ones)
    install = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [str(py), "-c", "import llds; print(llds.__file__)"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert str(site) in where.stdout, where.stdout + where.stderr  # the wheel, not the repo
    out = subprocess.run(
        [str(site / "bin" / "llds"), "train", "--config", "organism", "--print-config"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    printed = yaml.safe_load(out.stdout)
    assert printed["optim"]["lr"] == 2.0e-4 and printed["rollout"]["group_size"] == 5
