"""mkdocs hook: config key tables generated from the pydantic models, so no key is written twice.

A page asks for a table with a marker on a line of its own:

    <!-- config-table: shoal.config:TrainerConfig -->        every key of the model
    <!-- config-table: shoal.config:PPOConfig own -->        the keys the class declares, then those
                                                             it gives another default or a note
    <!-- policy-keys: shoal.config:PPOConfig -->             the keys one policy in `policies` may override

Each row is one key as users write it (the field's alias, e.g. ``model_config``), its type, its
default, the values allowed by the field's constraints (``ge``/``gt``/``le``/``lt``, lengths,
``Literal`` choices) and its meaning. Types, defaults and constraints are read from the model at
run time, so they are what pydantic enforces. A key is declared once (``shoal.config.base``); a
class that gives it another default (its ``DEFAULTS``) shows the default it replaces beside its
own, e.g. ``0.0023`` (TrainerConfig: ``0.001``). The meaning is the field's attribute docstring (the
string literal under the field in the class body), read with griffe, the same reader
mkdocstrings uses for the API reference: one sentence in the source serves both pages; followed by
the nearest note on the key in the class or its bases (their ``NOTES``).
``tests/test_docs_tables.py`` checks the tables against the models.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any, Literal

import annotated_types
import griffe
from pydantic import BaseModel
from pydantic.fields import FieldInfo

SRC = Path(__file__).resolve().parents[2] / "src"
MARKER = re.compile(r"^<!-- (config-table|policy-keys): ([\w.]+:\w+)((?: \w+)*) -->$", re.MULTILINE)
HEADER = "| key | type | default | allowed | meaning |\n|---|---|---|---|---|"


def load_model(spec: str) -> type[BaseModel]:
    """The class ``spec`` names as ``package.module:Class``."""
    module, _, name = spec.partition(":")
    model = getattr(importlib.import_module(module), name)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"{spec} is not a pydantic model")
    return model


def key_of(name: str, field: FieldInfo) -> str:
    """The key as users write it (``model_config`` for the attribute ``model_options``)."""
    return field.alias or name


def own_data(model: type, table: str) -> dict[str, Any]:
    """The class body's ``DEFAULTS`` or ``NOTES`` of ``model`` (not inherited), keyed by field name."""
    names = {field.alias or name: name for name, field in getattr(model, "model_fields", {}).items()}
    aliases = getattr(model, "ALIASES", {})
    data = vars(model).get(table) or {}
    return {names.get(aliases.get(key, key), aliases.get(key, key)): value for key, value in data.items()}


def own_fields(model: type[BaseModel]) -> list[str]:
    """Fields the class body of ``model`` declares itself, then those it gives another default
    (``DEFAULTS``) or a note (``NOTES``)."""
    declared = inspect.get_annotations(model)
    changed = own_data(model, "DEFAULTS") | own_data(model, "NOTES")
    return [name for name in model.model_fields if name in declared] + [
        name for name in model.model_fields if name in changed and name not in declared
    ]


def table_fields(model: type[BaseModel], own: bool) -> list[str]:
    """The fields a table of ``model`` lists, in declaration order."""
    return own_fields(model) if own else list(model.model_fields)


@cache
def _griffe_package(name: str) -> Any:
    """The package ``name`` as griffe reads it from source, loaded once: griffe reads every module
    of a package whichever of them is asked for."""
    return griffe.load(name, search_paths=[str(SRC)], resolve_aliases=False)


def meaning(model: type[BaseModel], name: str) -> str:
    """The attribute docstring of field ``name``: the nearest class in ``model``'s MRO whose body
    documents it (a subclass that only changes a default keeps its parent's sentence)."""
    for cls in model.__mro__:
        if name not in inspect.get_annotations(cls):
            continue
        try:
            package, _, module = cls.__module__.partition(".")
            attribute = _griffe_package(package)[".".join(filter(None, (module, cls.__qualname__, name)))]
        except (KeyError, ImportError):
            continue
        if attribute.docstring is not None and attribute.docstring.value.strip():
            return " ".join(f"{attribute.docstring.value} {note(model, name)}".split())
    return ""


def note(model: type[BaseModel], name: str) -> str:
    """What field ``name`` means for ``model`` besides its docstring: the nearest ``NOTES`` entry in
    its MRO ('' when none)."""
    return next((own_data(cls, "NOTES")[name] for cls in model.__mro__ if name in own_data(cls, "NOTES")), "")


