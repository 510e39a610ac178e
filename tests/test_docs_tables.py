"""The docs' key tables stay true to the config models.

``docs/hooks/config_tables.py`` (an mkdocs hook) turns ``<!-- config-table: module:Class -->``
markers into tables. These tests render each marker with the hook and read the table back; what
it shows (keys, defaults parsed as Python literals, bounds, length limits, choices, meanings) is
compared with the pydantic fields themselves: their defaults and constraint metadata, the
attribute docstrings read from the source with ``ast``, and the ``DEFAULTS`` and ``NOTES`` of the
classes. None of the hook's helpers computes the expected values. The same goes for
``<!-- policy-keys: ... -->``: the keys shown are compared with the keys a policy override is
accepted for. Every config model must have a table.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import itertools
import re
import textwrap
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

import annotated_types
import pytest
from pydantic import BaseModel, Field, create_model

from shoal.algos.base import Algorithm
from shoal.algos.registry import ALGORITHMS
from shoal.config import PPOConfig, TrainerConfig
from shoal.errors import ConfigError
from shoal.models.catalog import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


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


def class_data(cls: type, table: str) -> dict[str, Any]:
    """``DEFAULTS`` or ``NOTES`` as the body of ``cls`` writes them (shoal's write field names)."""
    return dict(vars(cls).get(table) or {})


def own_fields(model: type[BaseModel]) -> list[str]:
    """The fields the class body of ``model`` annotates itself, then those its ``DEFAULTS`` or
    ``NOTES`` name."""
    declared = inspect.get_annotations(model)
    changed = class_data(model, "DEFAULTS") | class_data(model, "NOTES")
    return [n for n in model.model_fields if n in declared] + [
        n for n in model.model_fields if n in changed and n not in declared
    ]


def note_of(model: type[BaseModel], name: str) -> str:
    """The nearest note on ``name`` in ``model``'s MRO."""
    return next((class_data(c, "NOTES")[name] for c in model.__mro__ if name in class_data(c, "NOTES")), "")


def field_signature(model: type[BaseModel], name: str) -> tuple:
    field = model.model_fields[name]
    default = field.get_default(call_default_factory=True)
    return field.annotation, default, type(default), field.metadata, field.alias, note_of(model, name)


def replaced_default(model: type[BaseModel], name: str) -> str:
    """What the default cell adds after the default when ``model`` changes its base's default:
    `` (Setter: `old`)``, the class that set the old default (declared or in DEFAULTS)."""
    base = next((b for b in model.__mro__[1:] if name in getattr(b, "model_fields", {})), None)
    if base is None or base.model_fields[name].is_required():
        return ""
    old = base.model_fields[name].get_default(call_default_factory=True)
    new = model.model_fields[name].get_default(call_default_factory=True)
    if type(old) is type(new) and old == new:
        return ""
    setter = next(c for c in base.__mro__ if name in inspect.get_annotations(c) or name in class_data(c, "DEFAULTS"))
    return f" ({setter.__name__}: `{old!r}`)"


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
        for name in own_fields(tabled) if own else tabled.model_fields:
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
        rows[re.sub(r"<[^>]*>", "", row["key"]).strip("`")] = row  # <code>key_<wbr>name</code>
    return rows


NUMBER = r"-?(?:\d+(?:\.\d*)?(?:e[+-]?\d+)?|inf)"
ALLOWED_PIECE = re.compile(
    rf"`(?P<choice>[^`]*)`|(?P<sign>[≥>≤<]) (?P<number>{NUMBER})|(?P<nonempty>non-empty)"
    r"|at (?P<side>least|most) (?P<length>\d+) item\(s\)"
)
SIGNS = {annotated_types.Ge: ("≥", "ge"), annotated_types.Gt: (">", "gt")}
SIGNS |= {annotated_types.Le: ("≤", "le"), annotated_types.Lt: ("<", "lt")}


def parse_allowed(cell: str) -> tuple[list[str], list[tuple[str, str]], list[tuple[str, int]]]:
    """An 'allowed' cell read back: its choices, its bounds as (sign, number as written) and its
    length limits as ("least" | "most", n). Anything else in the cell fails the test."""
    choices, bounds, lengths = [], [], []
    pos = 0
    while pos < len(cell):
        m = ALLOWED_PIECE.match(cell, pos)
        assert m, f"cannot read {cell[pos:]!r} in the 'allowed' cell {cell!r}"
        if m["choice"] is not None:
            choices.append(m["choice"])
        elif m["sign"]:
            bounds.append((m["sign"], m["number"]))
        elif m["nonempty"]:
            lengths.append(("least", 1))
        else:
            lengths.append((m["side"], int(m["length"])))
        pos = m.end()
        if pos < len(cell):
            assert cell.startswith(", ", pos), f"pieces of {cell!r} must be separated by ', '"
            pos += 2
    return choices, bounds, lengths


def literal_values(annotation: Any) -> list[Any]:
    """The values of every ``Literal`` inside ``annotation``."""
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return [v for arg in typing.get_args(annotation) for v in literal_values(arg)]


@functools.cache
def class_body(cls: type) -> list[ast.stmt]:
    """The statements of ``cls``'s body, parsed from its source (once per class: ``getsource``
    parses the whole module to find a class)."""
    return ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body


def source_docstring(model: type[BaseModel], name: str) -> str:
    """The attribute docstring of field ``name`` as the source has it: the string right under the
    field in the body of the nearest class of the MRO that annotates it and documents it."""
    for cls in model.__mro__:
        if name not in inspect.get_annotations(cls):
            continue
        for stmt, following in itertools.pairwise(class_body(cls)):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == name
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
                and following.value.value.strip()
            ):
                return " ".join(following.value.value.split())
    return ""


