"""The corpus's logs, manifest and summary, from the runs' logs alone (PROTOCOL.md, Outputs).

`collect()` copies every finished run's logs from `runs/collapse_corpus/` into this folder's
`runs/` (the per-step log gzipped), then reads them back from there: `manifest.csv`,
`summary.json` and `summary.md` depend on the committed logs only, so a test can recompute
them from a fresh clone. The pilot's runs get their own table (`pilot.md`, `pilot.json`) with
the choice its rule makes.
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import corpus_study as S
from llds.analysis.study_logs import run_rows
from llds.report.collapse import collapse_step, median_window
from llds.runs.tracking import read_metrics

MANIFEST_COLUMNS = (
    "run",
    "mechanism",
    "seed",
    "split",
    "cause_step",
    "collapse_step",
    "arm",
    "censored",
    "abrupt",
    "last_step",
)


@dataclass(frozen=True)
class RunOutcome:
    """What the collapse rule says of one run's log."""

    run: str
    arm: str
    seed: int
    last_step: int
    collapse: int | None
    """the rule's collapse step, censored or not"""
    censored: bool
    abrupt: bool
    onset_healthy: bool
    """no collapse at or before the onset (in the trunk's part of the log)"""
    peak: float
    """the highest 10-step median reward"""
    final: float
    """the 10-step median reward at the last step"""

    @property
    def collapsed(self) -> bool:
        return self.collapse is not None and not self.censored


def outcome(run: str, arm: str, seed: int, rows: list[dict], cause_step: int | None) -> RunOutcome:
    """The collapse rule on a run's rows, with the protocol's censoring and abruptness."""
    steps = [int(r["step"]) for r in rows]
    reward = [float(r["reward/mean"]) for r in rows]
    start = collapse_step(steps, reward)
    last = steps[-1]
    censored = start is not None and last - start < S.CENSOR_AFTER
    abrupt = start is not None and cause_step is not None and start - cause_step < S.ABRUPT_BEFORE
    onset_rows = [i for i, s in enumerate(steps) if s <= S.ONSET]
    trunk_start = collapse_step(steps[: len(onset_rows)], reward[: len(onset_rows)])
    smooth = [median_window(reward, i, 10) for i in range(len(reward))]
    return RunOutcome(
        run=run,
        arm=arm,
        seed=seed,
        last_step=last,
        collapse=start,
        censored=censored,
        abrupt=abrupt,
        onset_healthy=trunk_start is None and (start is None or start > S.ONSET),
        peak=max(v for v in smooth if v is not None),
        final=smooth[-1] or 0.0,
    )


# ------------------------------------------------------------------ copying the logs
def _finished_runs(root: Path) -> list[tuple[str, int, Path]]:
    """`(arm folder, seed, run dir)` of every branch under `root` that logged STEPS steps."""
    out = []
    for arm_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "trunk"):
        for run_dir in sorted(arm_dir.glob("seed*")):
            rows = read_metrics(run_dir)
            if rows and rows[-1]["step"] >= S.STEPS:
                out.append((arm_dir.name, int(run_dir.name[4:]), run_dir))
    return out


