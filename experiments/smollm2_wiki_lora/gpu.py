"""The SmolLM2-wiki LoRA study's runs on a lent GPU for a fixed time: the runs `run.py` plans
(the pilot until its decisions are made, then the study), continued from the state a previous
call returned (or the committed results), for `--budget-s` seconds; the new state comes back
under 64 MiB (PROTOCOL.md, "Where it runs").

    python experiments/smollm2_wiki_lora/gpu.py --resume STATE --budget-s 540 --out DIR \\
        --results OUT
    python experiments/smollm2_wiki_lora/gpu.py --smoke --budget-s 60 --out /tmp/s --results /tmp/o

STATE: a `state.tar` an earlier call wrote, or a results folder (default: the committed
`results/`). The runs go one at a time in the protocol's order, in this process, and each
stops at a step boundary before the budget (less `--reserve-s`) is spent, saving a checkpoint
there; a run's steps are the same whichever machine takes them, and each run's
`machines.jsonl` says which machine took which steps. Written to OUT, and rewritten at every
checkpoint so that a call killed at its limit keeps what it had done:
  state.tar      the results folder as it now stands: the decisions, the tables, every run's
                 logs, and the parked state (adapter, AdamW state, RNG, step) of the unfinished
                 runs that fit under 64 MiB, in the protocol's order; one line names the runs
                 left behind (their state stays where it was). Unpack it into the results
                 folder to commit it (`tar -xf OUT/state.tar -C experiments/smollm2_wiki_lora/
                 results`), or give it to the next call.
  logs.tar.gz    the runs' logs and the tables alone
  progress.jsonl one line per event
The base model must be the warm start the runs began from: its adapter records the base's
fingerprint, and another base is refused in one line. `--smoke` runs the whole route on a tiny
random model and a tiny synthetic world (a few steps a run) on any machine: it checks the
command, and measures nothing.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: shared modules
from _common import Clock, say
from llds.io import atomic_write
from llds.policy.lora import ADAPTER_DIR
from smollm2_wiki_lora import decisions as D
from smollm2_wiki_lora import protocol as P
from smollm2_wiki_lora import run as R
from smollm2_wiki_lora import tables as T

STATE_LIMIT = 64 * 2**20
"""What one transfer carries back from a lent machine, at most."""
STATE, LOGS = "state.tar", "logs.tar.gz"
KEPT = (
    D.DECISIONS,
    "decisions.md",
    R.WARM_START,
    "pilot.md",
    "summary.json",
    "summary.md",
)
"""The results folder's own files, carried with the logs."""
MEMBER = 1536
"""Bytes a tar member may cost besides its padded contents (its header, a long-name header)."""


def load_state(source: Path | None, results: Path, smoke: bool) -> None:
    """`results` made afresh from a state tar, a results folder, or (`--smoke`, no state) a
    stand-in decision 1 (the preset as committed: smoke measures nothing)."""
    if results.exists():
        shutil.rmtree(results)
    if source is None and smoke:
        bench = {
            "machine": "smoke: nothing measured",
            "command": "gpu.py --smoke",
            "arms": [
                {
                    "arm": "lora",
                    "name": "LoRA, bf16 (smoke)",
                    "preset": P.PRESET,
                    "overrides": [],
                    "median_s": {"step": 0.0},
                }
            ],
        }
        D.write_decisions(results, {"sampling": D.sampling_decision(bench, "smoke")})
        return
    source = R.RESULTS if source is None else source
    if source.is_dir():
        shutil.copytree(source, results)
    elif source.is_file() and tarfile.is_tarfile(source):
        with tarfile.open(source) as tar:
            tar.extractall(results, filter="data")
    else:
        raise SystemExit(f"--resume {source}: neither a state tar nor a results folder")


