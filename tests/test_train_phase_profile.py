"""A profiled step's time by phase: the `llds/<phase>` ranges `PhaseTimes` opens, the
matrix-product kernels each one holds (`llds.train.phase_profile`), and a run's
`logging.profile_step`."""

from __future__ import annotations

import json
import logging

import torch
from torch.profiler import ProfilerActivity, profile

from conftest import tiny_trainer
from llds.train.phase_profile import PhaseSplit, split_by_phase, summary_line
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


def _trainer(run_dir, world, tok, retriever, extra=()):
    return tiny_trainer(run_dir, world, tok, retriever, ["steps=2", *extra])


def test_a_profiled_step_keeps_its_trace_and_split_and_trains_the_same(
    tmp_path, small_world, world_tokenizer, world_retriever, caplog
) -> None:
    plain = _trainer(tmp_path / "plain", small_world, world_tokenizer, world_retriever)
    plain.train()
    profiled = _trainer(
        tmp_path / "profiled",
        small_world,
        world_tokenizer,
        world_retriever,
        ["logging.profile_step=2"],
    )
    with caplog.at_level(logging.INFO, logger="llds.train"):
        rows = profiled.train()
    # profiling changes no number the run computes
    for a, b in zip(plain.model.parameters(), profiled.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not (tmp_path / "plain" / "profile").exists()
    out = tmp_path / "profiled" / "profile"
    assert sorted(p.name for p in out.iterdir()) == [
        "step_000002.phases.json",
        "step_000002.pt.trace.json",
    ]
    names = {
        e.get("name")
        for e in json.loads((out / "step_000002.pt.trace.json").read_text())["traceEvents"]
    }
    assert {"llds/rollout", "llds/update", "aten::mm"} <= names
    saved = json.loads((out / "step_000002.phases.json").read_text())
    assert saved["step"] == 2 and saved["seconds"] == rows[1]["time/step"]
    phases = saved["phases"]
    assert {"rollout", "update", "ref_logprob", "diagnostics"} <= set(phases)
    for p in phases.values():
        assert 0 <= p["dense_seconds"] <= p["matrix_seconds"] <= p["seconds"] + 1e-9
    assert phases["update"]["matrix_seconds"] > 0 and phases["update"]["dense_flops"] > 0
    # each phase's range lasts about as long as the trainer timed it
    for name in ("rollout", "update"):
        assert (
            abs(phases[name]["seconds"] - rows[1][f"time/{name}"])
            < 0.1 * rows[1][f"time/{name}"] + 0.01
        )
    line = next(r.getMessage() for r in caplog.records if "profiled step 2" in r.getMessage())
    assert "in matrix products (rollout" in line and "step_000002.pt.trace.json" in line


def test_summary_line_gives_the_step_and_each_phase_share() -> None:
    split = {
        "rollout": PhaseSplit(10.0, 4.5, 4.0, 1e9),
        "old_logprob": PhaseSplit(0.3, 0.1, 0.1, 1e8),  # under 1% of the step: left out
        "update": PhaseSplit(20.0, 15.0, 10.0, 1e9),
        "other": PhaseSplit(0.5, 0.5, 0.5, 0.0),
    }
    # (4.5 + 0.1 + 15 + 0.5) / 40 = 50.25%; 4.5 / 10 = 45%; 15 / 20 = 75%
    assert (
        summary_line(split, 40.0) == "50% of 40.00 s in matrix products (rollout 45%, update 75%)"
    )
