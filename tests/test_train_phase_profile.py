"""A profiled step's time by phase: the `llds/<phase>` ranges `PhaseTimes` opens, and the
matrix-product kernels each one holds (`llds.train.phase_profile`)."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from llds.train.phase_profile import split_by_phase
from llds.train.progress import PhaseTimes


def test_matrix_kernels_are_counted_in_the_phase_that_ran_them() -> None:
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    q = torch.randn(1, 2, 8, 16)
    x, y = torch.randn(3, 16, 8), torch.randn(3, 8, 5)
    times = PhaseTimes()
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        with times("rollout"):
            for _ in range(3):
                (a @ b).relu_()
        with times("update"):
            torch.bmm(x, y).sum()
            torch.nn.functional.scaled_dot_product_attention(q, q, q)  # no FLOPs counted
        a @ b  # outside every phase
    split = split_by_phase(prof.events())
    events = prof.events()
    mm = [e.self_cpu_time_total / 1e6 for e in events if e.name == "aten::mm"]
    bmm = [e.self_cpu_time_total / 1e6 for e in events if e.name == "aten::bmm"]
    assert len(mm) == 4 and len(bmm) == 1
    assert abs(split["rollout"].matrix_seconds - sum(mm[:3])) < 1e-9
    assert abs(split["other"].matrix_seconds - mm[3]) < 1e-9
    sdpa = [e.self_cpu_time_total / 1e6 for e in events if "flash_attention" in e.name]
    assert len(sdpa) == 1
    assert abs(split["update"].matrix_seconds - bmm[0] - sdpa[0]) < 1e-9
    assert abs(split["update"].dense_seconds - bmm[0]) < 1e-9
    # FLOPs by hand: 2 * M * N * K per product
    assert split["rollout"].dense_flops == 3 * 2 * 64 * 48 * 32
    assert split["update"].dense_flops == 2 * 3 * 16 * 5 * 8
    assert split["rollout"].dense_seconds == split["rollout"].matrix_seconds
    rate = split["rollout"].dense_flops / sum(mm[:3]) / 1e9
    assert abs(split["rollout"].dense_gflops - rate) < 1e-6 * rate
    # the phase's wall time is the range's: it holds its kernels and is at most what
    # PhaseTimes measured around it
    for phase in ("rollout", "update"):
        got = split[phase]
        assert got.matrix_seconds <= got.seconds <= times.seconds[phase] + 1e-4
        assert got.other_seconds == got.seconds - got.matrix_seconds


def test_without_a_profiler_phases_are_only_timed() -> None:
    times = PhaseTimes()
    with times("rollout"):
        torch.ones(4) @ torch.ones(4)
    with times("rollout"):
        pass
    assert set(times.metrics()) == {"time/rollout", "time/step"}
    assert times.metrics()["time/rollout"] <= times.metrics()["time/step"]
