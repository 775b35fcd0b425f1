"""Helpers shared by the benchmark scripts: machine description, timing, and the in-memory
single-turn config the timing benchmarks train."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from llds.analysis.machine import machine

__all__ = [
    "SINGLE_TURN_TEMPLATE",
    "machine",
    "median_time",
    "single_turn_config",
    "step_zero_requests",
    "world_tokenizer",
]


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` in seconds over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_zero_requests(cfg, tok, questions, group: int) -> list:
    """`group` rollout requests per question with the seeds the trainer gives them at step 0,
    prompts built as the trainer builds them (`cfg` is a `TrainConfig`)."""
    from llds.env.prompts import build_prompt_ids
    from llds.rollout import RolloutRequest
    from llds.train.build import prompt_template
    from llds.train.trainer import rollout_seed

    template = prompt_template(cfg)
    return [
        RolloutRequest(
            build_prompt_ids(tok, q.question, template, chat=cfg.model.chat),
            q.id,
            f"{q.id}@0:{j}",
            q.answers,
            seed=rollout_seed(cfg.seed, 0, j * group + i),
        )
        for j, q in enumerate(questions)
        for i in range(group)
    ]


SINGLE_TURN_TEMPLATE = "Question: {question}\nAnswer: "


def world_tokenizer(world, vocab_size: int = 2000):
    """A BPE tokenizer fitted to an organism world's passages and training questions."""
    from llds.models.bpe import tokenizer_for_world

    return tokenizer_for_world(world, vocab_size)


def single_turn_config(
    run_dir: str,
    *,
    prompts: int,
    group: int,
    tokens: int,
    algo,
    optim,
    dtype: str = "float32",
    device: str = "auto",
    cache: str = "auto",
    compile: bool = False,
):
    """A validated TrainConfig for a timing benchmark: in-memory model and questions, one turn
    of exactly `tokens` generated tokens per completion (no retrieval), no logging, no
    diagnostics, no checkpoints."""
    from llds.rollout import RolloutConfig
    from llds.train.config import (
        DataConfig,
        DiagnosticsConfig,
        LoggingConfig,
        ModelConfig,
        TrainConfig,
    )

    cfg = TrainConfig(
        run_dir=run_dir,
        seed=0,
        steps=10**9,
        save_every=10**9,
        prompts_per_step=prompts,
        model=ModelConfig(path="in-memory", chat=False, dtype=dtype, device=device),
        data=DataConfig(train="in-memory", prompt_template=SINGLE_TURN_TEMPLATE),
        rollout=RolloutConfig(
            group_size=group,
            max_turns=0,
            max_turn_tokens=tokens,
            min_turn_tokens=tokens,
            max_total_tokens=4096,
            temperature=1.0,
            max_rows=prompts * group,
            cache=cache,
            compile=compile,
        ),
        algo=algo,
        optim=optim,
        logging=LoggingConfig(tensorboard=False, wandb=False, progress=False),
        diagnostics=DiagnosticsConfig(enabled=False),
    )
    cfg.validate()
    return cfg
