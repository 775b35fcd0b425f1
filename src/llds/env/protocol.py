"""The search protocol a model was trained with, saved beside its weights.

A search agent answers well only with the prompt, chat mode, passage count and turn limits it
learned: evaluated with another template or top-k, a model that scored 0.27 can score 0.01.
SFT and RL training therefore write `llds_protocol.json` into every model directory they save,
and `llds eval` / `llds probe` read it for their defaults (flags still override each value).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds.env.prompts import PromptTemplate
from llds.errors import DataFormatError
from llds.io import atomic_write

PROTOCOL_FILE = "llds_protocol.json"


@dataclass(frozen=True)
class Protocol:
    """How a model talks to the search environment: everything `llds eval` needs besides data."""

    prompt_template: str | None = None
    """template text containing {question}; None = the default instruction"""
    chat: bool | None = None
    """apply the tokenizer's chat template; None = when it has one"""
    topk: int = 3
    max_turns: int = 4
    """turns allowed at evaluation (searches + the answer turn)"""
    max_turn_tokens: int = 500
    max_obs_tokens: int = 500
    max_total_tokens: int = 4096

    def write(self, model_dir: str | Path) -> Path:
        path = Path(model_dir) / PROTOCOL_FILE
        with atomic_write(path, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)
        return path

    @classmethod
    def read(cls, model_dir: str | Path) -> Protocol | None:
        """The protocol saved in `model_dir`, or None when there is none (e.g. a hub model)."""
        path = Path(model_dir).expanduser() / PROTOCOL_FILE
        if not path.is_file():
            return None
        try:
            data: Any = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise DataFormatError(f"{path}: not a readable protocol file ({exc})") from None
        if not isinstance(data, dict):
            raise DataFormatError(f"{path}: expected a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataFormatError(f"{path}: unknown key(s) {unknown}; known: {sorted(known)}")
        return cls(**data)

    def template(self) -> PromptTemplate | None:
        """The prompt template, or None for the default instruction."""
        return None if self.prompt_template is None else PromptTemplate(self.prompt_template)

    def rollout_limits(self) -> dict[str, int]:
        """The `RolloutConfig` fields this protocol fixes (`RolloutConfig(**limits, ...)`)."""
        return {
            "max_turns": self.max_turns,
            "topk": self.topk,
            "max_turn_tokens": self.max_turn_tokens,
            "max_obs_tokens": self.max_obs_tokens,
            "max_total_tokens": self.max_total_tokens,
        }

    def merged(self, **overrides: Any) -> Protocol:
        """This protocol with every override that is not None applied (command-line flags)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})
