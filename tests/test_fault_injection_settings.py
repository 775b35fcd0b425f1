"""Fault injection, part four (silent and unclear settings): inputs that once ran on without a
word, or were named in a misleading way. Answers stored as JSON text or as floats, a sampling
temperature of 0 for GRPO, more threads than cores, a 12 MB passage, a second `--config`,
a NaN reward, out-of-range arguments of the loss functions, a URL without its scheme, a
read-only output, YAML 1.1's base-60 numbers, a run's log given for its folder, SIGTERM, and
a finished run's closing line. Through the real command line or the Python API."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import mounted_tmpfs
from llds.algo import group_advantages, kl_penalty, llds_loss, masked_mean, policy_loss
from llds.cli import main
from llds.data.loaders import load_examples
from llds.errors import ConfigError, DataFormatError
from test_fault_injection_bad_inputs import no_model_load  # noqa: F401 (a fixture)
from test_fault_injection_inputs import (
    assert_untouched,
    cli,
    error_line,
    inputs,  # noqa: F401 (a fixture)
    previous_run,  # noqa: F401 (a fixture)
    train,
)

# ------------------------------------------------------------------------------------ answers


def _parquet(path: Path, answers: list[object]) -> Path:
    rows = [{"question": f"q{i}", "golden_answers": a} for i, a in enumerate(answers)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_answers_stored_as_json_text_are_read_as_lists(tmp_path):
    """A parquet written after a CSV round trip: each list is the text `'["Vutok"]'`."""
    data = _parquet(tmp_path / "qa.parquet", ['["Vutok"]', '["Paris", "Paree"]', "Rome"])
    assert [ex.answers for ex in load_examples(data)] == [
        ("Vutok",),
        ("Paris", "Paree"),
        ("Rome",),
    ]


def test_answers_that_look_like_json_but_are_not_are_refused_by_name(tmp_path):
    data = _parquet(tmp_path / "qa.parquet", ['["Vutok", ]'])
    with pytest.raises(DataFormatError) as err:
        load_examples(data)
    assert str(err.value).startswith(
        f"{data} row 0.golden_answers: '[\"Vutok\", ]' looks like a JSON list but is not valid JSON"
    )


def test_answers_stored_as_floats_read_as_written(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text(
        '{"question": "When?", "golden_answers": [1990.0, 2.5]}\n'
        '{"question": "How many?", "golden_answers": 12.0}\n',
        encoding="utf-8",
    )
    assert [ex.answers for ex in load_examples(data)] == [("1990", "2.5"), ("12",)]


CHAT_TEXT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWho rules Vutok?<|im_end|>"
)


def test_a_prompt_without_its_question_marker_is_refused_by_name(
    inputs,  # noqa: F811
    previous_run,  # noqa: F811
    tmp_path,
    capsys,
    no_model_load,  # noqa: F811
):
    """A Search-R1 prompt saved chat-templated, without "Question:": the whole text, template
    and all, once became the question."""
    data = tmp_path / "chat.parquet"
    rows = [{"prompt": [{"role": "user", "content": CHAT_TEXT}], "golden_answers": ["Ana"]}] * 2
    pq.write_table(pa.Table.from_pylist(rows), data)
    rc, out = cli(train(inputs, previous_run, f"data.train={data}"), capsys)
    line = error_line(rc, out, "train")
    assert f"{data} row 0.prompt: no 'Question:' in a prompt of 4 lines" in line
    assert "give each row a 'question' field" in line
    assert_untouched(previous_run)
    # one line without the marker is the question itself; with it, the text after it
    bare = tmp_path / "bare.parquet"
    prompts = ["Who rules Vutok?", "Answer briefly.\nQuestion: Who rules Pafon?"]
    pq.write_table(
        pa.Table.from_pylist([{"prompt": p, "golden_answers": ["Ana"]} for p in prompts]), bare
    )
    assert [ex.question for ex in load_examples(bare)] == ["Who rules Vutok?", "Who rules Pafon?"]


# ------------------------------------------------------------------------- training settings


def test_temperature_zero_is_refused_for_grpo(inputs, previous_run, capsys, no_model_load):  # noqa: F811
    rc, out = cli(train(inputs, previous_run, "rollout.temperature=0"), capsys)
    line = error_line(rc, out, "train")
    assert "rollout.temperature: 0 is greedy decoding: every rollout of a question is" in line
    assert_untouched(previous_run)


def test_threads_above_the_cores_are_warned(inputs, tmp_path, capsys, no_model_load):  # noqa: F811
    cores = len(os.sched_getaffinity(0))
    missing = tmp_path / "missing.jsonl"  # the run then stops at once, after the warning
    args = train(inputs, tmp_path / "run", f"threads={cores + 1}", f"data.train={missing}")
    rc, out = cli(args, capsys)
    error_line(rc, out, "train")
    warned = [line for line in out.splitlines() if line.startswith("llds train: warning: ")]
    assert warned == [
        f"llds train: warning: threads={cores + 1} is more than the {cores} CPU core(s) this "
        f"process may use; threads past the cores make each step slower, not faster "
        f"(threads={cores} or fewer)"
    ]
    rc, out = cli(
        train(inputs, tmp_path / "run", f"threads={cores}", f"data.train={missing}"), capsys
    )
    assert "warning" not in out


def test_a_huge_passage_is_cut_before_it_is_tokenized(world_tokenizer):
    """One 12.8 MB passage once cost 68 s a search: the whole hit was tokenized, then cut."""
    from llds.env.observation import truncate_to_tokens

    text = "the capital of the empire is vutok and its river is wide " * 220_000
    assert len(text) > 12_000_000
    start = time.perf_counter()
    cut = truncate_to_tokens(text, world_tokenizer, 40)
    took = time.perf_counter() - start
    assert took < 1.0, took
    assert cut == truncate_to_tokens(text[:5_000], world_tokenizer, 40)  # the same longest prefix
    assert text.startswith(cut) and len(world_tokenizer.encode(cut, add_special_tokens=False)) <= 40


CHINESE = [
    "北京是中华人民共和国的首都，也是全国的政治和文化中心。",
    "长江是中国最长的河流，流经十一个省份。",
]


def _index(tmp_path: Path, name: str, texts: list[str], capsys, caplog) -> tuple[Path, list[str]]:
    """`llds index` of a corpus of `texts`: the index and the warnings it logged."""
    import json

    corpus = tmp_path / f"{name}.jsonl"
    rows = [{"id": str(i), "contents": f'"{i}"\n{t}'} for i, t in enumerate(texts)]
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    caplog.clear()
    with caplog.at_level("WARNING", logger="llds.retrieval.bm25"):
        rc, out = cli(["index", f"corpus={corpus}", "--out", str(tmp_path / name)], capsys)
    assert rc == 0, out
    return tmp_path / name, [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_a_corpus_the_analyzer_does_not_split_is_named_at_index_time(tmp_path, capsys, caplog):
    """A Chinese corpus, not segmented: each phrase is one "word" to the English analyzer, so a
    search for a word finds nothing (once without a warning)."""
    from llds.retrieval.bm25 import BM25Retriever

    index, warned = _index(tmp_path, "zh", CHINESE, capsys, caplog)
    assert warned == [
        f"{tmp_path / 'zh.jsonl'}: 2 of 2 passages looked at are mostly text without spaces "
        "between its words (Chinese, Japanese, Thai, ...); the BM25 analyzer is English (it "
        "splits at spaces and punctuation), so it keeps each phrase as one word and searches "
        "will find next to nothing: put spaces between the words first (a word segmenter), or "
        "build a dense index (method=dense)"
    ]
    assert BM25Retriever.load(index).search(["北京"], 2) == [[]]  # what the warning says
    # the same text with spaces between its words: no warning, and the word is found
    segmented = [
        "北京 是 中华人民共和国 的 首都 ， 也 是 全国 的 政治 和 文化 中心 。",
        "长江 是 中国 最长 的 河流",
    ]
    index, warned = _index(tmp_path, "zh_words", segmented, capsys, caplog)
    assert warned == []
    assert [h.id for h in BM25Retriever.load(index).search(["北京"], 2)[0]] == ["0"]
    assert (
        _index(tmp_path, "en", ["Paris is the capital of France (巴黎)."], capsys, caplog)[1] == []
    )


def test_a_second_config_is_refused_by_name(tmp_path, capsys):
    out_dir = tmp_path / "w"
    args = ["world", "--config", "world-organism", "--config", "world-hard", "--out", str(out_dir)]
    rc, out = cli(args, capsys)
    line = error_line(rc, out, "world")
    assert "--config given 2 times (world-organism, world-hard); give one" in line
    assert not out_dir.exists()


def test_a_base_60_number_is_named(tmp_path, capsys):
    """`hop_mix={3:1}`: without a space after the colon YAML 1.1 reads 3:1 as 181."""
    rc, out = cli(["world", "hop_mix={3:1}", "--out", str(tmp_path / "w")], capsys)
    line = error_line(rc, out, "world")
    assert "hop_mix: '3:1' is what YAML 1.1 reads as the base-60 number 181" in line
    assert "({3: 1})" in line and "hop_mix[181]" not in line
    rc, out = cli(["world", "hop_mix={3: 1}", "--print-config"], capsys)
    assert rc == 0 and "hop_mix:\n  '3': 1.0" in out


# ------------------------------------------------------------------------------ the Python API


def test_a_nan_reward_is_an_error_naming_its_row():
    rewards = torch.tensor([1.0, 0.0, float("nan"), 1.0])
    with pytest.raises(ValueError, match=r"rewards: 1 of 4 are not finite \(row 2: nan\)"):
        group_advantages(rewards, [0, 0, 1, 1])
    assert group_advantages(torch.tensor([1.0, 0.0]), [0, 0]).tolist() == pytest.approx(
        [0.7071, -0.7071], abs=1e-4
    )


@pytest.mark.parametrize(
    ("call", "named"),
    [
        ("policy_loss", "policy_loss: clip_low: Input should be greater than 0, got -0.2"),
        ("llds_loss", "llds_loss: coef: Input should be greater than or equal to 0, got -1.0"),
    ],
)
def test_the_loss_functions_take_the_command_lines_bounds(call, named):
    lp, mask, adv = torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([1.0, -1.0])
    kwargs = {"clip_low": -0.2} if call == "policy_loss" else {"coef": -1.0}
    fn = policy_loss if call == "policy_loss" else llds_loss
    with pytest.raises(ConfigError) as err:
        fn(lp, lp, adv, mask, **kwargs)
    assert str(err.value).startswith(named)
    fn(lp, lp, adv, mask)  # the defaults pass


LP, MASK, ADV = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), torch.tensor([1.0, -1.0])
NOT_TENSORS = {
    "group_advantages": (
        lambda: group_advantages([1.0, 0.0], [0, 0]),
        "group_advantages: rewards must be a torch.Tensor, got list",
    ),
    "policy_loss": (
        lambda: policy_loss(LP, LP, [1.0, -1.0], MASK),
        "policy_loss: advantages must be a torch.Tensor, got list",
    ),
    "llds_loss": (
        lambda: llds_loss(LP.tolist(), LP, ADV, MASK),
        "llds_loss: log_probs must be a torch.Tensor, got list",
    ),
    "kl_penalty": (
        lambda: kl_penalty(LP, None),
        "kl_penalty: ref_log_probs must be a torch.Tensor, got NoneType",
    ),
    "masked_mean": (
        lambda: masked_mean(LP, MASK.tolist()),
        "masked_mean: mask must be a torch.Tensor, got list",
    ),
}


@pytest.mark.parametrize("case", list(NOT_TENSORS))
def test_a_list_where_a_tensor_belongs_is_named(case):
    """A list (or None) once ended in an AttributeError from deep inside the math."""
    call, named = NOT_TENSORS[case]
    with pytest.raises(TypeError) as err:
        call()
    assert str(err.value).startswith(named)


def test_a_search_batch_with_none_is_named(world_retriever):
    """In-process and over HTTP alike, before any search or request (the client's port is
    closed: a request would be a connection error)."""
    from llds.retrieval.client import HTTPRetriever
    from test_retrieval_server import free_port

    with pytest.raises(TypeError, match=r"^search: queries\[1\] must be a string, got NoneType"):
        world_retriever.search(["capital", None], 2)
    client = HTTPRetriever(f"http://127.0.0.1:{free_port()}", retries=0)
    with client, pytest.raises(TypeError, match=r"^search: queries\[0\] must be a string, got int"):
        client.search([7], 2)
    with pytest.raises(TypeError, match="not a single string"):
        world_retriever.search("capital", 2)
    assert len(world_retriever.search(["capital"], 2)) == 1  # a good batch still searches


# ------------------------------------------------------------------------------- paths and URLs


def test_a_url_without_its_scheme_gets_a_hint(inputs, previous_run, capsys, no_model_load):  # noqa: F811
    rc, out = cli(train(inputs, previous_run, "retriever.source=localhost:8000/retrieve"), capsys)
    line = error_line(rc, out, "train")
    assert "retriever.source: localhost:8000/retrieve is not a file or folder" in line
    assert "(a URL? write it with its scheme: http://localhost:8000/retrieve)" in line
    assert_untouched(previous_run)
    data = inputs / "world" / "test.jsonl"
    args = ["eval", "--model", str(inputs / "model"), "--data", str(data)]
    rc, out = cli([*args, "--retriever", "127.0.0.1:8000"], capsys)
    assert "(a URL? write it with its scheme: http://127.0.0.1:8000)" in error_line(rc, out, "eval")


def test_a_read_only_output_is_not_advised_to_free_space(tmp_path, capsys):
    mount = tmp_path / "ro"
    with mounted_tmpfs(mount, 1 << 20):
        run = mount / "run"
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n', encoding="utf-8")
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        rc, out = cli(["report", str(run)], capsys)
        line = error_line(rc, out, "report")
        assert "Read-only file system" in line
        assert "make it writable" in line and "free space" not in line


def test_a_runs_log_is_taken_for_its_folder(inputs, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    run.mkdir()
    rows = "".join(f'{{"step": {s}, "reward/mean": {s / 10}}}\n' for s in (1, 2, 3))
    (run / "metrics.jsonl").write_text(rows, encoding="utf-8")
    rc, out = cli(["report", str(run / "metrics.jsonl")], capsys)
    assert rc == 0, out
    assert f"report written to {run / 'report' / 'report.html'}" in out


# --------------------------------------------------------------------------- signals and lines


def test_sigterm_stops_like_ctrl_c_with_one_line_and_resumes(inputs, tmp_path, capsys):  # noqa: F811
    """Slurm's preemption, `docker stop`: one line, exit code 143, and the same command
    resumes to the end."""
    from llds.runs.tracking import read_metrics

    run = tmp_path / "run"
    args = ["train", "--config", str(inputs / "cfg.yaml"), f"run_dir={run}", "steps=4"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llds.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline and not (run / "checkpoints" / "latest").is_file():
        assert proc.poll() is None, proc.communicate()[1]  # still training
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "terminated (SIGTERM)"
    assert len(read_metrics(run)) < 4  # it really was stopped
    assert main(args) == 0
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    capsys.readouterr()


def test_the_closing_line_names_only_what_was_written(inputs, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    rc, out = cli(train(inputs, run, "steps=1", "save_every=1"), capsys)
    assert rc == 0, out
    assert f"run written to {run} (metrics.jsonl, checkpoints/)" in out
    assert not (run / "tensorboard").exists()
