"""What a warm start looks like before any RL, measured against the LLD theorem's conditions.

The theorem (arXiv 2512.04220, Thm 4.2) predicts likelihood displacement of correct responses
when wrong responses are low-likelihood over many tokens and similar to the right ones. Whether
a warm start offers that is measurable from sampled groups alone: the policy's entropy, how long
and how likely right and wrong responses are, how often a wrong response starts exactly as a
right one of its group, how close their hidden states are, and the Eq. 3 first-order drag and
pull of each correct response. Every share is pooled over responses (or tokens), never a mean
of per-group shares, so small groups do not weigh as much as large ones.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from llds.data.example import QAExample
from llds.env.prompts import PromptTemplate, build_prompt_ids
from llds.monitor.likelihood import group_hidden_similarity
from llds.policy.forward import pooled_response_hidden, response_log_probs
from llds.probe.one_step import first_order_displacement, probe_objective
from llds.rollout import RolloutBatch, RolloutConfig, RolloutEngine, RolloutRequest

MIN_ACCURACY = 0.5
"""sampled accuracy a warm start must reach (issue: at least half its responses right)"""
MIN_ENTROPY = 0.3
"""policy entropy, nats per model token, a warm start must keep"""


@dataclass
class ProbeByAccuracy:
    """Eq. 3 first-order drag and pull of the correct responses of mixed groups in one band of
    group accuracy. A response is dragged down when the drag of the negatives exceeds the pull
    of the positives (drag/pull above 1): its first-order likelihood change is below zero."""

    groups: int = 0
    correct_responses: int = 0
    share_drag_over_pull: float = math.nan
    """correct responses with drag/pull > 1, pooled over the band's correct responses"""
    share_groups_drag_over_pull: float = math.nan
    """groups whose mean drag over their correct responses exceeds their mean pull"""


@dataclass
class WarmStartReport:
    """The measurements of `measure_warm_start`; `to_dict` is its JSON form."""

    questions: int
    group_size: int
    temperature: float
    responses: int
    accuracy: float
    """sampled accuracy: share of responses with reward > 0"""
    entropy_per_token: float
    """policy entropy at the sampling temperature, pooled over all model-written tokens"""
    tokens_right: list[int] = field(default_factory=list, repr=False)
    tokens_wrong: list[int] = field(default_factory=list, repr=False)
    loglik_per_token_right: float = math.nan
    """sum of log-likelihoods over right responses' model tokens / their number of tokens"""
    loglik_per_token_wrong: float = math.nan
    mixed_groups: int = 0
    wrong_in_mixed_groups: int = 0
    first_action_shared: float = math.nan
    """wrong responses of mixed groups whose first action (token ids) equals a right one's"""
    first_search_shared: float = math.nan
    """wrong responses of mixed groups whose first search query (text, stripped) equals a right
    one's: the same start in what it asks, whatever the thinking text around it"""
    hidden_cosine: float = math.nan
    """mean cosine of right vs wrong pooled hidden states, per group then over mixed groups"""
    probe_low: ProbeByAccuracy = field(default_factory=ProbeByAccuracy)
    """groups with at most half of their responses correct"""
    probe_high: ProbeByAccuracy = field(default_factory=ProbeByAccuracy)
    """groups with more than half correct"""
    probe_by_correct: dict[int, ProbeByAccuracy] = field(default_factory=dict)
    """the probed groups again, by their number of correct responses (finer than the bands)"""

    @property
    def meets_conditions(self) -> bool:
        """Sampled accuracy and entropy both at least the thresholds fixed above."""
        return self.accuracy >= MIN_ACCURACY and self.entropy_per_token >= MIN_ENTROPY

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("tokens_right", "tokens_wrong"):
            counts = out.pop(key)
            out[f"{key}_n"] = len(counts)
            out[f"{key}_mean"] = statistics.fmean(counts) if counts else math.nan
            out[f"{key}_median"] = statistics.median(counts) if counts else math.nan
        out["meets_conditions"] = self.meets_conditions
        return out


def _first_actions(batch: RolloutBatch) -> list[tuple[int, ...]]:
    """Each row's first action as the token ids the model sampled."""
    ids = batch.response_ids
    return [tuple(ids[i][batch.action_index[i] == 0].tolist()) for i in range(len(batch))]


def _first_query(episode: Any) -> str | None:
    """The first search query an episode made (None when it made none)."""
    return episode.queries[0].strip() if episode.queries else None


def _groups(batch: RolloutBatch) -> dict[str, list[int]]:
    rows: dict[str, list[int]] = {}
    for r, g in enumerate(batch.group_ids):
        rows.setdefault(g, []).append(r)
    return rows


