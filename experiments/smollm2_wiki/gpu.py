"""The SmolLM2 trivia-wiki study on one GPU in one command under a time limit: warm start,
GRPO and GRPO+LLDS for every seed at once, test and transfer EM as they go. It does not fit 10
minutes: on one H200 the six runs reached steps 20-22 of 120 in 565 s (PROTOCOL.md, amendment 1).

Stages, each kept when its output exists (so a second call continues the first):
  model   the SmolLM2 GGUF (`--gguf`, or joined from `--gguf-parts` and checked against its
          manifest: see `weights.py`), dequantized once to an fp32 model folder
  sft     the reading warm start, `sft-smollm2-wiki-rl`, on the train split
  start   the warm start's greedy EM on the test split and the transfer lists (step 0), in a
          process of its own beside the runs
  runs    `smollm2-wiki-rl` with LLDS off and on for every seed, all at once on the one device,
          stopped when `--budget-s` (counted from the command's start) is spent; the test and
          transfer EM every `--eval-every` steps
The table (`table.md`), every run's logs (`runs.tar.gz`) and the progress (`progress.jsonl`)
are rewritten in `--results` every `--write-every` seconds and at the end, so a command killed
at its limit keeps what it had done. Protocol: `PROTOCOL.md` ("Where it runs").

    python experiments/smollm2_wiki/gpu.py --out runs/smollm2-wiki-gpu --results OUT \\
        --gguf-parts PARTS --data data/trivia-wiki --index indexes/wiki --budget-s 540
    python experiments/smollm2_wiki/gpu.py --smoke --out /tmp/smoke --results /tmp/smoke/out

`--smoke` runs every stage on any machine in a few minutes with a tiny random model on a tiny
synthetic world, 2 steps per run: it checks the command, and measures nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import Clock, finished, say
from llds.models.gguf_parts import join_parts

ARMS = {"GRPO": ["algo.llds.enabled=false"], "GRPO+LLDS": ["algo.llds.enabled=true"]}
STAGES = ("model", "sft", "start", "runs")
SOURCES = {"test.jsonl": "held-out", "transfer.jsonl": "transfer"}
"""Split file -> the `data_source` its rows carry in the evaluation file (the tables' names)."""
SMOKE_RUN = [
    "steps=2",
    "prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_turn_tokens=16",
    "rollout.max_obs_tokens=48",
    "rollout.max_total_tokens=256",
    "optim.mini_batches=2",
    "retriever.topk=2",
]
SMOKE_SFT = ["tiny=true", "reading=false", "miss_first=0", "steps=3", "batch_size=4", "lr=3e-3"]


def _atomic_bytes(path: Path, data: bytes) -> None:
    from llds.io import atomic_write

    with atomic_write(path, "wb") as f:
        f.write(data)


# ------------------------------------------------------------------------------------ stages


def in_own_process(target: Any, *args: Any) -> None:
    """`target(*args)` in a spawned process, waited for: what a stage allocates (the warm
    start's model, optimizer and activations, about 10 GB on a CPU) is given back when it
    ends instead of staying with this process beside the runs."""
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
    proc.start()
    proc.join()
    if proc.exitcode:
        raise SystemExit(f"{target.__name__} failed (exit code {proc.exitcode}); see above")


def model_dir(args: argparse.Namespace, out: Path) -> Path | None:
    """The fp32 SmolLM2 folder (None with `--smoke`: the warm start makes a tiny model)."""
    if args.smoke:
        return None
    from llds.models.smollm2 import smollm2_checkpoint

    gguf = Path(args.gguf) if args.gguf else None
    if args.gguf_parts:
        gguf = out / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if not gguf.is_file():
            join_parts(args.gguf_parts, gguf)
    return smollm2_checkpoint(out / "smollm2", gguf=gguf)


def smoke_inputs(out: Path) -> tuple[Path, Path, Path]:
    """A tiny synthetic world standing in for trivia-wiki: (data dir, corpus, world dir)."""
    from llds.data.world import WorldConfig, generate_world, write_world
    from llds.io import write_jsonl

    world = out / "world"
    if not (world / "world.json").is_file():
        write_world(generate_world(WorldConfig(num_entities=40, num_train=30, num_test=12)), world)
    data = out / "smoke-data"
    rows = [json.loads(line) for line in (world / "test.jsonl").read_text().splitlines()]
    write_jsonl(data / "test.jsonl", rows[:6])
    write_jsonl(data / "transfer.jsonl", rows[6:10])
    return data, world / "corpus.jsonl", world


def warm_start(args: argparse.Namespace, out: Path, base: Path | None, world: Path | None) -> Path:
    """`llds sft --config sft-smollm2-wiki-rl` on the train split; returns its folder."""
    from llds.sft import load_sft_config
    from llds.sft import run as run_sft

    sft = out / "sft"
    if (sft / "model").is_dir():
        return sft
    given = [f"out={sft}", f"device={args.device}", "progress=false", f"seed={args.sft_seed}"]
    if args.smoke:
        given += [f"world={world}", "model=null", *SMOKE_SFT, "data=null", "corpus=null"]
    else:
        given += [f"model={base}", f"data={Path(args.data) / 'train.jsonl'}"]
        given += [f"corpus={args.index}"]
        given += [f"steps={args.sft_steps}"] if args.sft_steps else []
    run_sft(load_sft_config("sft-smollm2-wiki-rl", given))
    return sft


def eval_data(data: Path, out: Path) -> Path:
    """The test split and the transfer lists in one file, tagged `held-out` and `transfer`."""
    from llds.io import write_jsonl

    rows = []
    for name, source in SOURCES.items():
        for line in (data / name).read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append({**json.loads(line), "data_source": source})
    path = out / "eval.jsonl"
    write_jsonl(path, rows)
    return path


def evaluate_start(args: argparse.Namespace, sft: Path, evals: Path, corpus: str, cfg) -> Path:
    """The warm start's greedy evaluation with the limits of the runs' own evaluations (`cfg`:
    one run's config), kept as step 0 of every run."""
    from llds.evaluation.config import EvalConfig, ProtocolChoice
    from llds.evaluation.evaluate import run_evaluation
    from llds.runs.eval_result import eval_file

    start = eval_file(sft, 0)
    if not start.is_file():
        run_evaluation(
            EvalConfig(
                model=str(sft / "model"),
                data=[str(evals)],
                retriever=corpus,
                out=str(start),
                device=args.device,
                protocol=ProtocolChoice(
                    max_turns=cfg.eval_max_turns,
                    topk=cfg.retriever.topk,
                    max_turn_tokens=cfg.rollout.max_turn_tokens,
                    max_obs_tokens=cfg.rollout.max_obs_tokens,
                    max_total_tokens=cfg.rollout.max_total_tokens,
                ),
            )
        )
    return start


def run_config(
    args: argparse.Namespace, out: Path, arm: str, seed: int, corpus: str, evals: Path, sft: Path
):
    """One arm and seed of `smollm2-wiki-rl` from this command's warm start and data."""
    from llds.train.config import load_config

    train = (Path(args.data) if not args.smoke else out / "world") / "train.jsonl"
    return load_config(
        "smollm2-wiki-rl",
        [
            f"run_dir={out / arm.replace('+', '_') / f'seed{seed}'}",
            f"seed={seed}",
            f"model.path={sft / 'model'}",
            f"data.train={train}",
            f"data.eval={evals}",
            f"retriever.source={corpus}",
            f"eval_every={args.eval_every}",
            "make_inputs=null",
            "logging.tensorboard=false",
            "logging.progress=false",
            *ARMS[arm],
            *(SMOKE_RUN if args.smoke else []),
            *([f"steps={args.steps}"] if args.steps else []),
        ],
    )


# ----------------------------------------------------------------------------------- results


def write_results(out: Path, results: Path, runs: dict[tuple[str, int], Any], start: Path) -> None:
    """`table.md` (every run that has logged a step) and `runs.tar.gz` (each run's metrics,
    evaluations and alarms, its resolved config as `config.json`, and the warm start's
    evaluation), each written whole or not at all. The run folders stay on the machine (their
    checkpoints are far larger than what a GPU call returns), so the config travels here."""
    from llds.analysis.source_table import source_table
    from llds.config.loader import to_dict
    from smollm2_wiki.answer import study_answer

    dirs = {key: Path(cfg.run_dir) for key, cfg in runs.items()}
    step = max(cfg.steps for cfg in runs.values())
    table = source_table(dirs, start) + "\n\n" + study_answer(dirs, start, step) + "\n"
    _atomic_bytes(results / "table.md", table.encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        if start.is_file():
            tar.add(start, arcname="warm_start_eval.json")
        for key, run_dir in dirs.items():
            where = run_dir.relative_to(out)
            config = json.dumps(to_dict(runs[key]), indent=1).encode()
            info = tarfile.TarInfo(str(where / "config.json"))
            info.size, info.mtime = len(config), int(time.time())
            tar.addfile(info, io.BytesIO(config))
            for name in ("metrics.jsonl", "eval", "alarms.jsonl"):
                if (run_dir / name).exists():
                    tar.add(run_dir / name, arcname=str(where / name))
    _atomic_bytes(results / "runs.tar.gz", buf.getvalue())


# -------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/smollm2-wiki-gpu"))
    ap.add_argument("--results", type=Path, default=None, help="tables and logs (default: OUT)")
    ap.add_argument("--data", default="data/trivia-wiki", help="`llds trivia-wiki` folder")
    ap.add_argument("--index", default="indexes/wiki", help="BM25 index of the summaries")
    ap.add_argument("--gguf", default=None, help="the SmolLM2 GGUF (default: the package's)")
    ap.add_argument("--gguf-parts", default=None, help="its parts and manifest (weights.py)")
    ap.add_argument("--device", default="auto", help="auto: cuda when there is one, else cpu")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=None, help="per run (default: the preset's)")
    ap.add_argument("--eval-every", type=int, default=40)
    ap.add_argument("--parallel", type=int, default=0, help="runs at once (0: all of them)")
    ap.add_argument("--sft-seed", type=int, default=0)
    ap.add_argument("--sft-steps", type=int, default=None, help="default: the preset's 60")
    ap.add_argument("--budget-s", type=float, default=540.0, help="from the command's start")
    ap.add_argument("--reserve-s", type=float, default=20.0, help="kept for the last tables")
    ap.add_argument("--write-every", type=float, default=30.0, help="seconds between tables")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--smoke", action="store_true", help="tiny model and world; measures nothing")
    args = ap.parse_args(argv)
    stages = {s.strip() for s in args.stages.split(",") if s.strip()}
    if stages - set(STAGES):
        ap.error(f"--stages: unknown {sorted(stages - set(STAGES))}; from {', '.join(STAGES)}")
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    clock = Clock(args.budget_s)
    out: Path = args.out
    results: Path = args.results or out
    out.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    from llds.analysis.machine import machine
    from llds.runs.eval_result import eval_file

    say(clock, results, "start", machine=machine(), argv=list(argv or sys.argv[1:]))
    world = None
    if args.smoke:
        data, corpus_path, world = smoke_inputs(out)
        corpus = str(corpus_path)
    else:
        data, corpus = Path(args.data), args.index
    base = None if args.smoke else out / "smollm2"
    if "model" in stages:
        in_own_process(model_dir, args, out)
    say(clock, results, "model", path=str(base))
    sft = out / "sft"
    if "sft" in stages:
        in_own_process(warm_start, args, out, base, world)
    say(clock, results, "sft", path=str(sft))
    evals = eval_data(data, out)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {
        (arm, s): run_config(args, out, arm, s, corpus, evals, sft) for s in seeds for arm in ARMS
    }
    one = next(iter(runs.values()))
    start, beside = eval_file(sft, 0), None
    if "start" in stages and not start.is_file():
        # step 0 of the table, not an input of the runs: evaluated in a process of its own
        # while they go, on the same device, so that it costs the time budget nothing
        spawn = multiprocessing.get_context("spawn")
        beside = spawn.Process(target=evaluate_start, args=(args, sft, evals, corpus, one))
        beside.start()
        say(clock, results, "warm start evaluation started")
    last = [0.0]

    def every_poll() -> None:
        if clock.elapsed() - last[0] >= args.write_every:
            last[0] = clock.elapsed()
            write_results(out, results, runs, start)
            steps = {f"{arm} {seed}": _steps(cfg) for (arm, seed), cfg in runs.items()}
            say(clock, results, "tables", steps=steps)

    left: list[Path] = []
    if "runs" in stages:
        from llds.train.background import run_queue

        stamp = int(time.time())
        todo = [
            (cfg, Path(cfg.run_dir) / f"train-{stamp}.log")
            for cfg in runs.values()
            if not finished(cfg)
        ]
        from llds.errors import UserInputError

        try:
            left = run_queue(
                todo,
                parallel=args.parallel or len(todo),
                poll_s=2.0,
                deadline=clock.deadline(args.reserve_s),
                on_poll=every_poll,
            )
        except UserInputError as exc:  # a run failed: keep what the others did, then stop
            if beside is not None:
                beside.terminate()
            write_results(out, results, runs, start)
            say(clock, results, "failed", error=str(exc))
            raise SystemExit(f"error: {exc}") from None
    if beside is not None:
        beside.join(timeout=max(0.0, clock.deadline(args.reserve_s / 2) - time.monotonic()))
        if beside.is_alive():
            beside.terminate()
            beside.join()
        say(clock, results, "warm start evaluated", done=start.is_file(), code=beside.exitcode)
    write_results(out, results, runs, start)
    say(clock, results, "done", unfinished=[str(p) for p in left])
    print((results / "table.md").read_text(encoding="utf-8"))


def _steps(cfg: Any) -> int:
    from llds.runs.tracking import read_metrics

    rows = read_metrics(cfg.run_dir)
    return rows[-1]["step"] if rows else 0


if __name__ == "__main__":
    main()
