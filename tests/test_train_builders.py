"""The trainer's pieces, each built alone from a config (`llds.train.build`), and the update's
functions over the global batch (`llds.train.global_batch`, `llds.train.update_stats`)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import TRAIN_BASE, make_tiny_model
from llds import metrics as keys
from llds.env.prompts import PromptTemplate
from llds.errors import ConfigError, UserInputError
from llds.policy.precision import Precision
from llds.train import build
from llds.train.config import load_config
from llds.train.distributed import Dist
from llds.train.global_batch import global_counts, mini_batches, split
from llds.train.update_stats import UpdateStats


def config(*extra: str):
    return load_config(None, [*TRAIN_BASE, *extra])


class FakeDist:
    """One of `world` processes whose collectives see `others` as the other ranks' share."""

    def __init__(self, world: int = 1, rank: int = 0, others: float = 0.0) -> None:
        self.world, self.rank, self.others = world, rank, others
        self.is_main = rank == 0
        self.enabled = world > 1

    def sum(self, value) -> torch.Tensor:
        return torch.as_tensor(value, dtype=torch.float64) + self.others


# ------------------------------------------------------------------ build


def test_groups_must_split_evenly_over_processes() -> None:
    build.check_whole_groups(config("prompts_per_step=4"), FakeDist(world=2))
    with pytest.raises(UserInputError, match=r"prompts_per_step=3 .* processes \(2\)"):
        build.check_whole_groups(config("prompts_per_step=3"), FakeDist(world=2))


def test_policy_keeps_float32_master_weights_and_a_frozen_starting_reference(
    world_tokenizer,
) -> None:
    model = make_tiny_model(world_tokenizer).to(torch.bfloat16)
    policy = build.policy(config("algo.kl_coef=0.01"), Dist(), None, model, world_tokenizer)
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    assert not policy.precision.mixed  # model.dtype float32: plain float32 compute
    ref = policy.reference
    assert ref is not policy.model and not ref.training
    assert not any(p.requires_grad for p in ref.parameters())
    with torch.no_grad():
        next(policy.model.parameters()).add_(1.0)  # training moves the policy, not the reference
    start, now = next(ref.parameters()), next(policy.model.parameters())
    assert torch.equal(start + 1.0, now)
    off = build.policy(config("algo.kl_coef=0"), Dist(), None, model, world_tokenizer)
    assert off.reference is None


