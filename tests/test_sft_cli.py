"""`llds sft` end to end on a tiny world: writes a loadable model, config file and errors."""

from __future__ import annotations

import json

import pytest
import torch

from llds.cli import main
from llds.env.protocol import Protocol
from llds.models import load_policy


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    assert main(["world", "--out", str(out), "num_entities=40", "num_train=12", "num_test=4"]) == 0
    return out


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


TINY = ["tiny=true", "tokenizer_vocab=400", "hidden=32", "layers=1", "threads=1", "progress=false"]


def test_cli_trains_and_writes_loadable_model(world_dir, tmp_path, capsys) -> None:
    out = tmp_path / "sft"
    rc = main(
        [
            "sft",
            f"world={world_dir}",
            *TINY,
            "steps=3",
            "batch_size=4",
            "max_hops=1",
            "eval=2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"model written to {out / 'model'}" in printed
    model, tok = load_policy(out / "model")
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert len(tok.encode("<search>", add_special_tokens=False)) == 1
    report = json.loads((out / "sft_report.json").read_text())
    assert report["data"]["kept_by_hops"].keys() == {"1"}
    assert report["eval"]["overall"]["n"] == 2
    rows = (out / "sft_metrics.jsonl").read_text().strip().split("\n")
    assert len(rows) == 3
    # the protocol it was trained with is saved beside the weights
    proto = Protocol.read(out / "model")
    assert proto is not None and proto.topk == 3 and proto.max_turns == 4
    assert proto.prompt_template is None  # the default instruction


def test_relabeled_copies_multiply_the_trajectories_and_loss_on_all(world_dir, tmp_path) -> None:
    runs = {}
    for name, extra in (("plain", []), ("copies", ["relabel_copies=2", "loss_on=all"])):
        out = tmp_path / name
        rc = main(
            [
                "sft",
                f"world={world_dir}",
                *TINY,
                "steps=1",
                "batch_size=2",
                *extra,
                "--out",
                str(out),
            ]
        )
        assert rc == 0
        runs[name] = json.loads((out / "sft_report.json").read_text())
    plain, copies = runs["plain"], runs["copies"]
    assert copies["data"]["kept"] == 3 * plain["data"]["kept"]
    assert copies["data"]["considered"] == 3 * plain["data"]["considered"]
    summary = json.loads((tmp_path / "copies" / "sft_summary.json").read_text())
    assert summary["loss_on"] == "all" and summary["episodes"] == copies["data"]["kept"]


def test_relabel_copies_refuse_an_edited_world(world_dir, tmp_path, capsys) -> None:
    edited = tmp_path / "edited"
    edited.mkdir()
    for f in world_dir.iterdir():
        (edited / f.name).write_bytes(f.read_bytes())
    corpus = edited / "corpus.jsonl"
    corpus.write_text(corpus.read_text().replace("capital", "kapital", 1))
    rc = main(
        [
            "sft",
            f"world={edited}",
            *TINY,
            "steps=1",
            "relabel_copies=1",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 2
    assert "corpus.jsonl: differs from the world" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_config_file_then_command_line(world_dir, tmp_path) -> None:
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("steps: 2\nbatch_size: 2\nlr: 0.001\nhidden: 16\n")
    out = tmp_path / "a"
    assert main(["sft", f"world={world_dir}", *TINY, "--config", str(cfg), "--out", str(out)]) == 0
    report = json.loads((out / "sft_report.json").read_text())
    assert report["options"]["steps"] == 2 and report["options"]["hidden"] == 32  # CLI wins
    assert report["options"]["lr"] == 0.001


def test_bad_inputs_are_named(world_dir, tmp_path, capsys) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("stepz: 2\n")
    assert (
        main(
            [
                "sft",
                f"world={world_dir}",
                *TINY,
                "--config",
                str(cfg),
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"{cfg}: stepz: unknown key (did you mean steps?)" in err
    assert main(["sft", f"world={tmp_path}", *TINY, "--out", str(tmp_path / "y")]) == 2
    assert "not a world folder" in capsys.readouterr().err
    assert main(["sft", f"world={world_dir}", "--out", str(tmp_path / "z")]) == 2
    assert "give exactly one of tiny=true or model=PATH" in capsys.readouterr().err
    assert (
        main(
            [
                "sft",
                f"world={world_dir}",
                *TINY,
                "early_answer=1.5",
                "--out",
                str(tmp_path / "w"),
            ]
        )
        == 2
    )
    assert "command line: early_answer: Input should be less than or equal to 1" in (
        capsys.readouterr().err
    )
    assert not any((tmp_path / d).exists() for d in ("x", "z", "w"))


def _sft_adapter(world_dir, base, out, *settings: str) -> None:
    """A tiny full SFT into `base`, then a rank-4 LoRA SFT on it into `out` (`settings` added)."""
    full = ["sft", f"world={world_dir}", *TINY, "steps=2", "batch_size=4", "--out", str(base)]
    assert main(full) == 0
    lora = [f"model={base / 'model'}", "lora.r=4", "batch_size=4", "threads=1", "progress=false"]
    assert main(["sft", f"world={world_dir}", *lora, *settings, "--out", str(out)]) == 0


def test_sft_with_lora_writes_the_adapter_alone_and_it_loads_as_a_model(world_dir, tmp_path):
    """`lora.*` trains adapters on a pretrained model: OUT/adapter (no OUT/model) with the
    record of its base and the protocol, which `llds eval --model` and `model.path` take as
    they are (base + adapter, merged), computing what peft's adapted model computes."""
    peft = pytest.importorskip("peft")
    from llds.policy.config import ModelConfig
    from llds.policy.lora import BASE_FILE
    from llds.policy.setup import load_model

    base, out = tmp_path / "base", tmp_path / "lora"
    _sft_adapter(world_dir, base, out, "lora.alpha=8", "lr=0.01", "steps=3")
    adapter = out / "adapter"
    assert not (out / "model").exists() and not (out / ".adapter.partial").exists()
    weights = adapter / "adapter_model.safetensors"
    full = (base / "model" / "model.safetensors").stat().st_size
    assert weights.stat().st_size < full / 2
    record = json.loads((adapter / BASE_FILE).read_text())
    assert record["path"] == str(base / "model")
    assert Protocol.read(adapter) is not None
    merged, tok = load_model(ModelConfig(path=str(adapter), device="cpu"))
    plain, _ = load_policy(base / "model")
    adapted = peft.PeftModel.from_pretrained(load_policy(base / "model")[0], str(adapter))
    ids = torch.tensor([tok.encode("Question: who?", add_special_tokens=False)])
    with torch.no_grad():
        got, want, before = (m(input_ids=ids).logits for m in (merged, adapted, plain))
    assert torch.allclose(got, want, atol=1e-5)
    assert (got - before).abs().max() > 1e-3  # three steps at lr 0.01 moved it
    world = str(world_dir)
    rc = main(
        [
            "eval",
            "--model",
            str(adapter),
            "--data",
            f"{world}/test.jsonl",
            "--retriever",
            f"{world}/corpus.jsonl",
            "--out",
            str(tmp_path / "eval.json"),
            "limit=2",
        ]
    )
    assert rc == 0 and json.loads((tmp_path / "eval.json").read_text())["overall"]["n"] == 2


def test_sft_refuses_lora_on_a_tiny_model_in_one_line(world_dir, tmp_path, capsys):
    rc = main(["sft", f"world={world_dir}", *TINY, "lora.r=4", "--out", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "lora" in err and "tiny=true" in err and not (tmp_path / "x").exists()


@pytest.mark.parametrize("lora", [False, True])
def test_rl_trains_from_an_sft_adapter(world_dir, tmp_path, small_world, world_tokenizer, lora):
    """`model.path` = an SFT adapter: full fine-tuning trains every merged weight, and a new
    LoRA run trains its own adapter on the merged base (whose fingerprint it records)."""
    pytest.importorskip("peft")
    from conftest import write_run_inputs
    from llds.policy.lora import BASE_FILE

    base, out = tmp_path / "base", tmp_path / "lora"
    _sft_adapter(world_dir, base, out, "steps=2")
    adapter = out / "adapter"
    sections = {"model": {"path": str(adapter)}, "steps": 2, "save_every": 2}
    if lora:
        sections["model"]["lora"] = {"r": 2, "alpha": 4}
    cfg = write_run_inputs(tmp_path / "rl", small_world, world_tokenizer, **sections)
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), f"run_dir={run}"]) == 0
    step = run / "checkpoints" / "step_000002"
    if lora:
        record = json.loads((step / "adapter" / BASE_FILE).read_text())
        assert record["path"] == str(adapter)
    else:
        from safetensors.torch import load_file

        from llds.policy.config import ModelConfig
        from llds.policy.setup import load_model

        trained = load_file(str(step / "model" / "model.safetensors"))
        start, _ = load_model(ModelConfig(path=str(adapter), device="cpu"))
        moved = [n for n, p in start.named_parameters() if not torch.equal(trained[n], p)]
        assert len(moved) > len(list(start.parameters())) // 2
