"""What a refused command line costs before its one line: `llds --version` and one bad input per
kind of check (config, files, model directory, retriever, outputs), each in a fresh process.

Each case runs `python -m llds.cli ARGS` `--repeats` times; the table gives the median CPU time
of the child (user + sys, from `getrusage(RUSAGE_CHILDREN)`: what the command itself costs, which
other jobs on the machine barely change) and the median wall time (what the user waits, which
they do), and checks each run's exit code and that its last line names the culprit.

    python benchmarks/cli_startup.py [--repeats 5] [--only train-]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, world_tokenizer


def make_inputs(root: Path) -> dict[str, Path]:
    """A small world, a tiny model and the damaged copies of them the cases refuse."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from llds.data.world import WorldConfig, generate_world, write_world
    from llds.models.tiny import save_tiny, tiny_causal_lm_for

    world = generate_world(WorldConfig(seed=3, num_entities=40, num_train=48, num_test=16))
    files = write_world(world, root / "world")
    tok = world_tokenizer(world, 400)
    model = save_tiny(tiny_causal_lm_for(tok, hidden_size=64, num_layers=2), tok, root / "model")
    paths = {"model": model, **files}
    edits = (
        ("model_cut", "cut"),
        ("model_type", "type"),
        ("model_nan", "nan"),
        ("model_tok", "tok"),
    )
    for name, edit in edits:
        damaged = shutil.copytree(model, root / name)
        if edit == "tok":
            for f in damaged.glob("tokenizer*"):
                f.unlink()
        elif edit == "cut":
            text = (damaged / "config.json").read_text(encoding="utf-8")
            (damaged / "config.json").write_text(text[: len(text) // 2], encoding="utf-8")
        elif edit == "type":
            config = json.loads((damaged / "config.json").read_text(encoding="utf-8"))
            (damaged / "config.json").write_text(json.dumps({**config, "model_type": "qwen9"}))
        else:
            weights = load_file(damaged / "model.safetensors")
            first = sorted(weights)[0]
            weights[first] = torch.full_like(weights[first], float("nan"))
            save_file(weights, damaged / "model.safetensors", metadata={"format": "pt"})
        paths[name] = damaged
    latin1 = root / "latin1.jsonl"
    latin1.write_bytes(
        '{"id": 1, "question": "Qui a \xe9crit ?", "golden_answers": ["V"]}\n'.encode("latin-1")
    )
    paths["latin1"] = latin1
    gz = root / "corpus.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 6)  # a gzip header and nothing after it
    paths["gz"] = gz
    import pyarrow as pa
    import pyarrow.parquet as pq

    chat = root / "chat.parquet"  # a Search-R1 prompt saved chat-templated, no "Question:"
    text = "<|im_start|>user\nAnswer the question.\nWho rules Vutok?<|im_end|>\n"
    rows = [{"prompt": [{"role": "user", "content": text}], "golden_answers": ["V"]}] * 2
    pq.write_table(pa.Table.from_pylist(rows), chat)
    paths["chat"] = chat
    index = root / "index"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "llds.cli",
            "index",
            "--corpus",
            str(files["corpus"]),
            "--out",
            str(index),
            "--no-progress",
        ],
        check=True,
        capture_output=True,
    )
    (index / "docs.jsonl").unlink()
    paths["index"] = index
    cfg = {
        "model": {"path": str(model)},
        "data": {"train": str(files["train"]), "prompt_template": "Question: {question}\n"},
        "retriever": {"source": str(files["corpus"]), "topk": 2},
        "rollout": {"group_size": 3, "max_turns": 1, "max_turn_tokens": 12},
        "logging": {"tensorboard": False, "progress": False},
    }
    (root / "results").mkdir()
    (root / "results" / "kept.json").write_text("{}", encoding="utf-8")
    paths["cfg"] = root / "cfg.yaml"
    paths["cfg"].write_text(json.dumps(cfg), encoding="utf-8")
    return paths