def _sample(
    engine: RolloutEngine,
    tokenizer: Any,
    examples: Sequence[QAExample],
    group_size: int,
    generator: torch.Generator,
    template: PromptTemplate | str | None,
    chat: bool | None,
) -> RolloutBatch:
    reqs = []
    for ex in examples:
        ids = build_prompt_ids(tokenizer, ex.question, template, chat=chat)
        reqs += [RolloutRequest(ids, ex.id, ex.id, ex.answers) for _ in range(group_size)]
    return engine.generate(reqs, generator=generator)


class _Tally:
    """Running pooled sums over the sampled chunks."""

    def __init__(self) -> None:
        self.tokens = 0
        self.entropy = 0.0
        self.right = 0
        self.responses = 0
        self.lp = {True: 0.0, False: 0.0}
        self.n_tok: dict[bool, list[int]] = {True: [], False: []}
        self.mixed = 0
        self.wrong_mixed = 0
        self.wrong_shared = 0
        self.wrong_same_search = 0
        self.cosines: list[float] = []
        self.bands: dict[str, list[tuple[list[bool], list[bool]]]] = {"low": [], "high": []}
        self.by_correct: dict[int, list[tuple[list[bool], list[bool]]]] = {}


def _measure_chunk(model: Any, batch: RolloutBatch, t: float, tally: _Tally, probe: dict) -> None:
    mask = batch.loss_mask.bool()
    with torch.no_grad():
        lp, ent = response_log_probs(model, batch, temperature=t, with_entropy=True)
        hidden = pooled_response_hidden(model, batch, probe["token_budget"])
    lp, ent, mask = lp.cpu(), ent.cpu(), mask.cpu()
    correct = (batch.rewards > 0).tolist()
    counts = mask.sum(-1).tolist()
    tally.tokens += int(mask.sum())
    tally.entropy += float(ent[mask].sum())
    tally.responses += len(batch)
    tally.right += sum(correct)
    for i, ok in enumerate(correct):
        tally.lp[ok] += float(lp[i][mask[i]].sum())
        tally.n_tok[ok].append(int(counts[i]))
    firsts = _first_actions(batch)
    searches = [_first_query(e) for e in batch.episodes]
    for g, rows in _groups(batch).items():
        ok = [correct[r] for r in rows]
        if all(ok) or not any(ok):
            continue
        tally.mixed += 1
        good = {firsts[r] for r in rows if correct[r]}
        wrong = [r for r in rows if not correct[r]]
        tally.wrong_mixed += len(wrong)
        tally.wrong_shared += sum(firsts[r] in good for r in wrong)
        asked = {searches[r] for r in rows if correct[r]} - {None}
        tally.wrong_same_search += sum(searches[r] in asked for r in wrong)
        tally.cosines.append(group_hidden_similarity(hidden[rows], [g] * len(rows), ok))
        if probe["groups"] is not None and probe["done"] >= probe["groups"]:
            continue
        probe["done"] += 1
        first = first_order_displacement(
            model, batch.select(rows), probe["objective"], temperature=t
        )
        pull = first.total - first.drag
        dragged = [bool(-first.drag[j] > pull[j]) for j, o in enumerate(ok) if o]
        band = "low" if sum(ok) / len(ok) <= 0.5 else "high"
        drag_mean = float(first.drag[torch.tensor(ok)].mean())
        pull_mean = float(pull[torch.tensor(ok)].mean())
        record = (dragged, [-drag_mean > pull_mean])
        tally.bands[band].append(record)
        tally.by_correct.setdefault(sum(ok), []).append(record)


def _band(groups: list[tuple[list[bool], list[bool]]]) -> ProbeByAccuracy:
    responses = [d for dragged, _ in groups for d in dragged]
    return ProbeByAccuracy(
        groups=len(groups),
        correct_responses=len(responses),
        share_drag_over_pull=sum(responses) / len(responses) if responses else math.nan,
        share_groups_drag_over_pull=(
            sum(g[0] for _, g in groups) / len(groups) if groups else math.nan
        ),
    )


def sample_groups(
    model: Any,
    tokenizer: Any,
    retriever: Any,
    examples: Sequence[QAExample],
    rollout: RolloutConfig,
    *,
    seed: int = 0,
    template: PromptTemplate | str | None = None,
    chat: bool | None = None,
    questions_per_chunk: int = 8,
) -> Iterator[RolloutBatch]:
    """`rollout.group_size` rollouts per example at `rollout.temperature`, a chunk of questions
    per batch, from one generator seeded by `seed` (the same seed gives the same rollouts)."""
    if rollout.temperature <= 0:
        raise ValueError("a warm start is measured on samples: rollout.temperature must be > 0")
    engine = RolloutEngine(model, tokenizer, retriever, rollout)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device if device.type == "cuda" else "cpu")
    generator.manual_seed(seed)
    for lo in range(0, len(examples), questions_per_chunk):
        part = examples[lo : lo + questions_per_chunk]
        yield _sample(engine, tokenizer, part, rollout.group_size, generator, template, chat)


