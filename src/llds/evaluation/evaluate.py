"""Greedy evaluation: per-source EM / F1 / substring-EM / valid searches, nothing dropped."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llds.data.example import QAExample
from llds.env.prompts import PromptTemplate, build_prompt_ids
from llds.errors import ConfigError
from llds.evaluation.config import EvalConfig
from llds.rollout import RolloutConfig
from llds.runs.eval_result import EvalRecord, EvalResult, Scores

if TYPE_CHECKING:
    from llds.env.protocol import Protocol


def evaluate(
    model,
    tokenizer,
    retriever,
    examples: Sequence[QAExample],
    rollout: RolloutConfig | None = None,
    *,
    template: PromptTemplate | str | None = None,
    chat: bool | None = None,
    progress: bool = True,
) -> EvalResult:
    """Run every example once with greedy decoding and aggregate the scores.

    Every example is scored, including the last partial batch; the result holds the scores
    overall, per source and per hop count, and every record.
    """
    from llds.rollout import RolloutEngine, RolloutRequest  # torch: not for the input checks

    cfg = dataclasses.replace(rollout or RolloutConfig(max_turns=4), temperature=0.0, group_size=1)
    engine = RolloutEngine(model, tokenizer, retriever, cfg)
    records: list[EvalRecord] = []
    chunk = cfg.max_rows
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("eval", total=len(examples))
        for s in range(0, len(examples), chunk):
            part = list(examples[s : s + chunk])
            reqs = [
                RolloutRequest(
                    build_prompt_ids(tokenizer, ex.question, template, chat=chat),
                    ex.id,
                    ex.id,
                    ex.answers,
                )
                for ex in part
            ]
            batch = engine.generate(reqs)
            for ex, ep in zip(part, batch.episodes, strict=True):
                records.append(
                    EvalRecord(
                        id=ex.id,
                        source=ex.source,
                        question=ex.question,
                        golds=list(ex.answers),
                        prediction=ep.answer,
                        em=ep.em,
                        f1=ep.f1,
                        sub_em=ep.sub_em,
                        valid_searches=ep.num_valid_searches,
                        answered=ep.stop_reason == "answer",
                        hops=ex.metadata.get("hops"),
                        queries=list(ep.queries),
                        response=ep.response_text,
                    )
                )
            bar.advance(task, len(part))
    return EvalResult.of(records)


def results_table(results: EvalResult) -> str:
    """A markdown table of the scores (per source, per hop count, overall)."""
    lines = [
        "| split | n | EM | F1 | sub-EM | valid searches | answered |",
        "|---|---|---|---|---|---|---|",
    ]

    def row(name: str, a: Scores) -> None:
        if a.n:
            lines.append(
                f"| {name} | {a.n} | {a.em:.3f} | {a.f1:.3f} | {a.sub_em:.3f} | "
                f"{a.valid_searches:.2f} | {a.answered:.2f} |"
            )

    for k, a in results.by_source.items():
        row(k, a)
    for k, a in results.by_hops.items():
        row(f"{k}-hop", a)
    row("**overall**", results.overall)
    return "\n".join(lines)


def check_model(model: str, *, chat: bool | None = None) -> None:
    """The model `run_evaluation` (or `llds probe`) will load, checked once, before the
    retriever opens (a corpus file's index takes its time to build): a model directory's files
    and its architecture, or a LoRA checkpoint's recorded base, and that its tokenizer has a
    chat template where the protocol's `chat` is true; one line naming the key."""
    from llds.models.hf import check_chat, check_model_source
    from llds.policy.lora import adapter_dir_of, base_model_path

    adapter = adapter_dir_of(model) if model != "smollm2" else None
    if adapter is None:
        check_model_source("model", model)
    else:
        model = base_model_path(adapter)  # whose tokenizer the adapted model uses
    check_chat("protocol.chat", model, chat)


def run_evaluation(cfg: EvalConfig, protocol: Protocol | None = None) -> EvalResult:
    """Greedy evaluation of `cfg.model` on `cfg.data` with the model's saved protocol (or the
    given one); writes `cfg.out` when set and returns the results.

    The inputs are checked cheapest first, each before any slower work: the output path, the
    data files (read and parsed), a retriever URL (one search), the model directory (its
    architecture read from transformers' source, no torch), and last a corpus file's retriever
    (its index is built as it opens)."""
    from llds.data.loaders import load_many
    from llds.policy.config import ModelConfig
    from llds.retrieval.factory import is_url, open_answering_retriever

    if cfg.out and Path(cfg.out).is_dir():
        raise ConfigError(f"out: {cfg.out} is a directory; give the path of a results .json file")
    if cfg.out:  # the results' directory must take a file, before any model loads
        from llds.io import check_directory_target

        check_directory_target("out", Path(cfg.out).absolute().parent)
    proto = protocol or cfg.protocol.resolve(cfg.model)[0]
    examples = load_many(cfg.data, limit=cfg.limit)
    served = is_url(cfg.retriever)
    retriever = open_answering_retriever(cfg.retriever, topk=proto.topk) if served else None
    check_model(cfg.model, chat=proto.chat)
    if retriever is None:
        retriever = open_answering_retriever(cfg.retriever, topk=proto.topk)
    from llds.policy.setup import load_model  # torch

    model, tok = load_model(
        ModelConfig(path=cfg.model, dtype=cfg.dtype, device=cfg.device),
        device_key="device",
        checked=True,
    )
    rollout = RolloutConfig(**proto.rollout_limits(), max_rows=cfg.batch_rows, temperature=0.0)
    template = proto.template()
    results = evaluate(
        model,
        tok,
        retriever,
        examples,
        rollout,
        template=template,
        chat=proto.chat,
    )
    if cfg.out:
        results.write(cfg.out)
    return results
