"""A refused command line costs little before its line: the CLI, and every command's config
(read and checked before any work), import neither torch nor transformers, and a fresh `llds`
process that refuses its input spends well under the 3 s a bad input may cost (its CPU time,
which other jobs on the machine barely change); `llds eval` names a bad data file or model
before it indexes its corpus. Figures: benchmarks/cli_startup.py."""

from __future__ import annotations

import json
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers")
CPU_BOUND_S = 2.5
"""the acceptance's 3 s with margin; torch alone costs about 2 s of CPU on the 2-core machine"""

IMPORTS = """
import json, sys
from llds.cli import main
codes = [main([name, "nosuch=1"]) for name in ("train", "eval", "probe", "sft", "index")]
print(json.dumps({"codes": codes, "heavy": [m for m in %r if m in sys.modules]}))
"""


def test_no_command_config_imports_torch() -> None:
    """Each command's config is parsed and its unknown key refused without torch."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS % (HEAVY,)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["codes"] == [2, 2, 2, 2, 2]
    assert result["heavy"] == []
    assert proc.stderr.count("nosuch: unknown key") == 5


@pytest.mark.parametrize(
    ("args", "code"),
    [(["--version"], 0), (["train", "nosuch=1"], 2), (["eval", "model=m", "nosuch=1"], 2)],
)
def test_a_fresh_process_refuses_within_the_bound(args: list[str], code: int) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, "-m", "llds.cli", *args], capture_output=True, text=True, timeout=120
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == code, proc.stderr
    if code:  # one line, naming the key
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith(f"llds {args[0]}: error: command line: nosuch: unknown key")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    assert cpu < CPU_BOUND_S, f"llds {' '.join(args)} took {cpu:.2f} s of CPU"


def _eval_inputs(root: Path) -> dict[str, Path]:
    """What `llds eval` is given: a model directory complete but for a model type no
    transformers knows, a question file, one that is not JSON, and a corpus no BM25 index can
    be built from (every passage is stopwords), so that the index build, if it is reached,
    refuses with a line of its own."""
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llamma"}), encoding="utf-8")
    (model / "tokenizer.json").write_text("{}", encoding="utf-8")
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    questions = root / "test.jsonl"
    row = {"id": "q1", "question": "Who wrote Candide?", "golden_answers": ["Voltaire"]}
    questions.write_text(json.dumps(row) + "\n", encoding="utf-8")
    broken = root / "broken.jsonl"
    broken.write_text("not json\n", encoding="utf-8")
    corpus = root / "corpus.jsonl"
    rows = [{"id": "1", "contents": "the of and"}, {"id": "2", "contents": "a an the"}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return {"model": model, "data": questions, "broken": broken, "corpus": corpus}


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ("data", "model: model directory '{model}': config.json names model_type 'llamma'"),
        ("broken", "{broken} line 1: invalid JSON"),
    ],
)
def test_eval_refuses_data_and_model_before_building_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: str, named: str
) -> None:
    """A bad data file, then a bad model, is the one line, before the retriever's corpus is
    indexed (that build would refuse this corpus first), and nothing is written."""
    from llds.cli import main

    p = _eval_inputs(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    out = tmp_path / "results.json"
    args = ["eval", "--model", str(p["model"]), "--data", str(p[data])]
    rc = main([*args, "--retriever", str(p["corpus"]), "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    [line] = (captured.out + captured.err).strip().splitlines()
    assert line.startswith("llds eval: error: "), line
    assert named.format(**{k: str(v) for k, v in p.items()}) in line, line
    assert "BM25" not in line
    assert sorted(tmp_path.rglob("*")) == before  # no results, no index


TRAIN = """
import json, sys
from llds.cli import main
code = main(["train", *%r])
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}))
"""


@pytest.mark.parametrize("case", ["model-type", "data", "dead-retriever"])
def test_train_names_its_model_type_data_and_retriever_without_torch(tmp_path, case) -> None:
    """`llds train` reads its model's type, its questions and a retriever URL's first answer
    before importing torch (the trainer's imports cost seconds): each is one line, and neither
    torch nor transformers was imported when it was written."""
    given = _eval_inputs(tmp_path)
    if case != "model-type":  # a type transformers knows: the check passes, statically
        config = given["model"] / "config.json"
        config.write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    data = given["broken"] if case == "data" else given["data"]
    if case != "data":  # two questions: a step's two prompts
        with given["data"].open("a", encoding="utf-8") as f:
            row = {"id": "q2", "question": "Who wrote Emile?", "golden_answers": ["Rousseau"]}
            f.write(json.dumps(row) + "\n")
    source = "http://127.0.0.1:9" if case == "dead-retriever" else str(given["corpus"])
    args = [
        f"model.path={given['model']}",
        f"data.train={data}",
        f"retriever.source={source}",
        f"run_dir={tmp_path / 'run'}",
        "prompts_per_step=2",
        "optim.mini_batches=2",
        "eval_every=0",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN % (args, HEAVY)], capture_output=True, text=True, timeout=120
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    assert (result["code"], result["heavy"]) == (2, []), proc.stderr
    [line] = proc.stderr.strip().splitlines()
    want = {
        "model-type": "config.json names model_type 'llamma', which transformers",
        "data": f"{given['broken']} line 1: invalid JSON",
        "dead-retriever": "retriever.source: the retrieval service at http://127.0.0.1:9",
    }[case]
    assert want in line
    assert not (tmp_path / "run").exists()  # nothing written


def test_the_model_types_read_from_source_are_the_ones_transformers_imports() -> None:
    """The static reading of transformers' table (no torch) against the table imported."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from llds.models.hf import _model_types_from_source

    assert _model_types_from_source() == frozenset(CONFIG_MAPPING_NAMES)
