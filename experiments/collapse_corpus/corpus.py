"""Run the collapse corpus (PROTOCOL.md): the warm start, the pilot, the corpus, the manifest.

    python experiments/collapse_corpus/corpus.py --warm-start      # build and commit warm/
    python experiments/collapse_corpus/corpus.py --pilot --parallel 2
    python experiments/collapse_corpus/corpus.py --run --parallel 2 [--seeds 0 1] [--arms lr]
    python experiments/collapse_corpus/corpus.py --collect         # logs, manifest, summary

Runs train in `runs/collapse_corpus/` (checkpoints stay out of the repository); a run that was
stopped resumes from its newest checkpoint when the same command is run again; a branch whose
full log is already committed is not run again (nor a trunk with no branch left). `--collect`
copies every finished run's logs into `runs/` of this folder and writes `manifest.csv` and
`summary.md` / `summary.json` from them alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_study as S


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


# ------------------------------------------------------------------ warm start
def build_warm_start() -> None:
    """The demo's world and warm start (seed 0), copied into `warm/` with their checksums."""
    from llds.demo import DemoConfig, evaluate_model, run_demo

    work = S.WORK / "warm"
    if not (work / "sft" / "model").is_dir():
        run_demo(DemoConfig(out=str(work), skip_train=True))
    S.WARM.mkdir(parents=True, exist_ok=True)
    for name in ("world", "sft/model"):
        shutil.copytree(work / name, S.WARM / name, dirs_exist_ok=True)
    shutil.copy2(work / "prompt.txt", S.WARM / "prompt.txt")
    for name in ("sft_report.json", "sft_metrics.jsonl"):
        if (work / "sft" / name).is_file():
            shutil.copy2(work / "sft" / name, S.WARM / "sft" / name)
    start = S.WARM / "eval" / "step_0.json"
    if not start.is_file():  # the warm start's held-out EM, as every run measures it
        evaluate_model(S.WARM / "sft" / "model", S.WARM, start, S.EVAL_LIMIT)
    (S.WARM / "SHA256SUMS").write_text("\n".join(S.sha256_lines(S.WARM)) + "\n", "utf-8")
    _log(f"warm start in {S.WARM}: held-out EM {json.loads(start.read_text())['overall']['em']}")


# ------------------------------------------------------------------ one run
def _finished(run_dir: Path, steps: int) -> bool:
    from llds.runs.tracking import read_metrics

    rows = read_metrics(run_dir) if run_dir.is_dir() else []
    return bool(rows) and rows[-1]["step"] >= steps


def _committed(job: tuple, pilot: bool) -> bool:
    """Whether a branch's full log is already committed under `runs/` of this folder (a new
    checkout has no `runs/collapse_corpus/`, so the work folder alone cannot tell). Read here,
    not with the library's committed-log reader: the runs run the library of 3b5273d, where that
    reader lives in another module than today's."""
    if pilot or job[3] is None:
        return False
    work = Path(job[0])
    log = S.RUNS / work.parent.name / work.name / "metrics.jsonl.gz"
    if not log.is_file():
        return False
    lines = gzip.decompress(log.read_bytes()).decode("utf-8").splitlines()
    return bool(lines) and json.loads(lines[-1])["step"] >= S.STEPS


