"""What `llds eval` and `llds probe` read: a model, questions, a retriever and the protocol's
overrides. Apart from the evaluation itself so that a command line is read and checked without
torch (the rollout engine imports it)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from llds.config.schema import section
from llds.env.prompts import PromptTemplate

if TYPE_CHECKING:
    from llds.env.protocol import Protocol


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
