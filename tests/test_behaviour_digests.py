"""Behaviour digests: tiny reference runs of the trainer whose every logged metric, final weight
and optimizer tensor must stay bit for bit what they were, so that a refactor that means to
change no behaviour is checked to change none.

Each run trains a tiny random model (prone to the protocol's tags, with the format-aware reward,
so that rewards and advantages are not all zero) on the test world for a few steps, one
torch thread, and hashes (SHA-256) three things separately: the logged metric rows without their
timings (`time/*`, `throughput/*`) as JSON with sorted keys (floats in their exact shortest
repr), including the log a rollback sets aside; every tensor of the model's `state_dict` (name,
dtype, shape, raw bytes); the optimizer's `state_dict` (its moments as raw bytes, its settings by
repr). Nothing is rounded: the runs are exact on one machine. They are not across machines (a
CPU with other vector kernels, another torch or transformers): the expected digests record the
platform they were made on, and on another platform the test says so and is skipped.

The expected digests are `tests/fixtures/behaviour_digests.json`. A change that alters
behaviour on purpose regenerates them deliberately, and says why in its commit:

    LLDS_WRITE_DIGESTS=1 .venv/bin/pytest -q -n 0 tests/test_behaviour_digests.py

(`-k NAME` rewrites one run's entry only; a rewrite on another platform replaces the recorded
platform and drops the other runs' entries, which were made on the old one.)
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import transformers

from conftest import TRAIN_BASE, make_tiny_model
from llds.algo import AlgoConfig, TermInputs, aggregate, register_loss_term
from llds.algo.objective import registered_loss_terms
from llds.env.tags import PROTOCOL_TOKENS
from llds.io import atomic_write
from llds.monitor.alarms import Alarm
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer

EXPECTED = Path(__file__).resolve().parent / "fixtures" / "behaviour_digests.json"
WRITE = os.environ.get("LLDS_WRITE_DIGESTS") == "1"

# every run: 3 steps of 2 questions x 3 rollouts, 2 mini-batches, up to 2 turns (a search, then
# an answer), the format-aware reward
COMMON = [
    *TRAIN_BASE,
    "steps=3",
    "rollout.max_turns=2",
    "algo.format_reward=true",
]

TERM = "digest_pull_to_old"


def pull_to_old(x: TermInputs, algo: AlgoConfig):
    """A registered extra term: coef * token-mean of (log pi - log pi_old)^2."""
    value = aggregate((x.log_probs - x.old_log_probs) ** 2, x.loss_mask, "token-mean")
    return algo.extra_terms[TERM] * value, {"toy/pull_to_old": value.detach()}


if TERM not in registered_loss_terms():
    register_loss_term(TERM)(pull_to_old)

RUNS: dict[str, list[str]] = {
    # GRPO alone: no LLDS, no KL; pi_old from the rollout's own sampling passes
    "grpo": ["algo.llds.enabled=false", "algo.kl_coef=0"],
    # the defaults: LLDS on (first update zero) with the default KL; the one-step probe at step 2
    "llds_kl_probe": ["diagnostics.probe_every=2", "diagnostics.probe_questions=2"],
    # LLDS-MA with KL and entropy, LLDS computed on the first update
    "llds_ma_kl_entropy": [
        "algo.llds.mask_answer=true",
        "algo.kl_coef=0.01",
        "algo.entropy_coef=0.01",
        "algo.llds.first_update=computed",
    ],
    "scope_batch": ["algo.llds.scope=batch", "algo.llds.batch_rows=3"],
    # pi_old recomputed by a separate pass, with a registered extra loss term
    "recompute_extra_term": [
        "algo.llds.enabled=false",
        "algo.old_logprobs=recompute",
        f"algo.extra_terms={{{TERM}: 5.0}}",
    ],
    "lora_kl": ["model.lora.r=4", "model.lora.alpha=8", "algo.kl_coef=0.01"],
    # rollouts from a bfloat16 sampling copy, corrected by truncated importance sampling
    "sampling_copy_tis": ["rollout.dtype=bfloat16", "algo.rollout_correction.mode=tis"],
    # 2 steps, a fresh trainer resumes from the step-2 checkpoint to step 3
    "resume": ["save_every=2"],
    # LLDS off; an actionable alarm at step 3 rolls back to step 2 with LLDS on, step 3 again
    "rollback": [
        "save_every=1",
        "keep_checkpoints=5",
        "algo.llds.enabled=false",
        "diagnostics.on_alarm=rollback",
        "diagnostics.rollback_llds_coef=0.3",
    ],
}


def cpu_model() -> str:
    """The CPU's model name (Linux: `/proc/cpuinfo`): an Intel and an AMD CPU with the same
    vector instructions still give other bits (the math libraries pick other kernels)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def platform_key() -> dict[str, str]:
    """What the digests depend on besides the code: the CPU, its vector kernels and the
    numeric libraries."""
    return {
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }


