"""Question-answer data: the example type, loaders for common formats, the synthetic world."""

from llds.data.example import QAExample
from llds.data.loaders import (
    available_trivia_lists,
    load_examples,
    load_flashrag_json,
    load_flashrag_jsonl,
    load_many,
    load_search_r1_parquet,
    load_trivia_lists,
)
from llds.data.world import World, WorldConfig, generate_world, write_world

__all__ = [
    "QAExample",
    "World",
    "WorldConfig",
    "available_trivia_lists",
    "generate_world",
    "load_examples",
    "load_flashrag_json",
    "load_flashrag_jsonl",
    "load_many",
    "load_search_r1_parquet",
    "load_trivia_lists",
    "write_world",
]
