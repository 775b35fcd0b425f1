"""The collapse corpus's `lld` mechanism (PROTOCOL.md, "The `lld` mechanism" and amendment 3):
GRPO on the theorem world, its pilot and then its arms, resumable across machines.

    python experiments/collapse_corpus/lld.py --pilot a --parallel 2   # pilot setting (a)
    python experiments/collapse_corpus/lld.py --pilot b --parallel 2   # pilot setting (b)
    python experiments/collapse_corpus/lld.py --setting b --parallel 2 # the arms, seeds 0-7
    python experiments/collapse_corpus/lld.py ... --dry-run            # each run's config
    python experiments/collapse_corpus/lld.py ... --park               # archive, to commit
    python experiments/collapse_corpus/lld.py --tables                 # pilot.md, summary.md
    python experiments/collapse_corpus/lld.py --check-stop-rule        # amendment 5, checked

The runs are the LLDS-strength confirmation's part B (its warm start, recipe and micro-batch
budgets) with the pilot's setting on top, so they are driven by that study's driver
(`../llds_strength/run.py`: planning from the committed logs, resuming from a checkpoint or a
parked archive, copying the logs): only the arms, the settings and the folders are this
study's. A 300-step theorem run outlives one machine: `--park` archives each unfinished run's
newest checkpoint under `lld/.../parked/` to commit.

A run dead by amendment 5's rule (`lld_collect.dead_step`) is not run on: this script runs the
driver in a child process and reads the running runs' logs every minute; when the rule holds
for one, it stops the child and every run under it (the others resume from their last
checkpoint) and plans again, without the dead run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
sys.path.insert(0, str(Path(__file__).resolve().parent))
import lld_collect as C
from llds.analysis.study_logs import COMMITTED_LOG, run_rows
from llds.io import atomic_write
from llds.report.collapse import collapse_step
from llds_strength.run import (
    collect,
    driver_arguments,
    execute,
    ordered_runs,
    parked_archive,
    plan,
    run_dir,
)

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
POLL_S = 60.0
"""How often the supervisor reads the running runs' logs for amendment 5's rule."""


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


def dead_at(folder: Path) -> int | None:
    """The step at which amendment 5's rule held on the run logged in `folder` (its live log,
    else its committed copy; None: not held, or no log yet)."""
    try:
        rows = run_rows(folder)
    except FileNotFoundError:
        return None
    return C.dead_step([int(r["step"]) for r in rows], [float(r["reward/mean"]) for r in rows])


def without_dead(runs: list[dict], work: Path, results: Path) -> list[tuple[str, int]]:
    """Mark every planned run on which amendment 5's rule holds (in its work folder's log, else
    its committed one) as not to run; returns those runs, whose logs are still to collect."""
    dead = []
    for r in runs:
        if not r["run"]:
            continue
        arm, seed = r["arm"], r["seed"]
        step = dead_at(run_dir(work, arm, seed))
        if step is None:
            step = dead_at(results / "runs" / arm / f"seed{seed}")
        if step is not None:
            r["run"], r["stopped"] = False, step
            dead.append((arm, seed))
            print(
                f"{arm} seed {seed}: dead at step {step} (amendment 5): not run on", file=sys.stderr
            )
    return dead


def finish_dead(work: Path, results: Path, dead: Sequence[tuple[str, int]]) -> None:
    """Copy the dead runs' logs and delete their parked archives: they are finished."""
    collect(work, results, dead)
    for arm, seed in dead:
        archive = parked_archive(results, arm, seed)
        if archive.is_file():
            archive.unlink()
            print(f"{arm} seed {seed}: finished (amendment 5); {archive} deleted", flush=True)


def supervise(
    command: Sequence[str],
    watched: Callable[[], list[tuple[str, int, Path]]],
    on_dead: Callable[[str, int], None],
    poll_s: float = POLL_S,
) -> int:
    """Run `command` (the driver with `--once`) in a child process of its own session until it
    ends; every `poll_s` read the logs of the runs `watched()` names (arm, seed, folder), and
    when amendment 5's rule holds for one, stop the child with every process under it, call
    `on_dead(arm, seed)` and start it again (it plans without the dead run). Returns the
    child's exit code."""
    child: subprocess.Popen | None = None

    def stop(*_: object) -> None:
        if child is not None and child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()

    def on_term(*_: object) -> None:
        stop()
        raise SystemExit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        child = subprocess.Popen(list(command), start_new_session=True)
        dead = None
        while dead is None and child.poll() is None:
            time.sleep(poll_s)
            dead = next(
                ((a, s, st) for a, s, f in watched() if (st := dead_at(f)) is not None), None
            )
        if dead is None:
            return child.returncode
        stop()
        arm, seed, step = dead
        print(f"{arm} seed {seed}: dead at step {step} (amendment 5); planning again", flush=True)
        on_dead(arm, seed)


def check_stop_rule(root: Path) -> dict:
    """Amendment 5's check on every committed per-step log under `root` with a reward: where the
    rule holds, is the collapse step read up to the stop the one read from the whole log?"""
    logs = fires = differs = saved = 0
    for path in sorted(root.rglob(COMMITTED_LOG)):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if not rows or "reward/mean" not in rows[0]:
            continue
        logs += 1
        at = [int(r["step"]) for r in rows]
        reward = [float(r["reward/mean"]) for r in rows]
        stop = C.dead_step(at, reward)
        if stop is None:
            continue
        i = at.index(stop)
        fires += 1
        saved += len(at) - 1 - i
        if collapse_step(at[: i + 1], reward[: i + 1]) != collapse_step(at, reward):
            differs += 1
            print(f"  {path.relative_to(root)}: the collapse step differs", flush=True)
    return {"logs": logs, "rule_holds": fires, "collapse_step_differs": differs, "steps": saved}


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
    if argv == ["--check-stop-rule"]:
        got = check_stop_rule(HERE.parent)
        print(
            f"{got['logs']} committed logs with a reward; the rule holds in {got['rule_holds']}, "
            f"the collapse step differs in {got['collapse_step_differs']}, {got['steps']} "
            "steps after the stop"
        )
        return
    # which runs decides the folders' and seeds' defaults, so it is read first
    known, _ = _which_runs(argparse.ArgumentParser(add_help=False)).parse_known_args(argv)
    setting = known.pilot or known.setting
    work, results = folders(known.pilot, setting or "a")
    p = _which_runs(driver_arguments(__doc__, work, results, PILOT_SEEDS if known.pilot else SEEDS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument(
        "--once", action="store_true", help="run the driver here, unsupervised (the supervisor's)"
    )
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
    pairs = ordered_runs(arms, args.seeds)

    def planned() -> list[dict]:
        return plan(theorem, work_dir, results_dir, pairs, overrides(setting))

    runs = planned()
    dead = without_dead(runs, work_dir, results_dir)
    running = not (args.dry_run or args.collect or args.park or args.unpark)
    if running and not args.once:

        def watched() -> list[tuple[str, int, Path]]:
            rs = planned()
            without_dead(rs, work_dir, results_dir)
            return [(r["arm"], r["seed"], Path(r["config"].run_dir)) for r in rs if r["run"]]

        def on_dead(arm: str, seed: int) -> None:
            finish_dead(work_dir, results_dir, [(arm, seed)])

        finish_dead(work_dir, results_dir, dead)
        command = [sys.executable, str(Path(__file__).resolve()), *argv, "--once"]
        raise SystemExit(supervise(command, watched, on_dead))
    execute(runs, theorem, work_dir, results_dir, args)
    if not args.dry_run:
        finish_dead(work_dir, results_dir, dead)


if __name__ == "__main__":
    main()
