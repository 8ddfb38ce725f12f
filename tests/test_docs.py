"""The manual: the site builds with ``mkdocs build --strict``, and every block a user copies works.

A small collector, not a library: the blocks need the project's own checks (a YAML block is a
spec, read by the spec loader; a shell line names a ``search`` command whose ``--help`` must
list its options; a ``make`` target must exist), which pytest-examples (Python only), sybil and
mktestdocs (Python and shell bodies run as they are) do not make. A block is checked by its
language:

- ``python``: run in a fresh interpreter in a temporary folder; a block whose first line is a
  comment naming a file (``# mypkg/train.py``) is written there first, so the YAML blocks of
  the same page can name it as their trainable;
- ``yaml``: parsed by the spec loader; a fragment (no ``study`` or ``trainable``) is laid over
  a minimal spec first;
- ``bash``: each ``python -m search CMD``/``search CMD`` line names one of the commands and
  only options its ``--help`` lists, each ``make TARGET`` a target of the Makefile, each
  ``python PATH.py`` a file of the repository.

``<!-- docs-test: not run: WHY -->`` on the line before a Python block that cannot run here
(it needs an exported bundle, a GPU cluster) has it compiled only.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from search.cli import app
from search.specs.schema import parse_spec

pytestmark = pytest.mark.slow  # over 5 s here (the site build, a process per block)

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [REPO / "README.md", REPO / "benchmarks" / "RESULTS.md", *(REPO / "docs").glob("*.md")]
)
NOT_RUN = re.compile(r"<!--\s*docs-test:\s*not run:\s*(.+?)\s*-->")
FENCE = re.compile(r"^```([\w-]*)\s*$")
# Every command of the CLI, as typer registered them (a new command needs its README line).
COMMANDS = tuple(c.name or getattr(c.callback, "__name__", "") for c in app.registered_commands)
BASE_SPEC: dict[str, Any] = {
    "study": "docs-example",
    "trainable": "torch_cnn",
    "objective": {"metric": "val_accuracy", "mode": "max"},
}
"""What a YAML fragment (a ``resources:`` block, an ``objective:`` list) is laid over."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None  # why a Python block is compiled only

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def file_name(self) -> str | None:
        """``mypkg/train.py`` when the block's first line is ``# mypkg/train.py``."""
        first = self.text.split("\n", 1)[0]
        found = re.fullmatch(r"#\s*([\w/]+\.py)\s*", first)
        return found.group(1) if found else None


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    lines = page.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = NOT_RUN.search(lines[i - 1]) if i else None
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, opening.group(1), text, before and before.group(1)))
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def of(lang: str) -> list[Any]:
    return [pytest.param(b, id=b.id) for b in ALL if b.lang == lang]


def test_every_block_has_a_checked_language() -> None:
    """A block in another language would go unchecked: only ``text`` (a picture, a tree) may."""
    unchecked = [b.id for b in ALL if b.lang not in ("python", "yaml", "bash", "text")]
    assert not unchecked, f"blocks of no checked language (give one): {unchecked}"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    """``make docs``: a broken link, a missing anchor or API reference fails the build."""
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count('id="search.') > 10


def _write_named_files(page: Path, folder: Path) -> None:
    """The page's Python blocks that name their file, written into ``folder``."""
    for block in blocks(page):
        if block.lang == "python" and block.file_name:
            path = folder / block.file_name
            path.parent.mkdir(parents=True, exist_ok=True)
            for parent in path.relative_to(folder).parents:
                if parent != Path("."):
                    (folder / parent / "__init__.py").touch()
            path.write_text(block.text)


@pytest.mark.parametrize("block", of("python"))
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    if block.not_run:
        compile(block.text, block.id, "exec")
        return
    _write_named_files(block.page, tmp_path)
    script = tmp_path / (block.file_name or "block.py")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(block.text)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])},
        timeout=120,
    )
    assert out.returncode == 0, f"{block.id}: {out.stderr[-2000:]}"