def test_rollout_and_sampling_models(world_tokenizer) -> None:
    model = make_tiny_model(world_tokenizer)
    policy = build.Policy(model, world_tokenizer, Precision(None), None)
    assert build.rollout_model(config(), Dist(), policy) is model
    with pytest.raises(ConfigError, match=r"fsdp\.enabled: needs a multi-process launch"):
        build.rollout_model(config("fsdp.enabled=true"), Dist(), policy)
    itself = build.sampler(config(), model)
    assert itself.model is model and not itself.is_copy
    copy = build.sampler(config("rollout.dtype=bfloat16"), model)
    assert copy.model is not model and copy.is_copy and copy.policy is model
    assert {p.dtype for p in copy.model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    copy.refresh()  # the copy takes the policy's new weights, in its dtype
    assert torch.equal(next(copy.model.parameters()), next(model.parameters()).to(torch.bfloat16))


def test_single_turn_runs_open_no_retriever() -> None:
    assert build.retriever(config("rollout.max_turns=0", "retriever.source=missing"), None) is None
    given = object()
    assert build.retriever(config(), given) is given  # type: ignore[arg-type]


def test_prompt_template_inline_file_or_default(tmp_path) -> None:
    assert build.prompt_template(config()).text == "Question: {question}\n"
    path = tmp_path / "prompt.txt"
    path.write_text("Q: {question}\nA:", encoding="utf-8")
    assert build.prompt_template(config(f"data.prompt_template={path}")).text == "Q: {question}\nA:"
    assert build.prompt_template(config("data.prompt_template=null")).text == (
        PromptTemplate.default().text
    )
    with pytest.raises(UserInputError, match="neither a file nor a template"):
        build.prompt_template(config(f"data.prompt_template={tmp_path / 'none.txt'}"))


def test_protocol_records_what_eval_needs() -> None:
    cfg = config("retriever.topk=2", "eval_max_turns=3")
    proto = build.protocol(cfg, build.prompt_template(cfg))
    assert (proto.topk, proto.max_turns, proto.max_turn_tokens) == (2, 3, 12)
    assert proto.prompt_template == "Question: {question}\n"


def test_periodic_evaluator_only_when_due_and_on_the_main_process(small_world, tmp_path) -> None:
    cfg = config(f"run_dir={tmp_path}")
    engine = SimpleNamespace(retriever=None, tokenizer=None, config=cfg.rollout)
    args = (engine, build.prompts(cfg, None))
    assert build.periodic_evaluator(cfg, FakeDist(), small_world.test, *args) is None
    due = config("eval_every=2", f"run_dir={tmp_path}")
    assert build.periodic_evaluator(due, FakeDist(2, rank=1), small_world.test, *args) is None
    ev = build.periodic_evaluator(due, FakeDist(), small_world.test, *args)
    assert ev is not None and ev.rollout.max_turns == 0  # no retriever: single-turn
    assert ev.rollout.temperature == 0.0 and ev.rollout.group_size == 1
    assert ev.template.text == "Question: {question}\n" and ev.out_dir == tmp_path
    with pytest.raises(ConfigError, match=r"eval_every: set data\.eval"):
        build.periodic_evaluator(due, FakeDist(), None, *args)


def test_probe_set_is_drawn_once_from_the_seed(small_world) -> None:
    cfg = config("diagnostics.probe_every=2", "diagnostics.probe_questions=5")
    first = build.probe_set(cfg, FakeDist(), small_world.train)
    assert len(first) == 5 and first == build.probe_set(cfg, FakeDist(), small_world.train)
    assert build.probe_set(config(), FakeDist(), small_world.train) == []  # off
    assert build.probe_set(cfg, FakeDist(2, rank=1), small_world.train) == []


def test_optimizer_steps_the_trainable_weights_with_the_configs_settings(world_tokenizer) -> None:
    model = make_tiny_model(world_tokenizer)
    frozen = next(model.parameters())
    frozen.requires_grad_(False)
    cfg = config("optim.lr=0.01", "optim.weight_decay=0.1", "optim.eps=1e-6")
    opt = build.optimizer(cfg, model)
    (group,) = opt.param_groups
    assert all(p is not frozen for p in group["params"])
    assert len(group["params"]) == sum(p.requires_grad for p in model.parameters())
    assert (group["lr"], group["weight_decay"], group["eps"]) == (0.01, 0.1, 1e-6)
    assert group["fused"] is True  # CPU float32 parameters


def test_scheduler_follows_the_warmup() -> None:
    cfg = config("optim.lr=1.0", "optim.warmup_steps=4", "steps=10")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build.scheduler(cfg, opt)
    lrs = []
    for _ in range(5):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])


# ------------------------------------------------------------------ global batch


def test_split_cuts_near_equal_parts_largest_first() -> None:
    assert split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split([4, 5], 3) == [[4], [5], []]


def test_mini_batches_of_two_ranks_are_the_single_process_ones() -> None:
    """Rank r holds questions r, r+2, ... (3 rollouts each): together the ranks' mini-batches
    cover exactly the rows one process draws, with the same generator."""
    g, questions = 3, 4
    one = mini_batches(torch.Generator().manual_seed(5), list(range(12)), 12, 4)
    for part in one:
        assert len(part) == 3
    got: list[set[int]] = [set() for _ in one]
    for rank in (0, 1):
        rows = [j * g + i for j in range(rank, questions, 2) for i in range(g)]
        local = mini_batches(torch.Generator().manual_seed(5), rows, 12, 4)
        for i, part in enumerate(local):
            got[i] |= {rows[r] for r in part}
    assert got == [set(p) for p in one]


