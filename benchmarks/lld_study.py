"""The LLD study: does GRPO on the organism enter the death spiral at a sane learning rate, does
LLDS stop it, and does the detector see it coming? (Protocol: benchmarks/README.md, "The LLD
study"; written before the runs.)

Each arm is an override file of one recipe (`benchmarks/lld_study/*.yaml`, `base.yaml` on the
`organism` preset); every run starts from the demo's warm start. Seed sets: `tune` (10 11 12:
the detector's thresholds are set on these) and `judge` (0 1 2: judged with frozen thresholds).

    llds demo --out runs/demo --skip-train                     # world + warm start (once)
    python benchmarks/lld_study.py --demo runs/demo --out runs/lld-study --set tune
    python benchmarks/lld_study.py --demo runs/demo --out runs/lld-study --set judge
    python benchmarks/lld_study.py ... --summarize-only        # tables from what is on disk
    python benchmarks/lld_study.py --factor similar-names --out runs/lld-study --set judge

`--factor` runs the same recipe on one of the theorem's factors (`FACTORS`): its own world and
warm start, built once under `OUT/FACTOR/warm` (world, SFT, start EM), runs under `OUT/FACTOR`.

Resumable: a finished run is skipped, an interrupted one resumes from its last checkpoint.
Runs go `--parallel` at a time (one thread each), through `llds.train.background.start_run`.
Writes `lld_study.json` and `lld_study.png` in --out and prints the markdown tables.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import finished, machine, run_unfinished
from llds import metrics as keys
from llds.env.rewards import normalize_answer
from llds.env.tags import INFO_CLOSE, INFO_OPEN
from llds.monitor.alarms import scan_alarms
from llds.runs.eval_result import EvalRecord, EvalResult, eval_file
from llds.runs.tracking import read_metrics
from llds.train.config import TrainConfig, load_config

HERE = Path(__file__).resolve().parent / "lld_study"
ARMS: dict[str, str] = {
    "GRPO": "grpo.yaml",
    "GRPO+LLDS": "grpo-llds.yaml",
    # the variants, run where GRPO showed LLD (each changes one thing against GRPO+LLDS)
    "GRPO+LLDS-MA": "grpo-llds-ma.yaml",
    "GRPO+LLDS-lam0.1": "grpo-llds-lam0.1.yaml",
    "GRPO+LLDS-lam0.01": "grpo-llds-lam0.01.yaml",
    "GRPO+LLDS-token": "grpo-llds-token.yaml",
    "GRPO+LLDS-response": "grpo-llds-response.yaml",
}
MAIN_ARMS = ["GRPO", "GRPO+LLDS"]
SEED_SETS: dict[str, tuple[int, ...]] = {"tune": (10, 11, 12), "judge": (0, 1, 2)}
COLORS = {
    "GRPO": "tab:red",
    "GRPO+LLDS": "tab:blue",
    "GRPO+LLDS-MA": "tab:green",
    "GRPO+LLDS-lam0.1": "tab:purple",
    "GRPO+LLDS-lam0.01": "tab:pink",
    "GRPO+LLDS-token": "tab:olive",
    "GRPO+LLDS-response": "tab:cyan",
}

# The collapse definition (pre-registered): the 10-step median training reward falls to at most
# half of its running peak (a peak of at least 0.2) and stays there to the end of the run.
SMOOTH = 10
DROP = 0.5
MIN_PEAK = 0.2
LLD_WINDOW = 50  # steps before the collapse in which LLD is looked for


@dataclass(frozen=True)
class Factor:
    """One of the theorem's factors: what changes against the organism's world (`WorldConfig`
    keys) and warm start (`SFTConfig` keys of the `sft-demo` preset); GRPO is the same recipe."""

    why: str
    world: dict[str, Any] = field(default_factory=dict)
    sft: dict[str, Any] = field(default_factory=dict)


FACTORS: dict[str, Factor] = {
    "similar-names": Factor(
        "half of the names are near-duplicates of another (one syllable changed), and names are "
        "sub-word pieces, not one token each: right and wrong answers share most of their tokens",
        world={"name_similarity": 0.5},
        sft={"name_tokens": False},
    ),
    "long-chains": Factor(
        "80% of the questions need 2-3 searches (organism: 50%): correct and incorrect responses "
        "share their first searches and the passages those return",
        world={"hop_mix": {1: 0.2, 2: 0.4, 3: 0.4}},
    ),
    "larger-model": Factor(
        "a 6.2M-parameter model (hidden 256, 6 layers; organism: 0.6M, 128 x 2)",
        sft={"hidden": 256, "layers": 6},
    ),
}
WARM_START_EM = (0.15, 0.75)  # pre-registered range of a usable warm start's held-out EM


def build_warm_start(name: str, root: Path, sft_steps: int | None = None) -> Path:
    """The factor's world and warm start (the demo's recipe with the factor's changes), and its
    held-out EM, in `root/warm`; what is already there is kept. Returns that folder."""
    from llds.data.world import WorldConfig, generate_world, write_world
    from llds.demo import TEMPLATE, evaluate_model
    from llds.sft import load_sft_config
    from llds.sft import run as run_sft

    factor, warm = FACTORS[name], root / "warm"
    print(f"{name}: {factor.why}", flush=True)
    if not (warm / "world" / "train.jsonl").is_file():
        write_world(generate_world(WorldConfig.preset("organism", **factor.world)), warm / "world")
    (warm / "prompt.txt").write_text(TEMPLATE, encoding="utf-8")
    if not (warm / "sft" / "model").is_dir():
        given = {
            "world": str(warm / "world"),
            "out": str(warm / "sft"),
            "prompt_template": str(warm / "prompt.txt"),
            "seed": 0,
            "threads": 1,
            "progress": False,
            **factor.sft,
        }
        if sft_steps is not None:
            given["steps"] = sft_steps
        t0 = time.perf_counter()
        run_sft(load_sft_config("sft-demo", given))
        print(f"{name}: warm start trained in {time.perf_counter() - t0:.0f} s", flush=True)
    start = eval_file(warm / "sft", 0)
    if not start.is_file():
        evaluate_model(warm / "sft" / "model", warm, start, 120)
    res = EvalResult.read(start)
    lo, hi = WARM_START_EM
    verdict = "usable" if lo <= res.overall.em <= hi else f"outside [{lo}, {hi}]"
    print(f"{name}: warm start held-out EM {res.overall.em:.3f} ({verdict})", flush=True)
    return warm


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / arm.replace("+", "_") / f"seed{seed}"


def arm_config(
    demo: Path, out: Path, arm: str, seed: int, extra: Sequence[str] = ()
) -> TrainConfig:
    """The run of `arm` for `seed`: the arm's file plus the warm start's paths and the seed
    (and `extra` overrides, for measurements that rerun part of a study run)."""
    return load_config(
        HERE / ARMS[arm],
        [
            f"run_dir={run_dir(out, arm, seed)}",
            f"seed={seed}",
            f"model.path={demo / 'sft' / 'model'}",
            f"data.train={demo / 'world' / 'train.jsonl'}",
            f"data.eval={demo / 'world' / 'test.jsonl'}",
            f"retriever.source={demo / 'world' / 'corpus.jsonl'}",
            *extra,
        ],
    )


def select_seeds(seed_set: str, wanted: Sequence[int] | None) -> tuple[int, ...]:
    """The set's seeds, or the wanted ones among them in the set's order (a typo fails loudly:
    a seed outside the set would be a run no protocol named)."""
    seeds = SEED_SETS[seed_set]
    if not wanted:
        return seeds
    if not set(wanted) <= set(seeds):
        raise ValueError(f"--seeds {list(wanted)}: the {seed_set} set has seeds {list(seeds)}")
    return tuple(s for s in seeds if s in wanted)


def run_all(demo: Path, out: Path, arms: Sequence[str], seeds: Sequence[int], parallel: int):
    """Every unfinished (arm, seed) in its own process, `parallel` at a time."""
    run_unfinished([arm_config(demo, out, arm, s) for s in seeds for arm in arms], parallel)


PROBE_QUESTIONS = 64  # training questions sampled by the end-of-run probe (mixed groups kept)


def probe_final(model_dir: Path, demo: Path, out: Path) -> dict[str, Any]:
    """The one-step probe (Eq. 3) on `model_dir` over the first PROBE_QUESTIONS training
    questions, 8 rollouts each; cached in `out/probe.json`."""
    cached = out / "probe.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    from llds.probe.one_step import ProbeConfig, probe_model

    cfg = ProbeConfig(
        model=str(model_dir),
        data=[str(demo / "world" / "train.jsonl")],
        retriever=str(demo / "world" / "corpus.jsonl"),
        out=str(out),
        limit=PROBE_QUESTIONS,
    )
    summary, _ = probe_model(cfg)
    return summary


def probe_all(demo: Path, out: Path, arms: Sequence[str], seeds: Sequence[int]) -> None:
    """The end-of-run probe of every finished run, and of the warm start they all began from."""
    probe_final(demo / "sft" / "model", demo, out / "warm_start_probe")
    for arm in arms:
        for seed in seeds:
            cfg = arm_config(demo, out, arm, seed)
            if finished(cfg):
                last = Path(cfg.run_dir) / "checkpoints" / f"step_{cfg.steps:06d}" / "model"
                probe_final(last, demo, Path(cfg.run_dir) / "probe_final")


def _probe_cells(summary: dict[str, Any] | None) -> str:
    if not summary or not summary.get("probed"):
        return "-"
    return (
        f"{summary['lld_share']:.2f} / {summary['first_order_lld_share']:.2f} / "
        f"{summary['median_drag_to_pull']:.2f} (n={summary['probed']})"
    )


def _median_window(values: Sequence[float | None], end: int, width: int) -> float | None:
    window = [v for v in values[max(0, end - width + 1) : end + 1] if v is not None]
    return statistics.median(window) if window else None


def collapse_step(steps: Sequence[int], reward: Sequence[float]) -> int | None:
    """The pre-registered collapse: the first step from which the 10-step median reward stays at
    or below half of the running peak (>= 0.2) of that median to the end of the run."""
    smooth = [_median_window(reward, i, SMOOTH) for i in range(len(reward))]
    peak, low_since = 0.0, None
    for i, s in enumerate(smooth):
        assert s is not None
        peak = max(peak, s)
        if peak >= MIN_PEAK and s <= DROP * peak:
            low_since = i if low_since is None else low_since
        else:
            low_since = None
    return steps[low_since] if low_since is not None else None


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else None


def deepest_dip(smooth: Sequence[float]) -> tuple[int, int]:
    """`(peak, trough)` indices of the largest fall of a series: the pair peak < trough that
    maximizes smooth[peak] - smooth[trough] (0, 0 for a series that never falls)."""
    best, best_pair, top = 0.0, (0, 0), 0
    for i, v in enumerate(smooth):
        if v > smooth[top]:
            top = i
        if smooth[top] - v > best:
            best, best_pair = smooth[top] - v, (top, i)
    return best_pair


DIP_KEYS = (  # what the deepest-dip table compares between the first 50 steps and the fall
    keys.DISP_POS,
    keys.FRAC_POS_FELL,
    "lld/logp_correct",
    keys.ENTROPY,
    "policy/approx_kl",
    "policy/clip_frac_low",
)


def dip_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The deepest fall of the 10-step median reward (descriptive, found after the runs) and
    the medians of DIP_KEYS over it and over the first 50 steps: LLD shows as pushed-up
    responses losing likelihood during the fall; a diverging step size as KL and clip fractions
    far above their start."""
    reward = [r[keys.REWARD_MEAN] for r in rows]
    smooth = [_median_window(reward, i, SMOOTH) or 0.0 for i in range(len(reward))]
    peak, trough = deepest_dip(smooth)
    fall = rows[peak : trough + 1]
    return {
        "peak_step": rows[peak]["step"],
        "trough_step": rows[trough]["step"],
        "peak": smooth[peak],
        "trough": smooth[trough],
        "fall": {k: _median_of(fall, k) for k in DIP_KEYS},
        "start": {k: _median_of(rows[:LLD_WINDOW], k) for k in DIP_KEYS},
    }


