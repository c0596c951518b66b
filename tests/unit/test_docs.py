"""The README and docs/ stay usable: links resolve, named commands exist, the README stays short.

Pure Python (no vLLM, no torch): it reads the Markdown files and the repository tree only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
if (ROOT / "CHANGELOG.md").exists():
    PAGES.append(ROOT / "CHANGELOG.md")

README_MAX_LINES = 300
# Modules a page may run with `python -m` that are not this repository's own.
EXTERNAL_MODULES = {"pip", "pytest", "venv"}
# Words about how the files were made rather than about the product.
PROCESS_WORDS = re.compile(
    r"\bstops? [0-9]+|\bissue #?[0-9]+|\bsession\b|this session"
    r"|\b(?:commit|code of|at) [0-9a-f]{7,40}\b", re.IGNORECASE)

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
MODULE = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)")
SCRIPT = re.compile(r"(?<![\w/])\./scripts/([\w.-]+)")
FIGURES = re.compile(r"<!-- figures:begin -->(.*?)<!-- figures:end -->", re.DOTALL)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"[`*_]", "", heading.strip().lower())
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    prose = FENCE.sub("", _text(page))
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", prose, re.MULTILINE)}


def broken_links(page: Path, text: str) -> list[str]:
    """Every relative link (and image) of `text`, read as `page`, whose target is missing."""
    broken = []
    for match in LINK.finditer(FENCE.sub("", text)):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    return broken


def missing_modules(text: str) -> list[str]:
    """Every `python -m X` of `text` whose X is neither a module of this repository nor
    allowed as an outside one."""
    missing = []
    for module in sorted(set(MODULE.findall(text))):
        if module.split(".")[0] in EXTERNAL_MODULES:
            continue
        base = ROOT.joinpath(*module.split("."))
        if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
            missing.append(module)
    return missing


def missing_scripts(text: str) -> list[str]:
    """Every `./scripts/X` of `text` that is not an executable file."""
    return [name for name in sorted(set(SCRIPT.findall(text)))
            if not os.access(ROOT / "scripts" / name, os.X_OK)
            or not (ROOT / "scripts" / name).is_file()]


def process_words(text: str) -> list[str]:
    return [m.group(0) for m in PROCESS_WORDS.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page):
    assert broken_links(page, _text(page)) == []


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_named_modules_exist(page):
    assert missing_modules(_text(page)) == []


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_named_scripts_are_executable(page):
    assert missing_scripts(_text(page)) == []


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_process_words(page):
    assert process_words(_text(page)) == []


def test_readme_is_short():
    lines = _text(README).count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_readme_keeps_the_ci_command():
    """CI (`.ci/run`) runs the README's test command; the README must keep naming it."""
    text = _text(README)
    assert "./scripts/test.sh" in text and "PCD_VLLM=0.24.0 ./scripts/test.sh" in text
    assert "./scripts/test.sh" in _text(ROOT / ".ci" / "run")


def test_headline_figures_name_their_command_and_results_file():
    """The README's headline figures sit in one delimited block, and every row of its table
    names the command that measures it and the results file that command writes."""
    blocks = FIGURES.findall(_text(README))
    assert len(blocks) == 1, "README.md needs exactly one <!-- figures:begin/end --> block"
    rows = [line for line in blocks[0].splitlines()
            if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|$", line)][1:]
    assert rows, "the figures block holds no table rows"
    for row in rows:
        assert "python -m benchmarks." in row, row
        assert re.search(r"benchmarks/results/[\w.-]+\.json", row), row


# The checks above must be able to fail: each helper is tried on text that breaks its rule.

def test_the_checks_catch_what_they_guard_against(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n")
    assert broken_links(page, "[x](missing.md)") == ["missing.md"]
    assert broken_links(page, "[x](page.md#no-such-heading)") == ["page.md#no-such-heading"]
    assert broken_links(page, "[x](page.md#title) [y](https://example.com/a)") == []
    assert broken_links(page, "```\n[x](missing.md)\n```\n") == []
    assert missing_modules("python -m benchmarks.no_such_bench") == ["benchmarks.no_such_bench"]
    assert missing_modules("python -m pytest -q; python -m vllm_pcd.models path") == []
    assert missing_scripts("./scripts/no_such.sh") == ["no_such.sh"]
    assert missing_scripts("./scripts/vllm_dist_alias.py") == ["vllm_dist_alias.py"]  # not +x
    assert process_words("as of stop 41, see issue 26 (this session), at 1890126") == [
        "stop 41", "issue 26", "this session", "at 1890126"]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_generated_figures_match_their_results_files(page):
    """A table generated from a benchmark's results file (`benchmarks.figures`) is exactly
    what that file renders: rerun the benchmark and `python -m benchmarks.figures`, never
    edit the numbers by hand."""
    from benchmarks import figures

    for name, content in figures.blocks(_text(page)):
        assert name in figures.TABLES, f"{_name(page)}: no results table named {name}"
        assert content == figures.rendered(name), \
            f"{_name(page)}: the {name} figures differ from docs/results/{name}.json"
