"""Quiet logs: by default a run prints llds's lines (one progress line per step) and libraries'
warnings, not every retrieval request nor libraries' debug lines; `logging.verbose` shows them."""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from rich.console import Console

from conftest import TRAIN_BASE, make_tiny_model, tag_happy
from llds.logs import setup_logging
from llds.train.progress import StepProgress

HTTPX_LINE = "HTTP Request: POST"  # httpx's INFO record of every request the client makes
ACCESS_LINE = '"POST /retrieve HTTP/1.1" 200'  # uvicorn's access record of each request served
BM25_LINE = "Building index from tokens"  # bm25s logs it at DEBUG on a logger it sets to DEBUG


@pytest.fixture()
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, given back with the handlers and level it had."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def emit_one_of_each() -> None:
    import bm25s  # noqa: F401  (sets its logger to DEBUG, as in a run)

    logging.getLogger("httpx").info(f'{HTTPX_LINE} http://127.0.0.1:1/retrieve "HTTP/1.1 200 OK"')
    logging.getLogger("uvicorn.access").info(f"127.0.0.1:2 - {ACCESS_LINE}")
    logging.getLogger("bm25s").debug(BM25_LINE)
    logging.getLogger("llds.train").info("resumed from step_000004 at step 4")
    logging.getLogger("llds.train").debug("an llds debug line")
    logging.getLogger("a_library").warning("a library's warning")


def test_by_default_llds_lines_and_library_warnings_only(root_logger) -> None:
    out = io.StringIO()
    setup_logging(stream=out)
    emit_one_of_each()
    assert out.getvalue().splitlines() == [
        "resumed from step_000004 at step 4",
        "a library's warning",
    ]


def test_verbose_shows_requests_and_library_debug_lines(root_logger) -> None:
    out = io.StringIO()
    setup_logging(True, stream=out)
    emit_one_of_each()
    text = out.getvalue()
    for line in (HTTPX_LINE, ACCESS_LINE, BM25_LINE, "resumed from", "a library's warning"):
        assert line in text


def test_a_second_call_replaces_its_own_handler_only(root_logger) -> None:
    other = logging.StreamHandler(io.StringIO())
    root_logger.addHandler(other)
    first, second = io.StringIO(), io.StringIO()
    setup_logging(True, stream=first)
    setup_logging(stream=second)
    logging.getLogger("httpx").info(HTTPX_LINE)
    logging.getLogger("llds").info("kept")
    assert first.getvalue() == ""
    assert second.getvalue() == "kept\n"
    assert other in root_logger.handlers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("verbose", [False, True])
def test_a_training_run_prints_requests_only_when_verbose(
    verbose, tmp_path, small_world, world_tokenizer, root_logger, capsys
) -> None:
    """One step against a retrieval service in this process (its records reach the root
    logger: no uvicorn log config of its own), by a model that searches."""
    from llds.retrieval.factory import build_retriever
    from llds.retrieval.service import create_app
    from llds.train.config import load_config
    from llds.train.trainer import GRPOTrainer

    log = io.StringIO()
    setup_logging(verbose, stream=log)
    retriever = build_retriever(small_world.corpus, show_progress=False)
    port = free_port()
    app = create_app(retriever, default_topk=2)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=True)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        cfg = load_config(
            None,
            [
                *TRAIN_BASE,
                f"run_dir={tmp_path}",
                f"retriever.source=http://127.0.0.1:{port}",
                "steps=2",
                "logging.progress=true",
                f"logging.verbose={str(verbose).lower()}",
            ],
        )
        model = tag_happy(make_tiny_model(world_tokenizer, seed=0), world_tokenizer, bias=5.0)
        rows = GRPOTrainer(
            cfg, model=model, tokenizer=world_tokenizer, train_examples=small_world.train
        ).train()
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert sum(r["rollout/valid_searches"] for r in rows) > 0  # the run did search
    text = log.getvalue()
    for line in (HTTPX_LINE, ACCESS_LINE, BM25_LINE, "Uvicorn running on"):
        assert (line in text) == verbose, line
    # one progress line per step (stdout is not a terminal here)
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in printed if line.startswith("step ")] == [
        "step 1/2",
        "step 2/2",
    ]


def test_progress_on_a_terminal_is_one_live_line() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with StepProgress(2, 0, enabled=True, console=console) as progress:
        progress.update(1, {"reward/mean": 0.25})
        progress.update(2, {"reward/mean": 0.5})
    text = out.getvalue()
    assert "step 1/2" not in text  # the bar is redrawn in place, not a line per step
    assert "2/2" in text and "reward 0.500" in text


def test_progress_off_prints_nothing(capsys) -> None:
    with StepProgress(2, 0, enabled=False) as progress:
        progress.update(1, {"reward/mean": 0.25})
    assert capsys.readouterr().out == ""