def copied_share(result: EvalResult) -> float | None:
    """Share of the answered questions whose answer appears verbatim in a passage the model
    retrieved for it: does the policy answer from its searches, or from memory? (Descriptive;
    added after the `long-chains` runs, where held-out answers stopped following the passages.)"""
    answered = [r for r in result.records if r.prediction and normalize_answer(r.prediction)]
    if not answered:
        return None
    pattern = re.compile(re.escape(INFO_OPEN) + "(.*?)" + re.escape(INFO_CLOSE), re.S)

    def copied(r: EvalRecord) -> bool:
        # normalized as EM is (case, punctuation, articles), on word boundaries
        passages = normalize_answer(" ".join(pattern.findall(r.response)))
        return f" {normalize_answer(r.prediction or '')} " in f" {passages} "

    return sum(map(copied, answered)) / len(answered)


PUNCTUATION_RUN = re.compile(r"([^\w\s<>/])\1{4,}")
"""Five or more of the same punctuation character in a row (tags' brackets and slashes aside)."""


def punctuation_run_share(result: EvalResult) -> float | None:
    """Share of the held-out responses that contain a run of 5+ of one punctuation character
    (`Kulban)))))`): degenerate text that EM cannot see, because its normalization drops
    punctuation. (Descriptive; added after a `similar-names` GRPO run kept its EM while its
    reference chains lost 75 nats.)"""
    if not result.records:
        return None
    return sum(bool(PUNCTUATION_RUN.search(r.response)) for r in result.records) / len(
        result.records
    )


