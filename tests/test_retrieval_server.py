"""The retrieval service as users run it: a real `llds serve-retriever` process on loopback.

No HTTP mocks: requests go through uvicorn, the client retries against a server that is killed
and restarted on the same port, and bad requests must leave the server healthy.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from llds.retrieval.bm25 import BM25Retriever
from llds.retrieval.client import HTTPRetriever, RetrievalServiceError
from llds.retrieval.corpus import make_contents, write_corpus

PASSAGES = [
    ("p0", make_contents("Mount Everest", "Mount Everest is Earth's highest mountain.")),
    ("p1", make_contents("Nile", "The Nile is a major river in northeastern Africa.")),
    ("p2", make_contents("Marie Curie", "Curie won Nobel Prizes in physics and chemistry.")),
    ("p3", make_contents("Python", "Python is a programming language created by Guido.")),
    ("p4", make_contents("Amazon", "The Amazon river flows through South America.")),
    ("p5", make_contents("Tokyo", "Tokyo is the capital of Japan and its most populous city.")),
    ("p6", make_contents("Kilimanjaro", "Kilimanjaro is the highest mountain in Africa.")),
    ("p7", make_contents("Canberra", "Canberra is the capital city of Australia.")),
]
QUESTIONS = {  # query -> the passage a person would pick
    "highest mountain on Earth": "p0",
    "who created the Python programming language": "p3",
    "capital of Japan": "p5",
    "Nobel prize chemistry physics": "p2",
    "river in South America": "p4",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(corpus: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "llds.cli",
        "serve-retriever",
        "--corpus",
        str(corpus),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--topk",
        "3",
        "--no-progress",
        "--log-level",
        "warning",
        *extra,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def wait_ready(proc: subprocess.Popen[str], port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not become ready")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_corpus(path, PASSAGES)
    return path


@pytest.fixture(scope="module")
def server(corpus: Path) -> Iterator[str]:
    port = free_port()
    proc = start_server(corpus, port, "max_queries=64", "max_query_chars=1000", "max_topk=50")
    try:
        wait_ready(proc, port)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def post(url: str, body: object | bytes, **kw: object) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{url}/retrieve",
        content=content,
        headers={"Content-Type": "application/json"},
        timeout=10,
        **kw,
    )


def test_health(server: str) -> None:
    body = httpx.get(f"{server}/health").json()
    assert body["status"] == "ok"
    assert body["documents"] == len(PASSAGES)
    assert body["method"] == "bm25"


def test_search_r1_request_with_scores_finds_the_right_passages(server: str) -> None:
    queries = list(QUESTIONS)
    response = post(server, {"queries": queries, "topk": 2, "return_scores": True})
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == len(queries)
    for query, hits in zip(queries, result, strict=True):
        assert 1 <= len(hits) <= 2
        assert hits[0]["document"]["id"] == QUESTIONS[query]
        assert set(hits[0]) == {"document", "score"}
        assert set(hits[0]["document"]) == {"id", "contents"}
        scores = [h["score"] for h in hits]
        assert all(isinstance(s, float) for s in scores)
        assert scores == sorted(scores, reverse=True)
    assert dict(PASSAGES)["p0"] == result[0][0]["document"]["contents"]


def test_return_scores_false_and_defaults_give_plain_documents(server: str) -> None:
    for body in ({"queries": ["capital"], "return_scores": False}, {"queries": ["capital"]}):
        result = post(server, body).json()["result"]
        hits = result[0]
        assert {h["id"] for h in hits} == {"p5", "p7"}
        assert all(set(h) == {"id", "contents"} for h in hits)


def test_default_topk_is_the_servers(server: str) -> None:
    hits = post(server, {"queries": ["river mountain capital Africa"]}).json()["result"][0]
    assert len(hits) == 3


def test_empty_query_list_and_empty_query_are_valid(server: str) -> None:
    assert post(server, {"queries": []}).json() == {"result": []}
    result = post(server, {"queries": ["", "Tokyo"], "topk": 1}).json()["result"]
    assert result[0] == []
    assert result[1][0]["id"] == "p5"


def test_verl_search_tool_request_and_formatting(server: str) -> None:
    """veRL's search tool posts this exact payload and formats `document.contents`."""
    payload = {
        "queries": ["capital of Japan", "highest mountain in Africa"],
        "topk": 3,
        "return_scores": True,
    }
    response = httpx.post(
        f"{server}/retrieve",
        json=payload,
        timeout=10,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    assert response.status_code == 200
    formatted = []
    for hits in response.json()["result"]:
        lines = []
        for i, hit in enumerate(hits, start=1):
            title, _, text = hit["document"]["contents"].partition("\n")
            lines.append(f"Doc {i} (Title: {title})\n{text}")
        formatted.append("\n\n".join(lines))
    assert formatted[0].startswith('Doc 1 (Title: "Tokyo")\nTokyo is the capital of Japan')
    assert formatted[1].startswith('Doc 1 (Title: "Kilimanjaro")')


BAD_REQUESTS = [
    (b"", 400),
    (b"{not json", 400),
    (b"\xff\xfe\x00", 400),
    (b"[]", 400),
    (b'"queries"', 400),
    (b"{}", 422),
    (b'{"queries": null}', 422),
    (b'{"queries": "one string"}', 422),
    (b'{"queries": [null]}', 422),
    (b'{"queries": [1, 2]}', 422),
    (b'{"queries": [["nested"]]}', 422),
    (b'{"queries": ["a"], "topk": 0}', 422),
    (b'{"queries": ["a"], "topk": -1}', 422),
    (b'{"queries": ["a"], "topk": 99999999999999999999999}', 422),
    (b'{"queries": ["a"], "topk": "3"}', 422),
    (b'{"queries": ["a"], "topk": 1.5}', 422),
    (b'{"queries": ["a"], "return_scores": "true"}', 422),
    (json.dumps({"queries": ["x" * 1001]}).encode(), 413),
    (json.dumps({"queries": ["q"] * 65}).encode(), 413),
    (b'{"queries": ["' + b"a" * (5 * 1024 * 1024) + b'"]}', 413),
]


@pytest.mark.parametrize(
    ("body", "status"), BAD_REQUESTS, ids=[f"{i}-{s}" for i, (_, s) in enumerate(BAD_REQUESTS)]
)
def test_bad_requests_get_4xx_json_and_server_stays_up(
    server: str, body: bytes, status: int
) -> None:
    response = post(server, body)
    assert response.status_code == status
    error = response.json()
    assert set(error) >= {"error", "detail"}
    health = httpx.get(f"{server}/health", timeout=5)
    assert health.json()["status"] == "ok"


def test_wrong_method_and_path_are_json_4xx(server: str) -> None:
    assert httpx.get(f"{server}/retrieve").status_code == 405
    missing = httpx.post(f"{server}/nowhere", json={})
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"


def test_concurrent_requests_each_get_their_own_answer(server: str) -> None:
    queries = list(QUESTIONS) * 6

    def one(query: str) -> str:
        hits = post(server, {"queries": [query], "topk": 1}).json()["result"][0]
        return hits[0]["id"]

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(one, queries))
    assert answers == [QUESTIONS[q] for q in queries]


