"""The machine a measurement was taken on, in one line.

Timings and, on a tiny model, even trained weights depend on the CPU's float kernels, so every
benchmark and study prints this line next to its numbers.
"""

from __future__ import annotations

import os
import platform


def cpu_name() -> str:
    """The CPU's model name from `/proc/cpuinfo`, or what `platform` knows where there is none."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def machine(threads: int | None = None) -> str:
    """One line naming the CPU/GPU, core count, torch's CPU kernel set (its figures depend on it)
    and library versions the numbers were taken on. `threads`: the torch threads of the process
    that takes them, where that is not this one (default: this process's)."""
    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    threads = torch.get_num_threads() if threads is None else threads
    kernels = torch.backends.cpu.get_cpu_capability()
    return (
        f"{cpu_name()}, {os.cpu_count()} cores ({threads} torch threads, {kernels} CPU kernels), "
        f"{dev}, torch {torch.__version__}, Python {platform.python_version()}"
    )