EVAL_SHARES = {"copied": copied_share, "punctuation_runs": punctuation_run_share}
"""The per-evaluation shares every run summary carries, by name."""


SEARCH_TAIL = 50  # steps at the end of a run over which valid searches are averaged
SEARCH_WINDOW = 25  # width of the sliding window whose lowest mean shows the one-search state


def search_summary(per_step: Sequence[float | None]) -> dict[str, float | None]:
    """Valid searches per rollout: the mean over the last SEARCH_TAIL steps and the lowest mean
    of any SEARCH_WINDOW consecutive steps (stage 3's measure of the one-search collapse, which
    LLDS-MA is meant to prevent)."""
    vals = [v for v in per_step if v is not None]
    if not vals:
        return {"last": None, "lowest_window": None}
    windows = [
        statistics.fmean(vals[i : i + SEARCH_WINDOW])
        for i in range(max(1, len(vals) - SEARCH_WINDOW + 1))
    ]
    return {"last": statistics.fmean(vals[-SEARCH_TAIL:]), "lowest_window": min(windows)}


def summarize_run(path: Path) -> dict[str, Any]:
    rows = read_metrics(path)
    if not rows:
        raise SystemExit(f"{path}: no metrics.jsonl rows (run the study first)")
    steps = [r["step"] for r in rows]
    reward = [r[keys.REWARD_MEAN] for r in rows]
    collapse = collapse_step(steps, reward)
    # each held-out evaluation read once, for every share of `EVAL_SHARES`
    evals = {
        int(f.stem.split("_")[1]): EvalResult.read(f)
        for f in sorted((path / "eval").glob("step_*.json"))
    }
    # replayed with the detector of this checkout, not read from what fired online
    critical = [a for a in scan_alarms(rows) if a.severity == "critical"]
    first = critical[0].step if critical else None
    out: dict[str, Any] = {
        "steps": steps[-1],
        "collapse_step": collapse,
        "first_critical_alarm": first,
        "first_critical_kind": critical[0].kind if critical else None,
        "lead": None if collapse is None or first is None else collapse - first,
        "false_alarm": collapse is None and first is not None,
        "eval_em": {r["step"]: r["eval/em"] for r in rows if "eval/em" in r},
        **{
            name: {step: share(result) for step, result in evals.items()}
            for name, share in EVAL_SHARES.items()
        },
        "first10": {
            "approx_kl": _mean(rows[:10], "policy/approx_kl"),
            "clip_frac": sum(
                _mean(rows[:10], f"policy/clip_frac_{side}") or 0.0 for side in ("low", "high")
            ),
        },
        "wall_s": sum(r["time/step"] for r in rows),
        # per-step LLD episodes: steps whose pushed-up responses lost likelihood on average
        "lld_steps": sum(1 for r in rows if (r.get(keys.DISP_POS) or 0.0) < 0),
        "worst_disp_pos": min(
            (r[keys.DISP_POS] for r in rows if r.get(keys.DISP_POS) is not None), default=None
        ),
        "dip": dip_summary(rows),
        "searches": search_summary([r.get(keys.VALID_SEARCHES) for r in rows]),
        "probe_final": (
            json.loads((path / "probe_final" / "probe.json").read_text())
            if (path / "probe_final" / "probe.json").is_file()
            else None
        ),
        "series": {
            k: [r.get(k) for r in rows]
            for k in (keys.REWARD_MEAN, keys.DISP_POS, keys.FRAC_POS_FELL, keys.ENTROPY)
        },
    }
    if collapse is not None:
        i = steps.index(collapse)
        before = rows[max(0, i - LLD_WINDOW) : i]
        out["before_collapse"] = {
            "disp_pos_median": _median_of(before, keys.DISP_POS),
            "frac_pos_fell_median": _median_of(before, keys.FRAC_POS_FELL),
            "reward_start": _median_window(reward, max(0, i - LLD_WINDOW), SMOOTH),
            "reward_peak_step": steps[max(range(i + 1), key=lambda j: reward[j])],
            "approx_kl": _mean(before, "policy/approx_kl"),
        }
    return out