class OffSchema(BaseHTTPRequestHandler):
    """A retrieval service whose 200 reply has no `result` list."""

    def do_POST(self) -> None:
        body = b'{"answer": "no result list"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def free_port() -> int:
    """A loopback port nothing listens on (a dead retriever URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cases(p: dict[str, Path], root: Path, dead: str, off: str) -> list[tuple[str, list[str]]]:
    """(name, arguments) of each command line; all but `--version` are refused (exit 2)."""
    train = ["train", "--config", str(p["cfg"]), f"run_dir={root / 'run'}"]
    data = [f"data={p['test']}", f"retriever={p['corpus']}"]
    evals = ["eval", f"model={p['model']}"]
    out = f"out={root / 'probe'}"
    sft = ["sft", "--config", "sft-demo", f"world={p['corpus'].parent}"]
    return [
        ("version", ["--version"]),
        ("train-unknown-key", [*train, "nosuch=1"]),
        ("train-temperature-0", [*train, "rollout.temperature=0"]),
        ("train-missing-data", [*train, f"data.train={root / 'absent.jsonl'}"]),
        ("train-data-not-utf8", [*train, f"data.train={p['latin1']}"]),
        ("train-dead-retriever", [*train, f"retriever.source={dead}"]),
        ("train-off-schema-retriever", [*train, f"retriever.source={off}"]),
        ("train-config-json-cut", [*train, f"model.path={p['model_cut']}"]),
        ("train-model-without-tokenizer", [*train, f"model.path={p['model_tok']}"]),
        ("train-unknown-model-type", [*train, f"model.path={p['model_type']}"]),
        ("train-nan-weights", [*train, f"model.path={p['model_nan']}"]),
        ("train-template-without-question", [*train, "data.prompt_template=Q: {q}"]),
        ("train-chat-without-template", [*train, "model.chat=true"]),
        ("train-prompt-without-marker", [*train, f"data.train={p['chat']}"]),
        ("train-uncached-hub-id", [*train, "model.path=no-such-org/no-such-model"]),
        ("eval-data-not-utf8", [*evals, f"data={p['latin1']}", f"retriever={p['corpus']}"]),
        ("eval-dead-retriever", [*evals, f"data={p['test']}", f"retriever={dead}"]),
        ("eval-out-is-a-folder", [*evals, *data, f"out={root / 'results'}"]),
        ("eval-nan-weights", ["eval", f"model={p['model_nan']}", *data]),
        ("probe-model-without-tokenizer", ["probe", f"model={p['model_tok']}", *data, out]),
        (
            "probe-missing-data",
            [
                "probe",
                f"model={p['model']}",
                f"data={root / 'absent.jsonl'}",
                f"retriever={p['corpus']}",
                out,
            ],
        ),
        (
            "probe-missing-questions-from",
            ["probe", f"model={p['model']}", *data, out, f"questions_from={root / 'absent'}"],
        ),
        ("sft-dead-retriever", [*sft, f"corpus={dead}", f"--out={root / 'sft'}"]),
        ("sft-out-is-its-input", [*sft, f"--out={p['corpus'].parent}"]),
        ("index-gz-cut-short", ["index", f"corpus={p['gz']}", f"--out={root / 'index2'}"]),
        ("index-into-its-input", ["index", f"corpus={p['corpus']}", f"--out={p['corpus'].parent}"]),
        (
            "serve-index-without-docs",
            ["serve-retriever", f"--index={p['index']}", f"--port={free_port()}"],
        ),
        (
            "world-second-config",
            [
                "world",
                "--config",
                "world-organism",
                "--config",
                "world-hard",
                f"--out={root / 'w2'}",
            ],
        ),
        ("report-no-run", ["report", str(root / "absent-run")]),
    ]


def run_once(args: list[str]) -> tuple[int, float, float, str]:
    """(exit code, child CPU s, wall s, last line of stderr) of one fresh `llds ARGS`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "llds.cli", *args], capture_output=True, text=True, timeout=300
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return proc.returncode, cpu, wall, lines[-1] if lines else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="", help="run the cases whose name starts with this")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    print(f"command: python benchmarks/cli_startup.py --repeats {args.repeats}")
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = make_inputs(root)
        server = ThreadingHTTPServer(("127.0.0.1", 0), OffSchema)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        off = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
        dead = f"http://127.0.0.1:{free_port()}/retrieve"
        print("| case | exit | CPU s (median) | CPU s (max) | wall s (median) | its line |")
        print("|---|---|---|---|---|---|")
        worst = 0.0
        for name, argv in cases(paths, root, dead, off):
            if not name.startswith(args.only):
                continue
            runs = [run_once(argv) for _ in range(args.repeats)]
            codes = sorted({r[0] for r in runs})
            cpu = [r[1] for r in runs]
            line = runs[-1][3]
            expected = 0 if name == "version" else 2
            ok = codes == [expected] and (name == "version" or ": error: " in line)
            worst = max(worst, statistics.median(cpu))
            print(
                f"| {name} | {','.join(map(str, codes))}{'' if ok else ' (!)'} | "
                f"{statistics.median(cpu):.2f} | {max(cpu):.2f} | "
                f"{statistics.median(r[2] for r in runs):.2f} | {line[:70]} |"
            )
        server.shutdown()
    print(f"load average at end: {os.getloadavg()[0]:.1f}; slowest median CPU: {worst:.2f} s")


if __name__ == "__main__":
    main()
