"""Every command reads its settings one way: `--config NAME|FILE`, `KEY=VALUE` overrides,
aliases, `--print-config`; a bad key or value is one line naming it (and its file), exit code 2.
In-process through `llds.cli.main`: no model or data is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from llds.cli import main
from llds.commands._reference import COMMANDS, command_module
from llds.config.cli import config_class
from llds.config.reference import all_keys

# command -> (its --config: a preset name or the keys of a file, the overrides it also needs)
CONFIGS: dict[str, tuple[str | dict[str, Any], list[str]]] = {
    "train": ("organism", []),
    "sft": ("sft-organism", ["out=runs/sft"]),
    "world": ("world-hard", ["out=runs/world"]),
    "eval": ({"model": "m", "data": ["q.jsonl"], "retriever": "c.jsonl"}, []),
    "export": ({"source": "runs/a", "out": "runs/a-merged"}, []),
    "probe": ({"model": "m", "data": "q.jsonl", "retriever": "c.jsonl", "out": "p"}, []),
    "index": ({"corpus": "c.jsonl", "out": "idx"}, []),
    "trivia-wiki": ({"out": "data/tw"}, []),
    "serve-retriever": ({"corpus": "c.jsonl"}, []),
    "demo": ({"out": "runs/d"}, []),
    "report": ({"runs": ["runs/a", "runs/b"]}, []),
}
# command -> (an override, the dotted key it sets, the value it shows in the printed config)
OVERRIDES: dict[str, tuple[str, str, Any]] = {
    "train": ("algo.llds.coef=0.3", "algo.llds.coef", 0.3),
    "sft": ("lr=0.01", "lr", 0.01),
    "world": ("num_train=5", "num_train", 5),
    "eval": ("protocol.topk=2", "protocol.topk", 2),
    "export": ("dtype=bfloat16", "dtype", "bfloat16"),
    "probe": ("group_size=4", "group_size", 4),
    "index": ("method=dense", "method", "dense"),
    "trivia-wiki": ("topk=5", "topk", 5),
    "serve-retriever": ("port=9001", "port", 9001),
    "demo": ("grpo_steps=3", "grpo_steps", 3),
    "report": ("labels=[x, y]", "labels", ["x", "y"]),
}
# command -> (keys of a file with one bad value, the dotted key the error must name)
BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "train": ({"optim": {"betas": [0.9, 1.5]}}, "optim.betas[1]"),
    "sft": ({"lr": -1}, "lr"),
    "world": ({"num_entities": 3}, "num_entities"),
    "eval": ({"batch_rows": 0}, "batch_rows"),
    "export": ({"dtype": "int8"}, "dtype"),
    "probe": ({"group_size": 1}, "group_size"),
    "index": ({"method": "tfidf"}, "method"),
    "trivia-wiki": ({"dev_share": 0.5, "test_share": 0.5}, "test_share"),
    "serve-retriever": ({"port": 70000}, "port"),
    "demo": ({"grpo_steps": "many"}, "grpo_steps"),
    "report": ({"labels": ["a", ""]}, "labels[1]"),
}


def test_every_command_is_covered() -> None:
    assert set(CONFIGS) == set(OVERRIDES) == set(BAD_VALUES) == set(COMMANDS)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def config_args(command: str, tmp_path: Path, extra: dict[str, Any] | None = None) -> list[str]:
    """`COMMAND --config X [needed overrides]`, X a preset or a file written under tmp_path
    (with `extra` keys: a file whose `base:` is the preset)."""
    spec, needed = CONFIGS[command]
    if isinstance(spec, str) and not extra:
        return [command, "--config", spec, *needed]
    data = {"base": spec, **(extra or {})} if isinstance(spec, str) else {**spec, **(extra or {})}
    path = tmp_path / f"{command}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return [command, "--config", str(path), *needed]


def value_at(printed: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        printed = printed[part]
    return printed


@pytest.mark.parametrize("command", COMMANDS)
def test_print_config_shows_the_file_and_the_override(command, tmp_path, capsys) -> None:
    override, key, value = OVERRIDES[command]
    args = config_args(command, tmp_path)
    rc, out, err = run([*args, override, "--print-config"], capsys)
    assert rc == 0, err
    printed = yaml.safe_load(out)
    assert value_at(printed, key) == value
    spec, _ = CONFIGS[command]
    if isinstance(spec, dict):  # the file's keys are there too
        for file_key, file_value in spec.items():
            shown = printed[file_key]
            assert shown == file_value or shown == [file_value], file_key
    # the printed config is a config file that reads back to the same config
    again = tmp_path / "printed.yaml"
    again.write_text(out, encoding="utf-8")
    rc, out_again, err = run([command, "--config", str(again), "--print-config"], capsys)
    assert rc == 0, err
    assert out_again == out


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_key_is_one_line_and_exit_code_2(command, tmp_path, capsys) -> None:
    rc, out, err = run([*config_args(command, tmp_path), "no_such_key=1", "--print-config"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith(f"llds {command}: error: command line: no_such_key: unknown key;")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_value_names_the_key_and_the_file(command, tmp_path, capsys) -> None:
    keys, dotted = BAD_VALUES[command]
    args = config_args(command, tmp_path, extra=keys)
    rc, out, err = run([*args, "--print-config"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith(f"llds {command}: error: {tmp_path / f'{command}.yaml'}: {dotted}: ")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_key_with_its_help(command, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    for flag in ("--config", "--print-config", *command_module(command).ALIASES):
        assert flag in shown
    for doc in all_keys(config_class(command_module(command))):
        assert f"{doc.key} ({doc.type}; default {doc.default})" in shown, doc.key
        assert doc.help in shown, doc.key


def test_base_inheritance_through_the_command_line(tmp_path, capsys) -> None:
    (tmp_path / "parent.yaml").write_text("base: world-hard\nnum_train: 10\nseed: 4\n")
    child = tmp_path / "sub" / "child.yaml"
    child.parent.mkdir()
    child.write_text("base: ../parent.yaml\nnum_train: 20\n")
    rc, out, err = run(["world", "--config", str(child), "out=w", "--print-config"], capsys)
    assert rc == 0, err
    printed = yaml.safe_load(out)
    assert (printed["num_train"], printed["seed"], printed["num_entities"]) == (20, 4, 600)


def test_aliases_set_their_key_and_clash_with_an_override(capsys) -> None:
    rc, out, _ = run(["train", "--config", "organism", "--model", "m", "--print-config"], capsys)
    assert rc == 0 and yaml.safe_load(out)["model"]["path"] == "m"
    rc, out, err = run(
        ["train", "--config", "organism", "--model", "m", "model.path=n", "--print-config"], capsys
    )
    assert rc == 2 and out == ""
    assert err.strip() == (
        "llds train: error: command line: model.path: given twice (--model and "
        "model.path=...); give one"
    )
    args = ["eval", "--model", "m", "--data", "a.jsonl", "--data", "b.jsonl", "--retriever", "c"]
    rc, out, _ = run([*args, "--print-config"], capsys)
    assert rc == 0 and yaml.safe_load(out)["data"] == ["a.jsonl", "b.jsonl"]
    rc, out, _ = run(["index", "--wiki", "--out", "i", "--no-progress", "--print-config"], capsys)
    printed = yaml.safe_load(out)
    assert rc == 0 and printed["wiki"] is True and printed["progress"] is False


def test_options_and_overrides_in_any_order(capsys) -> None:
    args = ["train", "steps=3", "--config", "organism", "--no-resume", "seed=2", "--print-config"]
    rc, out, err = run(args, capsys)
    assert rc == 0, err
    assert (yaml.safe_load(out)["steps"], yaml.safe_load(out)["seed"]) == (3, 2)


def test_report_tells_run_directories_from_overrides(capsys) -> None:
    args = ["report", "runs/a", "./lr=1e-4", "out=runs/r", "runs/c", "--labels", "a,b,c"]
    rc, out, err = run([*args, "--print-config"], capsys)
    assert rc == 0, err
    printed = yaml.safe_load(out)
    assert printed["runs"] == ["runs/a", "./lr=1e-4", "runs/c"]
    assert printed["out"] == "runs/r" and printed["labels"] == ["a", "b", "c"]
    rc, _, err = run(["report", "runs/a", "runs=[x]", "--print-config"], capsys)
    assert rc == 2 and "runs: given twice" in err


def test_a_token_that_is_no_override_is_named(capsys) -> None:
    rc, _, err = run(["world", "--out", "w", "num_train", "--print-config"], capsys)
    assert rc == 2
    assert err.strip() == (
        "llds world: error: command line: 'num_train' is not a KEY=VALUE override (a dotted "
        "key, `=`, its value)"
    )


def test_sft_steps_and_epochs_replace_each_other(tmp_path, capsys) -> None:
    rc, out, err = run(
        ["sft", "--config", "sft-demo", "out=o", "epochs=2", "--print-config"], capsys
    )
    assert rc == 0, err
    assert (yaml.safe_load(out)["steps"], yaml.safe_load(out)["epochs"]) == (None, 2.0)
    f = tmp_path / "epochs.yaml"
    f.write_text("base: sft-demo\nepochs: 3\n")
    rc, out, err = run(["sft", "--config", str(f), "out=o", "steps=5", "--print-config"], capsys)
    assert rc == 0, err
    assert (yaml.safe_load(out)["steps"], yaml.safe_load(out)["epochs"]) == (5, None)
    rc, _, err = run(["sft", "out=o", "steps=5", "epochs=1", "--print-config"], capsys)
    assert rc == 2 and "command line: steps: give steps or epochs, not both" in err


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("steps=true", "steps: Input should be a number, got true"),
        ("optim.lr=false", "optim.lr: Input should be a number, got false"),
        ("algo.llds.enabled=1", "algo.llds.enabled: Input should be true or false, got 1"),
    ],
)
def test_a_switch_for_a_number_or_a_number_for_a_switch_is_refused(override, why, capsys):
    """pydantic's lax mode would read `steps=true` as 1 and `enabled=1` as true."""
    rc, out, err = run(["train", "--config", "organism", override, "--print-config"], capsys)
    assert rc == 2 and out == ""
    assert err.strip() == f"llds train: error: command line: {why}"
