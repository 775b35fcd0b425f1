"""Load any Hugging Face causal LM (a local directory or a cached hub id) as a policy."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from llds.errors import UserInputError

DTYPES = ("float32", "bfloat16", "float16", "auto")


def _torch_dtype(dtype: str) -> Any:
    import torch

    if dtype == "auto":
        return "auto"
    if dtype not in DTYPES:
        raise UserInputError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return getattr(torch, dtype)


def _looks_like_path(name: str) -> bool:
    """Paths are resolved by us; everything else goes to the hub resolution (cache, or download).
    A hub id is `name` or `org/name`: more slashes, a leading `.`, `/` or `~`, or a first part
    that is a local directory (`runs/model` where `runs/` exists) make it a path, so that a
    mistyped local path is named at once instead of being looked up on the hub."""
    if name.startswith((".", "/", "~")) or name.endswith("/") or name.count("/") >= 2:
        return True
    path = Path(name).expanduser()
    return path.exists() or (len(path.parts) > 1 and Path(path.parts[0]).is_dir())


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
"""a model directory holds its tokenizer in one of these (transformers' fast or slow formats)"""


def check_model_directory(path: Path, name: str, *, architecture: bool = True) -> None:
    """Refuse, before anything loads, a model directory transformers would load wrong or late:
    no config.json, no tokenizer (transformers would make an empty one), no weights, a
    safetensors file shorter than its header says (a copy cut short), or a config.json it cannot
    build a model from (checked last: knowing the architectures imports transformers, and torch;
    `architecture=False` leaves that to a later check, after the cheaper ones)."""
    if not (path / "config.json").is_file():
        raise UserInputError(
            f"model directory {name!r} has no config.json (not a Hugging Face model directory)"
        )
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise UserInputError(
            f"model directory {name!r} has no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ...): "
            "save the tokenizer beside the model (tokenizer.save_pretrained(DIR))"
        )
    safetensors = sorted(path.glob("*.safetensors"))
    if not safetensors and not any(path.glob("pytorch_model*.bin")):
        raise UserInputError(
            f"model directory {name!r} has no weights (model.safetensors or pytorch_model.bin)"
        )
    for file in safetensors:
        problem = safetensors_problem(file) or safetensors_nonfinite(file)
        if problem:
            raise UserInputError(f"model directory {name!r}: {file.name} {problem}")
    config_problem(path / "config.json", name, architecture=architecture)


def config_problem(file: Path, name: str, *, architecture: bool = True) -> None:
    """Refuse a `config.json` transformers cannot build a model from: not JSON (a copy cut
    short), no `model_type`, or (with `architecture`) a type this transformers does not know (a
    newer model, or a typo) unless the directory brings its own code (`auto_map`)."""
    import json

    try:
        config = json.loads(file.read_bytes())
    except (UnicodeDecodeError, ValueError) as exc:
        raise UserInputError(
            f"model directory {name!r}: config.json is not valid JSON ({exc}); a copy cut "
            "short? copy it again"
        ) from None
    if not isinstance(config, dict):
        raise UserInputError(f"model directory {name!r}: config.json is not a JSON object")
    kind = config.get("model_type")
    if "auto_map" in config:
        return
    if not isinstance(kind, str) or not kind:
        raise UserInputError(f"model directory {name!r}: config.json has no model_type")
    if not architecture:
        return
    known = known_model_types()
    if kind not in known:
        import difflib
        from importlib.metadata import version

        close = difflib.get_close_matches(kind, sorted(known), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserInputError(
            f"model directory {name!r}: config.json names model_type {kind!r}, which "
            f"transformers {version('transformers')} does not know; {hint}a newer model may "
            "need a newer transformers"
        )


MAPPING = "CONFIG_MAPPING_NAMES"
"""transformers' table of the model types it builds configs for (`model_type` -> class)."""


def known_model_types() -> frozenset[str]:
    """The model types this transformers knows: read from its source (`models/auto`), which
    takes milliseconds, where importing the table imports torch (seconds on a small CPU);
    imported when the source does not read as expected (another layout)."""
    read = _model_types_from_source()
    if read:
        return read
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return frozenset(CONFIG_MAPPING_NAMES)


def _model_types_from_source() -> frozenset[str] | None:
    """The string keys of every literal that builds `CONFIG_MAPPING_NAMES` in transformers'
    `models/auto/auto_mappings.py` and `configuration_auto.py` (an assignment, or an `update`
    of it); None when a file is missing or holds none."""
    import importlib.util

    spec = importlib.util.find_spec("transformers")  # locates the package; imports nothing
    if spec is None or spec.origin is None:
        return None
    auto = Path(spec.origin).parent / "models" / "auto"
    names: set[str] = set()
    for file in (auto / "auto_mappings.py", auto / "configuration_auto.py"):
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            return None
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == MAPPING for t in node.targets
            ):
                found |= _literal_keys(node.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == MAPPING
            ):
                found |= _literal_keys(node)
        if not found:
            return None
        names |= found
    return frozenset(names)


def _literal_keys(node: ast.AST) -> set[str]:
    """String keys of the dict literals and first items of the pair tuples under `node`."""
    keys: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Dict):
            keys |= {
                k.value
                for k in sub.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
        elif isinstance(sub, ast.Tuple) and len(sub.elts) == 2:
            first = sub.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                keys.add(first.value)
    return keys


def nonfinite_weight(model: Any) -> str | None:
    """The first parameter of `model` holding a NaN or an infinity, described
    (`model.layers.0.mlp.up_proj.weight: 3 NaN of 4096 values`), else None."""
    import torch

    for key, tensor in model.named_parameters():
        if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
            continue
        nan = int(torch.isnan(tensor).sum())
        inf = int(torch.isinf(tensor).sum())
        kinds = " and ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "Inf")) if n)
        return f"{key}: {kinds} of {tensor.numel()} values"
    return None


def safetensors_header(file: Path) -> tuple[int, dict[str, Any]] | str:
    """`(header length, header)` of a safetensors file, or what is wrong with reading them."""
    import json
    import struct

    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"is damaged ({size} bytes, no safetensors header)"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"is truncated: its header alone needs {8 + n} bytes, the file has {size}"
        try:
            return n, json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError):
            return "is damaged (its header is not valid JSON)"


def safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file, read from its header alone (no tensor is loaded):
    None when the header parses and the file holds every byte the header's tensors need."""
    read = safetensors_header(file)
    if isinstance(read, str):
        return read
    n, header = read
    size = file.stat().st_size
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    need = 8 + n + max(ends, default=0)
    if need > size:
        return f"is truncated: its tensors need {need} bytes, the file has {size}; copy it again"
    return None


FLOAT_BITS: dict[str, tuple[str, int, int]] = {
    "F16": ("<u2", 0x7C00, 0x03FF),
    "BF16": ("<u2", 0x7F80, 0x007F),
    "F32": ("<u4", 0x7F800000, 0x007FFFFF),
    "F64": ("<u8", 0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
}
"""Each safetensors float dtype's bits as an unsigned integer, its exponent mask and its
mantissa mask: a value is not finite exactly when its exponent bits are all ones (IEEE 754), a
NaN when its mantissa is then not zero, else an infinity; so the check reads the raw bytes with
numpy and needs neither torch nor a bfloat16 type."""


def safetensors_nonfinite(file: Path) -> str | None:
    """The first tensor of a safetensors file (whose header `safetensors_problem` accepted)
    holding a NaN or an infinity, described as `nonfinite_weight` describes a loaded one, else
    None: read before any model loads, so a damaged checkpoint is named in a second, not after
    transformers has built the model."""
    import numpy as np

    read = safetensors_header(file)
    if isinstance(read, str):  # a damaged file is `safetensors_problem`'s to name
        return None
    n, header = read
    data = np.memmap(file, dtype=np.uint8, mode="r", offset=8 + n)
    for key, t in header.items():
        if key == "__metadata__" or t.get("dtype") not in FLOAT_BITS:
            continue
        kind, exponent, mantissa = FLOAT_BITS[t["dtype"]]
        start, end = t["data_offsets"]
        bits = data[start:end].view(kind)
        special = bits[(bits & exponent) == exponent]
        if special.size:
            nan = int(np.count_nonzero(special & mantissa))
            inf = special.size - nan
            kinds = " and ".join(f"{c} {what}" for c, what in ((nan, "NaN"), (inf, "Inf")) if c)
            return (
                f"is damaged: its weights are not finite ({key}: {kinds} of {bits.size} "
                "values); a diverged run? use an earlier checkpoint"
            )
    return None


def resolve_model_source(
    name_or_path: str | Path, *, architecture: bool = True, checked: bool = False
) -> str:
    """Return what `from_pretrained` should receive, or raise a UserInputError naming the input.

    A directory must hold a config.json. A hub id is passed through unchanged: transformers finds
    it in the local cache (and downloads only where the user's environment allows it).
    `checked`: the caller has already checked this source (`check_model_source`), so only its
    spelling is resolved and no file is read again.
    """
    name = str(name_or_path)
    if isinstance(name_or_path, Path) or _looks_like_path(name):
        path = Path(name).expanduser()
        if checked:
            return str(path)
        if not path.exists():
            raise UserInputError(f"model path {name!r} does not exist")
        if not path.is_dir():
            raise UserInputError(f"model path {name!r} is not a directory")
        check_model_directory(path, name, architecture=architecture)
        return str(path)
    return name


HUB_TIMEOUT = 3.0
"""seconds the hub is given to answer when a hub id is not in the local cache"""


def hub_problem(name: str) -> str | None:
    """Why hub id `name` cannot load at once, else None: it is not in the local Hugging Face
    cache, and the hub is off (`HF_HUB_OFFLINE`) or does not answer one request in
    `HUB_TIMEOUT` seconds (transformers' own retries took 50 s and 24 lines to say so)."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(name, "config.json", cache_dir=constants.HF_HUB_CACHE)
    except HFValidationError as exc:
        return f"is not a hub id ({exc})"
    if isinstance(cached, str):
        return None
    where = f"is not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.is_offline_mode():
        return f"{where}, and HF_HUB_OFFLINE is set"
    import httpx

    try:
        httpx.head(constants.ENDPOINT, timeout=HUB_TIMEOUT)
    except httpx.HTTPError as exc:
        return f"{where}, and {constants.ENDPOINT} cannot be reached ({exc or type(exc).__name__})"
    return None


def check_model_source(key: str, name: str, *, architecture: bool = True) -> None:
    """The model a command will load, checked before any work: a local directory that is
    missing, incomplete or cut short, or a hub id neither cached nor downloadable now, is one
    line naming `key` (the packaged `smollm2` is left to its loader). `architecture=False`: all
    but whether transformers knows its model type (which imports transformers and torch), for a
    first check that the command's other inputs follow before that one."""
    if name == "smollm2":
        return
    try:
        resolve_model_source(name, architecture=architecture)
    except UserInputError as exc:
        raise UserInputError(f"{key}: {exc}") from None
    if not _looks_like_path(name):
        problem = hub_problem(name)
        if problem:
            raise UserInputError(
                f"{key}: {name!r} {problem}: download it where the hub can be reached "
                f"(`hf download {name}`), or give a model directory"
            )


CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
"""files beside the tokenizer that hold its chat template (transformers reads them too, and
`additional_chat_templates/`), besides `tokenizer_config.json`'s `chat_template`"""


def has_chat_template(path: Path) -> bool | None:
    """Whether the tokenizer saved in model directory `path` has a chat template, read from its
    files (no tokenizer loaded); None when the directory holds no `tokenizer_config.json` (the
    tokenizer is elsewhere: a hub id, an adapter on its base)."""
    import json

    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    if any((path / f).is_file() for f in CHAT_TEMPLATE_FILES):
        return True
    extra = path / "additional_chat_templates"
    if extra.is_dir() and any(extra.glob("*.jinja")):
        return True
    try:
        saved = json.loads(config.read_bytes())
    except (UnicodeDecodeError, ValueError):
        return None  # the loader names a damaged file
    return bool(saved.get("chat_template")) if isinstance(saved, dict) else None


def check_chat(key: str, model: str, chat: bool | None) -> None:
    """Refuse `chat=True` for a local model whose tokenizer has no chat template, before it
    loads (it was refused only once the tokenizer had loaded). Hub ids and `smollm2` are left
    to the prompt builder."""
    if chat is not True or not model or model == "smollm2":
        return
    path = Path(model).expanduser()
    if path.is_dir() and has_chat_template(path) is False:
        raise UserInputError(
            f"{key}: true, but the tokenizer of {model!r} has no chat template (no "
            f"chat_template in its tokenizer_config.json, no {CHAT_TEMPLATE_FILES[0]}): set "
            f"{key}=false, or leave it unset to use a chat template where there is one"
        )


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Pad with EOS when the tokenizer has no pad token; pad on the left (batched generation)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserInputError("tokenizer has neither a pad nor an eos token; set one")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(
    name_or_path: str | Path,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
    local_files_only: bool | None = None,
    checked: bool = False,
) -> tuple[Any, Any]:
    """Load `(model, tokenizer)` for a causal LM directory or hub id.

    The tokenizer pads on the left, which batched generation needs; training code that wants
    right padding sets `tokenizer.padding_side` itself. `local_files_only=None` keeps the
    Hugging Face default (which honours HF_HUB_OFFLINE); True never touches the network.
    The model is returned in eval mode, as `from_pretrained` leaves it. `checked`: the caller
    checked the directory before its other work (`check_model_source`); it is not read again.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model_source(name_or_path, checked=checked)
    torch_dtype = _torch_dtype(dtype)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if local_files_only is not None:
        kwargs["local_files_only"] = local_files_only
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
    except OSError as exc:
        raise UserInputError(
            f"cannot load model {source!r}: it is neither a model directory with config.json "
            f"nor a hub id present in the local Hugging Face cache ({exc})"
        ) from exc
    bad = nonfinite_weight(model)
    if bad is not None:  # nothing learns from, or answers with, such weights
        raise UserInputError(
            f"model {source!r}: its weights are not finite ({bad}); the checkpoint is damaged "
            "(a diverged run?): use an earlier one"
        )
    prepare_tokenizer(tokenizer)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    return model.to(device), tokenizer


def enable_activation_checkpointing(model: Any, **checkpoint_kwargs: Any) -> None:
    """Recompute each layer's activations in the backward pass, under this release's name.

    transformers 5 renamed `gradient_checkpointing_enable` to `activation_checkpointing_enable`
    and keeps the old name, with a warning, only until v6; older releases have only the old one.
    `checkpoint_kwargs` go to `torch.utils.checkpoint` (e.g. `use_reentrant=False`).
    """
    kwargs = checkpoint_kwargs or None
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
