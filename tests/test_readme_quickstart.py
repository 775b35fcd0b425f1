"""The README is a manual that works as written: at most 250 lines, its quickstart runs in a
scratch directory exactly as printed (one bash block after the `<!-- quickstart -->` marker,
with the environment's `llds` on PATH, as the README says), every file the quickstart section
says it writes is there afterwards, the Python API snippets run after it in the same directory,
as the README says they do, and every other `llds` command line the manuals print parses."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKER = "<!-- quickstart -->"
MAX_LINES = 250
QUICKSTART_DIR = "runs/quickstart/"
MANUALS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"\b[A-Z]{3,}\b|\[")  # `llds COMMAND -h`, `--config NAME|FILE [...]`


def section(text: str, start: str) -> str:
    """From the first line that is `start` to the next `## ` heading (or the end)."""
    lines = text.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.rstrip("\n") == start)
    rest = lines[first + 1 :]
    end = next((i for i, line in enumerate(rest) if line.startswith("## ")), len(rest))
    return "".join(lines[first : first + 1 + end])


def code_blocks(text: str, lang: str) -> list[str]:
    """The bodies of the fenced blocks of `lang`, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.M | re.S)


def quickstart_script(text: str) -> str:
    """The first bash block after the marker line: the quickstart, as printed."""
    after = text[text.index("\n" + MARKER + "\n") :]
    blocks = code_blocks(after, "bash")
    if not blocks:
        raise ValueError(f"no ```bash block after {MARKER}")
    return blocks[0]


def promised_paths(text: str) -> list[str]:
    """Every `runs/quickstart/...` path that the quickstart section's prose names."""
    prose = re.sub(r"^```.*?^```$", "", section(text, "## Quickstart"), flags=re.M | re.S)
    return sorted(set(re.findall(rf"`({re.escape(QUICKSTART_DIR)}[^`\s]+)`", prose)))


def command_lines(text: str, *, inline: bool) -> list[str]:
    """The `llds ...` command lines of a manual: the lines of its bash blocks (continuations
    joined, comments dropped, `$W` as the quickstart sets it) and, with `inline`, its inline
    code that is a whole command (three words or more, no placeholder in capitals; the
    README's command list)."""
    found = []
    for block in code_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(re.sub(r"\s#.*$", "", line).split())
            line = re.sub(r"^(?:[A-Z_]+=\S+ )+", "", line)  # an environment setting
            if line.startswith("llds "):
                found.append(line.replace("$W", "runs/quickstart/world"))
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S).replace("\n", " ")
    for span in re.findall(r"`(llds [^`]+)`", prose) if inline else []:
        if len(span.split()) >= 3 and not PLACEHOLDER.search(span):
            found.append(span)
    return found


def test_readme_is_at_most_250_lines() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count("\n") <= MAX_LINES, f"README.md has {text.count(chr(10))} lines"


def test_the_parsers_find_the_marked_block_and_the_promised_paths() -> None:
    text = (
        "# t\n## Quickstart\nIt writes `runs/quickstart/a.txt` and `runs/other/b`.\n"
        "```bash\necho early\n```\n"
        f"{MARKER}\n```bash\nmkdir -p x\n# `runs/quickstart/in-code` is no promise\n```\n"
        "Then `runs/quickstart/c/`.\n## Next\n`runs/quickstart/later`\n"
    )
    assert quickstart_script(text) == "mkdir -p x\n# `runs/quickstart/in-code` is no promise\n"
    assert promised_paths(text) == ["runs/quickstart/a.txt", "runs/quickstart/c/"]
    with pytest.raises(ValueError):
        quickstart_script(f"{MARKER}\n```python\nx = 1\n```\n")


def test_command_lines_are_found_in_blocks_and_inline_code() -> None:
    text = (
        "Run `llds train --config organism steps=5`, not `llds eval` or `llds COMMAND -h`.\n"
        "```bash\nW=runs/w\nllds world --out $W   # a world\nX=1 llds sft \\\n  steps=2\n```\n"
    )
    assert command_lines(text, inline=True) == [
        "llds world --out runs/quickstart/world",
        "llds sft steps=2",
        "llds train --config organism steps=5",
    ]
    assert command_lines(text, inline=False) == command_lines(text, inline=True)[:2]


@pytest.mark.parametrize("manual", MANUALS)
def test_every_command_line_of_the_manuals_parses(manual: str, capsys) -> None:
    """Each printed `llds` command, with `--print-config`, resolves its config (keys, values,
    presets) and exits 0; no model, data or corpus is read."""
    from llds.cli import main

    failed = []
    text = (ROOT / manual).read_text(encoding="utf-8")
    for line in command_lines(text, inline=manual == "README.md"):
        argv = [a for a in shlex.split(line)[1:] if a != "--print-config"]
        try:
            rc = main([*argv, "--print-config"])
        except SystemExit as exc:  # argparse: an unknown flag or a missing value
            rc = exc.code
        if rc != 0:
            failed.append(f"{line}: {capsys.readouterr().err.strip()[-300:]}")
        capsys.readouterr()
    assert not failed, f"{manual}: command lines that do not parse:\n" + "\n".join(failed)


def test_the_readme_has_a_quickstart_that_promises_files() -> None:
    text = README.read_text(encoding="utf-8")
    script = quickstart_script(text)
    assert "llds " in script
    assert len(promised_paths(text)) >= 5


def _environment() -> dict[str, str]:
    """This interpreter's bin directory first on PATH: the README's `. .venv/bin/activate`."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The quickstart run once in a scratch directory, as one bash script that stops at the
    first command that fails (`set -x` names it in the output)."""
    scratch = tmp_path_factory.mktemp("quickstart")
    script = "set -euxo pipefail\n" + quickstart_script(README.read_text(encoding="utf-8"))
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=scratch,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return scratch, done


@pytest.mark.slow
def test_quickstart_runs_as_written(quickstart) -> None:
    scratch, done = quickstart
    output = done.stdout[-4000:] + "\n--- stderr ---\n" + done.stderr[-6000:]
    assert done.returncode == 0, f"a quickstart command failed (the last '+' line):\n{output}"
    missing = [
        p for p in promised_paths(README.read_text(encoding="utf-8")) if not (scratch / p).exists()
    ]
    assert not missing, f"the README says the quickstart writes these, but it did not: {missing}"


@pytest.mark.slow
def test_python_api_snippets_run_after_the_quickstart(quickstart) -> None:
    scratch, done = quickstart
    if done.returncode != 0:
        pytest.fail("the quickstart failed, and the snippets read its outputs")
    snippets = code_blocks(section(README.read_text(encoding="utf-8"), "## Python API"), "python")
    assert len(snippets) >= 3
    program = scratch / "readme_api.py"
    program.write_text("\n".join(snippets), encoding="utf-8")
    ran = subprocess.run(
        [sys.executable, str(program)],
        cwd=scratch,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr[-6000:]
    assert (scratch / "runs/api/grpo_llds/checkpoints/step_000005/model").is_dir()