@pytest.mark.parametrize("block", of("yaml"))
def test_yaml_block_is_a_spec(block: Block, tmp_path: Path, monkeypatch: Any) -> None:
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block.id}: not a mapping"
    if "study" not in data:
        data = {**BASE_SPEC, **data}
    _write_named_files(block.page, tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    parse_spec(data, block.id)


@functools.cache
def command_help(command: str) -> str:
    """``python -m search COMMAND --help``, which must succeed."""
    out = subprocess.run(
        [sys.executable, "-m", "search", command, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"},
        timeout=120,
    )
    assert out.returncode == 0, f"search {command} --help: {out.stderr[-1000:]}"
    return out.stdout


@functools.cache
def make_targets() -> frozenset[str]:
    text = (REPO / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z][\w-]*):", text, flags=re.M))


def shell_lines(text: str) -> list[list[str]]:
    """The block's commands as words: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for line in joined.split("\n"):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote inside $(...): not a command checked here
            continue
        if words:
            commands.append(words)
    return commands


def search_calls(words: list[str]) -> list[tuple[str, list[str]]]:
    """Each ``python -m search CMD ARGS`` or ``search CMD ARGS`` in one command line."""
    calls = []
    for i, word in enumerate(words):
        after = words[i + 1] if i + 1 < len(words) else "-"
        called = i == 0 or words[i - 1] == "-m" or "=" in words[i - 1]
        if word == "search" and called and not after.startswith("-"):
            calls.append((after, words[i + 2 :]))
    return calls


@pytest.mark.parametrize("block", of("bash"))
def test_shell_block_names_what_exists(block: Block) -> None:
    for words in shell_lines(block.text):
        for command, args in search_calls(words):
            assert command in COMMANDS, f"{block.id}: no command {command!r}"
            listed = command_help(command)
            for arg in args:
                option = arg.split("=", 1)[0]
                if option.startswith("--"):
                    assert option in listed, f"{block.id}: search {command} has no {option}"
        if words[0] == "make":
            for target in (w for w in words[1:] if "=" not in w and not w.startswith("-")):
                assert target in make_targets(), f"{block.id}: no make target {target!r}"
        if words[0] in ("python", "python3") and len(words) > 1 and words[1].endswith(".py"):
            assert (REPO / words[1]).is_file(), f"{block.id}: no file {words[1]}"


def test_the_collector_sees_the_readme() -> None:
    """The README's front door: the two make commands first, then a spec, a trainable, the
    nine commands."""
    readme = blocks(REPO / "README.md")
    assert readme[0].text.startswith("make run ") and "\nmake test " in readme[0].text
    assert {b.lang for b in readme} >= {"python", "yaml", "bash"}
    lines = [words for b in readme if b.lang == "bash" for words in shell_lines(b.text)]
    named = {command for words in lines for command, _ in search_calls(words)}
    assert named == set(COMMANDS)


def _anchors(page: Path) -> set[str]:
    """The heading anchors mkdocs makes for ``page`` (Python-Markdown's toc slugify)."""
    from markdown.extensions.toc import slugify

    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", page.read_text(), flags=re.M)
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in headings}


def test_readme_links_resolve() -> None:
    """mkdocs checks the site's links; the README lies outside it, so its links are checked
    here: each relative link names a file, and each anchor a heading of it."""
    text = (REPO / "README.md").read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        assert (REPO / path).exists(), f"README.md links to a missing {path}"
        if anchor:
            assert anchor in _anchors(REPO / path), f"README.md: no #{anchor} in {path}"


def test_internal_paths_only_in_the_architecture_page() -> None:
    """The manual describes behaviour: internal modules may move, so only the architecture
    page names their files."""
    pattern = re.compile(r"search/[a-z_]+/[a-z_]+\.py|search/[a-z_]+\.py")
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    named = {
        f"{p.relative_to(REPO)}: {m}"
        for p in pages
        if p.name != "architecture.md"
        for m in pattern.findall(p.read_text())
    }
    assert not named, sorted(named)
