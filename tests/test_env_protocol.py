"""A trained model remembers its protocol: training writes it beside the weights, `llds eval`
and `llds probe` read it for their defaults and every flag overrides it; one top-k."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import TRAIN_BASE, make_tiny_model
from llds.cli import main
from llds.config.loader import load
from llds.env.protocol import PROTOCOL_FILE, Protocol
from llds.errors import ConfigError, DataFormatError
from llds.evaluation.config import ProtocolChoice
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer


def _resolve(model_dir, *overrides: str) -> Protocol:
    """The protocol `protocol.KEY=VALUE` overrides resolve to for a model directory."""
    return load(ProtocolChoice, None, overrides).resolve(str(model_dir))[0]


def test_round_trip_and_bad_files_are_named(tmp_path):
    proto = Protocol(prompt_template="Q: {question}\n", chat=False, topk=2, max_turns=3)
    proto.write(tmp_path)
    assert Protocol.read(tmp_path) == proto
    assert Protocol.read(tmp_path / "nothing-here") is None
    (tmp_path / PROTOCOL_FILE).write_text('{"topk": 2, "top_k": 3}')
    with pytest.raises(DataFormatError, match=r"llds_protocol\.json: unknown key\(s\) \['top_k'\]"):
        Protocol.read(tmp_path)
    (tmp_path / PROTOCOL_FILE).write_text("{not json")
    with pytest.raises(DataFormatError, match=r"llds_protocol\.json: not a readable"):
        Protocol.read(tmp_path)


def test_saved_protocol_is_the_default_and_overrides_win(tmp_path):
    Protocol(prompt_template="Q: {question}\n", chat=False, topk=2, max_turns=3).write(tmp_path)
    got = _resolve(tmp_path)
    assert (got.prompt_template, got.chat, got.topk, got.max_turns) == (
        "Q: {question}\n",
        False,
        2,
        3,
    )
    assert ProtocolChoice().resolve(str(tmp_path))[1] == f"{tmp_path}/llds_protocol.json"
    template = tmp_path / "t.txt"
    template.write_text("Question: {question}\nAnswer:")
    got = _resolve(tmp_path, "topk=5", "chat=auto", f"template={template}")
    assert (got.topk, got.chat, got.max_turns) == (5, None, 3)
    assert got.prompt_template == "Question: {question}\nAnswer:"
    assert _resolve(tmp_path, "chat=true").chat is True
    assert _resolve(tmp_path / "hub-id-like") == Protocol()  # nothing saved
    with pytest.raises(
        ConfigError,
        match=r"^command line: chat: Input should be bool \| auto \| null, got 'sometimes'",
    ):
        _resolve(tmp_path, "chat=sometimes")


def test_one_top_k(tmp_path):
    base = [*TRAIN_BASE, "retriever.topk=2"]
    cfg = load_config(None, base)
    assert cfg.rollout.topk == 2  # what --print-config shows is what runs
    with pytest.raises(ConfigError, match=r"rollout\.topk: set retriever\.topk"):
        load_config(None, [*base, "rollout.topk=3"])


def test_checkpoints_carry_the_training_protocol(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    cfg = load_config(
        None,
        [
            *TRAIN_BASE,
            f"run_dir={tmp_path}",
            "steps=1",
            "save_every=1",
            "retriever.topk=2",
            "eval_max_turns=2",
            "model.chat=false",
        ],
    )
    tr = GRPOTrainer(
        cfg,
        model=make_tiny_model(world_tokenizer),
        tokenizer=world_tokenizer,
        retriever=world_retriever,
        train_examples=small_world.train,
        resume=False,
    )
    tr.train()
    assert cfg.rollout.topk == 2 and tr.engine.config.topk == 2
    saved = Protocol.read(tmp_path / "checkpoints" / "step_000001" / "model")
    assert saved == Protocol(
        prompt_template="Question: {question}\n",
        chat=False,
        topk=2,
        max_turns=2,
        max_turn_tokens=cfg.rollout.max_turn_tokens,
        max_obs_tokens=cfg.rollout.max_obs_tokens,
        max_total_tokens=cfg.rollout.max_total_tokens,
    )


def test_print_config_shows_the_one_top_k(capsys):
    rc = main(["train", "--print-config", *TRAIN_BASE, "retriever.topk=2"])
    assert rc == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rollout"]["topk"] == printed["retriever"]["topk"] == 2


def test_eval_and_probe_commands_use_the_saved_protocol(
    tmp_path, small_world, world_tokenizer, capsys
):
    from conftest import write_run_inputs

    write_run_inputs(tmp_path, small_world, world_tokenizer)
    model = tmp_path / "model"
    Protocol(prompt_template="Question: {question}\n", topk=2, max_turns=2).write(model)
    data, corpus = tmp_path / "world" / "test.jsonl", tmp_path / "world" / "corpus.jsonl"
    out = tmp_path / "eval.json"
    common = ["--model", str(model), "--data", str(data), "--retriever", str(corpus)]
    assert main(["eval", *common, "limit=4", "--out", str(out), "protocol.max_turn_tokens=8"]) == 0
    printed = capsys.readouterr().out
    assert f"{model}/llds_protocol.json" in printed and "topk=2, max_turns=2" in printed
    assert "max_turn_tokens=8" in printed  # a flag overrides one value
    assert json.loads(out.read_text())["overall"]["n"] == 4
    probe_dir = tmp_path / "probe"
    rc = main(
        [
            "probe",
            *common,
            "--out",
            str(probe_dir),
            "limit=2",
            "group_size=2",
            "protocol.max_turn_tokens=8",
        ]
    )
    assert rc == 0 and (probe_dir / "probe.json").is_file()
    assert "topk=2, max_turns=2" in capsys.readouterr().out
