"""Retrieval server under load: throughput and p50/p99 latency at 1, 8 and 32 concurrent clients.

Starts `llds serve-retriever` (BM25) on 127.0.0.1 over a ~10k-passage corpus (the optional
Wikipedia summaries when installed, else a generated one) and drives it with closed-loop clients:
each client sends one veRL-shaped request (`{"queries": [q], "topk": 3, "return_scores": true}`)
over a keep-alive connection, waits for the answer, and sends the next. A level stops after
`--requests` requests or `--seconds` seconds, whichever comes first. The client is a minimal
asyncio HTTP/1.1 client so that it costs the shared CPU little. Every answer is checked (status
200, one result list); anything else counts as an error. The same levels are then run against a
server with micro-batching switched off (one backend call per request) for comparison.

    python benchmarks/retriever_server_load.py [--requests 2000] [--seconds 20] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from _common import machine
from bm25_vs_rank_bm25 import load_corpus, make_queries
from llds.retrieval.corpus import write_corpus

HOST = "127.0.0.1"  # loopback only
LEVELS = (1, 8, 32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(corpus: Path, port: int, batching: bool) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "llds.cli",
        "serve-retriever",
        "--corpus",
        str(corpus),
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-progress",
    ]
    if not batching:
        cmd += ["max_batch_queries=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{HOST}:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
    writer.write(
        b"POST /retrieve HTTP/1.1\r\nHost: "
        + HOST.encode()
        + b"\r\nContent-Type: application/json\r\nAccept: application/json\r\n"
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next(
        int(h.split(":", 1)[1]) for h in lines[1:] if h.lower().startswith("content-length:")
    )
    payload = json.loads(await reader.readexactly(length))
    return status == 200 and len(payload["result"]) == 1


async def run_level(
    port: int, clients: int, queries: list[str], max_requests: int, max_seconds: float
) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    issued = 0
    deadline = 0.0

    async def client(seed: int) -> None:
        nonlocal errors, issued
        rng = random.Random(seed)
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            while issued < max_requests and time.perf_counter() < deadline:
                issued += 1
                body = json.dumps(
                    {"queries": [rng.choice(queries)], "topk": 3, "return_scores": True}
                ).encode()
                t0 = time.perf_counter()
                try:
                    ok = await _request(reader, writer, body)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    ok = False
                latencies.append(time.perf_counter() - t0)
                errors += not ok
        finally:
            writer.close()

    deadline = time.perf_counter() + 2.0  # warm-up: connections, caches
    max_warm, max_requests = max_requests, min(50 * clients, max_requests)
    await asyncio.gather(*(client(i) for i in range(clients)))
    latencies.clear()
    errors, issued, max_requests = 0, 0, max_warm
    started = time.perf_counter()
    deadline = started + max_seconds
    await asyncio.gather(*(client(1000 + i) for i in range(clients)))
    elapsed = time.perf_counter() - started
    lat = sorted(latencies)
    return {
        "requests": len(lat),
        "errors": errors,
        "rps": len(lat) / elapsed,
        "p50": 1000 * lat[len(lat) // 2],
        "p99": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


def median_runs(runs: list[dict[str, float]]) -> dict[str, float]:
    out = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99")}
    out["requests"] = sum(r["requests"] for r in runs)
    out["errors"] = sum(r["errors"] for r in runs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per level and repeat")
    parser.add_argument("--seconds", type=float, default=20.0, help="per level and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    args = parser.parse_args()

    passages, corpus_name = load_corpus()
    queries = make_queries(passages, 1000)
    table: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        write_corpus(corpus, passages)
        for label, batching in (("micro-batching on", True), ("micro-batching off", False)):
            port = free_port()
            proc = start_server(corpus, port, batching)
            try:
                for clients in args.levels:
                    runs = [
                        asyncio.run(run_level(port, clients, queries, args.requests, args.seconds))
                        for _ in range(args.repeats)
                    ]
                    table[(label, clients)] = median_runs(runs)
            finally:
                proc.terminate()
                proc.wait(timeout=30)

    print(f"Machine: {machine()}; server and load generator share it  ")
    print(f"Command: `python {' '.join(sys.argv)}`  ")
    print(
        f"Corpus: {corpus_name}, {len(passages)} passages, BM25; 1 query/request, topk 3, "
        f"return_scores true; loopback {HOST}; per level <= {args.requests} requests or "
        f"{args.seconds:g} s; median of {args.repeats} repeat(s); pid {os.getpid()}\n"
    )
    print("| server | clients | requests | errors | req/s | p50 ms | p99 ms | req/s vs off |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (label, clients), r in table.items():
        base = table[("micro-batching off", clients)]["rps"]
        print(
            f"| {label} | {clients} | {r['requests']:.0f} | {r['errors']:.0f} | "
            f"{r['rps']:,.0f} | {r['p50']:.1f} | {r['p99']:.1f} | {r['rps'] / base:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
