"""Merged weights of a run, made only when asked (`llds export`).

A LoRA run's checkpoints hold the adapter, not the merged model (see `llds.policy.lora`), so
that a run's state stays a few MB. Tools outside llds that want a plain Hugging Face model get
one here: the adapter put on its recorded base, checked, merged, and written with the base's
tokenizer and the run's protocol. A full fine-tuning checkpoint is exported the same way (its
`model/` rewritten, in another dtype if asked).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from llds.config.schema import section
from llds.errors import UserInputError
from llds.io import atomic_directory, write_json

EXPORT_RECORD = "llds_export.json"
"""what an export writes beside the weights: the checkpoint it came from (and marks the folder
as an earlier export, which a new export may replace)"""


@section
class ExportConfig:
    """`llds export`: a run's (or a checkpoint's) weights as a plain Hugging Face model
    directory, a LoRA adapter merged into its base."""

    source: str = ""
    """a run directory (its newest checkpoint that verifies) or a checkpoint directory
    (`RUN/checkpoints/step_N`); on the command line, the positional value; required"""
    out: str = ""
    """the model directory to write (weights, tokenizer, `llds_protocol.json`); required"""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """dtype of the written weights (training keeps float32)"""

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        wanted = {"source": "a run or checkpoint directory", "out": "a directory to write"}
        return [(k, f"required ({why})") for k, why in wanted.items() if not getattr(self, k)]


def checkpoint_to_export(source: Path) -> Path:
    """The checkpoint `source` names: itself (a `step_N` directory with a trainer state), or a
    run directory's newest checkpoint that verifies; refused in one line otherwise."""
    if not source.is_dir():
        raise UserInputError(f"source: {source} is not a directory")
    from llds.train.checkpoint import (  # torch, for the checks below
        TRAINER_STATE,
        checkpoint_problem,
        checkpoint_step,
        find_resumable,
    )

    if (source / TRAINER_STATE).is_file() or checkpoint_step(source) is not None:
        problem = checkpoint_problem(source)
        if problem:
            raise UserInputError(f"source: checkpoint {source} is damaged ({problem})")
        return source
    ckpt, damaged = find_resumable(source / "checkpoints")
    if ckpt is None:
        why = "; ".join(f"{p.name}: {problem}" for p, problem in damaged)
        raise UserInputError(
            f"source: {source} holds no checkpoint that verifies"
            + (f" (damaged: {why})" if why else " (no checkpoints/step_N directory)")
        )
    return ckpt


def export_model(cfg: ExportConfig) -> Path:
    """Write `cfg.source`'s weights, merged when they are an adapter, to `cfg.out` (whole or
    not at all; an existing folder is replaced); returns the checkpoint exported."""
    ckpt = checkpoint_to_export(Path(cfg.source))  # before the imports of the work (torch)
    from llds.env.protocol import Protocol
    from llds.policy.config import ModelConfig
    from llds.policy.lora import adapter_dir_of
    from llds.policy.setup import load_model
    from llds.train.checkpoint import MODEL_DIR

    weights = adapter_dir_of(ckpt) or ckpt / MODEL_DIR
    model, tokenizer = load_model(ModelConfig(path=str(weights), device="cpu"), dtype=cfg.dtype)
    protocol = Protocol.read(weights)
    with atomic_directory(cfg.out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if protocol is not None:
            protocol.write(tmp)
        record = {"checkpoint": str(ckpt), "merged": weights.name != MODEL_DIR}
        write_json(tmp / EXPORT_RECORD, {**record, "dtype": cfg.dtype})
    return ckpt