def base_default(model: type[BaseModel], name: str) -> tuple[str, Any] | None:
    """When ``model`` gives field ``name`` another default than its base: the class that set the
    base's default (its declaration or ``DEFAULTS``) and that default; else None."""
    base = next((b for b in model.__mro__[1:] if name in getattr(b, "model_fields", {})), None)
    if base is None or base.model_fields[name].is_required():
        return None
    old, new = (m.model_fields[name].get_default(call_default_factory=True) for m in (base, model))
    if type(old) is type(new) and old == new:
        return None
    setter = next(
        cls for cls in base.__mro__ if name in inspect.get_annotations(cls) or name in own_data(cls, "DEFAULTS")
    )
    return setter.__name__, old


def type_name(annotation: Any) -> str:
    """A short, readable type: ``int``, ``float | None``, ``list[str]``, ``any``; Literal choices
    show as the type of their values (the choices go in the 'allowed' column)."""
    if annotation is type(None) or annotation is None:
        return "None"
    if annotation is Any:
        return "any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:  # a constrained member of a union: its bounds are pydantic's, not a type
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(dict.fromkeys(type(a).__name__ for a in args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(dict.fromkeys(type_name(a) for a in args))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def literal_choices(annotation: Any) -> list[Any]:
    """The values of every ``Literal`` inside ``annotation`` (also under ``| None``)."""
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return [c for arg in typing.get_args(annotation) for c in literal_choices(arg)]


def number(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


CONSTRAINTS = (
    (annotated_types.Ge, "ge", "≥ {}"),
    (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Le, "le", "≤ {}"),
    (annotated_types.Lt, "lt", "< {}"),
    (annotated_types.MinLen, "min_length", "at least {} item(s)"),
    (annotated_types.MaxLen, "max_length", "at most {} item(s)"),
)


def allowed(field: FieldInfo) -> str:
    """What the field's constraints allow: Literal choices and bounds (empty when unconstrained)."""
    parts = [f"`{c}`" for c in literal_choices(field.annotation)]
    for meta in field.metadata:
        for kind, attr, text in CONSTRAINTS:
            if isinstance(meta, kind):
                bound = getattr(meta, attr)
                parts.append("non-empty" if attr == "min_length" and bound == 1 else text.format(number(bound)))
    return ", ".join(parts)


def default(model: type[BaseModel], name: str) -> str:
    """The default of field ``name``, and the one of its base when ``model`` changes it."""
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    shown = f"`{field.get_default(call_default_factory=True)!r}`"
    replaced = base_default(model, name)
    return shown if replaced is None else f"{shown} ({replaced[0]}: `{replaced[1]!r}`)"


def cell(text: str) -> str:
    """``text`` safe in a table cell: pipes outside code spans escaped (inside them a pipe does
    not split cells)."""
    pieces = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in pieces)


def key_cell(key: str) -> str:
    """A key as code that a narrow column may break after an underscore, never inside a word."""
    return "<code>" + key.replace("_", "_<wbr>") + "</code>"


def row(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    cells = (
        key_cell(key_of(name, field)),
        f"`{type_name(field.annotation)}`",
        default(model, name),
        allowed(field),
        meaning(model, name),
    )
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def model_table(model: type[BaseModel], own: bool = False) -> str:
    """The markdown table of ``model``'s keys (``own``: only those its class body declares)."""
    return "\n".join([HEADER, *(row(model, name) for name in table_fields(model, own))])


def config_table(spec: str, own: bool = False) -> str:
    """The table of the model ``spec`` names as ``package.module:Class``."""
    return model_table(load_model(spec), own)


def policy_keys(spec: str) -> str:
    """The keys a policy in ``policies`` may override (the model's ``POLICY_KEYS``), as code."""
    return ", ".join(f"`{key}`" for key in load_model(spec).POLICY_KEYS)


def markers(markdown: str) -> list[tuple[str, str, bool]]:
    """Every marker in ``markdown``: (kind, model spec, own)."""
    return [(m[1], m[2], "own" in m[3].split()) for m in MARKER.finditer(markdown)]


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced by what it asks for."""

    def replace(m: re.Match[str]) -> str:
        if m[1] == "policy-keys":
            return policy_keys(m[2])
        options = m[3].split()
        unknown = [o for o in options if o != "own"]
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} in marker {m[0]!r}; the one option is 'own'")
        return config_table(m[2], own="own" in options)

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return render(markdown)
