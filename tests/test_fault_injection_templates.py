"""Fault injection, part four (templates, chat settings, probe sets): a prompt template without
{question}, `chat=true` for a tokenizer that has no chat template, and a missing
`questions_from` probe file were named only once the model had loaded. Each is now one line
naming the key, exit code 2, before any model loads: in a fresh process that has imported
neither torch nor transformers when it writes the line, and nothing written before changes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llds.errors import UserInputError
from llds.models.hf import check_chat
from test_fault_injection_inputs import (
    assert_untouched,
    inputs,  # noqa: F401 (a fixture)
    previous_run,  # noqa: F401 (a fixture)
)

HEAVY = ("torch", "transformers")
RUN = """
import json, sys
from llds.cli import main
code = main(%r)
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}))
"""


def refused(args: list[str], command: str) -> str:
    """`llds ARGS` in a fresh process: its one error line, checked for exit code 2 and for
    neither torch nor transformers imported by then."""
    proc = subprocess.run(
        [sys.executable, "-c", RUN % (args, HEAVY)], capture_output=True, text=True, timeout=120
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    assert (result["code"], result["heavy"]) == (2, []), proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"llds {command}: error: "), line
    return line


def train(inputs: Path, run: Path, *overrides: str) -> list[str]:  # noqa: F811
    return ["train", "--config", str(inputs / "cfg.yaml"), f"run_dir={run}", *overrides]


def on_data(command: str, inputs: Path, *more: str) -> list[str]:  # noqa: F811
    world = inputs / "world"
    data, corpus = world / "test.jsonl", world / "corpus.jsonl"
    args = [command, "--model", str(inputs / "model"), "--data", str(data)]
    return [*args, "--retriever", str(corpus), *more]


NO_CHAT = "has no chat template (no chat_template in its tokenizer_config.json, no chat_template"


# ---------------------------------------------------------------------------- prompt templates


def test_a_template_without_its_question_field(inputs, previous_run, tmp_path):  # noqa: F811
    line = refused(train(inputs, previous_run, "data.prompt_template=Q: no field"), "train")
    assert "data.prompt_template: 'Q: no field' is neither a file nor a template with" in line
    template = tmp_path / "prompt.txt"
    template.write_text("Answer the question below.\n", encoding="utf-8")
    line = refused(train(inputs, previous_run, f"data.prompt_template={template}"), "train")
    assert f"data.prompt_template: prompt template file {template} does not contain" in line
    assert_untouched(previous_run)


# ------------------------------------------------------------------------------- chat settings


def test_chat_for_a_tokenizer_without_a_chat_template(inputs, previous_run, tmp_path):  # noqa: F811
    model = inputs / "model"
    line = refused(train(inputs, previous_run, "model.chat=true"), "train")
    assert f"model.chat: true, but the tokenizer of '{model}' {NO_CHAT}" in line
    assert "set model.chat=false" in line
    assert_untouched(previous_run)
    line = refused(on_data("eval", inputs, "protocol.chat=true"), "eval")
    assert f"protocol.chat: true, but the tokenizer of '{model}' {NO_CHAT}" in line
    out = tmp_path / "probe"
    line = refused(on_data("probe", inputs, "protocol.chat=true", "--out", str(out)), "probe")
    assert f"protocol.chat: true, but the tokenizer of '{model}' {NO_CHAT}" in line
    world, out = inputs / "world", tmp_path / "sft"
    sft = ["sft", "--config", "sft-demo", f"world={world}", "--out", str(out), "chat=true"]
    line = refused([*sft, "tiny=false", f"model={model}"], "sft")
    assert f"chat: true, but the tokenizer of '{model}' {NO_CHAT}" in line
    assert "chat: true, but tiny=true's tokenizer has no chat template" in refused(sft, "sft")
    assert not (tmp_path / "probe").exists() and not (tmp_path / "sft").exists()


def test_a_chat_template_file_is_found_as_transformers_finds_it(inputs, tmp_path):  # noqa: F811
    """The files the check reads are the ones the tokenizer loads its template from."""
    from transformers import AutoTokenizer

    model = tmp_path / "model"
    shutil.copytree(inputs / "model", model)
    with pytest.raises(UserInputError, match="has no chat template"):
        check_chat("model.chat", str(model), True)
    assert not AutoTokenizer.from_pretrained(model).chat_template
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}", encoding="utf-8"
    )
    check_chat("model.chat", str(model), True)  # passes
    assert AutoTokenizer.from_pretrained(model).chat_template
    check_chat("model.chat", "Qwen/Qwen2.5-0.5B-Instruct", True)  # a hub id: left to its loader


# -------------------------------------------------------------------------------- probe sets


def test_a_missing_questions_from_file(inputs, tmp_path):  # noqa: F811
    missing, out = tmp_path / "earlier" / "probe.json", tmp_path / "probe"
    args = on_data("probe", inputs, f"questions_from={missing}", "--out", str(out))
    line = refused(args, "probe")
    assert f"questions_from: {missing}: not a readable probe.json" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no out folder