def _median_of(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _series_median(r: dict[str, Any], key: str) -> float | None:
    vals = [v for v in r["series"][key] if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _alarm_cell(r: dict[str, Any]) -> str:
    """`401 (collapse)`: the run's first critical alarm and its kind, or `none`."""
    if not r["first_critical_alarm"]:
        return "none"
    return f"{r['first_critical_alarm']} ({r['first_critical_kind']})"


def _displacement_cell(r: dict[str, Any]) -> str:
    """`108 / -16.28`: steps with `disp_pos` < 0 and the worst `disp_pos` of the run."""
    return f"{_fmt(r['lld_steps'])} / {_fmt(r['worst_disp_pos'], 2)}"


def table(study: dict[str, dict[int, dict[str, Any]]], start: float | None) -> str:
    checkpoints = sorted(
        {s for runs in study.values() for r in runs.values() for s in r["eval_em"]}
    )
    head = ["arm", "seed", "start EM", *[f"EM @ {c}" for c in checkpoints]]
    head += ["collapse step", "first critical alarm", "lead", "disp_pos before", "KL / clip, 1-10"]
    head += ["median disp_pos / frac_pos_fell", "steps with disp_pos < 0 / worst disp_pos"]
    head += ["end probe: LLD / 1st-order LLD / drag:pull"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, runs in study.items():
        for seed, r in sorted(runs.items()):
            b = r.get("before_collapse", {})
            cells = [arm, str(seed), _fmt(start)]
            cells += [_fmt(r["eval_em"].get(c)) for c in checkpoints]
            cells += [
                _fmt(r["collapse_step"]) if r["collapse_step"] else "none",
                _alarm_cell(r),
                _fmt(r["lead"]),
                _fmt(b.get("disp_pos_median")),
                f"{_fmt(r['first10']['approx_kl'], 4)} / {_fmt(r['first10']['clip_frac'])}",
                f"{_fmt(_series_median(r, keys.DISP_POS))} / "
                f"{_fmt(_series_median(r, keys.FRAC_POS_FELL))}",
                _displacement_cell(r),
                _probe_cells(r.get("probe_final")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _largest_share(shares: dict[Any, float | None]) -> str:
    """`0.05 (step 250)`: the largest of a run's per-evaluation shares and where it was
    (`0.00` when every evaluation had none)."""
    known = {int(step): v for step, v in shares.items() if v is not None}
    if not known:
        return "-"
    step = max(known, key=lambda s: (known[s], -s))
    return f"{known[step]:.2f} (step {step})" if known[step] > 0 else "0.00"


def variant_table(study: dict[str, dict[int, dict[str, Any]]]) -> str:
    """The stage-3 table (one row per run): held-out EM at each evaluation, collapse, first
    critical alarm, steps with `disp_pos` < 0, lowest EM, valid searches (last steps / lowest
    window) and the largest share of held-out responses with punctuation runs."""
    head = ["arm", "seed", "EM @ evaluations", "collapse (pre-registered)"]
    head += ["first critical alarm", "steps with disp_pos < 0 / worst", "lowest EM"]
    head += [f"valid searches: last {SEARCH_TAIL} steps / lowest {SEARCH_WINDOW}-step mean"]
    head += ["held-out punctuation runs, largest share"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, runs in study.items():
        for seed, r in sorted(runs.items()):
            ems = [em for _, em in sorted((int(s), em) for s, em in r["eval_em"].items())]
            searches = r.get("searches") or {}
            cells = [
                arm,
                str(seed),
                " / ".join(_fmt(em) for em in ems),
                _fmt(r["collapse_step"]) if r["collapse_step"] else "none",
                _alarm_cell(r),
                _displacement_cell(r),
                _fmt(min((em for em in ems if em is not None), default=None)),
                f"{_fmt(searches.get('last'), 2)} / {_fmt(searches.get('lowest_window'), 2)}",
                _largest_share(r.get("punctuation_runs") or {}),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dip_table(study: dict[str, dict[int, dict[str, Any]]]) -> str:
    """Each run's deepest reward fall with the medians of DIP_KEYS (first 50 steps -> fall)."""
    head = ["arm", "seed", "10-step median reward: peak (step) -> trough (step)"]
    head += [f"{k}: first 50 -> fall" for k in DIP_KEYS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, runs in study.items():
        for seed, r in sorted(runs.items()):
            d = r["dip"]
            cells = [
                arm,
                str(seed),
                f"{d['peak']:.2f} ({d['peak_step']}) -> {d['trough']:.2f} ({d['trough_step']})",
            ]
            cells += [f"{_fmt(d['start'][k], 3)} -> {_fmt(d['fall'][k], 3)}" for k in DIP_KEYS]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def share_table(study: dict[str, dict[int, dict[str, Any]]], name: str, start: float | None) -> str:
    """Per run, one of the `EVAL_SHARES` at each held-out evaluation (`start`: the warm
    start's value)."""
    evals = sorted({s for runs in study.values() for r in runs.values() for s in r[name]})
    head = ["arm", "seed", "start", *[f"@ {s}" for s in evals]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, runs in study.items():
        for seed, r in sorted(runs.items()):
            cells = [arm, str(seed), _fmt(start, 2), *[_fmt(r[name].get(s), 2) for s in evals]]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(
    study: dict[str, dict[int, dict[str, Any]]], path: Path, start: float | None = None
) -> None:
    """Reward, displacement, share fell and held-out EM per run (the warm start's EM, when
    known, is step 0 of every EM curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (keys.REWARD_MEAN, "training reward (10-step median)"),
        (keys.DISP_POS, "displacement of A>0 responses (10-step median)"),
        (keys.FRAC_POS_FELL, "share of A>0 responses that lost likelihood"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    for arm, runs in study.items():
        for r in runs.values():
            color = COLORS.get(arm, "black")
            for ax, (key, title) in zip(axes, panels, strict=False):
                ys = r["series"][key]
                smooth = [_median_window(ys, i, SMOOTH) for i in range(len(ys))]
                ax.plot(range(1, len(ys) + 1), smooth, color=color, lw=1, alpha=0.8)
                ax.set_title(title, fontsize=10)
            em = sorted({**({0: start} if start is not None else {}), **r["eval_em"]}.items())
            axes[3].plot([s for s, _ in em], [v for _, v in em], color=color, marker="o", lw=1)
            if r["collapse_step"]:
                axes[0].axvline(r["collapse_step"], color=color, ls=":", lw=0.8)
            if r["first_critical_alarm"]:
                axes[0].plot(r["first_critical_alarm"], 0, marker="^", color=color)
    axes[1].axhline(0, color="black", lw=0.6)
    axes[3].set_title("held-out EM (120 questions, greedy)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
    handles = [plt.Line2D([], [], color=c, label=a) for a, c in COLORS.items() if a in study]
    axes[3].legend(handles=handles, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=Path("runs/demo"))
    ap.add_argument("--out", type=Path, default=Path("runs/lld-study"))
    ap.add_argument("--set", choices=sorted(SEED_SETS), default="tune")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=MAIN_ARMS)
    ap.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        help="run (and tabulate) only these seeds of the set, e.g. to finish one before the next",
    )
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument(
        "--factor",
        choices=["organism", *FACTORS],
        default="organism",
        help="organism: the demo's warm start (--demo); else the factor's own world and warm "
        "start, built under OUT/FACTOR/warm",
    )
    ap.add_argument("--sft-steps", type=int, help="a factor's warm start: SFT steps (default 1200)")
    ap.add_argument("--summarize-only", action="store_true")
    ap.add_argument(
        "--probe-final",
        action="store_true",
        help="run the one-step probe on every finished run's last checkpoint and the warm start",
    )
    args = ap.parse_args()
    try:
        seeds = select_seeds(args.set, args.seeds)
    except ValueError as e:
        ap.error(str(e))
    if args.factor != "organism":
        args.out = args.out / args.factor
        # tables only read what is on disk: no world or warm start is built for them
        if args.summarize_only:
            args.demo = args.out / "warm"
        else:
            args.demo = build_warm_start(args.factor, args.out, args.sft_steps)
    if not args.summarize_only:
        if not (args.demo / "sft" / "model").is_dir():
            raise SystemExit(f"{args.demo}: no warm start; run `llds demo --out {args.demo}`")
        run_all(args.demo, args.out, args.arms, seeds, args.parallel)
    if args.probe_final:
        probe_all(args.demo, args.out, args.arms, seeds)
    study = {
        arm: {
            s: summarize_run(run_dir(args.out, arm, s))
            for s in seeds
            if (run_dir(args.out, arm, s) / "metrics.jsonl").is_file()
        }
        for arm in args.arms
    }
    start_file = eval_file(args.demo / "sft", 0)
    start = EvalResult.read(start_file).overall.em if start_file.is_file() else None
    print(f"machine: {machine()}")
    print(f"factor: {args.factor}; seed set: {args.set} {seeds}")
    warm = args.out / "warm_start_probe" / "probe.json"
    if warm.is_file():
        cells = _probe_cells(json.loads(warm.read_text()))
        print(f"warm start probe (LLD / 1st-order LLD / drag:pull): {cells}")
    print()
    print(table(study, start))
    print()
    print("Per run, as in stage 3's tables:")
    print(variant_table(study))
    print()
    print("The deepest fall of each run's reward (descriptive, not pre-registered):")
    print(dip_table(study))
    titles = {
        "copied": "Held-out answers copied from a retrieved passage",
        "punctuation_runs": "Held-out responses with a run of 5+ of one punctuation character",
    }
    start_eval = EvalResult.read(start_file) if start_file.is_file() else None
    for name, share in EVAL_SHARES.items():
        print()
        print(f"{titles[name]} (descriptive, not pre-registered):")
        print(share_table(study, name, share(start_eval) if start_eval else None))
    args.out.mkdir(parents=True, exist_ok=True)
    slim = {
        a: {s: {k: v for k, v in r.items() if k != "series"} for s, r in runs.items()}
        for a, runs in study.items()
    }
    (args.out / f"lld_study_{args.set}.json").write_text(json.dumps(slim, indent=1))
    plot(study, args.out / f"lld_study_{args.set}.png", start)


if __name__ == "__main__":
    main()
