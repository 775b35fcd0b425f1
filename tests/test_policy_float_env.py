"""The floating-point environment a checkpoint records, and what a resume says when it differs."""

from __future__ import annotations

import torch

from llds.policy.float_env import environment_changes, float_environment, resume_warning

SAVED = {"torch": "2.13.0+cpu", "cpu_kernels": "AVX2", "accelerator": "none", "threads": 1}


def test_environment_is_what_torch_reports():
    env = float_environment()
    assert env["torch"] == torch.__version__
    assert env["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert env["threads"] == torch.get_num_threads()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    assert env["accelerator"] == gpu


def test_changes_name_each_differing_key_and_skip_keys_one_side_lacks():
    now = {**SAVED, "cpu_kernels": "AVX512", "threads": 2, "new_key": "x"}
    assert environment_changes(SAVED, now) == ["cpu_kernels: AVX2 -> AVX512", "threads: 1 -> 2"]
    assert environment_changes({}, now) == []  # a checkpoint from before this was recorded
    assert environment_changes(SAVED, dict(SAVED)) == []


def test_warning_text_and_the_kernel_hint():
    assert resume_warning(SAVED, dict(SAVED)) is None
    assert resume_warning({}, {**SAVED, "threads": 4}) is None
    assert resume_warning(SAVED, {**SAVED, "threads": 4}) == (
        "resuming in another floating-point environment (threads: 1 -> 4): the run goes on, "
        "but it will not repeat an uninterrupted run bit for bit"
    )
    text = resume_warning(SAVED, {**SAVED, "cpu_kernels": "AVX512"})
    assert text is not None
    assert "(cpu_kernels: AVX2 -> AVX512)" in text
    assert text.endswith("; ATEN_CPU_CAPABILITY=avx2 selects the checkpoint's CPU kernels")