def _padded(size: int) -> int:
    return -(-size // 512) * 512 + MEMBER


def state_members(results: Path, order: Sequence[tuple[str, int]]) -> tuple[list[Path], list[str]]:
    """What the state carries, as paths under `results`: its own files and every run's logs,
    then the parked archives in the protocol's `order` while the whole stays under the limit;
    and the runs left behind."""
    kept = [results / n for n in KEPT if (results / n).is_file()]
    if (results / "runs").is_dir():
        kept += sorted(p for p in (results / "runs").rglob("*") if p.is_file())
    total = 10240 + sum(_padded(p.stat().st_size) for p in kept)
    parked = {p: None for p in sorted((results / "parked").rglob("*.tar.gz"))}
    ranked = [R.parked_archive(results, arm, seed) for arm, seed in order]
    ranked = [p for p in ranked if p in parked] + [p for p in parked if p not in ranked]
    behind = []
    for archive in ranked:
        size = _padded(archive.stat().st_size)
        if total + size < STATE_LIMIT:
            kept.append(archive)
            total += size
        else:
            behind.append(archive.relative_to(results / "parked").as_posix())
    return kept, behind


def write_tar(path: Path, results: Path, members: Sequence[Path], compress: bool) -> int:
    """`members` (paths under `results`) as a tar at `path`, replaced only once complete."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if compress else "w") as tar:
        for p in members:
            tar.add(p, arcname=p.relative_to(results).as_posix(), recursive=False)
    with atomic_write(path, "wb") as f:
        f.write(buf.getvalue())
    return len(buf.getvalue())


class Carrier:
    """Keeps OUT's state and logs up to date with the work folder (`save`), and says which
    runs could not be carried."""

    def __init__(self, clock: Clock, out: Path, work: Path, results: Path) -> None:
        self.clock, self.out, self.work, self.results = clock, out, work, results
        self.runs: list[dict[str, Any]] = []
        self.order: list[tuple[str, int]] = []
        self.behind: list[str] = []

    def track(self, runs: Sequence[dict[str, Any]]) -> None:
        for r in runs:
            if R.key(r) not in self.order:
                self.order.append(R.key(r))
        self.runs = [r for r in self.runs if R.key(r) not in {R.key(x) for x in runs}]
        self.runs += [r for r in runs if r["config"] is not None]

    def save(self, *_: Any) -> None:
        """Logs in, finished runs' archives out, unfinished runs parked, OUT rewritten."""
        R.collect(self.work, self.results, self.runs)
        R.retire_parked(self.results, [{**r, "arm": R.key(r)[0]} for r in self.runs])
        unfinished = [R.key(r) for r in self.runs if not R.finished(r["config"])]
        R.park(self.work, self.results, unfinished)
        members, self.behind = state_members(self.results, self.order)
        size = write_tar(self.out / STATE, self.results, members, compress=False)
        if size >= STATE_LIMIT:
            raise SystemExit(f"{self.out / STATE}: {size} bytes, over the 64 MiB a transfer takes")
        logs = [p for p in members if p.relative_to(self.results).parts[0] != "parked"]
        write_tar(self.out / LOGS, self.results, logs, compress=True)
        steps = {
            f"{arm} {seed}": R.committed_steps(self.results, arm, seed) for arm, seed in self.order
        }
        say(self.clock, self.out, "state", bytes=size, steps=steps, left_behind=self.behind)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--resume", type=Path, default=None, help="STATE: state.tar or a results folder"
    )
    ap.add_argument("--budget-s", type=float, required=True, help="from the command's start")
    ap.add_argument("--reserve-s", type=float, default=30.0, help="kept for the last state")
    ap.add_argument("--out", type=Path, required=True, help="work folder (runs, inputs)")
    ap.add_argument("--results", type=Path, required=True, help="OUT: state, logs, progress")
    ap.add_argument("--stage", choices=list(P.STAGES), default=None, help="default: the next")
    ap.add_argument("--max-steps", type=int, default=None, help="steps in all, at most")
    ap.add_argument("--model", default=str(R.WARM_DIR / ADAPTER_DIR), help="the warm start")
    ap.add_argument("--data", type=Path, default=Path("data/trivia-wiki"))
    ap.add_argument("--index", default="indexes/wiki")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (4; smoke: 1)")
    ap.add_argument("--smoke", action="store_true", help="tiny model and world; measures nothing")
    args = ap.parse_args(argv)
    clock = Clock(args.budget_s)
    out: Path = args.results
    out.mkdir(parents=True, exist_ok=True)
    from llds.analysis.machine import machine

    say(clock, out, "start", machine=machine(), argv=list(sys.argv[1:] if argv is None else argv))
    results, work = args.out / "results", args.out / "work"
    load_state(args.resume, results, args.smoke)
    stages = P.SMOKE_STAGES if args.smoke else P.STAGES
    threads = args.threads or (1 if args.smoke else 4)
    if args.smoke:
        inp = R.smoke_inputs(args.out / "smoke-inputs")
    else:
        inp = R.Inputs(args.model, args.data, args.index)
        if not Path(inp.model).exists():
            raise SystemExit(
                f"{inp.model}: no warm start there; it must be the one the runs began from "
                f"({R.WARM_START_COMMAND} builds it)"
            )
    carrier = Carrier(clock, out, work, results)
    deadline = clock.deadline(args.reserve_s)
    steps_left = args.max_steps
    while True:
        decisions = D.derive_decisions(results, stages["pilot"])
        name = args.stage or ("study" if not D.missing_decisions("study", decisions) else "pilot")
        try:
            D.refuse_without_decisions(name, decisions, results)
        except SystemExit as e:
            say(clock, out, "refused", why=str(e))
            raise
        if name == "pilot" and not inp.smoke and not (results / R.WARM_START).is_file():
            why = f"pilot: not started: the state has no {R.WARM_START} (the warm start's dev "
            why += "readiness, measured before the pilot; run.py --stage pilot keeps it)"
            say(clock, out, "refused", why=why)
            raise SystemExit(why)
        runs = R.plan(stages[name], inp, work, results, decisions, threads)
        carrier.track(runs)
        todo = [r for r in runs if r["run"]]
        if not todo or steps_left == 0 or time.monotonic() >= deadline:
            break
        R.prepare(runs, inp, work, results)
        if not (results / "runs" / name / P.STEP0 / "eval.json").is_file():
            say(clock, out, "step 0 evaluation", stage=name)
            R.evaluate_step0(todo[0]["config"], work / name / P.STEP0)
            R.collect_eval(work / name / P.STEP0, results / "runs" / name / P.STEP0)
        say(clock, out, "runs", stage=name, runs=[f"{r['arm']} {r['seed']}" for r in todo])
        left, taken = R.train_in_process(
            [r["config"] for r in todo],
            deadline=deadline,
            max_steps=steps_left,
            on_checkpoint=carrier.save,
        )
        steps_left = None if steps_left is None else steps_left - taken
        carrier.save()
        if left:  # the budget or --max-steps ended it; else plan again (the pilot's r4 or
            break  # the study may follow)
    D.derive_decisions(results, stages["pilot"])
    T.write_tables(results, stages)
    carrier.save()
    if carrier.behind:
        print(
            "left behind (over 64 MiB with the runs before them; their state is not in "
            f"{out / STATE}, and stays where it was): " + ", ".join(carrier.behind),
            flush=True,
        )
    say(clock, out, "done", left_behind=carrier.behind)


if __name__ == "__main__":
    main()