def check_table(model: type[BaseModel], own: bool, table: str) -> None:
    """The rendered ``table`` read back against ``model``'s fields."""
    rows = parse_table(table)
    names = own_fields(model) if own else list(model.model_fields)
    keys = {model.model_fields[name].alias or name: name for name in names}
    assert set(rows) == set(keys), f"table keys differ: extra {set(rows) - set(keys)}, missing {set(keys) - set(rows)}"
    for key, name in keys.items():
        field, row = model.model_fields[name], rows[key]
        if field.is_required():
            assert row["default"] == "required", (key, row["default"])
        else:
            default = field.get_default(call_default_factory=True)
            code = re.match(r"`[^`]*`", row["default"])
            assert code, (key, row["default"])
            own = code[0]
            shown = ast.literal_eval(own[1:-1])
            assert type(shown) is type(default) and shown == default, f"{key}: default {default!r}, table {shown!r}"
            assert row["default"][len(own) :] == replaced_default(model, name), f"{key}: {row['default']}"

        choices, bounds, lengths = parse_allowed(row["allowed"])
        assert choices == [str(v) for v in literal_values(field.annotation)], f"{key}: choices {choices}"
        expected_bounds, expected_lengths = [], []
        for meta in field.metadata:
            if type(meta) in SIGNS:
                sign, attr = SIGNS[type(meta)]
                expected_bounds.append((sign, getattr(meta, attr)))
            elif isinstance(meta, annotated_types.MinLen):
                expected_lengths.append(("least", meta.min_length))
            elif isinstance(meta, annotated_types.MaxLen):
                expected_lengths.append(("most", meta.max_length))
            else:
                pytest.fail(f"{key}: the table cannot show the constraint {meta!r}; teach the hook and this test")
        assert [s for s, _ in bounds] == [s for s, _ in expected_bounds], f"{key}: bounds {bounds}"
        for (_, written), (_, bound) in zip(bounds, expected_bounds):
            assert float(written) == bound, f"{key}: the table shows {written}, the field's bound is {bound!r}"
            if isinstance(bound, int):
                assert re.fullmatch(r"-?\d+", written), f"{key}: the int bound {bound} shows as {written}"
        assert lengths == expected_lengths, f"{key}: length limits {lengths}, expected {expected_lengths}"

        meaning = row["meaning"].replace("\\|", "|")
        assert meaning, f"{key} of {model.__name__} has no meaning: give the field an attribute docstring"
        expected = " ".join(f"{source_docstring(model, name)} {note_of(model, name)}".split())
        assert meaning == expected, f"{key}: the meaning is not the field's docstring and its note"


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
    assert parse_allowed(row["allowed"]) == ([], [(">", "0"), ("≤", "1")], [])


