"""The docs stay true to the code: every code block is either run or says why not, the error
transcripts are what the command line prints, the API reference lists every public name, and the
links of the repository's root files resolve. (The key tables: tests/test_docs_tables.py.)

Code blocks: every fenced ``python`` or ``bash`` block in ``docs/``, ``README.md`` and
``CONTRIBUTING.md`` has a marker on the line right above its fence: ``<!-- runnable -->`` or
``<!-- not-runnable: why -->``. A runnable block is run here at a tiny budget: every ``learn()``
is capped at ``BUDGET`` env steps and every evaluation at ``EPISODES`` episodes, in a temporary
working directory (runs/ goes there, ``configs/`` is linked in, and ``examples`` imports as from
the repository root). Python blocks run in-process; each line of a bash block must be a
``shoal ...`` command and runs through ``shoal.cli.main`` (exit code 0 expected). A ``yaml``
block with ``title="NAME"`` on its fence line is written to ``NAME`` before the page's blocks and
error transcripts run.

Error transcripts: a ``text`` block under ``<!-- cli-errors -->`` holds ``$ shoal ...`` lines, each
followed by the error line it prints; each command is run and its ``shoal: error:`` line compared
with the one shown (a shown line ending in ``...`` is compared up to there).
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

import shoal

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
ROOT_FILES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md"]
MARKED_FILES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *PAGES]  # files whose code blocks carry markers
BUDGET = 512  # env steps per learn() call in a runnable block
EPISODES = 2  # episodes per evaluation in a runnable block


# ----- API reference and links ------------------------------------------------------------------
def test_api_reference_lists_every_public_name():
    documented = set(re.findall(r"^::: shoal\.(\w+)$", (DOCS / "api.md").read_text(), re.MULTILINE))
    assert set(shoal.__all__) <= documented, f"add to docs/api.md: {sorted(set(shoal.__all__) - documented)}"


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_front_pages_name_every_algorithm_and_every_command(page):
    from shoal.algos.registry import ALGORITHMS
    from shoal.cli.parser import build_parser

    text = (ROOT / page).read_text()
    missing = [name for name in ALGORITHMS if not re.search(rf"\b{name}\b", text, re.IGNORECASE)]
    commands = next(a for a in build_parser()._actions if a.choices and "train" in a.choices).choices
    missing += [f"shoal {c}" for c in commands if not re.search(rf"\b{c}\b", text)]
    assert not missing, f"{page} does not name {missing}"


def test_readme_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)[1].splitlines()
    assert [line.split("#")[0].strip() for line in first_block] == ["make train", "make test"]


LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings, as mkdocs (and, for these headings, GitHub) makes them."""
    text = FENCE.sub("", markdown)
    return {slugify(m[1].replace("`", ""), "-") for m in re.finditer(r"^#{1,6} (.+?)\s*$", text, re.MULTILINE)}


@pytest.mark.parametrize("path", ROOT_FILES, ids=lambda p: p.name)
def test_relative_links_of_root_files_resolve(path):
    """Every relative link of the root files names an existing file, and an existing heading when
    it has an anchor into a page (the site's own links are checked by `mkdocs build --strict`)."""
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = ROOT / file if file else path
        assert linked.exists(), f"{path.name} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in heading_anchors(linked.read_text()), f"{path.name}: no heading #{anchor} in {file}"