def test_global_counts_add_the_other_ranks() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5])
    alone = global_counts(FakeDist(), mask, adv)
    assert (float(alone.tokens), float(alone.sequences)) == (3.0, 2.0)
    assert float(alone.preserving) >= 1.0
    empty = global_counts(FakeDist(), torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2))
    assert (float(empty.tokens), float(empty.sequences), float(empty.preserving)) == (1, 1, 1)
    shared = global_counts(FakeDist(world=2, others=10.0), mask, adv)
    assert (float(shared.tokens), float(shared.sequences)) == (13.0, 12.0)


# ------------------------------------------------------------------ statistics


def micro_stats(pg: float, clip: float, ratio: tuple[float, float], gate: float | None = None):
    st = {
        keys.PG_LOSS: torch.tensor(pg),
        "policy/clip_frac_low": torch.tensor(clip),
        "policy/clip_frac_high": torch.tensor(0.0),
        "policy/approx_kl": torch.tensor(0.0),
        "policy/ratio_mean": torch.tensor(1.0),
        keys.RATIO_MAX: torch.tensor(ratio[1]),
        keys.RATIO_MIN: torch.tensor(ratio[0]),
    }
    if gate is not None:
        st.update(
            {
                keys.LLDS_GATE_FRAC: torch.tensor(gate),
                keys.LLDS_LOSS: torch.tensor(0.5),
                "llds/penalized_token_frac": torch.tensor(0.0),
                "llds/mean_penalty": torch.tensor(0.0),
            }
        )
    return st


def test_update_stats_sum_losses_weight_fractions_and_keep_extremes() -> None:
    stats = UpdateStats()
    assert stats.start_mini_batch()  # before any update: pi_theta == pi_old
    stats.add(micro_stats(1.0, 0.5, (0.9, 1.2), gate=0.4), 0.25, first=True, llds_acts=False)
    stats.add(micro_stats(2.0, 0.1, (0.8, 1.1), gate=0.2), 0.75, first=True, llds_acts=False)
    stats.add_update(3.0)
    assert not stats.start_mini_batch()
    stats.add(micro_stats(4.0, 0.3, (0.95, 1.5), gate=0.6), 1.0, first=False, llds_acts=True)
    stats.add_update(None)  # a skipped (non-finite) update
    out = stats.summary(mini_batches=2, processes=2)
    assert out[keys.PG_LOSS] == pytest.approx((1.0 + 2.0 + 4.0) / 2 * 2)  # shares of a sum
    assert out["policy/clip_frac_low"] == pytest.approx((0.5 * 0.25 + 0.1 * 0.75 + 0.3) / 2)
    assert out[keys.LLDS_FIRST_STEP_GATE_FRAC] == pytest.approx(0.4 * 0.25 + 0.2 * 0.75)
    assert out[keys.LLDS_LOSS] == pytest.approx(0.5 / 2 * 2)  # only where LLDS acted
    assert out["llds/gate_frac"] == pytest.approx(0.6 / 2)
    assert (out[keys.RATIO_MIN], out[keys.RATIO_MAX]) == pytest.approx((0.8, 1.5))
    assert out[keys.GRAD_NORM] == 3.0 and out["policy/grad_norm_max"] == 3.0
    assert out["optim/updates"] == 1


def test_update_stats_read_no_tensor_until_the_summary(monkeypatch) -> None:
    """A micro-batch's stats are not read on the host when added (on a GPU each read would wait
    for the device's queue); the summary reads them and gives the same figures."""
    reads: list[float] = []
    to_float = torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "__float__", lambda t: reads.append(1.0) or to_float(t))
    stats = UpdateStats()
    stats.start_mini_batch()
    stats.add(micro_stats(1.0, 0.5, (0.9, 1.2), gate=0.4), 1.0, first=True, llds_acts=False)
    assert reads == []
    stats.add_update(2.0)
    out = stats.summary(mini_batches=1, processes=1)
    assert reads and out[keys.PG_LOSS] == 1.0 and out[keys.RATIO_MAX] == pytest.approx(1.2)


def test_update_stats_without_an_update_log_nan_norms() -> None:
    stats = UpdateStats()
    stats.start_mini_batch()
    stats.add_update(None)
    out = stats.summary(mini_batches=1, processes=1)
    assert math.isnan(out[keys.GRAD_NORM]) and out["optim/updates"] == 0
