"""Shared fixtures: a small synthetic world, a BPE tokenizer fitted to it, tiny random models,
and a real BM25 retriever over the world's corpus. Built once per test session."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.fixture(scope="session")
def small_world():
    from llds.data.world import WorldConfig, generate_world

    return generate_world(WorldConfig(seed=3, num_entities=40, num_train=48, num_test=16))


@pytest.fixture(scope="session")
def world_tokenizer(small_world):
    from llds.models.bpe import tokenizer_for_world

    return tokenizer_for_world(small_world, 400)


@pytest.fixture(scope="session")
def world_retriever(small_world):
    from llds.retrieval.factory import build_retriever

    return build_retriever(small_world.corpus, show_progress=False)


def make_tiny_model(tokenizer, *, seed: int = 0, hidden: int = 64, layers: int = 2):
    from llds.models.tiny import tiny_causal_lm_for

    return tiny_causal_lm_for(tokenizer, hidden_size=hidden, num_layers=layers, seed=seed)


def rollout_requests(world, tok, n=12, group=3):
    """`n` rollout requests: the first `n // group` training questions, `group` rows each."""
    from llds.env.prompts import build_prompt_ids
    from llds.rollout import RolloutRequest

    qs = world.train[: n // group]
    return [
        RolloutRequest(
            build_prompt_ids(tok, q.question, "Question: {question}\n"),
            q.id,
            f"{q.id}#0",
            q.answers,
        )
        for q in qs
        for _ in range(group)
    ]


def tag_happy(model, tokenizer, bias: float = 4.0):
    """Give a random tiny model an output bias towards the protocol tags, so that short sampled
    rollouts search, answer and make invalid actions often enough to exercise every branch."""
    from llds.env.tags import PROTOCOL_TOKENS

    head = model.get_output_embeddings()
    new = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        new.bias.zero_()
        for tag in PROTOCOL_TOKENS:
            if tag not in ("<information>", "</information>"):
                new.bias[tokenizer.convert_tokens_to_ids(tag)] = bias
    model.config.tie_word_embeddings = False
    model.set_output_embeddings(new)
    return model


@pytest.fixture()
def tiny_model(world_tokenizer):
    return make_tiny_model(world_tokenizer)


def write_run_inputs(root, world, tok, **sections) -> Path:
    """Write a world, a tiny model and a small `llds train` config under `root`.

    Keyword arguments replace or extend config sections, e.g. `optim={"lr": 0.05}`.
    Returns the config path (JSON, which is YAML).
    """
    import json

    from llds.config.loader import deep_merge
    from llds.data.world import write_world
    from llds.models.tiny import save_tiny

    files = write_world(world, root / "world")
    save_tiny(make_tiny_model(tok, seed=0), tok, root / "model")
    cfg = {
        "steps": 6,
        "save_every": 2,
        "seed": 3,
        "prompts_per_step": 2,
        "model": {"path": str(root / "model")},
        "data": {"train": str(files["train"]), "prompt_template": "Question: {question}\n"},
        "retriever": {"source": str(files["corpus"]), "topk": 2},
        "rollout": {
            "group_size": 3,
            "max_turns": 1,
            "max_turn_tokens": 12,
            "max_total_tokens": 200,
            "max_obs_tokens": 40,
        },
        "algo": {"kl_coef": 0.01},
        "optim": {"lr": 1e-3, "mini_batches": 2},
        "logging": {"tensorboard": False, "progress": False},
    }
    cfg = deep_merge(cfg, sections)
    path = root / "cfg.yaml"
    path.write_text(json.dumps(cfg))
    return path


# overrides for a tiny, fast training config on `small_world` (paths filled in by each test)
TRAIN_BASE = [
    "model.path=unused",
    "data.train=unused",
    "retriever.source=unused",
    "data.prompt_template=Question: {question}\n",
    "prompts_per_step=2",
    "rollout.group_size=3",
    "rollout.max_turns=1",
    "rollout.max_turn_tokens=12",
    "rollout.max_total_tokens=200",
    "rollout.max_obs_tokens=40",
    "optim.lr=1e-3",
    "optim.mini_batches=2",
    "logging.tensorboard=false",
    "logging.progress=false",
    "save_every=100",
]


def tiny_trainer(run_dir, world, tok, retriever, overrides=(), *, seed=0, resume=False, **kwargs):
    """A `GRPOTrainer` on `world`'s training questions with a tiny random model
    (`make_tiny_model(tok, seed=seed)`) and the config `TRAIN_BASE` + `overrides`; other keyword
    arguments go to the trainer (`eval_examples=...`)."""
    from llds.train.config import load_config
    from llds.train.trainer import GRPOTrainer

    cfg = load_config(None, [*TRAIN_BASE, f"run_dir={run_dir}", *overrides])
    return GRPOTrainer(
        cfg,
        model=make_tiny_model(tok, seed=seed),
        tokenizer=tok,
        retriever=retriever,
        train_examples=world.train,
        resume=resume,
        **kwargs,
    )


def planned_runs(script: Path, *args: str | Path) -> list[dict[str, Any]]:
    """What a study driver would run, as it prints it with `--dry-run` (one JSON object a line)."""
    cmd = [sys.executable, str(script), *map(str, args), "--dry-run"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@contextmanager
def mounted_tmpfs(mount: Path, size_bytes: int) -> Iterator[Path]:
    """A fresh tmpfs of `size_bytes` at `mount`, unmounted afterwards: a real disk that fills
    up. Root may mount (as in CI); where mounting is not permitted the test is skipped, saying
    so."""
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


PAGE = 4096


def leave_free(disk: Path, free: int) -> Path:
    """Fill `disk` with one file, then give back `free` bytes (whole pages)."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 20)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 20, PAGE):  # unbuffered: what fits is written, then ENOSPC
            while True:
                try:
                    os.write(fd, chunk[:size])
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - -(-free // PAGE) * PAGE))
    return filler


def comparable(rows: list[dict]) -> list[dict]:
    """Logged rows without their timings, which no two runs share."""
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows
    ]