# ----- code blocks ------------------------------------------------------------------------------
FENCE = re.compile(r"^```(\w*)([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
RUNNABLE = "<!-- runnable -->"
NOT_RUNNABLE = re.compile(r"<!-- not-runnable: \S.*? -->")
CLI_ERRORS = "<!-- cli-errors -->"
CHECKED_LANGS = ("python", "bash")


@dataclass
class Block:
    lang: str
    info: str  # what follows the language on the fence line, e.g. title="my_run.yaml"
    code: str
    marker: str  # the line right above the fence
    where: str  # file:line of the fence


def code_blocks(text: str, name: str) -> list[Block]:
    blocks = []
    for m in FENCE.finditer(text):
        above = text[: m.start() - 1].rpartition("\n")[2] if m.start() else ""  # the fence starts a line
        line = text[: m.start()].count("\n") + 1
        blocks.append(Block(m[1], m[2].strip(), m[3], above.strip(), f"{name}:{line}"))
    return blocks


def marker_problems(text: str, name: str) -> list[str]:
    """What is wrong with the markers of one file: python / bash blocks without one, and marker
    lines that are not right above a fence of their kind."""
    problems = []
    blocks = code_blocks(text, name)
    for block in blocks:
        if block.lang in CHECKED_LANGS and block.marker != RUNNABLE and not NOT_RUNNABLE.fullmatch(block.marker):
            problems.append(
                f"{block.where}: a {block.lang} block needs `{RUNNABLE}` or `<!-- not-runnable: why -->` "
                f"on the line right above its fence"
            )
    lines = text.splitlines()
    for kind, matches, langs in (
        ("runnable", lambda s: s == RUNNABLE, CHECKED_LANGS),
        ("not-runnable", NOT_RUNNABLE.fullmatch, CHECKED_LANGS),
        ("cli-errors", lambda s: s == CLI_ERRORS, ("text",)),
    ):
        marked = sum(1 for line in lines if matches(line.strip()))
        placed = sum(1 for b in blocks if matches(b.marker) and b.lang in langs)
        if marked != placed:
            problems.append(f"{name}: {marked - placed} {kind} marker(s) not right above a {' or '.join(langs)} fence")
    return problems


def test_every_code_block_is_marked():
    problems = [p for path in MARKED_FILES for p in marker_problems(path.read_text(), path.relative_to(ROOT))]
    assert not problems, "\n".join(problems)


def test_an_unmarked_or_misplaced_block_is_reported():
    good = "<!-- runnable -->\n```python\nprint(1)\n```\n\n<!-- not-runnable: a sketch -->\n```bash\nmake\n```\n"
    assert marker_problems(good, "page.md") == []
    unmarked = "Text.\n\n```python\nprint(1)\n```\n"
    assert marker_problems(unmarked, "page.md") == [
        "page.md:3: a python block needs `<!-- runnable -->` or `<!-- not-runnable: why -->` "
        "on the line right above its fence"
    ]
    misplaced = "<!-- runnable -->\n\n```bash\nshoal train CartPole-v1\n```\n"
    assert len(marker_problems(misplaced, "page.md")) == 2  # the block is unmarked, the marker stray
    assert marker_problems("<!-- not-runnable: -->\n```bash\nmake\n```\n", "page.md")  # a reason is required


def page_files(blocks: list[Block]) -> dict[str, str]:
    """The page's ```yaml title="NAME" blocks: written to NAME before its blocks and transcripts run."""
    titles = [(block, re.search(r'title="([^"]+)"', block.info)) for block in blocks if block.lang == "yaml"]
    return {title[1]: block.code for block, title in titles if title}


def runnable_blocks() -> list:
    params = []
    for path in MARKED_FILES:
        blocks = code_blocks(path.read_text(), str(path.relative_to(ROOT)))
        files = page_files(blocks)
        for block in blocks:
            if block.marker == RUNNABLE:
                params.append(pytest.param(block.lang, block.code, block.where, files, id=block.where))
    return params


@pytest.fixture
def small_budget(monkeypatch, tmp_path):
    """Cap every learn() and evaluation, and run in a temporary directory (runs/ goes there) that
    sees configs/ and examples/ as the repository root does."""
    learn, evaluate = shoal.Trainer.learn, shoal.Trainer.evaluate

    def small_learn(self, total_timesteps=None, progress=None):
        left = self.config.total_timesteps - self.timesteps_total if total_timesteps is None else total_timesteps
        if getattr(self.algorithm.config, "timesteps_per_iteration", 0) > BUDGET:  # a replay learner's iteration
            self.algorithm.config.timesteps_per_iteration = BUDGET  # would run 1,000 steps, whatever learn() asks
        return learn(self, min(left, BUDGET) if left >= 1 else total_timesteps, progress=False)

    def small_evaluate(self, num_episodes=None, *args, **kwargs):
        return evaluate(self, min(num_episodes or self.config.evaluation_num_episodes, EPISODES), *args, **kwargs)

    monkeypatch.setattr(shoal.Trainer, "learn", small_learn)
    monkeypatch.setattr(shoal.Trainer, "evaluate", small_evaluate)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.syspath_prepend(str(ROOT))  # examples/ imports as from the repository root


def run_shoal(line: str, where: str) -> int:
    """One ``shoal ...`` line of a block through ``shoal.cli.main``; its exit code."""
    from shoal.cli import main

    argv = shlex.split(line, comments=True)
    assert argv[0] == "shoal", f"{where}: only shoal commands run here, got {line!r}"
    saved_path = list(sys.path)
    try:
        return main(argv[1:])
    finally:
        sys.path[:] = saved_path  # main() adds the working directory


@pytest.mark.slow
@pytest.mark.parametrize(("lang", "code", "where", "files"), runnable_blocks())
def test_runnable_block(lang, code, where, files, small_budget):
    for name, content in files.items():
        Path(name).write_text(content)
    if lang == "python":
        exec(compile(code, where, "exec"), {"__name__": "__main__"})
        return
    assert lang == "bash", f"{where}: runnable blocks are python or bash, not {lang}"
    for line in code.splitlines():
        if shlex.split(line, comments=True):
            assert run_shoal(line, where) == 0, f"{where}: `{line}` failed"


# ----- error transcripts ------------------------------------------------------------------------
def cli_error_cases() -> list:
    cases = []
    for path in MARKED_FILES:
        blocks = code_blocks(path.read_text(), str(path.relative_to(ROOT)))
        for block in blocks:
            if block.marker != CLI_ERRORS:
                continue
            lines = block.code.splitlines()
            assert lines and lines[0].startswith("$ "), f"{block.where}: a cli-errors block starts with `$ shoal ...`"
            for i, line in enumerate(lines):
                if line.startswith("$ "):
                    shown = lines[i + 1] if i + 1 < len(lines) else ""
                    assert shown.startswith("shoal: error: "), f"{block.where}: `{line}` shows no error line under it"
                    case = (line[2:], shown, block.where, page_files(blocks))
                    cases.append(pytest.param(*case, id=f"{block.where} {line[2:]}"))
    return cases


@pytest.mark.parametrize(("command", "shown", "where", "files"), cli_error_cases())
def test_error_transcript_is_what_the_command_prints(command, shown, where, files, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        Path(name).write_text(content)
    assert run_shoal(command, where) == 2, f"{where}: `{command}` did not fail with exit code 2"
    printed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("shoal: error: ")]
    assert len(printed) == 1, f"{where}: `{command}` printed {printed}"
    if shown.endswith("..."):
        assert printed[0].startswith(shown[:-3]), f"{where}: `{command}` printed\n{printed[0]}\nthe docs show\n{shown}"
    else:
        assert printed[0] == shown, f"{where}: `{command}` printed\n{printed[0]}\nthe docs show\n{shown}"
