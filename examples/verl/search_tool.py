"""veRL function tool: Search-R1-style retrieval through an `llds serve-retriever` server.

Loaded by veRL's agent loop via
`actor_rollout_ref.rollout.multi_turn.function_tool_path=examples/verl/search_tool.py`.
The server speaks the Search-R1 retrieval API (`POST /retrieve`); hits are formatted the way
Search-R1 clients format them: `Doc i(Title: <title>) <text>`.
"""

from __future__ import annotations

import os

import httpx
from verl.tools.function_tool import function_tool

RETRIEVER_URL = os.environ.get("LLDS_RETRIEVER_URL", "http://127.0.0.1:8000/retrieve")
TOPK = int(os.environ.get("LLDS_RETRIEVER_TOPK", "3"))
TIMEOUT_S = float(os.environ.get("LLDS_RETRIEVER_TIMEOUT", "30"))


def _format(hits: list[dict]) -> str:
    lines = []
    for i, hit in enumerate(hits, start=1):
        doc = hit.get("document", hit)
        title, _, text = str(doc.get("contents", "")).partition("\n")
        title = title.strip().strip('"')
        lines.append(f"Doc {i}(Title: {title}) {text.strip()}")
    return "\n".join(lines)


@function_tool("search")
def search(query_list: list[str]) -> str:
    """Search a Wikipedia passage index and return the top passages for each query.

    Args:
        query_list: One or more search queries.
    """
    response = httpx.post(
        RETRIEVER_URL,
        json={"queries": list(query_list), "topk": TOPK, "return_scores": True},
        timeout=TIMEOUT_S,
    )
    response.raise_for_status()
    results = response.json()["result"]
    return "\n\n".join(_format(hits) for hits in results)
