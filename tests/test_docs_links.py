"""The manuals' links resolve: every `](#anchor)` names a heading of the same file (GitHub's
slug rule), every relative `](path)` names a file or folder of the repository, and a
`](page.md#anchor)` a heading of that page. The manuals are the READMEs and every page under
`docs/`. The benchmark sections are renamed as runs come in ("2 of 12 runs so far"), which
silently breaks a contents list that is not checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
MANUALS = ["README.md", "benchmarks/README.md", *DOCS]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to
    hyphens (markdown emphasis and code marks are punctuation too)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated heading gets `-1`, `-2`, ... as on GitHub."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # a '#' line in a code block is no heading
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose, flags=re.M):
        slug = github_slug(heading)
        n = seen.get(slug, 0)
        out.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return out


def test_the_slug_rule_on_headings_of_these_manuals() -> None:
    assert github_slug("`similar-names`, stage 3 results: GRPO+LLDS-MA, seeds 0, 1, 2") == (
        "similar-names-stage-3-results-grpollds-ma-seeds-0-1-2"
    )
    assert github_slug("GPU step: update MFU and rollout tokens/s (`gpu_step.py`)") == (
        "gpu-step-update-mfu-and-rollout-tokenss-gpu_steppy"
    )
    assert anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def resolves(page: Path, target: str) -> bool:
    """Whether a relative link of `page` names an existing file or folder and, when it has an
    anchor, a heading of that file (or of `page` itself for a bare `#anchor`)."""
    file, _, anchor = target.partition("#")
    linked = page.parent / file if file else page
    if not linked.exists():
        return False
    if anchor and linked.suffix == ".md":
        return anchor in anchors(linked.read_text(encoding="utf-8"))
    return True


def test_a_link_to_a_missing_heading_of_another_page_is_broken(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n## Here it is\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text("# B\n", encoding="utf-8")
    assert resolves(page, "a.md#here-it-is") and resolves(page, "#b") and resolves(page, "a.md")
    assert not resolves(page, "a.md#gone")
    assert not resolves(page, "#a")
    assert not resolves(page, "c.md")


@pytest.mark.parametrize("manual", MANUALS)
def test_every_link_resolves(manual: str) -> None:
    path = ROOT / manual
    text = path.read_text(encoding="utf-8")
    broken = [
        target
        for target in LINK.findall(text)
        if not re.match(r"[a-z]+:", target)  # http(s), mailto: checked by nobody offline
        and not resolves(path, target)
    ]
    assert not broken, f"{manual}: links that resolve to nothing: {broken}"