# ------------------------------------------------------------------ the runs


@contextmanager
def one_thread() -> Iterator[None]:
    """One intra-op thread: a reduction's order then does not depend on the machine's cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tag_prone(model, tokenizer, bias: float = 4.0):
    """Make a random tiny model emit the protocol's tags often (so that it searches and
    answers), in weights its checkpoint keeps (conftest's `tag_happy` adds a head bias, which a
    reloaded Qwen2 has no place for): every token's embedding gets a constant first feature, the
    head reads that feature for the tags only, at a weight that adds about `bias` to their
    logits."""
    head = model.get_output_embeddings()
    untied = torch.nn.Linear(head.in_features, head.out_features, bias=False)
    with torch.no_grad():
        untied.weight.copy_(head.weight)
        model.config.tie_word_embeddings = False
        model.set_output_embeddings(untied)
        model.get_input_embeddings().weight[:, 0] = 0.05
        ids = torch.arange(min(200, len(tokenizer)))[None]
        feature = model.model(ids).last_hidden_state[0, :, 0].mean()
        untied.weight[:, 0] = 0.0
        for tag in PROTOCOL_TOKENS:
            if tag not in ("<information>", "</information>"):
                untied.weight[tokenizer.convert_tokens_to_ids(tag), 0] = bias / feature
    return model


class AlarmAtStep:
    """A monitor that raises one actionable alarm at `step`, its trouble since `since`."""

    label = None

    def __init__(self, step: int, since: int) -> None:
        self.step, self.since = step, since

    def update(self, row: dict[str, Any]) -> list[Alarm]:
        if row["step"] != self.step:
            return []
        evidence = {"since_step": self.since}
        return [Alarm(self.step, "collapse", "critical", "scripted alarm", evidence)]


def run(name: str, run_dir: Path, world, tok, retriever) -> GRPOTrainer:
    """Reference run `name` into `run_dir`; returns its trainer after its last step."""

    def trainer(resume: bool = False) -> GRPOTrainer:
        cfg = load_config(None, [*COMMON, *RUNS[name], f"run_dir={run_dir}"])
        return GRPOTrainer(
            cfg,
            model=tag_prone(make_tiny_model(tok), tok),
            tokenizer=tok,
            retriever=retriever,
            train_examples=world.train,
            resume=resume,
        )

    tr = trainer()
    if name == "resume":
        tr.train(steps=2)
        tr = trainer(resume=True)
    elif name == "rollback":
        tr.monitor = AlarmAtStep(3, since=2)
    tr.train()
    return tr


# ------------------------------------------------------------------ the digests


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return f"{t.dtype}{tuple(t.shape)}".encode() + flat.view(torch.uint8).numpy().tobytes()


def _feed(h: Any, value: Any) -> None:
    """Hash a nest of dicts, lists and tensors: tensors by their bytes, the rest by repr."""
    if isinstance(value, torch.Tensor):
        h.update(_tensor_bytes(value))
    elif isinstance(value, dict):
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _feed(h, value[k])
    elif isinstance(value, list | tuple):
        h.update(b"[")
        for v in value:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(repr(value).encode())


def metrics_digest(run_dir: Path) -> str:
    """Every logged row of the run (and of a branch a rollback set aside), timings left out."""
    h = hashlib.sha256()
    for log in sorted(run_dir.glob("metrics*.jsonl")):
        h.update(log.name.encode())
        for line in log.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            kept = {k: v for k, v in row.items() if not k.startswith(("time/", "throughput/"))}
            h.update(json.dumps(kept, sort_keys=True).encode() + b"\n")
    return h.hexdigest()


def digest_of(value: Any) -> str:
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def digests(tr: GRPOTrainer) -> dict[str, str]:
    return {
        "metrics": metrics_digest(tr.run_dir),
        "weights": digest_of(tr.model.state_dict()),
        "optimizer": digest_of(tr.optimizer.state_dict()),
    }


# ------------------------------------------------------------------ the test


def _recorded() -> dict[str, Any]:
    return json.loads(EXPECTED.read_text(encoding="utf-8")) if EXPECTED.is_file() else {}


def _record(name: str, got: dict[str, str]) -> None:
    """Write run `name`'s digests into the expected file (temp file + rename)."""
    recorded = _recorded()
    if recorded.get("platform") != platform_key():
        recorded = {"platform": platform_key(), "runs": {}}
    recorded["runs"][name] = got
    recorded["runs"] = dict(sorted(recorded["runs"].items()))
    with atomic_write(EXPECTED, "w", encoding="utf-8") as f:
        f.write(json.dumps(recorded, indent=2) + "\n")


