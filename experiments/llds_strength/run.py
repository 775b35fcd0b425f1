"""The LLDS-strength study (PROTOCOL.md): its runs, resumable in the background, and each run's
per-step logs copied into `results/runs/` for `tables.py`.

    python experiments/theorem_world/warm_start.py --work runs/theorem_world   # once, first
    python experiments/llds_strength/run.py --theorem runs/theorem_world --work runs/llds_strength
    python experiments/llds_strength/run.py ... --dry-run     # each run's config; runs nothing
    python experiments/llds_strength/run.py ... --collect     # copy the logs only
    python experiments/llds_strength/run.py ... --park        # archive unfinished runs, to commit

Resumable: a finished run is skipped (also one whose complete log is in `results/runs/` but
whose work folder is gone, as on a new machine), an interrupted one resumes from its last
checkpoint (or, when its work folder is gone, from the checkpoint `--park` archived into
`results/parked/`, else from step 0);
`--parallel` runs at a time, one thread each, in the protocol's order (seed 1 of every arm,
then seed 2, then seed 3). At the end, and at any time with `--collect`, every started run's
`metrics.jsonl` goes to `results/runs/ARM/seedN/metrics.jsonl.gz` (with `alarms.jsonl` and the
held-out evaluations' summaries), complete or not.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import config_data, finished, print_dry_run, run_unfinished
from llds.analysis.machine import machine
from llds.analysis.study_logs import COMMITTED_LOG, read_committed_metrics
from llds.io import write_json
from llds.runs.folder_archive import pack_folder, unpack_folder
from llds.train.checkpoint import checkpoint_step, find_resumable, point_latest
from llds.train.config import load_config
from llds_strength.strength_study import ARMS, SEEDS, WARM_EM

HERE = Path(__file__).resolve().parent
MACHINES_LOG = "machines.jsonl"
WARM_EVAL = "warm_start.json"  # a part's warm start's step-0 held-out EM, where it is not 0.750
LR = 3e-4  # the theorem study's calibrated rate (../theorem_world/results/calibration.json)


def run_config(theorem: Path, work: Path, arm: str, seed: int, extra: Sequence[str] = ()):
    """The run of `arm` for `seed`: base.yaml, the arm's overrides, the paths and `extra`
    (the confirmation's `steps=300`)."""
    return load_config(
        HERE / "base.yaml",
        [
            f"run_dir={run_dir(work, arm, seed)}",
            f"seed={seed}",
            f"optim.lr={LR}",
            f"model.path={theorem / 'model'}",
            f"data.train={theorem / 'world' / 'train.jsonl'}",
            f"data.eval={theorem / 'world' / 'test.jsonl'}",
            f"retriever.source={theorem / 'world' / 'corpus.jsonl'}",
            *ARMS[arm],
            *extra,
        ],
    )


def run_dir(work: Path, arm: str, seed: int) -> Path:
    return work / arm / f"seed{seed}"


def ordered_runs(arms: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """The protocol's order: seed 1 of every arm, then seed 2, then seed 3."""
    return [(a, s) for s in seeds for a in arms]


def ensure_world(theorem: Path) -> None:
    """The world files (deterministic from the preset) when only the warm start is on disk."""
    if (theorem / "world" / "train.jsonl").is_file():
        return
    from llds.data.world import WorldConfig, generate_world, write_world

    write_world(generate_world(WorldConfig.preset("theorem")), theorem / "world")


WARM_START_ARCHIVE = HERE.parent / "theorem_world" / "results" / "warm_start_2" / "model.tar.gz"
"""The theorem study's warm start itself, archived by the first machine that verified it."""


def ensure_warm_start(theorem: Path, archive: Path = WARM_START_ARCHIVE) -> None:
    """The warm start from its committed archive when `theorem/model` is missing. A rebuild
    repeats it only on the CPU float kernels it was trained with (a tiny model amplifies
    last-bit differences: docs/reproducibility.md), so once a machine has verified it, every
    later one unpacks that model instead of training its own."""
    model = theorem / "model"
    if model.exists() or not archive.is_file():
        return
    unpack_folder(archive, model)
    print(f"warm start: unpacked {archive} into {model}", flush=True)


def check_warm_start(
    theorem: Path, work: Path, archive: Path = WARM_START_ARCHIVE, report: Path | None = None
) -> tuple[float, str]:
    """Step-0 held-out EM of the warm start, measured as the runs measure it; the study stops
    unless the model is the one its runs start from: with no `report`, the theorem study's
    (its held-out EM); with one, the model that report describes (its `model_sha256`, and it
    must have stopped on the warm-start conditions: CONFIRMATION.md, amendment 1). A verified
    warm start not yet archived is archived, to commit. Returns its held-out EM and SHA-256."""
    from llds.data.loaders import load_examples
    from llds.evaluation.evaluate import evaluate
    from llds.evaluation.periodic import eval_rollout_config
    from llds.models.hf import load_policy
    from llds.retrieval.factory import open_retriever
    from llds.runs.eval_result import eval_file
    from llds.train.checkpoint import file_sha256

    model = theorem / "model"
    if not (model / "model.safetensors").is_file():
        raise SystemExit(
            f"{model}: no warm start there (no model.safetensors) and no archive {archive} to "
            f"unpack; build it with `python experiments/theorem_world/warm_start.py --work "
            f"{theorem}`, then this check tells whether it is the theorem study's"
        )
    digest = file_sha256(model / "model.safetensors")
    if report is not None:
        _check_reported_model(model, digest, report)
    out = eval_file(work / "warm_eval" / digest[:16], 0)  # one measurement per distinct model
    if not out.is_file():
        cfg = run_config(theorem, work, "lam0", 1)
        policy, tok = load_policy(cfg.model.path)
        examples = load_examples(cfg.data.eval, limit=cfg.data.eval_limit)
        retriever = open_retriever(cfg.retriever.source)
        rollout = eval_rollout_config(cfg.rollout, cfg.eval_max_turns)
        evaluate(policy, tok, retriever, examples, rollout, template=None).write(out)
    em = json.loads(out.read_text(encoding="utf-8"))["overall"]["em"]
    print(
        f"warm start: held-out EM {em:.3f} (the theorem study's: {WARM_EM:.3f}); weights "
        f"sha256 {digest[:16]}" + (f", as {report} records" if report is not None else ""),
        flush=True,
    )
    if report is None and abs(em - WARM_EM) > 1e-9:
        where = (
            f"{archive} holds the verified one: move {model} aside and run again"
            if archive.is_file()
            else f"no machine has archived the theorem study's warm start yet ({archive})"
        )
        raise SystemExit(
            f"{model}: not the theorem study's warm start (held-out EM {em:.3f}; checked on "
            f"{machine()}; a tiny model trained on other CPU float kernels is another model, "
            f"docs/reproducibility.md); {where}; stopping"
        )
    if not archive.is_file():
        pack_folder(model, archive)
        print(f"warm start: verified and archived in {archive}; commit it", flush=True)
    return em, digest


def _check_reported_model(model: Path, digest: str, report: Path) -> None:
    """Stop unless `model` holds the weights `report` (a warm_start.py report) describes and
    that build met the warm-start conditions."""
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        expected, met = data["model_sha256"], data["stopped_on_conditions"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"{report}: no warm-start report with model_sha256 ({e})") from e
    if not met:
        raise SystemExit(
            f"{report}: that warm start did not meet the warm-start conditions "
            "(stopped_on_conditions false); its runs do not start"
        )
    if digest != expected:
        raise SystemExit(
            f"{model}: not the warm start {report} describes (weights sha256 {digest[:16]}, "
            f"the report's {expected[:16]}); unpack the committed archive instead, stopping"
        )


def note_machine(run: Path, threads: int) -> None:
    """Append the machine this call queues `run` on, and the checkpoint it resumes from, to
    `run/machines.jsonl`. A run parked on one machine and resumed on another changes its float
    rounding from that step on (CONFIRMATION.md, amendment 1); this says where. One row per
    driver call that queued the run, whether or not its turn came."""
    ckpt, _ = find_resumable(run / "checkpoints")
    row = {
        "queued": datetime.now(UTC).isoformat(timespec="seconds"),
        "from_step": (checkpoint_step(ckpt) or 0) if ckpt is not None else 0,
        "machine": machine(threads),  # the run's threads, not this driver's
    }
    run.mkdir(parents=True, exist_ok=True)
    with (run / MACHINES_LOG).open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def committed_steps(results: Path, arm: str, seed: int) -> int:
    """The last step in the run's log already copied to `results/runs/` (0 when there is none).
    A run that finished on another machine is complete there although its work folder, with
    its checkpoints, is gone: it is not run again."""
    path = results / "runs" / arm / f"seed{seed}" / COMMITTED_LOG
    if not path.is_file():
        return 0
    return max((int(row["step"]) for row in read_committed_metrics(path)), default=0)


def plan(
    theorem: Path,
    work: Path,
    results: Path,
    runs: Sequence[tuple[str, int]],
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Each run of the study, its config, the steps its committed log holds and whether this
    call runs it (in the protocol's order)."""
    out = []
    for arm, seed in runs:
        cfg = run_config(theorem, work, arm, seed, extra)
        done = committed_steps(results, arm, seed)
        run = done < cfg.steps
        out.append({"arm": arm, "seed": seed, "committed_steps": done, "run": run, "config": cfg})
    return out


def collect(work: Path, results: Path, runs: Sequence[tuple[str, int]]) -> None:
    """Copy every started run's per-step logs into `results/runs/ARM/seedN/`."""
    for arm, seed in runs:
        src = run_dir(work, arm, seed)
        if not (src / "metrics.jsonl").is_file():
            continue
        dst = results / "runs" / arm / f"seed{seed}"
        dst.mkdir(parents=True, exist_ok=True)
        with (
            (src / "metrics.jsonl").open("rb") as f,
            (dst / "metrics.jsonl.gz").open("wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g,
        ):
            shutil.copyfileobj(f, g)  # no name or time in the header: same log, same bytes
        for name in ("alarms.jsonl", MACHINES_LOG):
            if (src / name).is_file():
                shutil.copyfile(src / name, dst / name)
        resolved = newest_config(src)
        if resolved is not None:  # the settings its alarms were raised with, for a replay
            (dst / "config.json").write_text(json.dumps(resolved, indent=1, sort_keys=True) + "\n")
        evals = {}
        for path in sorted((src / "eval").glob("step_*.json")):
            overall = json.loads(path.read_text(encoding="utf-8"))["overall"]
            evals[path.stem] = overall
        if evals:
            (dst / "eval.json").write_text(json.dumps(evals, indent=1, sort_keys=True) + "\n")


def newest_config(run: Path) -> dict[str, Any] | None:
    """The resolved config a run's newest checkpoint records (its last leg's), or None."""
    states = sorted((run / "checkpoints").glob("step_*/trainer_state.json"))
    if not states:
        return None
    return json.loads(states[-1].read_text(encoding="utf-8")).get("config")


def parked_archive(results: Path, arm: str, seed: int) -> Path:
    return results / "parked" / arm / f"seed{seed}.tar.gz"


def park(work: Path, results: Path, runs: Sequence[tuple[str, int]]) -> None:
    """Each started, unfinished run's work folder with only its newest verified checkpoint, as
    `results/parked/ARM/seedN.tar.gz`. A 300-step run outlives one machine: committed, the
    archive lets a new one resume it where it stopped (`unpark`) instead of starting again."""
    for arm, seed in runs:
        src = run_dir(work, arm, seed)
        ckpt, _ = find_resumable(src / "checkpoints")
        if ckpt is None:
            continue
        archive = pack_folder(src, parked_archive(results, arm, seed), _parked_member(ckpt.name))
        mib = archive.stat().st_size / 2**20
        print(f"{arm} seed {seed}: parked at {ckpt.name} in {archive} ({mib:.1f} MiB)", flush=True)


def _parked_member(checkpoint: str) -> Callable[[Path], bool]:
    """Members of a parked run: the run folder without its other checkpoints (nor their
    staging folders or the `latest` pointer, which `unpark` sets again) and without the
    training processes' console logs."""

    def keep(rel: Path) -> bool:
        parts = rel.parts
        if parts[0] == "checkpoints" and len(parts) > 1 and parts[1] != checkpoint:
            return False
        return not (len(parts) == 1 and parts[0].startswith("train-"))

    return keep


def unpark(work: Path, results: Path, runs: Sequence[tuple[str, int]]) -> None:
    """Unpack each parked run whose work folder is gone, so that it resumes from the parked
    checkpoint; a work folder already there is never overwritten."""
    for arm, seed in runs:
        archive, dst = parked_archive(results, arm, seed), run_dir(work, arm, seed)
        if not archive.is_file() or dst.exists():
            continue
        unpack_folder(archive, dst)
        ckpt, _ = find_resumable(dst / "checkpoints")
        if ckpt is not None:
            point_latest(dst / "checkpoints", ckpt)
        print(f"{arm} seed {seed}: unparked from {archive}", flush=True)


def retire_parked(results: Path, runs: Sequence[dict[str, Any]]) -> None:
    """Delete the parked archive of every run whose committed log is now complete."""
    for r in runs:
        archive = parked_archive(results, r["arm"], r["seed"])
        if archive.is_file() and committed_steps(results, r["arm"], r["seed"]) >= r["config"].steps:
            archive.unlink()
            print(f"{r['arm']} seed {r['seed']}: complete; {archive} deleted", flush=True)


def execute(runs: Sequence[dict[str, Any]], theorem: Path, work: Path, results: Path, args) -> None:
    """What a driver call does with its plan: print it (`--dry-run`), or run the unfinished
    runs `args.parallel` at a time (unless `--collect`), then copy their logs to `results`."""
    if args.dry_run:
        print_dry_run([{**r, "config": config_data(r["config"])} for r in runs])
        return
    todo = [r for r in runs if r["run"]]
    pairs = [(r["arm"], r["seed"]) for r in todo]
    if args.park:
        park(work, results, pairs)
        collect(work, results, pairs)
        retire_parked(results, todo)  # a run that finished since its last collect
        return
    if args.unpark:
        unpark(work, results, pairs)
        return
    if not args.collect:
        unpark(work, results, pairs)
        for r in todo:
            if r["committed_steps"] and not (Path(r["config"].run_dir) / "metrics.jsonl").is_file():
                print(
                    f"{r['arm']} seed {r['seed']}: its work folder is gone; it starts again "
                    f"(its log of {r['committed_steps']} steps is replaced at the next collect)",
                    flush=True,
                )
        ensure_world(theorem)
        ensure_warm_start(theorem, Path(args.warm_archive))
        report = Path(args.warm_report) if args.warm_report else None
        em, digest = check_warm_start(theorem, work, Path(args.warm_archive), report)
        if report is not None:  # a warm start other than the theorem study's: keep its EM
            write_json(results / WARM_EVAL, {"held_out_em": em, "model_sha256": digest})
        for r in todo:
            if not finished(r["config"]):  # threads: start_run's 1 where the config has none
                note_machine(Path(r["config"].run_dir), r["config"].threads or 1)
        run_unfinished([r["config"] for r in todo], args.parallel)
    collect(work, results, pairs)
    retire_parked(results, todo)


def driver_arguments(
    doc: str | None, work: str, results: Path, seeds: Sequence[int]
) -> argparse.ArgumentParser:
    """The options every driver of this study takes (`execute` reads them)."""
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--theorem", default="runs/theorem_world", help="world and warm start")
    p.add_argument("--work", default=work, help="the runs")
    p.add_argument("--results", default=str(results), help="logs are copied here")
    p.add_argument("--seeds", nargs="+", type=int, default=list(seeds), help="default: %(default)s")
    p.add_argument(
        "--warm-archive",
        default=str(WARM_START_ARCHIVE),
        help="the verified warm start, unpacked when --theorem has no model",
    )
    p.add_argument(
        "--warm-report",
        default=None,
        help="a warm_start.py report whose model_sha256 names the warm start (default: the "
        "theorem study's, known by its held-out EM)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=2,
        help="runs at a time, one torch thread each (%(default)s)",
    )
    p.add_argument("--dry-run", action="store_true", help="print each run's config; run nothing")
    p.add_argument("--collect", action="store_true", help="only copy the logs")
    p.add_argument(
        "--park",
        action="store_true",
        help="only archive each unfinished run's newest checkpoint into RESULTS/parked/ and "
        "copy the logs (a later call on a new machine resumes from the archive)",
    )
    p.add_argument(
        "--unpark",
        action="store_true",
        help="only unpack the parked runs whose work folder is gone (a run unpacks them itself)",
    )
    return p


def main() -> None:
    p = driver_arguments(__doc__, "runs/llds_strength", HERE / "results", SEEDS)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args = p.parse_args()
    theorem, work, results = Path(args.theorem), Path(args.work), Path(args.results)
    runs = plan(theorem, work, results, ordered_runs(args.arms, args.seeds))
    execute(runs, theorem, work, results, args)


if __name__ == "__main__":
    main()
