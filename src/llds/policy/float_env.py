"""What decides a run's floating-point results besides its config and seed.

The same code, config and seed repeat a run bit for bit only under the same torch build, the
same CPU kernel set (torch picks AVX2 or AVX-512 kernels by what the CPU offers), the same
accelerator and the same thread count. Small models amplify last-bit differences over hundreds
of steps, so a run resumed on another machine can drift from the uninterrupted one. Every
checkpoint records this environment; a resume compares it with the current one and says what
changed, and how to select the checkpoint's CPU kernels again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# torch's own switch for its CPU kernel set (values: default, avx2, avx512, ...)
CPU_KERNELS_VARIABLE = "ATEN_CPU_CAPABILITY"


def float_environment() -> dict[str, Any]:
    """The current process's torch build, CPU kernel set, accelerator and thread count."""
    import torch

    return {
        "torch": torch.__version__,
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "accelerator": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "threads": torch.get_num_threads(),
    }


def environment_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """`"key: saved -> now"` for each entry recorded in both that differs, in `now`'s order.
    Entries only one side records are not compared (older checkpoints record none)."""
    return [
        f"{key}: {saved[key]} -> {value}"
        for key, value in now.items()
        if key in saved and saved[key] != value
    ]


def resume_warning(saved: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """The warning a resume from a checkpoint recorded under `saved` gives under `now`, or None
    when nothing recorded in both differs."""
    changes = environment_changes(saved, now)
    if not changes:
        return None
    text = (
        f"resuming in another floating-point environment ({'; '.join(changes)}): the run goes "
        "on, but it will not repeat an uninterrupted run bit for bit"
    )
    kernels = saved.get("cpu_kernels")
    if isinstance(kernels, str) and kernels != now.get("cpu_kernels"):
        text += f"; {CPU_KERNELS_VARIABLE}={kernels.lower()} selects the checkpoint's CPU kernels"
    return text