def copy_logs(run_dir: Path, dest: Path) -> None:
    """A run's logs (not its checkpoints) into `dest`, the per-step log gzipped."""
    dest.mkdir(parents=True, exist_ok=True)
    data = (run_dir / "metrics.jsonl").read_bytes()
    # mtime 0: the same log gives the same bytes, so collecting again changes nothing in git
    (dest / "metrics.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
    for name in ("alarms.jsonl", "config.json", "machines.jsonl"):
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, dest / name)
    evals = {
        f.stem: json.loads(f.read_text(encoding="utf-8"))["overall"]
        for f in sorted((run_dir / "eval").glob("step_*.json"))
    }
    # each evaluation's overall figures, as the other studies commit them (the per-question
    # records stay with the run: 47 kB an evaluation)
    _write(dest / "eval.json", json.dumps(evals, indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------ reading them back
ARM_OF_FOLDER = {S.arm_folder(a): a for a in S.ARMS}


def corpus_outcomes(runs_root: Path) -> list[RunOutcome]:
    """Every committed corpus run's outcome, in arm then seed order."""
    out = []
    for arm_dir in sorted(p for p in runs_root.iterdir() if p.is_dir() and p.name != "pilot"):
        arm = ARM_OF_FOLDER[arm_dir.name]
        for run_dir in sorted(arm_dir.glob("seed*"), key=lambda p: int(p.name[4:])):
            seed = int(run_dir.name[4:])
            cause = None if S.mechanism_of(arm) == "none" else S.ONSET + 1
            rel = run_dir.relative_to(S.HERE).as_posix()
            out.append(outcome(rel, arm, seed, run_rows(run_dir), cause))
    return out


def manifest_rows(outcomes: list[RunOutcome]) -> list[dict[str, str]]:
    rows = []
    for o in outcomes:
        if not o.onset_healthy:
            continue  # the protocol leaves a trunk that collapsed before the onset out
        mech = S.mechanism_of(o.arm)
        rows.append(
            {
                "run": o.run,
                "mechanism": mech,
                "seed": str(o.seed),
                "split": S.split_of(o.arm, o.seed),
                "cause_step": "" if mech == "none" else str(S.ONSET + 1),
                "collapse_step": str(o.collapse) if o.collapsed else "",
                "arm": o.arm,
                "censored": "yes" if o.censored else "no",
                "abrupt": "yes" if o.abrupt else "no",
                "last_step": str(o.last_step),
            }
        )
    return rows


SIGNALS = (
    "reward/mean",
    "policy/entropy",
    "policy/grad_norm",
    "policy/ratio_max",
    "lld/logp_correct",
    "rollout/valid_searches",
    "rollout/response_tokens",
    "turns/void_share",
)
"""the per-step metrics whose course before a collapse the summary shows"""
BASELINE = (S.ONSET - 19, S.ONSET)
"""the run's own healthy window: the last 20 trunk steps before the onset"""
WINDOWS = {"before 50-21": (-50, -21), "before 20-1": (-20, -1)}
"""windows before the collapse step (or before the same step in a run that did not collapse)"""


def _window_mean(rows: list[dict], lo: int, hi: int, key: str) -> float | None:
    vals = [float(r[key]) for r in rows if lo <= r["step"] <= hi and r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def pooled_share(rows: list[dict], lo: int, hi: int) -> float | None:
    """The LLD share pooled over responses: pushed-up responses that lost likelihood over all
    pushed-up responses of steps lo..hi (not a mean of per-step shares)."""
    fell = pos = 0.0
    for r in rows:
        if lo <= r["step"] <= hi and r.get("lld/pos_responses"):
            n = float(r["lld/pos_responses"])
            fell += float(r["lld/frac_pos_fell"]) * n
            pos += n
    return fell / pos if pos else None


def signals_before(rows: list[dict], at: int) -> dict[str, dict[str, float | None]]:
    """Each signal's mean over the healthy baseline and over each window before step `at`, and
    the pooled LLD share over the same steps."""
    spans = {"baseline": BASELINE, **{k: (at + a, at + b) for k, (a, b) in WINDOWS.items()}}
    out: dict[str, dict[str, float | None]] = {}
    for name, (lo, hi) in spans.items():
        row: dict[str, float | None] = {key: _window_mean(rows, lo, hi, key) for key in SIGNALS}
        row["lld_share_pooled"] = pooled_share(rows, lo, hi)
        out[name] = row
    return out


def signal_table(runs_root: Path, outcomes: list[RunOutcome]) -> list[dict]:
    """For every gradual collapse: the signals before it, and the seed's control over the
    same steps."""
    out = []
    for o in outcomes:
        if not o.collapsed or o.abrupt or S.mechanism_of(o.arm) == "none" or o.collapse is None:
            continue
        rows = run_rows(S.HERE / o.run)
        control_dir = runs_root / S.arm_folder("none") / f"seed{o.seed}"
        control = run_rows(control_dir) if control_dir.is_dir() else []
        out.append(
            {
                "run": o.run,
                "arm": o.arm,
                "seed": o.seed,
                "collapse": o.collapse,
                "cause": signals_before(rows, o.collapse),
                "control": signals_before(control, o.collapse) if control else None,
            }
        )
    return out


def _ratio(sig: dict, window: str, key: str) -> float | None:
    base, val = sig["baseline"].get(key), sig[window].get(key)
    if base is None or val is None or base == 0:
        return None
    return val / base


def signals_markdown(table: list[dict]) -> list[str]:
    """Per arm, the median over its gradual collapses of each signal's mean in the 20 steps
    before the collapse over its own baseline; in brackets the controls' same ratio."""
    keys = (*SIGNALS, "lld_share_pooled")
    lines = [
        "",
        "Signals in the 20 steps before each gradual collapse, as a ratio to the run's own "
        f"steps {BASELINE[0]}-{BASELINE[1]} (median over the arm's collapses; in brackets the "
        "seeds' controls over the same steps):",
        "",
        "| arm | collapses | " + " | ".join(keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    for arm in S.ARMS:
        rows = [t for t in table if t["arm"] == arm]
        if not rows:
            continue
        cells = []
        for key in keys:
            mine = [r for t in rows if (r := _ratio(t["cause"], "before 20-1", key)) is not None]
            ctrl = [
                r
                for t in rows
                if t["control"] and (r := _ratio(t["control"], "before 20-1", key)) is not None
            ]
            a = f"{statistics.median(mine):.2f}" if mine else "-"
            b = f"{statistics.median(ctrl):.2f}" if ctrl else "-"
            cells.append(f"{a} ({b})")
        lines.append(f"| {arm} | {len(rows)} | " + " | ".join(cells) + " |")
    return lines


def summary(outcomes: list[RunOutcome]) -> dict:
    """Per arm: usable runs, collapses (censored and abrupt apart), steps from onset."""
    per_arm: dict[str, dict] = {}
    for arm in S.ARMS:
        runs = [o for o in outcomes if o.arm == arm]
        usable = [o for o in runs if o.onset_healthy]
        collapsed = [o for o in usable if o.collapsed]
        gradual = [o for o in collapsed if not o.abrupt]
        delays = [o.collapse - S.ONSET - 1 for o in gradual if o.collapse is not None]
        per_arm[arm] = {
            "runs": len(runs),
            "usable": len(usable),
            "collapsed": len(collapsed),
            "abrupt": sum(o.abrupt for o in collapsed),
            "censored": sum(o.censored for o in usable),
            "collapse_rate": len(collapsed) / len(usable) if usable else None,
            "steps_onset_to_collapse": delays,
            "median_steps_onset_to_collapse": statistics.median(delays) if delays else None,
        }
    healthy = [o for o in outcomes if S.mechanism_of(o.arm) == "none" and o.onset_healthy]
    return {
        "arms": per_arm,
        "healthy_runs": len(healthy),
        "healthy_collapsed": sum(o.collapsed for o in healthy),
        "runs": [asdict(o) for o in outcomes],
    }


def summary_markdown(s: dict) -> str:
    lines = [
        "# Collapse corpus: summary",
        "",
        "Written by `corpus.py --collect` from the committed logs; do not edit.",
        "",
        "| arm | runs | usable | collapsed | abrupt | censored | rate | steps onset -> collapse |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, a in s["arms"].items():
        rate = "-" if a["collapse_rate"] is None else f"{a['collapse_rate']:.2f}"
        delays = a["steps_onset_to_collapse"]
        shown = "-" if not delays else f"median {a['median_steps_onset_to_collapse']:g} ({delays})"
        lines.append(
            f"| {arm} | {a['runs']} | {a['usable']} | {a['collapsed']} | {a['abrupt']} | "
            f"{a['censored']} | {rate} | {shown} |"
        )
    lines += [
        "",
        f"Healthy runs (controls, twins, extra seeds): {s['healthy_collapsed']} of "
        f"{s['healthy_runs']} collapsed.",
        "",
        "| run | arm | seed | collapse step | censored | abrupt | peak | final |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in s["runs"]:
        lines.append(
            f"| {o['run']} | {o['arm']} | {o['seed']} | {o['collapse'] or '-'} | "
            f"{'yes' if o['censored'] else 'no'} | {'yes' if o['abrupt'] else 'no'} | "
            f"{o['peak']:.3f} | {o['final']:.3f} |"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the pilot
def pilot_outcomes(pilot_root: Path) -> list[RunOutcome]:
    out = []
    for arm_dir in sorted(pilot_root.iterdir()):
        if not arm_dir.is_dir():
            continue
        for run_dir in sorted(arm_dir.glob("seed*")):
            rel = run_dir.relative_to(S.HERE).as_posix()
            rows = run_rows(run_dir)
            out.append(outcome(rel, arm_dir.name, int(run_dir.name[4:]), rows, S.ONSET + 1))
    return out


def pilot_choice(outcomes: list[RunOutcome]) -> dict[str, dict]:
    """The protocol's rule, per mechanism: the first grid value whose branch collapses (not
    censored) at least ABRUPT_BEFORE steps after the onset; else the latest collapse; else
    the strongest value, with 'no collapsing setting' said."""
    by_folder = {o.arm: o for o in outcomes}
    choice: dict[str, dict] = {}
    for name, cause in S.CAUSES.items():
        if not cause.grid:
            continue
        runs = [by_folder.get(S.arm_folder(f"{name}@{v}")) for v in cause.grid]
        if any(r is None or r.last_step < S.STEPS for r in runs):
            choice[name] = {"value": None, "why": "pilot unfinished"}
            continue
        gradual = [v for v, r in zip(cause.grid, runs, strict=True) if r.collapsed and not r.abrupt]
        collapsed = [(r.collapse, v) for v, r in zip(cause.grid, runs, strict=True) if r.collapsed]
        if gradual:
            choice[name] = {"value": gradual[0], "why": "first value collapsing >= 30 steps on"}
        elif collapsed:
            choice[name] = {"value": max(collapsed)[1], "why": "latest collapse (all abrupt)"}
        else:
            choice[name] = {"value": cause.grid[-1], "why": "the pilot found no collapsing setting"}
    return choice


def pilot_markdown(outcomes: list[RunOutcome], choice: dict[str, dict]) -> str:
    lines = [
        "# Collapse corpus: the pilot (seed 100)",
        "",
        "Written by `corpus.py --collect` from the committed pilot logs; do not edit.",
        "",
        "| branch | last step | collapse | steps after onset | censored | abrupt | peak | final |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        after = "-" if o.collapse is None else str(o.collapse - S.ONSET - 1)
        lines.append(
            f"| {o.arm} | {o.last_step} | {o.collapse or '-'} | {after} | "
            f"{'yes' if o.censored else 'no'} | {'yes' if o.abrupt else 'no'} | "
            f"{o.peak:.3f} | {o.final:.3f} |"
        )
    lines += ["", "| mechanism | chosen | why |", "|---|---|---|"]
    for name, c in choice.items():
        lines.append(f"| {name} | {c['value'] or '-'} | {c['why']} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the command
def lld_manifest_rows() -> list[dict[str, str]]:
    """The `lld` mechanism's finished runs at the setting its pilot chose (none before)."""
    import lld  # the theorem world's runs (lld.py), made by the LLDS-strength driver
    import lld_collect

    return lld_collect.manifest_rows(lld.arm_runs(), lld.MECHANISM)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def collect() -> None:
    runs_root = S.RUNS
    for kind, dest in (("corpus", runs_root), ("pilot", runs_root / "pilot")):
        work = S.WORK / kind
        if work.is_dir():
            for folder, seed, run_dir in _finished_runs(work):
                copy_logs(run_dir, dest / folder / f"seed{seed}")
    if (runs_root / "pilot").is_dir():
        po = pilot_outcomes(runs_root / "pilot")
        choice = pilot_choice(po)
        _write(S.HERE / "pilot.md", pilot_markdown(po, choice))
        data = {"runs": [asdict(o) for o in po], "choice": choice}
        _write(S.HERE / "pilot.json", json.dumps(data, indent=1) + "\n")
        print(pilot_markdown(po, choice))
    if runs_root.is_dir() and any(p.name != "pilot" for p in runs_root.iterdir()):
        outcomes = corpus_outcomes(runs_root)
        signals = signal_table(runs_root, outcomes)
        rows = manifest_rows(outcomes) + lld_manifest_rows()
        tmp = S.HERE / "manifest.csv.tmp"
        with tmp.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=MANIFEST_COLUMNS)
            w.writeheader()
            w.writerows(rows)
        tmp.replace(S.HERE / "manifest.csv")
        s = {**summary(outcomes), "signals": signals}
        text = summary_markdown(s) + "\n".join(signals_markdown(signals)) + "\n"
        _write(S.HERE / "summary.json", json.dumps(s, indent=1) + "\n")
        _write(S.HERE / "summary.md", text)
        print(text)
