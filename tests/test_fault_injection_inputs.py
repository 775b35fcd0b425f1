"""Fault injection on the inputs: each bad input, through the real command line, must end in one
line that names the bad key, file or port, exit code 2, no traceback, and nothing written before
damaged. Tiny inputs only; no GPU and no network (servers listen on loopback)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from conftest import write_run_inputs
from llds.cli import main
from llds.retrieval.corpus import write_corpus

PREVIOUS_ROWS = '{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.75}\n'


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, small_world, world_tokenizer) -> Path:
    """A world, a tiny model and a train config that runs (`cfg.yaml`), under one folder."""
    root = tmp_path_factory.mktemp("inputs")
    write_run_inputs(root, small_world, world_tokenizer)
    (root / "empty.jsonl").write_text("", encoding="utf-8")
    (root / "blank.jsonl").write_text("\n\n", encoding="utf-8")
    return root


@pytest.fixture()
def previous_run(tmp_path: Path) -> Path:
    """A run directory that already holds a metrics log (which a failed start must keep)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(PREVIOUS_ROWS, encoding="utf-8")
    return run


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run `llds ARGS` in-process; (exit code, everything it printed)."""
    rc = main(args)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def error_line(rc: int, output: str, command: str) -> str:
    """The one error line of a failed command, checked for exit code 2 and no traceback."""
    assert rc == 2, output
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.startswith(f"llds {command}: error: ")]
    assert len(lines) == 1, output
    return lines[0]


def train(inputs: Path, run_dir: Path, *overrides: str) -> list[str]:
    return ["train", "--config", str(inputs / "cfg.yaml"), f"run_dir={run_dir}", *overrides]


def assert_untouched(run: Path) -> None:
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]
    assert (run / "metrics.jsonl").read_text(encoding="utf-8") == PREVIOUS_ROWS


def corpus_file(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ training inputs


@pytest.mark.parametrize("name", ["empty.jsonl", "blank.jsonl"])
def test_empty_training_file_names_the_file(inputs, previous_run, capsys, name) -> None:
    data = inputs / name
    rc, out = cli(train(inputs, previous_run, f"data.train={data}"), capsys)
    line = error_line(rc, out, "train")
    assert f"{data}: no questions to load (an empty file)" in line
    assert_untouched(previous_run)


def test_empty_periodic_eval_file_names_the_file(inputs, tmp_path, capsys) -> None:
    data = inputs / "empty.jsonl"
    run = tmp_path / "fresh"
    rc, out = cli(train(inputs, run, "eval_every=2", f"data.eval={data}"), capsys)
    assert f"{data}: no questions to load" in error_line(rc, out, "train")
    assert not run.exists()  # nothing created for a run that never started


def test_corpus_of_empty_passages_names_the_file(inputs, previous_run, tmp_path, capsys) -> None:
    corpus = corpus_file(
        tmp_path / "hollow.jsonl",
        [{"id": "a", "contents": ""}, {"id": "b", "contents": '""\n  '}],
    )
    rc, out = cli(train(inputs, previous_run, f"retriever.source={corpus}"), capsys)
    line = error_line(rc, out, "train")
    assert f"{corpus}: all 2 passages are empty" in line
    assert "max() arg" not in out
    assert_untouched(previous_run)


def test_wandb_without_the_package_writes_nothing(
    inputs, previous_run, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails as if not installed
    rc, out = cli(train(inputs, previous_run, "logging.wandb=true"), capsys)
    line = error_line(rc, out, "train")
    assert "logging.wandb=true needs the wandb package: pip install 'llds[wandb]'" in line
    assert_untouched(previous_run)
    fresh = tmp_path / "fresh"
    rc, out = cli(train(inputs, fresh, "logging.wandb=true"), capsys)
    error_line(rc, out, "train")
    assert not fresh.exists()  # no empty metrics.jsonl left behind


def test_wandb_check_comes_before_the_metrics_log_is_rewritten(previous_run, monkeypatch) -> None:
    from llds.errors import ConfigError
    from llds.runs.tracking import MetricsLogger

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"logging\.wandb"):
        MetricsLogger(previous_run, tensorboard=False, wandb=True, resume_step=0)
    assert_untouched(previous_run)  # resume_step=0 would have cut both rows


@pytest.mark.parametrize(
    ("group_size", "why"),
    [
        (1, "must be >= 2, got 1: GRPO's advantages are relative to the group"),
        (0, "Input should be greater than or equal to 1, got 0"),
    ],
)
def test_group_size_below_two_is_named(inputs, tmp_path, capsys, group_size, why) -> None:
    args = train(inputs, tmp_path / "run", f"rollout.group_size={group_size}")
    rc, out = cli([*args, "--print-config"], capsys)
    line = error_line(rc, out, "train")
    assert line.startswith(f"llds train: error: command line: rollout.group_size: {why}")
    assert "mini_batches" not in line


@pytest.mark.parametrize(
    ("override", "key", "shown"),
    [
        ("algo.llds.coef=nan", "algo.llds.coef", ", got 'nan'"),  # YAML reads `nan` as text
        ("optim.lr=inf", "optim.lr", ", got 'inf'"),
        ("algo.kl_coef=-.inf", "algo.kl_coef", ", got -inf"),  # and `-.inf` as a float
        ("algo.clip_high=nan", "algo.clip_high", " (or null), got 'nan'"),
        ("optim.betas=[0.9, .nan]", "optim.betas[1]", ", got nan"),
        ("diagnostics.rollback_llds_coef=inf", "diagnostics.rollback_llds_coef", ", got 'inf'"),
    ],
)
def test_non_finite_numbers_are_named(inputs, tmp_path, capsys, override, key, shown) -> None:
    rc, out = cli([*train(inputs, tmp_path / "run", override), "--print-config"], capsys)
    line = error_line(rc, out, "train")
    why = f"Input should be a finite number{shown}"
    assert line == f"llds train: error: command line: {key}: {why}"


def test_cuda_device_on_a_machine_without_cuda(inputs, previous_run, capsys, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out = cli(train(inputs, previous_run, "model.device=cuda"), capsys)
    line = error_line(rc, out, "train")
    assert "model.device: 'cuda' needs CUDA, but torch.cuda.is_available() is false" in line
    assert_untouched(previous_run)
    world = inputs / "world"
    args = ["--model", str(inputs / "model"), "--data", str(world / "test.jsonl")]
    rc, out = cli(
        ["eval", *args, "--retriever", str(world / "corpus.jsonl"), "device=cuda"], capsys
    )
    assert "device: 'cuda' needs CUDA" in error_line(rc, out, "eval")
    sft = ["sft", f"world={world}", "tiny=true", "tokenizer_vocab=300", "steps=1"]
    rc, out = cli([*sft, "--out", str(inputs / "sft"), "device=cuda:0"], capsys)
    assert "device: 'cuda:0' needs CUDA" in error_line(rc, out, "sft")
    assert not (inputs / "sft").exists()


def test_exit_code_and_one_line_from_a_real_process(inputs, previous_run) -> None:
    """The same failure as users see it: `python -m llds.cli` exits 2 with one line."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU visible, whatever the machine
    cmd = [sys.executable, "-m", "llds.cli", *train(inputs, previous_run, "model.device=cuda")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("llds train: error: model.device: 'cuda'")
    )
    assert_untouched(previous_run)


