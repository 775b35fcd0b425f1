"""Mixed precision for the policy update: float32 master weights, low-precision compute.

Why not step bf16 weights directly: at the paper's learning rate (1e-6) an Adam update is about
1e-6 per element, far below bfloat16's spacing at weight scale (~1e-4 for weights near 0.02), so
most of it rounds away and the model barely moves. The trained policy therefore always holds
float32 parameters and optimizer state; `model.dtype: bfloat16` (or float16) selects the dtype of
the matrix multiplications, through `torch.autocast`, for rollouts, log-prob passes and the
update alike. Only frozen copies (the KL reference) are stored in the compute dtype.

float16 has a narrow exponent range, so its gradients are scaled (`torch.amp.GradScaler`);
bfloat16 needs no scaling.

bfloat16 pays only where the hardware computes it: a CPU without bf16 instructions emulates it
and runs slower than float32. `model.dtype: bfloat16_if_supported` therefore decides at start, by
what the device offers (`native_bfloat16`), and logs the decision.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from llds.errors import UserInputError

COMPUTE_DTYPES: dict[str, torch.dtype | None] = {
    "float32": None,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
IF_SUPPORTED = "bfloat16_if_supported"
"""`model.dtype`'s choice of bfloat16 where the device computes it natively, float32 elsewhere"""
CPU_BF16_FEATURES = ("avx512_bf16", "amx_bf16")
"""CPU features (as `torch.cpu.get_capabilities()` names them) with bfloat16 matrix products"""

log = logging.getLogger("llds.policy")


@dataclass(frozen=True)
class Precision:
    """Where and in which dtype the policy computes; `compute_dtype=None` is plain float32."""

    compute_dtype: torch.dtype | None
    device_type: str = "cpu"

    @property
    def mixed(self) -> bool:
        return self.compute_dtype is not None

    @property
    def name(self) -> str:
        return "float32" if self.compute_dtype is None else str(self.compute_dtype).split(".")[-1]

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Run the enclosed forward passes in the compute dtype (a no-op for float32).

        Within one autocast region each float32 weight is cast once and reused, so wrapping a
        whole rollout (hundreds of decode steps) costs one cast of the model, not one per step.
        """
        if self.compute_dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device_type, dtype=self.compute_dtype):
            yield

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """A loss scaler for float16 compute (gradients underflow without it); None otherwise."""
        if self.compute_dtype is not torch.float16:
            return None
        return torch.amp.GradScaler(self.device_type)


def compute_dtype_of(
    dtype: str, source: str | None = None, device_type: str | None = None
) -> torch.dtype | None:
    """The compute dtype for `model.dtype`; `auto` takes the checkpoint's stored dtype;
    `bfloat16_if_supported` is bfloat16 where `native_bfloat16(device_type)`, else float32
    (logged either way).

    `source` is the model directory `auto` reads `config.json` from; anything but bf16/fp16 there
    (or no readable config) means float32. `device_type` None: the device `model.device: auto`
    picks (CUDA when available, else the CPU).
    """
    if dtype in COMPUTE_DTYPES:
        return COMPUTE_DTYPES[dtype]
    if dtype == IF_SUPPORTED:
        device = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
        native = native_bfloat16(device)
        log.info(
            "model.dtype %s: %s -> computing in %s",
            IF_SUPPORTED,
            f"{device} has bfloat16 instructions" if native else f"{device} lacks bfloat16",
            "bfloat16" if native else "float32",
        )
        return torch.bfloat16 if native else None
    if dtype != "auto":
        raise UserInputError(
            f"model.dtype must be one of {[*COMPUTE_DTYPES, 'auto', IF_SUPPORTED]}, got {dtype!r}"
        )
    stored = _stored_dtype(source) if source else None
    return COMPUTE_DTYPES.get(stored or "float32")


def native_bfloat16(device_type: str, capabilities: dict[str, object] | None = None) -> bool:
    """Whether `device_type` computes bfloat16 matrix products natively: on a CPU, AVX512-BF16
    or AMX-BF16 (`capabilities`: `torch.cpu.get_capabilities()`, given for tests); on CUDA,
    `torch.cuda.is_bf16_supported()`; False elsewhere."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type != "cpu":
        return False
    if capabilities is None:
        capabilities = _cpu_capabilities()
    return any(bool(capabilities.get(name)) for name in CPU_BF16_FEATURES)


def _cpu_capabilities() -> dict[str, object]:
    """`torch.cpu.get_capabilities()`, or on a torch without it the older private checks."""
    listed = getattr(torch.cpu, "get_capabilities", None)
    if listed is not None:
        return dict(listed())
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return {"avx512_bf16": bool(check()) if check is not None else False}


def _stored_dtype(source: str) -> str | None:
    path = Path(source).expanduser() / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    value = config.get("dtype", config.get("torch_dtype"))
    return value if isinstance(value, str) and value in COMPUTE_DTYPES else None


def update_ratio(before: list[torch.Tensor], after: list[torch.Tensor]) -> tuple[float, float]:
    """`(sum ||after - before||^2, sum ||before||^2)` over a list of (local) tensors.

    The caller takes the square root of the ratio, after summing both parts over ranks when the
    tensors are shards. The difference of two nearby floats is exact, so float32 norms per
    tensor suffice; only the sums across tensors are kept in float64. (Converting a whole model
    to float64 for this would cost seconds per step on a 100M-parameter model.)
    """
    num, den = 0.0, 0.0
    with torch.no_grad():
        for b, a in zip(before, after, strict=True):
            num += float(torch.linalg.vector_norm(a - b)) ** 2
            den += float(torch.linalg.vector_norm(b)) ** 2
    return num, den