def test_http_client_matches_in_process_backend_and_batches(server: str) -> None:
    local = BM25Retriever.build(PASSAGES, show_progress=False)
    queries = [*QUESTIONS, "", "nothing matches zzzz"]
    before = httpx.get(f"{server}/health").json()["served"]["requests"]
    with HTTPRetriever(server, batch_size=2, retries=0) as client:
        remote = client.search(queries, 3)
    after = httpx.get(f"{server}/health").json()["served"]["requests"]
    assert after - before == 4  # 7 queries in requests of at most 2
    assert remote == local.search(queries, 3)


def test_http_client_does_not_retry_a_4xx_and_shows_the_reason(server: str) -> None:
    with HTTPRetriever(server, retries=3, backoff=0.01) as client:
        with pytest.raises(RetrievalServiceError) as err:
            client.search(["a"], 51)
        assert client.retry_count == 0
    assert err.value.status == 422
    assert "topk" in str(err.value)


def test_http_client_gives_up_on_a_dead_address() -> None:
    with HTTPRetriever(f"http://127.0.0.1:{free_port()}", retries=2, backoff=0.01) as client:
        with pytest.raises(RetrievalServiceError, match="3 attempts"):
            client.search(["a"], 1)
        assert client.retry_count == 2


def test_client_rides_out_a_server_restart_then_sigterm_drains(corpus: Path) -> None:
    port = free_port()
    first = start_server(corpus, port)
    second: list[subprocess.Popen[str]] = []
    try:
        wait_ready(first, port)
        client = HTTPRetriever(  # a time, not a count: a loaded machine restarts slowly
            f"http://127.0.0.1:{port}/retrieve",
            backoff=0.1,
            max_backoff=2.0,
            timeout=10,
            retry_seconds=90,
        )
        assert client.search(["capital of Japan"], 1)[0][0].id == "p5"
        first.kill()
        first.wait(timeout=10)

        def restart() -> None:
            time.sleep(0.3)
            second.append(start_server(corpus, port))

        thread = threading.Thread(target=restart)
        thread.start()
        hits = client.search(["highest mountain on Earth"], 1)  # retries until the new server is up
        thread.join()
        assert hits[0][0].id == "p0"
        assert client.retry_count >= 1
        client.close()

        proc = second[0]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        # uvicorn re-raises the signal once it has drained, so the exit status may show it
        assert proc.returncode in (0, -signal.SIGTERM)
        assert "retrieval service stopped after" in out
    finally:
        stop(first)
        for proc in second:
            stop(proc)