def copy_trunk(trunk: Path, branch: Path, onset: int = S.ONSET) -> None:
    """The branch's folder as the trunk left it at the onset: its log, alarms, evaluations and
    the step-ONSET checkpoint (nothing else: the trunk's older checkpoint stays behind)."""
    tmp = branch.with_name(branch.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("metrics.jsonl", "alarms.jsonl"):
        if (trunk / name).is_file():
            shutil.copy2(trunk / name, tmp / name)
    if (trunk / "eval").is_dir():
        shutil.copytree(trunk / "eval", tmp / "eval")
    ckpt = f"step_{onset:06d}"
    shutil.copytree(trunk / "checkpoints" / ckpt, tmp / "checkpoints" / ckpt)
    latest = trunk / "checkpoints" / "latest"
    if latest.is_file():
        shutil.copy2(latest, tmp / "checkpoints" / "latest")
    tmp.rename(branch)


def run_leg(run_dir: str, overrides: list[str], allow: list[str], trunk: str | None) -> str:
    """Train one run to its end in this process (a trunk, or a branch resumed from `trunk`)."""
    import torch

    torch.set_num_threads(1)
    from llds.logs import setup_logging
    from llds.train import run
    from llds.train.config import load_config

    out = Path(run_dir)
    if trunk is not None and not out.is_dir():
        copy_trunk(Path(trunk), out)
    out.mkdir(parents=True, exist_ok=True)
    setup_logging()
    cfg = load_config("organism", overrides)
    (out / "config.json").write_text(json.dumps(_plain(cfg), indent=1, sort_keys=True), "utf-8")
    _write_machine(out)
    run(cfg, resume=True, allow_config_change=allow or None)
    return run_dir


def _plain(cfg) -> dict:
    from llds.config.loader import to_dict

    return to_dict(cfg)


def _write_machine(out: Path) -> None:
    """Append this machine's line to the run's `machines.jsonl` (a run may span machines)."""
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpu": cpu, "torch": torch.__version__}
    with (out / "machines.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------ planning
def trunk_job(seed: int, pilot: bool) -> tuple[str, list[str], list[str], None]:
    run_dir = S.trunk_dir(seed, pilot)
    return (str(run_dir), S.base_overrides(seed, run_dir), [], None)


def branch_job(arm: str, strength: str, seed: int, pilot: bool):
    """A branch of `seed`'s trunk with `arm`'s cause at `strength` (none: the control)."""
    run_dir = S.branch_dir(arm if not pilot else f"{arm}@{strength}", seed, pilot)
    over = [*S.base_overrides(seed, run_dir), f"steps={S.STEPS}"]
    allow: list[str] = []
    if arm != "none":
        cause = S.CAUSES[arm]
        over += cause.overrides(strength)
        allow = list(cause.allow)
    return (str(run_dir), over, allow, str(S.trunk_dir(seed, pilot)))


def pilot_jobs() -> tuple[list, list]:
    seed = S.PILOT_SEED
    branches = [
        branch_job(name, value, seed, True)
        for name, cause in S.CAUSES.items()
        for value in cause.grid
    ]
    return [trunk_job(seed, True)], branches


def corpus_jobs(seeds: list[int], arms: list[str]) -> tuple[list, list]:
    trunks, branches = [], []
    for seed in seeds:
        trunks.append(trunk_job(seed, False))
        wanted = ["none"] if seed in S.HEALTHY_SEEDS else arms
        for arm in wanted:
            strength = "" if arm == "none" else S.strength_of(arm)
            branches.append(branch_job(arm, strength, seed, False))
    return trunks, branches


def execute(trunks: list, branches: list, parallel: int, pilot: bool = False) -> None:
    """Every unfinished run not yet committed, `parallel` processes at a time, seed by seed: a
    trunk's branches go to the front of the queue once it is done, so that a seed's runs finish
    together (and on one machine) before the next seed's trunk starts."""
    waiting: dict[str, list] = {}
    for job in branches:
        if _committed(job, pilot):
            continue
        waiting.setdefault(job[3], []).append(job)
    queue = [job for job in trunks if job[0] in waiting]  # a trunk with nothing left waits
    with ProcessPoolExecutor(parallel, mp_context=get_context("spawn")) as pool:
        running: dict[Future, tuple] = {}
        while queue or running:
            while queue and len(running) < parallel:
                job = queue.pop(0)
                steps = S.STEPS if job[3] is not None else S.ONSET
                if _finished(Path(job[0]), steps):
                    if job[3] is None:
                        queue[:0] = waiting.pop(job[0], [])
                    continue
                _log(f"start {job[0]}")
                running[pool.submit(run_leg, *job)] = job
            if not running:
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                job = running.pop(fut)
                try:
                    fut.result()
                except Exception as exc:  # one run's failure stops none of the others
                    _log(f"FAILED {job[0]}: {type(exc).__name__}: {exc}")
                    continue
                _log(f"done {job[0]}")
                if job[3] is None:
                    queue[:0] = waiting.pop(job[0], [])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--warm-start", action="store_true", help="build warm/ (once)")
    what.add_argument("--pilot", action="store_true", help="the pilot's runs (seed 100)")
    what.add_argument("--run", action="store_true", help="the corpus's runs")
    what.add_argument("--collect", action="store_true", help="logs, manifest.csv, summary")
    what.add_argument("--dry-run", action="store_true", help="print the corpus's runs")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--seeds", type=int, nargs="*", default=None)
    ap.add_argument("--arms", nargs="*", default=None, choices=S.ARMS)
    args = ap.parse_args(argv)
    seeds = args.seeds if args.seeds else [*S.CAUSE_SEEDS, *S.HEALTHY_SEEDS]
    arms = args.arms or list(S.ARMS)
    if args.warm_start:
        build_warm_start()
        return
    if args.collect:
        from corpus_collect import collect

        collect()
        return
    S.check_warm_start()
    if args.dry_run:
        trunks, branches = corpus_jobs(seeds, arms)
        for job in [*trunks, *branches]:
            print(json.dumps({"run_dir": job[0], "overrides": job[1], "allow": job[2]}))
        return
    trunks, branches = pilot_jobs() if args.pilot else corpus_jobs(seeds, arms)
    execute(trunks, branches, args.parallel, args.pilot)


if __name__ == "__main__":
    main()
