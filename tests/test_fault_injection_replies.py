"""Fault injection, part four (retriever replies): a service that answers with a 200 outside the
Search-R1 schema (no `result` list, a hit without `contents`, a score that is not a number), or
that refuses the run's top-k, is found by the start-up check (a first real search at the run's
top-k) before any model loads: one line naming the key, the URL and the part of the reply that
is wrong, exit code 2. Through the real command line, in process; the services listen on
loopback only."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llds.retrieval.protocol import ReplyError, decode_hits
from test_fault_injection_bad_inputs import no_model_load  # noqa: F401 (a fixture)
from test_fault_injection_inputs import (
    assert_untouched,
    cli,
    error_line,
    inputs,  # noqa: F401 (a fixture)
    previous_run,  # noqa: F401 (a fixture)
    train,
)
from test_retrieval_server import free_port, start_server, stop, wait_ready


@contextmanager
def answering(body: object) -> Iterator[str]:
    """A service on loopback that answers every POST with HTTP 200 and `body` as JSON (what a
    server of another project that misreads the schema does); yields its /retrieve URL."""
    data = json.dumps(body).encode()

    class Reply(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Reply)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    finally:
        server.shutdown()
        server.server_close()


HIT = {"id": "1", "contents": '"Paris"\nthe capital'}
BAD_REPLIES = {
    "no result list": (
        {"results": [[HIT]]},
        "the reply has no 'result' list (got keys ['results'])",
    ),
    "result not a list of lists": ({"result": [HIT]}, "result[0] is not a list of hits (got dict)"),
    "hit without contents": (
        {"result": [[{"document": {"id": "1"}, "score": 1.0}]]},
        "result[0][0] has no 'contents' text",
    ),
    "score not a number": (
        {"result": [[{"document": HIT, "score": "high"}]]},
        "result[0][0].score is not a number (got 'high')",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REPLIES))
def test_decode_hits_names_the_wrong_part(case):
    body, why = BAD_REPLIES[case]
    with pytest.raises(ReplyError) as err:
        decode_hits(body)
    assert str(err.value).startswith(why)


@pytest.mark.parametrize("case", list(BAD_REPLIES))
def test_eval_at_a_service_that_answers_outside_the_schema(inputs, capsys, no_model_load, case):  # noqa: F811
    body, why = BAD_REPLIES[case]
    data = inputs / "world" / "test.jsonl"
    with answering(body) as url:
        args = ["eval", "--model", str(inputs / "model"), "--data", str(data), "--retriever", url]
        rc, out = cli(args, capsys)
    line = error_line(rc, out, "eval")
    assert f"retriever: the retrieval service at {url} fails a first search at top-k 3: " in line
    assert f"the reply does not follow the Search-R1 schema: {why}" in line


def test_train_at_a_service_that_answers_outside_the_schema(
    inputs,  # noqa: F811
    previous_run,  # noqa: F811
    capsys,
    no_model_load,  # noqa: F811
):
    body, why = BAD_REPLIES["score not a number"]
    with answering(body) as url:
        rc, out = cli(train(inputs, previous_run, f"retriever.source={url}"), capsys)
    line = error_line(rc, out, "train")
    assert f"retriever.source: the retrieval service at {url} fails a first search" in line
    assert why in line
    assert_untouched(previous_run)


def test_a_top_k_above_the_services_limit_is_found_at_start(
    inputs,  # noqa: F811
    previous_run,  # noqa: F811
    capsys,
    no_model_load,  # noqa: F811
):
    """The service's limit is 100 per request; a run at top-k 500 once passed the start-up
    check (made at top-k 1) and failed after its model had loaded."""
    port = free_port()
    proc = start_server(inputs / "world" / "corpus.jsonl", port)
    try:
        wait_ready(proc, port)
        url = f"http://127.0.0.1:{port}/retrieve"
        args = train(inputs, previous_run, f"retriever.source={url}", "retriever.topk=500")
        rc, out = cli(args, capsys)
    finally:
        stop(proc)
    line = error_line(rc, out, "train")
    assert (
        f"retriever.source: the retrieval service at {url} fails a first search at top-k 500"
        in line
    )
    assert "field 'topk': must be between 1 and 100, got 500" in line
    assert_untouched(previous_run)
