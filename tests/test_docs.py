"""The docs stay true to the code: key tables generated from the config models cover every field
of every model, the marked code blocks run, and the API reference lists every public name.

Tables: ``docs/hooks/config_tables.py`` (an mkdocs hook) turns ``<!-- config-table: module:Class -->``
markers into tables; these tests render the markers with the same code and check each table
against the pydantic model, independently of how the hook formats it.

Runnable blocks: a fenced ``python`` or ``bash`` block right under a ``<!-- runnable -->`` line (in
``docs/`` or ``README.md``) is run here at a tiny budget: every ``learn()`` is capped at
``BUDGET`` env steps and every evaluation at ``EPISODES`` episodes, in a temporary working
directory so runs/ goes there. Python blocks run in-process; each line of a bash block must be a
``shoal ...`` command and runs through ``shoal.cli.main`` (exit code 0 expected).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import annotated_types
import pytest
from pydantic import BaseModel, Field, create_model

import shoal
from shoal.algos.base import Algorithm
from shoal.algos.registry import ALGORITHMS
from shoal.config import PPOConfig, TrainerConfig
from shoal.models.catalog import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
BUDGET = 512  # env steps per learn() call in a runnable block
EPISODES = 2  # episodes per evaluation in a runnable block


def _load_hook():
    spec = importlib.util.spec_from_file_location("config_tables", DOCS / "hooks" / "config_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _load_hook()


# ----- config tables ----------------------------------------------------------------------------
def config_models() -> set[type[BaseModel]]:
    """Every config model the docs must table: the trainer's, each registered algorithm's, every
    TrainerConfig subclass shoal defines, and the built-in models' model_config."""
    models = {TrainerConfig, ModelConfig, *(cls.config_class for cls in ALGORITHMS.values())}
    todo = [TrainerConfig]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("shoal."):
                models.add(sub)
    return models


def all_markers() -> list[tuple[str, str, bool]]:
    return [m for page in PAGES for m in hook.markers(page.read_text())]


def field_signature(model: type[BaseModel], name: str) -> tuple:
    field = model.model_fields[name]
    return field.annotation, field.get_default(call_default_factory=True), field.metadata, field.alias


def uncovered_fields(model: type[BaseModel], markers: list[tuple[str, str, bool]]) -> list[str]:
    """Fields of ``model`` that no table in the docs shows as they are in ``model``: a table of the
    model itself, or of a base class it inherits the field from unchanged."""
    covered = set()
    for kind, spec, own in markers:
        if kind != "config-table":
            continue
        tabled = hook.load_model(spec)
        if tabled not in model.__mro__:
            continue
        for name in hook.table_fields(tabled, own):
            if name in model.model_fields and field_signature(model, name) == field_signature(tabled, name):
                covered.add(name)
    return [name for name in model.model_fields if name not in covered]


@pytest.mark.parametrize("model", sorted(config_models(), key=lambda m: m.__qualname__), ids=lambda m: m.__name__)
def test_every_config_model_is_tabled_in_the_docs(model):
    missing = uncovered_fields(model, all_markers())
    spec = f"{model.__module__}:{model.__qualname__}"
    assert not missing, (
        f"docs/ shows no table with the keys {missing} of {spec}: add `<!-- config-table: {spec} -->` "
        f"(or `{spec} own` for the keys its class adds) to the page that documents it"
    )


def test_a_model_without_a_marker_is_reported(monkeypatch):
    """A new algorithm's config (a model the docs have no marker for) fails the check above."""
    new_config = create_model("NewConfig", __base__=PPOConfig, new_key=(int, Field(3, ge=2)))

    class NewAlgorithm(Algorithm):
        config_class = new_config

    monkeypatch.setitem(ALGORITHMS, "new", NewAlgorithm)
    assert new_config in config_models()
    assert uncovered_fields(new_config, all_markers()) == ["new_key"]


def split_row(line: str) -> list[str]:
    """The cells of a table row: split at pipes outside code spans that are not escaped."""
    cells, cell, in_code, escaped = [], "", False, False
    for char in line.strip()[1:-1]:
        if char == "|" and not in_code and not escaped:
            cells.append(cell.strip())
            cell = ""
            continue
        in_code ^= char == "`"
        escaped = char == "\\"
        cell += char
    return [*cells, cell.strip()]


def parse_table(table: str) -> dict[str, dict[str, str]]:
    """Rows of a generated table by key: the cells under each header."""
    lines = table.strip().splitlines()
    header = split_row(lines[0])
    rows = {}
    for line in lines[2:]:
        cells = split_row(line)
        assert len(cells) == len(header), f"row has {len(cells)} cells, header {len(header)}: {line}"
        row = dict(zip(header, cells))
        rows[row["key"].strip("`")] = row
    return rows


def expected_bounds(metadata: list) -> list[str]:
    """What each bound must show in the 'allowed' cell: its sign and its number (ints whole)."""
    signs = {annotated_types.Ge: ("≥", "ge"), annotated_types.Gt: (">", "gt")}
    signs |= {annotated_types.Le: ("≤", "le"), annotated_types.Lt: ("<", "lt")}
    out = []
    for meta in metadata:
        if type(meta) in signs:
            sign, attr = signs[type(meta)]
            bound = getattr(meta, attr)
            out.append(f"{sign} {bound:g}" if isinstance(bound, float) else f"{sign} {bound}")
    return out


