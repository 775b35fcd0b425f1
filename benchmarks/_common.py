"""Helpers shared by the benchmark scripts: machine description and timing."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable


def machine() -> str:
    """One line naming the CPU/GPU, core count and library versions the numbers were taken on."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    threads = torch.get_num_threads()
    return (
        f"{cpu}, {os.cpu_count()} cores ({threads} torch threads), {dev}, "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` in seconds over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
