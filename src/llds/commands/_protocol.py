"""The protocol flags `llds eval` and `llds probe` share: defaults come from the model directory's
saved protocol (`llds_protocol.json`), and every flag given overrides its value."""

from __future__ import annotations

import argparse
import dataclasses

from llds.env.protocol import PROTOCOL_FILE, Protocol


def add_protocol_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "protocol",
        f"default: the model directory's {PROTOCOL_FILE} (written by llds sft / llds train), "
        "else the values shown",
    )
    d = Protocol()
    g.add_argument("--template", help="prompt template file containing {question}")
    g.add_argument("--chat", choices=["auto", "yes", "no"], help="apply the chat template")
    g.add_argument("--topk", type=int, help=f"passages per search ({d.topk})")
    g.add_argument("--max-turns", type=int, help=f"turns per rollout ({d.max_turns})")
    g.add_argument("--max-turn-tokens", type=int, help=f"tokens per turn ({d.max_turn_tokens})")
    g.add_argument(
        "--max-obs-tokens", type=int, help=f"tokens per observation ({d.max_obs_tokens})"
    )
    g.add_argument(
        "--max-total-tokens", type=int, help=f"tokens per rollout ({d.max_total_tokens})"
    )


def resolve_protocol(args: argparse.Namespace) -> Protocol:
    """The saved protocol (or the defaults) with the given flags applied; says which it used."""
    from pathlib import Path

    from llds.env.prompts import PromptTemplate

    saved = Protocol.read(args.model) if Path(args.model).expanduser().is_dir() else None
    base = saved or Protocol()
    proto = base.merged(
        prompt_template=PromptTemplate.from_file(args.template).text if args.template else None,
        topk=args.topk,
        max_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
        max_obs_tokens=args.max_obs_tokens,
        max_total_tokens=args.max_total_tokens,
    )
    if args.chat is not None:  # "auto" is a value too: it means None (decide from the tokenizer)
        chat = {"auto": None, "yes": True, "no": False}[args.chat]
        proto = dataclasses.replace(proto, chat=chat)
    source = f"{args.model}/{PROTOCOL_FILE}" if saved else "defaults (no saved protocol)"
    print(f"protocol from {source}, flags applied: {proto}")
    return proto