@pytest.mark.parametrize("name", list(RUNS))
def test_reference_run_is_unchanged(
    name: str, tmp_path: Path, small_world, world_tokenizer, world_retriever
) -> None:
    recorded = _recorded()
    if not WRITE:
        assert recorded, f"{EXPECTED} is missing: see this module's docstring to write it"
        if recorded["platform"] != platform_key():
            pytest.skip(
                f"digests recorded on {recorded['platform']}, this is {platform_key()}: "
                "floating-point kernels differ across platforms (see the module docstring)"
            )
        assert name in recorded["runs"], f"no recorded digests for run {name!r}"
    with one_thread():
        tr = run(name, tmp_path, small_world, world_tokenizer, world_retriever)
    got = digests(tr)
    if WRITE:
        _record(name, got)
        return
    assert got == recorded["runs"][name], (
        f"run {name!r} ({RUNS[name]}) behaves differently: the parts whose digest changed are "
        f"{sorted(k for k in got if got[k] != recorded['runs'][name][k])}"
    )


def test_every_run_has_recorded_digests() -> None:
    """No run silently unrecorded, no stale entry for a run that no longer exists."""
    if WRITE:
        return
    assert set(_recorded()["runs"]) == set(RUNS)


def test_the_digests_see_one_changed_bit() -> None:
    """A tensor's digest changes with one bit of one element, its dtype and its shape; a
    logged row's with one value."""
    t = torch.zeros(4, dtype=torch.float32)
    flipped = t.clone()
    flipped.view(torch.int32)[2] ^= 1  # 0.0 -> the smallest subnormal
    assert digest_of({"w": t}) != digest_of({"w": flipped})
    assert digest_of({"w": t}) != digest_of({"w": t.to(torch.float64)})
    assert digest_of({"w": t}) != digest_of({"w": t.reshape(2, 2)})
    assert digest_of({"w": t}) == digest_of({"w": torch.zeros(4)})


def test_metrics_digest_ignores_timings_only(tmp_path: Path) -> None:
    rows = [{"step": 1, "time/step": 0.5, "throughput/x": 9.0, "reward/mean": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = metrics_digest(tmp_path)
    rows[0]["time/step"] = 0.7
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert metrics_digest(tmp_path) == base
    rows[0]["reward/mean"] = 0.25000000000000006  # the next float up
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert metrics_digest(tmp_path) != base
