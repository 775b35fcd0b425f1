"""The collapse corpus's `lld` mechanism (PROTOCOL.md, "The `lld` mechanism" and amendment 3):
GRPO on the theorem world, its pilot and then its arms, resumable across machines.

    python experiments/collapse_corpus/lld.py --pilot a --parallel 2   # pilot setting (a)
    python experiments/collapse_corpus/lld.py --pilot b --parallel 2   # pilot setting (b)
    python experiments/collapse_corpus/lld.py --setting b --parallel 2 # the arms, seeds 0-7
    python experiments/collapse_corpus/lld.py ... --dry-run            # each run's config
    python experiments/collapse_corpus/lld.py ... --park               # archive, to commit
    python experiments/collapse_corpus/lld.py --tables                 # pilot.md, summary.md

The runs are the LLDS-strength confirmation's part B (its warm start, recipe and micro-batch
budgets) with the pilot's setting on top, so they are driven by that study's driver
(`../llds_strength/run.py`: planning from the committed logs, resuming from a checkpoint or a
parked archive, copying the logs): only the arms, the settings and the folders are this
study's. A 300-step theorem run outlives one machine: `--park` archives each unfinished run's
newest checkpoint under `lld/.../parked/` to commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
sys.path.insert(0, str(Path(__file__).resolve().parent))
import lld_collect as C
from llds.io import atomic_write
from llds_strength.run import driver_arguments, execute, ordered_runs, plan

HERE = Path(__file__).resolve().parent
WARM_START = HERE.parent / "theorem_world" / "results" / "warm_start_3"
"""The protocol's warm start (the confirmation's part B), known by the SHA-256 its report holds."""
BUDGETS = ("optim.micro_batch_tokens=4096", "optim.logprob_micro_batch_tokens=16384")
"""The confirmation's micro-batch budgets (they change float rounding only)."""
PREFIX_SHARING = ("rollout.prefix_sharing=true",)
"""Amendment 3: each group's prompt computed once per pass (float rounding only; 1.36x)."""
STEPS = 300
SETTINGS: dict[str, tuple[str, ...]] = {
    "a": ("algo.kl_coef=0",),
    "b": ("algo.kl_coef=0", "optim.lr=9e-4"),
}
"""The pilot's settings, in the protocol's order: (a) the recipe with the KL term off, (b) the
same at 3x the recipe's learning rate (3e-4, the theorem study's calibrated rate)."""
SECOND_VIEW = ("eval_every=10", "data.eval_limit=60")
"""The protocol's second view: greedy held-out EM on the first 60 questions every 10 steps."""
PILOT_SEEDS = (100, 101)
SEEDS = tuple(range(8))
PILOT_ARM = "lam0"
ARMS = ("lam0", "lam0.6", "lam2")
"""GRPO and GRPO+LLDS at lambda 0.6 and 2, named as the LLDS-strength study names them."""
MECHANISM = {"lam0": "lld", "lam0.6": "lld+llds", "lam2": "lld+llds"}
"""The manifest's mechanism of each arm (the issue's naming: LLDS arms as `lld+llds`)."""


def folders(pilot: str | None, setting: str) -> tuple[str, Path]:
    """`(work folder, results folder)` of the pilot at `setting`, or of the arms."""
    name = f"pilot_{pilot}" if pilot else f"setting_{setting}"
    return f"runs/collapse_corpus/lld/{name}", HERE / "lld" / name


def overrides(setting: str) -> list[str]:
    """What every run of `setting` adds to the confirmation's recipe (in this order)."""
    return [f"steps={STEPS}", *BUDGETS, *PREFIX_SHARING, *SETTINGS[setting], *SECOND_VIEW]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)


def chosen_setting() -> str | None:
    """The pilot's choice as `--tables` recorded it (None before it is made)."""
    path = HERE / "lld" / "pilot.json"
    return (
        json.loads(path.read_text(encoding="utf-8"))["choice"]["setting"]
        if path.is_file()
        else None
    )


def arm_runs() -> list[C.LLDRun]:
    """The arms' runs at the chosen setting (none before the pilot chose one)."""
    setting = chosen_setting()
    return C.read_runs(HERE, folders(None, setting)[1], STEPS) if setting else []


def tables() -> None:
    """The pilot's table and choice, then (once chosen) the arms' summary, from the logs."""
    pilot = {
        name: C.read_runs(HERE, folders(name, name)[1], STEPS)
        for name in SETTINGS
        if folders(name, name)[1].is_dir()
    }
    choice = C.setting_choice(pilot, list(SETTINGS))
    data = {"choice": choice, "runs": {k: C.as_json(v) for k, v in pilot.items()}}
    _write(HERE / "lld" / "pilot.json", json.dumps(data, indent=1) + "\n")
    _write(HERE / "lld" / "pilot.md", C.pilot_markdown(pilot, choice))
    print(C.pilot_markdown(pilot, choice))
    runs = arm_runs()
    if not runs:
        return
    table, spiral = C.collapses_per_arm(runs, ARMS), C.death_spiral(HERE, runs)
    summary = {"setting": choice["setting"], "arms": table, "death_spiral": spiral}
    _write(
        HERE / "lld" / "summary.json",
        json.dumps({**summary, "runs": C.as_json(runs)}, indent=1) + "\n",
    )
    _write(HERE / "lld" / "summary.md", C.summary_markdown(runs, table, spiral))


def _which_runs(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--pilot", choices=sorted(SETTINGS), default=None, help="a pilot setting")
    p.add_argument(
        "--setting", choices=sorted(SETTINGS), default=None, help="the arms' setting (the pilot's)"
    )
    return p


def main(argv: list[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv == ["--tables"]:
        tables()
        return
    # which runs decides the folders' and seeds' defaults, so it is read first
    known, _ = _which_runs(argparse.ArgumentParser(add_help=False)).parse_known_args(argv)
    setting = known.pilot or known.setting
    work, results = folders(known.pilot, setting or "a")
    p = _which_runs(driver_arguments(__doc__, work, results, PILOT_SEEDS if known.pilot else SEEDS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.set_defaults(
        theorem="runs/theorem_world_b",
        warm_archive=str(WARM_START / "model.tar.gz"),
        warm_report=str(WARM_START / "report.json"),
    )
    args = p.parse_args(argv)
    if (args.pilot is None) == (args.setting is None):
        p.error("give exactly one of --pilot SETTING or --setting SETTING")
    arms = [PILOT_ARM] if args.pilot else args.arms
    theorem, work_dir, results_dir = Path(args.theorem), Path(args.work), Path(args.results)
    runs = plan(theorem, work_dir, results_dir, ordered_runs(arms, args.seeds), overrides(setting))
    execute(runs, theorem, work_dir, results_dir, args)


if __name__ == "__main__":
    main()