def check_table(model: type[BaseModel], own: bool, table: str) -> None:
    rows = parse_table(table)
    fields = model.model_fields if not own else {n: model.model_fields[n] for n in hook.own_fields(model)}
    keys = {field.alias or name: (name, field) for name, field in fields.items()}
    assert set(rows) == set(keys), f"table keys differ: extra {set(rows) - set(keys)}, missing {set(keys) - set(rows)}"
    for key, (_, field) in keys.items():
        row = rows[key]
        assert row["default"] == f"`{field.get_default(call_default_factory=True)!r}`", (key, row["default"])
        for bound in expected_bounds(field.metadata):
            assert bound in row["allowed"], f"{key}: constraint {bound} not in {row['allowed']!r}"
        for choice in hook.literal_choices(field.annotation):
            assert f"`{choice}`" in row["allowed"], f"{key}: choice {choice!r} not in {row['allowed']!r}"
        if not field.metadata and not hook.literal_choices(field.annotation):
            assert row["allowed"] == "", f"{key} has no constraint but the table says {row['allowed']!r}"
        assert row["meaning"], f"{key} of {model.__name__} has no meaning: give the field an attribute docstring"


MARKERS = sorted({m for m in all_markers() if m[0] == "config-table"})


@pytest.mark.parametrize(("kind", "spec", "own"), MARKERS, ids=[f"{s}{' own' if o else ''}" for _, s, o in MARKERS])
def test_generated_table_matches_the_model(kind, spec, own):
    check_table(hook.load_model(spec), own, hook.config_table(spec, own))


def test_markers_are_replaced_in_the_pages():
    for page in PAGES:
        rendered = hook.render(page.read_text())
        assert "<!-- config-table" not in rendered and "<!-- policy-keys" not in rendered, page


def test_a_new_field_shows_up_with_its_default_and_range():
    model = create_model("Extended", __base__=PPOConfig, new_rate=(float, Field(0.5, gt=0.0, le=1.0)))
    row = parse_table(hook.model_table(model, own=True))["new_rate"]
    assert (row["type"], row["default"]) == ("`float`", "`0.5`")
    assert "> 0" in row["allowed"] and "≤ 1" in row["allowed"]


def test_policy_keys_are_the_models():
    assert hook.policy_keys("shoal.config:PPOConfig") == ", ".join(f"`{k}`" for k in PPOConfig.POLICY_KEYS)


# ----- API reference ----------------------------------------------------------------------------
def test_api_reference_lists_every_public_name():
    documented = set(re.findall(r"^::: shoal\.(\w+)$", (DOCS / "api.md").read_text(), re.MULTILINE))
    assert set(shoal.__all__) <= documented, f"add to docs/api.md: {sorted(set(shoal.__all__) - documented)}"


def test_readme_starts_with_the_two_commands_and_links_existing_pages():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)[1].splitlines()
    assert [line.split("#")[0].strip() for line in first_block] == ["make train", "make test"]
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link


# ----- runnable blocks --------------------------------------------------------------------------
RUNNABLE = re.compile(r"^<!-- runnable -->\n```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def runnable_blocks() -> list:
    blocks = []
    for page in [ROOT / "README.md", *PAGES]:
        text = page.read_text()
        found = list(RUNNABLE.finditer(text))
        assert len(found) == text.count("<!-- runnable -->"), f"{page}: a runnable marker not right above a fence"
        for m in found:
            line = text[: m.start()].count("\n") + 2
            name = f"{page.relative_to(ROOT)}:{line}"
            blocks.append(pytest.param(m[1], m[2], name, id=name))
    return blocks


@pytest.fixture
def small_budget(monkeypatch, tmp_path):
    """Cap every learn() and evaluation, and run in a temporary directory (runs/ goes there)."""
    learn, evaluate = shoal.Trainer.learn, shoal.Trainer.evaluate

    def small_learn(self, total_timesteps=None, progress=None):
        left = self.config.total_timesteps - self.timesteps_total if total_timesteps is None else total_timesteps
        return learn(self, min(left, BUDGET) if left >= 1 else total_timesteps, progress=False)

    def small_evaluate(self, num_episodes=None, *args, **kwargs):
        return evaluate(self, min(num_episodes or self.config.evaluation_num_episodes, EPISODES), *args, **kwargs)

    monkeypatch.setattr(shoal.Trainer, "learn", small_learn)
    monkeypatch.setattr(shoal.Trainer, "evaluate", small_evaluate)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # examples/ imports as from the repository root


@pytest.mark.slow
@pytest.mark.parametrize(("lang", "code", "where"), runnable_blocks())
def test_runnable_block(lang, code, where, small_budget):
    if lang == "python":
        exec(compile(code, where, "exec"), {"__name__": "__main__"})
        return
    assert lang == "bash", f"{where}: runnable blocks are python or bash, not {lang}"
    from shoal.cli import main

    for line in code.splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        assert argv[0] == "shoal", f"{where}: a runnable bash block holds only shoal commands, got {line!r}"
        saved_path = list(sys.path)
        try:
            assert main(argv[1:]) == 0, f"{where}: `{line}` failed"
        finally:
            sys.path[:] = saved_path