def test_an_algorithms_defaults_show_what_they_replace():
    """DQN's table lists the keys it declares, then those it gives another default, each beside the
    default it replaces and the class that set that one."""
    from shoal.config import DQNConfig, MADDPGConfig

    table = hook.config_table("shoal.config:DQNConfig", own=True)
    rows = parse_table(table)
    assert rows["learning_rate"]["default"] == "`0.0023` (TrainerConfig: `0.001`)"
    assert rows["gradient_steps"]["default"] == "`128` (OffPolicyConfig: `1`)"
    assert rows["double_q"]["default"] == "`True`"
    keys = list(rows)
    assert keys.index("replay_priority_eta") < keys.index("num_envs"), "declared keys come first"
    assert "tau" not in rows, "a key DQN leaves as OffPolicyConfig has it is not in DQN's own table"
    # MADDPG's 8 envs replace the replay actor-critics' 1, which replaced the trainer's 8
    maddpg = parse_table(hook.config_table("shoal.config:MADDPGConfig", own=True))
    assert maddpg["num_envs"]["default"] == "`8` (ReplayActorCriticConfig: `1`)"
    assert MADDPGConfig.model_fields["num_envs"].default == 8 and DQNConfig.model_fields["num_envs"].default == 1
    # the full table of a subclass marks them too; the trainer's shows none
    assert parse_table(hook.model_table(DQNConfig))["gamma"]["default"] == "`0.99` (TrainerConfig: `0.98`)"
    assert all(
        " (" not in row["default"] for row in parse_table(hook.config_table("shoal.config:TrainerConfig")).values()
    )


def test_a_note_follows_the_docstring_in_the_class_and_its_subclasses():
    class Noted(PPOConfig):
        DEFAULTS: ClassVar[dict[str, Any]] = {"gamma": 0.9}
        NOTES: ClassVar[dict[str, str]] = {"gae_lambda": "Noted: mind the lambda."}

    class Child(Noted):
        pass

    rows = parse_table(hook.model_table(Noted, own=True))
    assert list(rows) == ["gamma", "gae_lambda"]
    assert rows["gamma"]["default"] == "`0.9` (TrainerConfig: `0.98`)"
    assert rows["gae_lambda"]["meaning"].endswith("1 Monte Carlo returns minus the value. Noted: mind the lambda.")
    assert parse_table(hook.model_table(Child))["gae_lambda"]["meaning"].endswith("Noted: mind the lambda.")
    assert parse_table(hook.model_table(Child, own=True)) == {}
    check_table(Noted, True, hook.model_table(Noted, own=True))


def test_a_wrong_bound_is_caught():
    """The bound check compares numbers: '≥ 1' does not pass for a field whose bound is 10."""
    model = create_model("Bounded", __base__=PPOConfig, steps=(int, Field(20, ge=10)))
    table = hook.model_table(model, own=True)
    with pytest.raises(AssertionError, match="the table shows 1, the field's bound is 10"):
        check_table(model, True, table.replace("≥ 10", "≥ 1"))


POLICY_MARKERS = sorted({spec for kind, spec, _ in all_markers() if kind == "policy-keys"})


@pytest.mark.parametrize("spec", POLICY_MARKERS)
def test_policy_keys_shown_are_the_keys_a_policy_may_override(spec):
    """The keys the page lists are those a policy in ``policies`` is accepted with: each key of the
    config is tried as an override (with its default value) and must be accepted or rejected as the
    list says."""
    model = hook.load_model(spec)
    shown = re.findall(r"`([^`]+)`", hook.render(f"<!-- policy-keys: {spec} -->"))
    defaults = model.build(env="CartPole-v1").settings()
    accepted = []
    for key in defaults:  # every key, as users write it
        try:
            model.build(env="CartPole-v1", policies={"p": {key: defaults[key]}})
        except ConfigError:
            continue
        accepted.append(key)
    assert sorted(shown) == sorted(accepted), f"shown {sorted(shown)}, accepted {sorted(accepted)}"