# --------------------------------------------------------------------------- evaluation inputs


def test_empty_eval_files_name_the_file(inputs, tmp_path, capsys) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "empty.parquet"
    schema = {"question": pa.string(), "golden_answers": pa.list_(pa.string())}
    pq.write_table(pa.table({k: pa.array([], t) for k, t in schema.items()}), parquet)
    out_json = tmp_path / "results.json"
    out_json.write_text('{"kept": true}', encoding="utf-8")
    corpus = inputs / "world" / "corpus.jsonl"
    for data in (inputs / "empty.jsonl", parquet):
        args = ["eval", "--model", str(inputs / "model"), "--data", str(data)]
        rc, out = cli([*args, "--retriever", str(corpus), "--out", str(out_json)], capsys)
        assert f"{data}: no questions to load (an empty file)" in error_line(rc, out, "eval")
        assert "n=0" not in out and "| 0 |" not in out
    assert out_json.read_text(encoding="utf-8") == '{"kept": true}'


# ------------------------------------------------------------------------------------ corpora


def test_duplicate_corpus_ids_name_both_lines(tmp_path, capsys) -> None:
    good = corpus_file(tmp_path / "good.jsonl", [{"id": "x", "contents": "Paris is in France"}])
    out = tmp_path / "index"
    assert main(["index", "--corpus", str(good), "--out", str(out), "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    dup = tmp_path / "dup.jsonl"
    dup.write_text(
        '{"id": "p1", "contents": "Lyon"}\n{"id": "p2", "contents": "Nice"}\n\n'
        '{"id": "p1", "contents": "Lille"}\n',
        encoding="utf-8",
    )
    rc, output = cli(["index", "--corpus", str(dup), "--out", str(out), "--no-progress"], capsys)
    line = error_line(rc, output, "index")
    assert f"{dup}: lines 1 and 4 have the same passage id 'p1'" in line
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_empty_passages_are_counted_in_a_warning(tmp_path, capsys, caplog) -> None:
    corpus = corpus_file(
        tmp_path / "some.jsonl",
        [
            {"id": "a", "contents": "Paris is the capital of France"},
            {"id": "b", "contents": "   "},
            {"id": "c", "contents": '""\n'},  # a title line with no title
        ],
    )
    out = tmp_path / "index"
    with caplog.at_level("WARNING", logger="llds.retrieval.corpus"):
        rc, _ = cli(["index", "--corpus", str(corpus), "--out", str(out), "--no-progress"], capsys)
    assert rc == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"{corpus}: 2 of 3 passages are empty (no letter or digit); no search will find them"
    ]


def test_empty_corpus_index_names_the_file(inputs, tmp_path, capsys) -> None:
    corpus = inputs / "empty.jsonl"
    rc, out = cli(["index", "--corpus", str(corpus), "--out", str(tmp_path / "i")], capsys)
    assert f"{corpus}: no passages (the corpus file is empty)" in error_line(rc, out, "index")
    assert not (tmp_path / "i").exists()


# ----------------------------------------------------------------------------- retrieval server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("server") / "corpus.jsonl"
    write_corpus(path, [("p0", "Paris is the capital of France"), ("p1", "Tokyo is in Japan")])
    return path


def serve_cmd(corpus: Path, port: int | str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "llds.cli",
        "serve-retriever",
        "--corpus",
        str(corpus),
        "--port",
        str(port),
        "--no-progress",
        "--log-level",
        "warning",
    ]


def serve_once(corpus: Path, port: int | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(serve_cmd(corpus, port), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("port", "why"),
    [
        ("99999", "less than or equal to 65535"),
        ("0", "greater than or equal to 1"),
        ("-1", "greater than or equal to 1"),
    ],
)
def test_server_rejects_a_port_out_of_range(server_corpus, port, why) -> None:
    proc = serve_once(server_corpus, port)
    assert proc.returncode == 2
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output and "serving" not in output
    assert proc.stderr.strip() == (
        f"llds serve-retriever: error: command line: port: Input should be {why}, got {port}"
    )


def test_server_on_a_busy_port_says_so_before_serving(server_corpus) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = serve_once(server_corpus, port)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 2, output
        assert "Traceback" not in output and "serving" not in output
        assert proc.stderr.strip() == (
            f"llds serve-retriever: error: port {port} on 127.0.0.1 is already in use "
            "(another server?); stop it or choose another port"
        )
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the port's owner is still listening


@pytest.fixture(scope="module")
def server(server_corpus) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        serve_cmd(server_corpus, port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


MALFORMED = {
    "deep array": b"[" * 100_000,
    "deep object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "deep queries": b'{"queries": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
    "deep extra field": b'{"queries": ["paris"], "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
    "integer past the digit limit": b'{"queries": ["paris"], "topk": ' + b"7" * 5000 + b"}",
    "latin-1 bytes": b'{"queries": ["caf\xe9"]}',
    "truncated": b'{"queries": ["paris"',
    "nul": b"\x00",
}


@pytest.mark.parametrize("body", list(MALFORMED.values()), ids=list(MALFORMED))
def test_server_answers_malformed_bodies_with_4xx(server, body) -> None:
    response = httpx.post(
        f"{server}/retrieve",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"] in ("invalid_json", "invalid_field")
    ok = httpx.post(f"{server}/retrieve", json={"queries": ["capital of France"]}, timeout=10)
    assert ok.status_code == 200
    assert ok.json()["result"][0][0]["id"] == "p0"
