"""The one-step likelihood-displacement probe (the paper's per-question diagnostic, Eq. 3).

For each question whose sampled group has both correct and incorrect rollouts, from the same
weights:
- the first-order change of each response's log-likelihood along the GRPO update direction,
  `<grad log pi(y_i), -grad L>` with `L` the group's GRPO loss: its sign is the sign of the
  change a small plain-SGD step causes, and it needs no step size. At pi_old = pi the loss is
  linear in the advantages, so the change splits exactly into the pull of the responses with
  advantage > 0 and the drag of those with advantage < 0 (Eq. 3's two sums): LLD is a drag
  larger than the pull;
- ONE such update on that group alone (plain SGD by default, as in Eq. 3; or, as the paper
  runs its probe, a fresh AdamW at the training learning rate: `llds.probe.update`), and the
  measured change of the log-likelihood of its responses.
Every log-prob is scored at the sampling temperature, as the trainer scores its rollouts.
GRPO asks the correct responses' likelihood to rise; a change below zero is Lazy Likelihood
Displacement: the negative gradients of similar wrong responses dragged the correct ones down.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from llds.algo import group_advantages
from llds.algo.llds_in_force import llds_in_force
from llds.algo.objective import TermInputs, grpo_objective
from llds.config.algo import AlgoConfig, LLDSConfig
from llds.data.example import QAExample
from llds.env.prompts import PromptTemplate, build_prompt_ids
from llds.policy.forward import batched_log_probs, response_log_probs
from llds.probe.config import RUN_ONLY, ProbeConfig, probed_questions
from llds.probe.update import (
    TRAINER_ADAM,
    AdamSettings,
    ProbeOptimizer,
    apply_updates,
    make_optimizer,
)
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest

if TYPE_CHECKING:
    from llds.env.protocol import Protocol
    from llds.retrieval.base import Retriever


@dataclass
class ProbeResult:
    example_id: str
    question: str
    n_correct: int
    n_incorrect: int
    disp_correct: float
    """mean over correct responses of sum_t (log pi_new - log pi_old) over model tokens"""
    disp_correct_per_token: float
    disp_incorrect: float
    frac_correct_fell: float
    first_order_correct: float
    """mean over correct responses of <grad log pi(y), -grad L> (per unit SGD step)"""
    first_order_incorrect: float
    first_order_correct_drag: float = 0.0
    """the part of `first_order_correct` that the advantage < 0 responses contribute (<= 0 when
    they drag the correct ones down); the rest is the pull of the advantage > 0 responses"""
    n_correct_first_order_fell: int = 0
    """correct responses whose own first-order change is negative (drag over pull)"""

    @property
    def high_accuracy(self) -> bool:
        """More than half of the group is right (where the theorem expects the drag to win)."""
        return self.n_correct > self.n_incorrect


class FirstOrder(NamedTuple):
    """Each response's first-order log-likelihood change per unit SGD step `[B]`, and the part
    of it that the responses with advantage < 0 contribute `[B]` (total minus drag = pull)."""

    total: torch.Tensor
    drag: torch.Tensor


class GroupProbe(NamedTuple):
    """One group's probe: log-probs before and after the update `[B, R]`, and each response's
    first-order log-likelihood change per unit SGD step `[B]` with its drag part `[B]`."""

    old: torch.Tensor
    new: torch.Tensor
    first_order: torch.Tensor
    drag: torch.Tensor


def _dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return sum(float((x.float() * y.float()).sum()) for x, y in zip(a, b, strict=True))


def first_order_displacement(
    model, batch, objective: AlgoConfig, *, temperature: float = 1.0
) -> FirstOrder:
    """`<grad log pi(y_i), -grad L>` at the current weights for every response i, with `L` the
    GRPO loss of `batch` (pi_old = the current policy, ratio 1), and the same inner product with
    the loss of the advantage < 0 responses alone. A plain-SGD step of size lr changes
    `log pi(y_i)` by `lr` times the total, to first order (the paper's Eq. 3). At ratio 1 no clip
    is active and the loss is linear in the advantages, so total = pull + drag exactly.
    `log pi` is scored at the sampling `temperature`.

    Each `grad log pi(y_i)` comes from a forward of row i alone: a backward through the whole
    batch's graph per response would cost B batch backwards; this costs about one."""
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()  # no dropout: the gradients of the weights as they are
    lp, _ = response_log_probs(model, batch, temperature=temperature)
    mask = batch.loss_mask.to(lp.device)
    adv = group_advantages(batch.rewards, batch.group_ids).to(lp.device)
    # a first update (pi_theta == pi_old): LLDS, where it is asked to act there, sees d = 0
    loss, _ = grpo_objective(TermInputs(lp, lp.detach(), adv, mask, first_update=True), objective)
    descent = [-g for g in torch.autograd.grad(loss, params, retain_graph=True)]
    # the same normalization (mask unchanged), advantages > 0 zeroed: the negatives' part
    negatives = TermInputs(lp, lp.detach(), adv.clamp(max=0.0), mask, first_update=True)
    loss_neg, _ = grpo_objective(negatives, objective)
    descent_neg = [-g for g in torch.autograd.grad(loss_neg, params)]
    del lp, loss, loss_neg
    total, drag = torch.zeros(len(batch)), torch.zeros(len(batch))
    for i in range(len(batch)):
        if not mask[i].any():
            continue
        row = batch.select([i])
        lp_i, _ = response_log_probs(model, row, temperature=temperature)
        grads = torch.autograd.grad(lp_i[0][row.loss_mask[0].to(lp_i.device)].sum(), params)
        total[i], drag[i] = _dot(grads, descent), _dot(grads, descent_neg)
    return FirstOrder(total, drag)


def probe_objective(clip: float, aggregation: str, llds_coef: float) -> AlgoConfig:
    """The probe's objective: GRPO's clipped surrogate (+ LLDS when `llds_coef > 0`), with no KL
    or entropy term (the probe passes neither reference log-probs nor entropies)."""
    llds = LLDSConfig(enabled=llds_coef > 0, coef=llds_coef)
    return AlgoConfig(clip_low=clip, aggregation=aggregation, kl_coef=0.0, llds=llds)


def probe_group(
    model,
    batch,
    *,
    lr: float,
    optimizer: ProbeOptimizer = "sgd",
    adam: AdamSettings = TRAINER_ADAM,
    temperature: float = 1.0,
    clip: float = 0.2,
    aggregation: str = "token-mean",
    token_budget: int = 16384,
    updates: int = 1,
    llds_coef: float = 0.0,
    objective: AlgoConfig | None = None,
    llds: LLDSConfig | None = None,
) -> GroupProbe:
    """`updates` GRPO updates on `batch` (one question's group) and the first-order prediction
    of the first one.

    `objective`: the loss's settings and terms (a training run's own, extra terms included;
    None: GRPO's clipped surrogate at `clip` and `aggregation`, with LLDS at `llds_coef`), and
    `llds` the LLDS settings in force (None: `objective.llds`); LLDS-MA's answer weight then
    comes from the group's own searches.

    One update is the paper's Eq. 3. With more, every update after the first uses the same
    rollouts with pi_old fixed at the sampling weights (as a rollout batch's optimizer steps do
    in training), and LLDS (`llds_coef > 0`) acts from the second update on: on the first,
    pi_theta = pi_old and its penalty is exactly 0. The updates use a fresh `optimizer` (`adam`:
    AdamW's settings), and every log-prob is scored at the sampling `temperature`. The weights
    are restored before returning.
    """
    if updates < 1:
        raise ValueError(f"updates must be >= 1, got {updates}")
    saved = copy.deepcopy(model.state_dict())
    if objective is None:
        objective = probe_objective(clip, aggregation, llds_coef)
    in_force = llds_in_force(
        objective.llds if llds is None else llds,
        lambda: sum(e.num_valid_searches for e in batch.episodes) / max(1, len(batch)),
    )
    try:
        params = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer(params, optimizer, lr, adam)
        first_order, drag = first_order_displacement(
            model, batch, objective, temperature=temperature
        )
        model.zero_grad(set_to_none=True)
        model.eval()
        old, _ = batched_log_probs(model, batch, token_budget, temperature=temperature)
        apply_updates(
            model,
            batch,
            old,
            opt,
            objective,
            updates=updates,
            temperature=temperature,
            llds=in_force,
        )
        new, _ = batched_log_probs(model, batch, token_budget, temperature=temperature)
        return GroupProbe(old, new, first_order, drag)
    finally:
        model.load_state_dict(saved)
        model.zero_grad(set_to_none=True)


def run_probe(
    model,
    tokenizer,
    retriever,
    examples: Sequence[QAExample],
    *,
    group_size: int = 8,
    rollout: RolloutConfig | None = None,
    lr: float = 1e-2,
    optimizer: ProbeOptimizer = "sgd",
    adam: AdamSettings = TRAINER_ADAM,
    seed: int = 0,
    template: PromptTemplate | str | None = None,
    chat: bool | None = None,
    progress: bool = True,
    updates: int = 1,
    llds_coef: float = 0.0,
    objective: AlgoConfig | None = None,
    llds: LLDSConfig | None = None,
    start: int = 0,
    on_question: Callable[[int, ProbeResult | None], None] | None = None,
    max_probed: int | None = None,
    only: Collection[str] | None = None,
) -> list[ProbeResult]:
    """Probe every example from index `start` on; questions whose group is all-correct or
    all-wrong are skipped (GRPO gives them zero advantage, so there is nothing to displace).

    Question i's rollouts are seeded by (seed, i) alone, so a probe resumed at `start` gives
    what the whole probe would have; `on_question(i, result or None)` is called after each.
    With `max_probed` it stops once that many questions were probed. With `only`, examples
    whose id is not in it are passed over without sampling (their index still counts, so the
    others get the rollouts they get in a probe of all). Each group is scored and updated at the
    temperature it was sampled at (`rollout.temperature`; greedy scores at 1); `optimizer`, `lr`
    and `adam` are the update's, `objective` and `llds` its loss (see `probe_group`)."""
    cfg = rollout or RolloutConfig()
    engine = RolloutEngine(model, tokenizer, retriever, cfg)
    results: list[ProbeResult] = []
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("probe", total=len(examples), completed=start)
        for i, ex in enumerate(examples):
            if i < start:
                continue
            if max_probed is not None and len(results) >= max_probed:
                break
            if only is not None and ex.id not in only:
                bar.advance(task)
                if on_question is not None:
                    on_question(i, None)
                continue
            ids = build_prompt_ids(tokenizer, ex.question, template, chat=chat)
            reqs = [RolloutRequest(ids, ex.id, ex.id, ex.answers) for _ in range(group_size)]
            gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
            batch = engine.generate(reqs, generator=gen)
            bar.advance(task)
            correct = batch.rewards > 0
            if correct.all() or not correct.any():
                if on_question is not None:
                    on_question(i, None)
                continue
            old, new, first_order, drag = probe_group(
                model,
                batch,
                lr=lr,
                optimizer=optimizer,
                adam=adam,
                temperature=cfg.temperature,
                updates=updates,
                llds_coef=llds_coef,
                objective=objective,
                llds=llds,
            )
            mask = batch.loss_mask
            delta = torch.where(mask, new - old, torch.zeros_like(new)).sum(-1)
            per_tok = delta / mask.sum(-1).clamp(min=1)
            results.append(
                ProbeResult(
                    example_id=ex.id,
                    question=ex.question,
                    n_correct=int(correct.sum()),
                    n_incorrect=int((~correct).sum()),
                    disp_correct=float(delta[correct].mean()),
                    disp_correct_per_token=float(per_tok[correct].mean()),
                    disp_incorrect=float(delta[~correct].mean()),
                    frac_correct_fell=float((delta[correct] < 0).float().mean()),
                    first_order_correct=float(first_order[correct].mean()),
                    first_order_incorrect=float(first_order[~correct].mean()),
                    first_order_correct_drag=float(drag[correct].mean()),
                    n_correct_first_order_fell=int((first_order[correct] < 0).sum()),
                )
            )
            if on_question is not None:
                on_question(i, results[-1])
    return results


def drag_to_pull(r: ProbeResult) -> float:
    """How close a question is to LLD: the drag of the wrong responses on its correct ones over
    the pull of the right ones (0: no drag; >= 1: the correct likelihood falls, to first order)."""
    pull = r.first_order_correct - r.first_order_correct_drag
    drag = -r.first_order_correct_drag
    if pull <= 0:
        return math.inf if drag > 0 else 0.0
    return drag / pull


def summarize(results: Sequence[ProbeResult]) -> dict[str, Any]:
    n = len(results)
    if n == 0:
        return {"probed": 0}
    return {
        "probed": n,
        "lld_share": sum(r.disp_correct < 0 for r in results) / n,
        "first_order_lld_share": sum(r.first_order_correct < 0 for r in results) / n,
        "mean_disp_correct": sum(r.disp_correct for r in results) / n,
        "mean_disp_incorrect": sum(r.disp_incorrect for r in results) / n,
        "mean_first_order_correct": sum(r.first_order_correct for r in results) / n,
        "mean_first_order_correct_drag": sum(r.first_order_correct_drag for r in results) / n,
        "median_drag_to_pull": statistics.median(drag_to_pull(r) for r in results),
        "results": [asdict(r) for r in results],
    }


def _by_accuracy(results: Sequence[ProbeResult]) -> dict[str, float]:
    """Counts and first-order shares split at group accuracy 0.5 (`_acc_hi`: more than half
    right), and the pooled share of correct responses whose first-order change is negative."""
    out: dict[str, float] = {}
    for band, members in (
        ("acc_hi", [r for r in results if r.high_accuracy]),
        ("acc_lo", [r for r in results if not r.high_accuracy]),
    ):
        n = len(members)
        out[f"probe/groups_{band}"] = float(n)
        fell = sum(r.first_order_correct < 0 for r in members)
        out[f"probe/first_order_lld_share_{band}"] = fell / n if n else float("nan")
    correct = sum(r.n_correct for r in results)
    out["probe/correct_responses"] = float(correct)
    fell = sum(r.n_correct_first_order_fell for r in results)
    out["probe/correct_first_order_fell_share"] = fell / correct if correct else float("nan")
    return out


def probe_metrics(results: Sequence[ProbeResult]) -> dict[str, float]:
    """The probe as training metrics (`probe/*`); shares are NaN when no group was mixed.
    `probe/first_order_lld_share` is the share of probed groups whose mean correct response
    falls to first order (drag over pull); `_acc_hi` / `_acc_lo` split it at group accuracy 0.5,
    with their group counts; `probe/correct_first_order_fell_share` pools over responses."""
    s = summarize(results)
    nan = float("nan")
    return {
        **_by_accuracy(results),
        "probe/questions": float(s["probed"]),
        "probe/lld_share": s.get("lld_share", nan),
        "probe/first_order_lld_share": s.get("first_order_lld_share", nan),
        "probe/disp_correct": s.get("mean_disp_correct", nan),
        "probe/first_order_correct": s.get("mean_first_order_correct", nan),
        "probe/first_order_drag": s.get("mean_first_order_correct_drag", nan),
        "probe/drag_to_pull": s.get("median_drag_to_pull", nan),
    }


def plot_probe(results: Sequence[ProbeResult], path, title: str = "One-step probe") -> None:
    """Bar per question (sorted): mean likelihood change of its correct responses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vals = sorted(r.disp_correct for r in results)
    fig, ax = plt.subplots(figsize=(max(6, 0.12 * len(vals) + 3), 3.6))
    colors = ["#c0392b" if v < 0 else "#2e86c1" for v in vals]
    ax.bar(range(len(vals)), vals, color=colors, width=0.85)
    ax.axhline(0, color="black", lw=0.8)
    neg = sum(v < 0 for v in vals)
    ax.set_title(f"{title}: {neg}/{len(vals)} questions with LLD (correct likelihood fell)")
    ax.set_xlabel("question (sorted)")
    ax.set_ylabel("Δ log-lik of correct responses")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


PARTIAL = "probe.partial.jsonl"


def _settings(cfg: ProbeConfig) -> dict[str, Any]:
    """What each question's outcome depends on (a partial probe resumes only under the same).
    Not how many questions: question i's outcome does not depend on it, so a probe resumed with
    a larger limit or max_probed goes on where it stopped. As JSON reads them back (tuples as
    lists), so that the settings a partial file records compare equal to these."""
    import json

    skip = RUN_ONLY
    if not cfg.questions_from:  # absent, not "", so partial probes of all questions stay valid
        skip += ("questions_from",)
    return json.loads(json.dumps({k: v for k, v in asdict(cfg).items() if k not in skip}))


def _resume(path, settings: dict[str, Any]) -> tuple[int, list[ProbeResult]]:
    """(next question index, results so far) from a partial probe file; a torn last line (a
    stop while writing) is dropped; other settings are an error naming the file."""
    import json

    from llds.errors import UserInputError

    if not path.is_file():
        return 0, []
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for n, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                break
            raise UserInputError(f"{path}: line {n + 1} is not JSON") from None
    if not rows:
        return 0, []
    if rows[0].get("settings") != settings:
        raise UserInputError(
            f"{path}: a partial probe with other settings ({rows[0].get('settings')}); "
            "remove it or choose another out"
        )
    done = [r for r in rows[1:] if "index" in r]
    results = [ProbeResult(**r["result"]) for r in done if r["result"] is not None]
    return (done[-1]["index"] + 1 if done else 0), results


def probe_model(
    cfg: ProbeConfig,
    protocol: Protocol | None = None,
    *,
    examples: Sequence[QAExample] | None = None,
    retriever: Retriever | None = None,
    only: set[str] | None = None,
) -> tuple[dict[str, Any], list[ProbeResult]]:
    """Run the probe on `cfg.model` with its saved protocol (or the given one); writes
    `OUT/probe.json` (and `OUT/probe.png` when a question was probed).

    Each question's outcome is appended to `OUT/probe.partial.jsonl` as it is measured, so a
    stopped probe started again with the same settings goes on from the next question.
    `examples`, `retriever` and `only`, when given, stand for `cfg.data` read, `cfg.retriever`
    opened and `cfg.questions_from`'s questions (`llds probe` reads them before this module's
    torch is imported)."""
    import json
    from pathlib import Path

    from llds.data.loaders import load_many
    from llds.io import write_json
    from llds.policy.config import ModelConfig
    from llds.policy.setup import load_model
    from llds.retrieval.factory import open_answering_retriever

    proto = protocol or cfg.protocol.resolve(cfg.model)[0]
    # the user's files first: a bad one stops the probe before any model loads or OUT exists
    if examples is None:
        examples = load_many(cfg.data, limit=cfg.limit)
    if retriever is None:
        retriever = open_answering_retriever(cfg.retriever)
    # the protocol (template, topk, turn limits) shapes every rollout: a resume or a
    # questions_from= under another one would mix groups sampled differently
    sampling = asdict(proto)
    if only is None and cfg.questions_from:
        only = probed_questions(cfg.questions_from, cfg, sampling)
    model, tok = load_model(ModelConfig(path=cfg.model, device=cfg.device), device_key="device")
    rollout = RolloutConfig(
        **proto.rollout_limits(), group_size=cfg.group_size, temperature=cfg.temperature
    )
    template = proto.template()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    partial, settings = out / PARTIAL, {**_settings(cfg), "protocol": sampling}
    start, earlier = _resume(partial, settings)
    if start == 0:
        partial.write_text(json.dumps({"settings": settings}) + "\n", encoding="utf-8")

    def record(index: int, result: ProbeResult | None) -> None:
        line = {"index": index, "result": None if result is None else asdict(result)}
        with partial.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    results = earlier + run_probe(
        model,
        tok,
        retriever,
        examples,
        group_size=cfg.group_size,
        rollout=rollout,
        lr=cfg.lr,
        optimizer=cfg.optimizer,
        adam=AdamSettings(tuple(cfg.betas), cfg.eps, cfg.weight_decay),
        seed=cfg.seed,
        template=template,
        chat=proto.chat,
        updates=cfg.updates,
        llds_coef=cfg.llds_coef,
        start=start,
        on_question=record,
        max_probed=None if cfg.max_probed is None else max(0, cfg.max_probed - len(earlier)),
        only=only,
    )
    summary = {
        **summarize(results),
        "settings": {**settings, "limit": cfg.limit, "max_probed": cfg.max_probed},
    }
    write_json(out / "probe.json", summary)
    if results:
        title = "One-step probe" if cfg.updates == 1 else f"{cfg.updates}-update probe"
        if cfg.llds_coef > 0:
            title += f" with LLDS (lambda {cfg.llds_coef:g})"
        plot_probe(results, out / "probe.png", title=title)
    partial.unlink()
    return summary, results