def measure_batches(
    model: Any,
    batches: Iterable[RolloutBatch],
    temperature: float,
    *,
    probe_groups: int | None = None,
    clip: float = 0.2,
    aggregation: str = "token-mean",
    token_budget: int = 16384,
) -> WarmStartReport:
    """Measure sampled groups (rows of one group share a `group_id`; a group lies in one
    batch). Likelihoods and entropy are scored at `temperature`, the one they were sampled at.
    The probe (Eq. 3's first-order drag and pull under the GRPO loss of the group alone) runs on
    the first `probe_groups` mixed groups (None: all)."""
    tally = _Tally()
    probe = {
        "groups": probe_groups,
        "done": 0,
        "objective": probe_objective(clip, aggregation, 0.0),
        "token_budget": token_budget,
    }
    questions: set[str] = set()
    group_size = 0
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            sizes = _groups(batch)
            questions.update(sizes)
            group_size = max([group_size, *map(len, sizes.values())])
            _measure_chunk(model, batch, temperature, tally, probe)
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)

    def per_token(ok: bool) -> float:
        n = sum(tally.n_tok[ok])
        return tally.lp[ok] / n if n else math.nan

    return WarmStartReport(
        questions=len(questions),
        group_size=group_size,
        temperature=temperature,
        responses=tally.responses,
        accuracy=tally.right / tally.responses if tally.responses else math.nan,
        entropy_per_token=tally.entropy / tally.tokens if tally.tokens else math.nan,
        tokens_right=tally.n_tok[True],
        tokens_wrong=tally.n_tok[False],
        loglik_per_token_right=per_token(True),
        loglik_per_token_wrong=per_token(False),
        mixed_groups=tally.mixed,
        wrong_in_mixed_groups=tally.wrong_mixed,
        first_action_shared=(
            tally.wrong_shared / tally.wrong_mixed if tally.wrong_mixed else math.nan
        ),
        first_search_shared=(
            tally.wrong_same_search / tally.wrong_mixed if tally.wrong_mixed else math.nan
        ),
        hidden_cosine=statistics.fmean(tally.cosines) if tally.cosines else math.nan,
        probe_low=_band(tally.bands["low"]),
        probe_high=_band(tally.bands["high"]),
        probe_by_correct={k: _band(v) for k, v in sorted(tally.by_correct.items())},
    )


def measure_warm_start(
    model: Any,
    tokenizer: Any,
    retriever: Any,
    examples: Sequence[QAExample],
    rollout: RolloutConfig,
    *,
    seed: int = 0,
    template: PromptTemplate | str | None = None,
    chat: bool | None = None,
    probe_groups: int | None = None,
) -> WarmStartReport:
    """`sample_groups` then `measure_batches`: the whole warm-start measurement."""
    batches = sample_groups(
        model, tokenizer, retriever, examples, rollout, seed=seed, template=template, chat=chat
    )
    return measure_batches(model, batches, rollout.temperature, probe_groups=probe_groups)


def markdown_table(report: WarmStartReport) -> str:
    """The report as a two-column markdown table."""
    d = report.to_dict()

    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    rows = [(k, v) for k, v in d.items() if not isinstance(v, dict)]
    for band in ("probe_low", "probe_high"):
        rows += [(f"{band}.{k}", v) for k, v in d[band].items()]
    for correct, band in d["probe_by_correct"].items():
        name = f"probe_{correct}_of_{report.group_size}_correct"
        rows += [(f"{name}.{k}", v) for k, v in band.items()]
    lines = ["| measurement | value |", "|---|---|"]
    lines += [f"| {k} | {fmt(v)} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def high_accuracy_mixed(batch: RolloutBatch) -> int:
    """Groups of `batch` with more than half and fewer than all responses correct."""
    rows: dict[str, list[bool]] = {}
    for g, r in zip(batch.group_ids, (batch.rewards > 0).tolist(), strict=True):
        rows.setdefault(g, []).append(bool(r))
    return sum(len(ok) / 2 < sum(ok) < len(ok) for ok in rows.values())


def until_enough(
    batches: Iterator[RolloutBatch], wanted: int, deadline: float, seen: dict[str, int]
) -> Iterator[RolloutBatch]:
    """The sampled chunks, up to the one that brings `wanted` high-accuracy mixed groups (or
    the deadline: then the count in `seen` says how many there were)."""
    for batch in batches:
        seen["chunks"] += 1
        seen["high_mixed"] += high_accuracy_mixed(batch)
        yield batch
        if seen["high_mixed"] >= wanted or time.perf_counter() > deadline:
            return
