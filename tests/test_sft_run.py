"""`llds.sft.run` is its parts: the same weights and losses as the expert data and the loop
called by hand with every setting spelled out; the loop's losses and weights against a loop
written here from the algorithm; what the run reports goes through the `llds.sft` logger."""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import logging
import math
import random
from dataclasses import fields
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from llds.cli import main
from llds.data.loaders import load_flashrag_jsonl
from llds.data.world import read_world, relabel_world
from llds.retrieval.bm25 import BM25Retriever
from llds.retrieval.factory import open_retriever
from llds.sft import SFTConfig, run, tiny_model_and_tokenizer
from llds.sft.data import build_expert_episodes
from llds.sft.inputs import EXPERT_KEYS
from llds.sft.trainer import sft_train
from llds.sft.warm_start import LOOP_KEYS
from test_sft_train import _model, setup  # noqa: F401 (a fixture)

SFT_SRC = Path(__file__).resolve().parents[1] / "src" / "llds" / "sft"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    assert main(["world", "--out", str(out), "num_entities=40", "num_train=16", "num_test=4"]) == 0
    return out


def _kwonly(fn) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_the_settings_passed_on_by_name_are_the_callees_keywords():
    """Every keyword of the expert and of the loop that `SFTConfig` has is passed on (none falls
    back to the callee's default), and every name passed on is a setting."""
    settings = {f.name for f in fields(SFTConfig)}
    assert set(EXPERT_KEYS) == _kwonly(build_expert_episodes) - {"template"}
    assert set(LOOP_KEYS) == _kwonly(sft_train) & settings
    assert set(EXPERT_KEYS) | set(LOOP_KEYS) <= settings


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _logged_losses(out: Path) -> list[list[float]]:
    rows = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    return [[r["step"], r["loss"], r["tokens"], r["lr"], r["grad_norm"]] for r in rows]


# each setting away from its default, so a setting that did not reach its callee shows
EXPERT = [
    {"chat": False, "topk": 2, "max_obs_tokens": 200, "max_hops": 2, "think_bank": "paraphrase"},
    {"think": False, "num_examples": 9, "early_answer": 0.5},
]
LOOP = [
    {"lr": 1e-2, "steps": 5, "batch_size": 3, "micro_batch_tokens": 300, "warmup": 2},
    {"lr": 2e-3, "steps": None, "epochs": 1.5, "batch_size": 4, "warmup": 0, "loss_on": "all"},
]
EXTRA = [{"think_draws": 2}, {}]
SEED = [3, 5]
COPIES = [0, 1]


@pytest.mark.parametrize("case", [0, 1])
def test_run_is_its_parts_spelled_out(world_dir, tmp_path, caplog, case):
    """The run, and the same work by hand through the public calls with each setting written
    out: byte-identical weights, the same logged loss series, the same data statistics."""
    expert = {**EXPERT[case], **EXTRA[case]}
    loop, seed, copies = LOOP[case], SEED[case], COPIES[case]
    tiny = {"tokenizer_vocab": 400, "hidden": 32, "layers": 1, "heads": 2}
    cfg = SFTConfig(
        out=str(tmp_path / "run"),
        world=str(world_dir),
        tiny=True,
        progress=False,
        seed=seed,
        relabel_copies=copies,
        **tiny,
        **expert,
        **loop,
    )
    with caplog.at_level(logging.INFO, logger="llds.sft"):
        report = run(cfg)

    corpus = str(world_dir / "corpus.jsonl")
    train = load_flashrag_jsonl(world_dir / "train.jsonl")
    model, tok = tiny_model_and_tokenizer(cfg, corpus, train)
    episodes, stats = build_expert_episodes(train, open_retriever(corpus), tok, seed=seed, **expert)
    world = read_world(world_dir)
    for i in range(copies):  # the relabeled copies' trajectories follow the world's
        copy = relabel_world(world, seed=seed * 1000 + 1 + i)
        retriever = BM25Retriever.build(copy.corpus, show_progress=False)
        more, more_stats = build_expert_episodes(copy.train, retriever, tok, seed=seed, **expert)
        episodes, stats = episodes + more, stats.merged(more_stats)
    by_hand = tmp_path / "by_hand"
    result = sft_train(model, tok, episodes, **loop, seed=seed, progress=False, out_dir=by_hand)

    ran = tmp_path / "run"
    assert _sha(ran / "model" / "model.safetensors") == _sha(
        by_hand / "model" / "model.safetensors"
    )
    assert _logged_losses(ran) == _logged_losses(by_hand)
    assert [row[1] for row in _logged_losses(ran)] == result.losses
    assert report["data"] == stats.to_dict() and report["final_loss"] == result.final_loss
    assert report["data"]["considered"] == len(train) * (1 + copies)
    logged = [r.getMessage() for r in caplog.records if r.name == "llds.sft"]
    assert logged[-1] == f"model written to {ran / 'model'}"
    assert any(m.startswith(f"{len(episodes)} trajectories of {stats.kept} ") for m in logged)


def _reference_run(model, episodes, *, lr, steps, batch_size, warmup, seed, max_grad_norm=1.0):
    """The warm start's algorithm written out: a seeded shuffle per epoch cut into batches;
    per step, each episode unpadded through the model with HF-style labels (-100 off the action
    tokens), the summed cross-entropy over the batch's action tokens divided by their number;
    linear warm-up then cosine decay to 10%; clipping; AdamW."""
    rng = random.Random(seed)
    batches: list[list[int]] = []
    while len(batches) < steps:
        order = list(range(len(episodes)))
        rng.shuffle(order)
        batches += [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step, batch in enumerate(batches[:steps]):
        if step < warmup:
            rate = lr * (step + 1) / warmup
        else:
            done = min(1.0, (step - warmup) / max(1, steps - warmup))
            rate = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))
        for group in opt.param_groups:
            group["lr"] = rate
        opt.zero_grad()
        total = torch.zeros(())
        count = 0
        for i in batch:
            ep = episodes[i]
            ids = torch.tensor([ep.input_ids])
            labels = [t if m else -100 for t, m in zip(ep.input_ids, ep.loss_mask, strict=True)]
            logits = model(input_ids=ids).logits[0, :-1]
            target = torch.tensor(labels[1:])
            total = total + F.cross_entropy(logits, target, reduction="sum", ignore_index=-100)
            count += int((target != -100).sum())
        (total / count).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        losses.append(float(total.detach()) / count)
    return losses


def test_the_loop_against_the_algorithm_written_out(setup):  # noqa: F811
    """Losses of every step and the final weights of `sft_train` (padded rows, micro-batches)
    match the loop above to float rounding; a wrong schedule, order, mask or clip would not."""
    tok, episodes = setup
    data = episodes[:7]  # batches of 3, 3, 1: an epoch boundary and a short batch
    settings = {"lr": 2e-2, "steps": 6, "batch_size": 3, "warmup": 2, "seed": 4}
    trained, reference = _model(tok), _model(tok)
    res = sft_train(trained, tok, data, **settings, micro_batch_tokens=400, progress=False)
    expected = _reference_run(reference, data, **settings)
    assert res.losses == pytest.approx(expected, rel=1e-4)
    assert res.losses[-1] < res.losses[0]  # it learns: the comparison is not of two still models
    for (name, a), b in zip(trained.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-4), name


def test_no_print_in_the_sft_package():
    """Everything the warm start says goes through the `llds.sft` logger."""
    calls = [
        f"{path.name}:{node.lineno}"
        for path in sorted(SFT_SRC.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
    ]
    assert calls == []
