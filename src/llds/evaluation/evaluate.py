"""Greedy evaluation: per-source EM / F1 / substring-EM / valid searches, nothing dropped."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from llds.config.schema import section
from llds.data.example import QAExample
from llds.env.prompts import PromptTemplate, build_prompt_ids
from llds.errors import ConfigError
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest
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


def _one_or_many(value: Any) -> Any:
    """A single data file given as text (`data=test.jsonl`) is a list of one."""
    return [value] if isinstance(value, str) else value


@section(key="protocol")
class ProtocolChoice:
    """How the model talks to the search engine. Each key left null takes the model
    directory's saved protocol (`llds_protocol.json`, written by `llds sft` / `llds train`),
    else the default shown in `llds.env.protocol.Protocol`."""

    template: str | None = None
    """prompt template file containing {question}"""
    chat: bool | Literal["auto"] | None = None
    """apply the chat template: true, false, or auto (when the tokenizer has one)"""
    topk: int | None = Field(default=None, ge=1)
    """passages per search"""
    max_turns: int | None = Field(default=None, ge=0)
    """turns per rollout (searches + the answer turn)"""
    max_turn_tokens: int | None = Field(default=None, ge=1)
    """tokens per turn"""
    max_obs_tokens: int | None = Field(default=None, ge=1)
    """tokens per observation"""
    max_total_tokens: int | None = Field(default=None, ge=8)
    """tokens per rollout"""

    def resolve(self, model: str) -> tuple[Protocol, str]:
        """The saved protocol of `model` (or the defaults) with these keys applied, and where
        the base came from (for the log line)."""
        from pathlib import Path

        from llds.env.protocol import PROTOCOL_FILE, Protocol

        saved = Protocol.read(model) if Path(model).expanduser().is_dir() else None
        template = PromptTemplate.from_file(self.template).text if self.template else None
        proto = (saved or Protocol()).merged(
            prompt_template=template,
            topk=self.topk,
            max_turns=self.max_turns,
            max_turn_tokens=self.max_turn_tokens,
            max_obs_tokens=self.max_obs_tokens,
            max_total_tokens=self.max_total_tokens,
        )
        if self.chat is not None:  # "auto" is a value too: None, decided by the tokenizer
            proto = dataclasses.replace(proto, chat=None if self.chat == "auto" else self.chat)
        source = f"{model}/{PROTOCOL_FILE}" if saved else "defaults (no saved protocol)"
        return proto, source


@section
class ModelOnData:
    """What `llds eval` and `llds probe` both run on: a model, questions and a retriever. How the
    model talks to the search engine (template, top-k, turn limits) is its `Protocol`."""

    model: str = ""
    """HF model directory, hub id, or smollm2; required"""
    data: Annotated[list[str], BeforeValidator(_one_or_many)] = dataclasses.field(
        default_factory=list
    )
    """.parquet / .jsonl files or trivia:LISTS; one or a list; required"""
    retriever: str = ""
    """corpus .jsonl, index directory or http URL; required"""
    protocol: ProtocolChoice = dataclasses.field(default_factory=ProtocolChoice)
    """overrides of the model's saved protocol"""

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        wanted = {"model": "a model directory, hub id or smollm2", "data": "question files"}
        wanted["retriever"] = "a corpus .jsonl, index directory or URL"
        return [(k, f"required ({why})") for k, why in wanted.items() if not getattr(self, k)]


@section
class EvalConfig(ModelOnData):
    """`llds eval`: greedy evaluation of a model on QA data with search."""

    limit: int | None = Field(default=None, ge=1)
    """at most N examples per data file; null = all"""
    batch_rows: int = Field(default=64, ge=1)
    """rollouts generated concurrently"""
    out: str | None = None
    """write results JSON here (default: print only)"""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """compute dtype of the model"""
    device: str = "auto"
    """cpu, cuda, cuda:1, auto"""


def run_evaluation(cfg: EvalConfig, protocol: Protocol | None = None) -> EvalResult:
    """Greedy evaluation of `cfg.model` on `cfg.data` with the model's saved protocol (or the
    given one); writes `cfg.out` when set and returns the results."""
    from llds.data.loaders import load_many
    from llds.policy.config import ModelConfig
    from llds.policy.setup import load_model
    from llds.retrieval.factory import open_answering_retriever

    if cfg.out and Path(cfg.out).is_dir():
        raise ConfigError(f"out: {cfg.out} is a directory; give the path of a results .json file")
    if cfg.out:  # the results' directory must take a file, before any model loads
        from llds.io import check_directory_target

        check_directory_target("out", Path(cfg.out).absolute().parent)
    proto = protocol or cfg.protocol.resolve(cfg.model)[0]
    # before the model: a dead URL, or one that cannot answer at this top-k, fails fast
    retriever = open_answering_retriever(cfg.retriever, topk=proto.topk)
    examples = load_many(cfg.data, limit=cfg.limit)
    model, tok = load_model(
        ModelConfig(path=cfg.model, dtype=cfg.dtype, device=cfg.device), device_key="device"
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
