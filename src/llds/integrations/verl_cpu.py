"""veRL on a CPU: a platform plugin that lets veRL 0.9's own engine-based actor (its FSDP2 engine,
`TrainingWorker`, `ActorRolloutRefWorker`) run on a machine without an accelerator.

For checking a recipe end to end on a laptop or in CI before it goes to a GPU cluster; nothing
here is fast. Load it before veRL resolves its platform, in every veRL process:
`VERL_USE_EXTERNAL_MODULES=llds.integrations.verl_cpu` (veRL imports the modules it names in
each worker), or `import llds.integrations.verl_cpu` first in a process of your own.

Everything goes through veRL's extension points, plus one argument default:

- `PlatformCPU`, registered with veRL's `PlatformRegistry` as ``cpu`` and made current: device
  name ``cpu``, device id `torch.device("cpu")` (veRL moves micro-batches `.to(get_device_id())`,
  and an integer there would mean ``cuda:0``), collective backend ``gloo``, and as device module
  `torch.cpu` plus the memory, seed and RNG calls veRL makes on `torch.cuda`.
- veRL's FSDP engines registered for device ``cpu`` in its `EngineRegistry` (veRL registers them
  for ``cuda`` and ``npu``). Use the ``fsdp2`` strategy: FSDP1 refuses parameters on the CPU.
- `initialize_global_process_group_ray` called with backend ``gloo``: its default,
  ``cpu:gloo,<device>:<backend>``, reads ``cpu:gloo,cpu:gloo`` here, which torch rejects.
- Ray bookkeeping keeps veRL's ``GPU`` resource name, as veRL's resource pool counts only
  accelerators: start Ray with a declared `num_gpus` (`ray.init(num_gpus=N)` works without one).
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

os.environ.setdefault("VERL_PLATFORM", "cpu")

from verl.plugin.platform import (
    PlatformBase,
    PlatformRegistry,
    platform_manager,
)

PLATFORM = "cpu"
BACKEND = "gloo"


class _CpuDeviceModule(types.ModuleType):
    """`torch.cpu` plus the `torch.cuda` calls veRL makes: memory queries (0, or the host's
    memory for `mem_get_info`), cache frees (nothing to free), seeding and RNG state (the CPU
    generator's)."""

    def __init__(self) -> None:
        super().__init__("llds_verl_cpu_device")

    def empty_cache(self) -> None:
        """Nothing is cached on the host."""

    def ipc_collect(self) -> None:
        """No inter-process memory handles on the host."""

    def memory_allocated(self, *args: Any, **kwargs: Any) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def reset_peak_memory_stats(self, *args: Any, **kwargs: Any) -> None:
        """No accelerator memory statistics to reset."""

    def set_per_process_memory_fraction(self, *args: Any, **kwargs: Any) -> None:
        """No accelerator memory to cap."""

    def mem_get_info(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    def get_rng_state(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        torch.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def get_device_name(self, *args: Any, **kwargs: Any) -> str:
        return PLATFORM

    def set_device(self, *args: Any, **kwargs: Any) -> None:
        """One device: nothing to select."""

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> str:
        return PLATFORM

    def __getattr__(self, name: str) -> Any:  # synchronize, Stream, Event, ...
        return getattr(torch.cpu, name)


CPU_DEVICE = _CpuDeviceModule()


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """veRL's platform interface answered for the host CPU."""

    @property
    def device_name(self) -> str:
        return PLATFORM

    @property
    def vendor_name(self) -> str:
        return PLATFORM

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> torch.device:
        return torch.device(PLATFORM)

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        """One device: nothing to select."""

    def synchronize(self, device_index: int | None = None) -> None:
        """CPU work is synchronous."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def set_allocator_settings(self, settings: str) -> None:
        """No accelerator allocator to configure."""

    def empty_cache(self) -> None:
        """Nothing is cached on the host."""

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return BACKEND

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        """No accelerator profiler."""

    def profiler_stop(self) -> None:
        """No accelerator profiler."""

    def ray_resource_name(self) -> str:
        return "GPU"  # veRL's resource pool counts accelerators only; Ray is told num_gpus

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def install() -> PlatformBase:
    """Make `PlatformCPU` veRL's current platform (idempotent), register veRL's FSDP engines
    for it and give veRL's process-group set-up the ``gloo`` backend. Returns the platform."""
    current = platform_manager._current_platform
    if current is None or current.device_name != PLATFORM:
        platform_manager.set_platform(PlatformCPU())
    _register_engines()
    _default_backend_gloo()
    return platform_manager.get_platform()


def _register_engines() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import (
        FSDPEngineWithLMHead,
        FSDPEngineWithValueHead,
    )

    for model_type, engine in (
        ("language_model", FSDPEngineWithLMHead),
        ("value_model", FSDPEngineWithValueHead),
    ):
        if PLATFORM not in EngineRegistry._engines.get(model_type, {}).get("fsdp", {}):
            EngineRegistry.register(
                model_type=model_type, backend=["fsdp", "fsdp2"], device=PLATFORM
            )(engine)


def _default_backend_gloo() -> None:
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "llds_gloo", False):
        return

    def initialize_with_gloo(timeout_second: Any = None, backend: str | None = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or BACKEND)

    initialize_with_gloo.llds_gloo = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize_with_gloo
    workers = sys.modules.get("verl.workers.engine_workers")  # bound the name at its import
    if workers is not None:
        workers.initialize_global_process_group_ray = initialize_with_gloo


install()
