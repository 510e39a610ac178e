"""The one YAML reader of shoal. Every file shoal reads (a ``--config`` file, an experiments file,
a benchmark suite, the references, a tuned config, a run's ``config.yaml``) goes through
``load_yaml``, and every ``key=value`` value through ``parse_yaml_value``. What they read is:

- safe: PyYAML's SafeLoader (libyaml's when PyYAML has it), so a tag cannot build a Python object;
- bounded: at most ``MAX_FILE_BYTES`` (``MAX_VALUE_BYTES`` for a value), nested at most
  ``MAX_DEPTH`` levels, and aliases that add at most ``MAX_ALIAS_NODES`` nodes and
  ``MAX_ALIAS_CHARS`` characters of text when expanded.
  An alias loads as one shared object, but whatever walks the result later (a repr, a deep copy,
  JSON; gymnasium's error message repeats an env's keyword arguments) expands it: nine levels of
  nine aliases (a "billion laughs") are a few hundred bytes that become 9**9 strings;
- refused with one ConfigError, ``file:line:column: what is wrong`` (the parser's own words for a
  syntax error: what it expected and what it found).

Light on purpose (PyYAML and ``shoal.errors`` only): ``shoal plot`` reads run directories without torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shoal.errors import ConfigError, shorten

try:  # libyaml: many times faster, and its parser has a nesting limit that guards its C stack
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

MAX_FILE_BYTES = 1 << 20
"""A file larger than this (1 MiB) is refused unread: configs are a few kilobytes."""
MAX_VALUE_BYTES = 16 << 10
"""The largest ``key=value`` value (16 KiB)."""
MAX_DEPTH = 100
"""The deepest nesting of lists and mappings, aliases expanded (deep enough for any config; below
Python's recursion limit for the code that walks the result)."""
MAX_ALIAS_NODES = 10_000
"""How many nodes (lists, mappings, keys and values) aliases may add to a document when expanded:
a few anchors reused in a config add tens."""
MAX_ALIAS_CHARS = 100_000
"""How many characters of scalar text aliases may add to a document when expanded: an alias of a
scalar is one node however long the scalar, and copies all of its text."""

# besides YAMLError, what SafeConstructor raises on a scalar it cannot convert: `!!int x` (ValueError),
# `!!bool x` (KeyError), `!!timestamp x` (AttributeError), `!!float ` (IndexError), 2020-13-45 (ValueError)
_CONVERSION_ERRORS = (ArithmeticError, AttributeError, LookupError, TypeError, ValueError)


class _Refused(Exception):
    """A document not read: the problem, and where, as (line, column) counted from 1 (None: the whole
    document)."""

    def __init__(self, problem: str, at: tuple[int, int] | None):
        super().__init__(problem)
        self.problem, self.at = shorten(problem), at


class _Loader(_SafeLoader):
    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """SafeLoader's, with a scalar it cannot convert refused at the scalar, as its own errors are."""
        try:
            return super().construct_object(node, deep)
        except _CONVERSION_ERRORS as e:
            kind = node.tag.rpartition(":")[2]
            raise yaml.constructor.ConstructorError(None, None, f"not a valid {kind} ({e})", node.start_mark) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML file (empty: ``{}``); its top-level keys are names, so strings."""
    path = Path(path)
    data = _read_file(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of key: value, got {type(data).__name__}.")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{path}: the key {shorten(repr(key))} must be a name (a string).")
    return data


def _read_file(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist.")
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)  # no more than one byte past the limit, whatever the file
    except OSError as e:
        raise ConfigError(f"cannot read '{path}': {e.strerror}.") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"'{path}' is larger than {MAX_FILE_BYTES:,} bytes, too large for a YAML file of settings.")
    try:
        return _load(data)
    except _Refused as e:
        where = f"{path}:{e.at[0]}:{e.at[1]}" if e.at else str(path)
        raise ConfigError(f"{where}: {e.problem}") from None


def parse_yaml_value(raw: str, key: str) -> Any:
    """The YAML value ``raw`` of ``key`` on the command line (``key=raw``), safe and bounded."""
    pair = shorten(f"{key}={raw}")
    try:
        data = raw.encode("utf-8")
    except UnicodeEncodeError as e:  # argv bytes that are not UTF-8 arrive as lone surrogates
        raise ConfigError(f"{pair}: the value is not UTF-8 text (character {e.start + 1}).") from None
    if len(data) > MAX_VALUE_BYTES:
        raise ConfigError(f"{pair}: the value is larger than {MAX_VALUE_BYTES:,} bytes; put it in a --config file.")
    try:
        return _load(data)
    except _Refused as e:
        where = f" (at {e.at[0]}:{e.at[1]} of the value)" if e.at else ""
        raise ConfigError(f"{pair}: {e.problem}{where}") from None


def _load(data: bytes) -> Any:
    """The one document in ``data``, checked before it is built; _Refused for any problem."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Refused(f"not UTF-8 text ({e.reason})", _position(data[: e.start].decode("utf-8"))) from None
    bad = yaml.reader.Reader.NON_PRINTABLE.search(text)  # PyYAML's own test, here to say where
    if bad:
        raise _Refused(f"YAML does not allow the character {bad.group()!r}", _position(text[: bad.start()]))
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:  # an empty document, or comments only
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        raise _Refused(_problem(e), _mark(e.problem_mark or e.context_mark)) from None
    except yaml.YAMLError as e:
        raise _Refused(str(e).splitlines()[0], None) from None
    except RecursionError:  # PyYAML's pure-Python composer recurses once per level
        raise _Refused(f"nested more than {MAX_DEPTH} levels deep", None) from None
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph that expands (each alias replaced by a copy of the node it names) beyond
    what the document writes by more than ``MAX_ALIAS_NODES`` nodes or ``MAX_ALIAS_CHARS``
    characters of scalar text, deeper than ``MAX_DEPTH``, or without end (an alias inside the node
    it names). Each list and mapping is measured once, after what it holds: work and memory grow
    with the document, not with its expansion. A scalar is measured where it stands, so only lists
    and mappings are visited; its text counts as written once, however many aliases repeat it."""
    sizes: dict[int, tuple[int, int]] = {}  # id(list or mapping) -> (nodes, characters) in its expansion
    depths: dict[int, int] = {}
    opened: set[int] = set()
    texts: set[int] = set()  # id(scalar) of the scalars whose text is counted in written_chars
    written_nodes = written_chars = 0  # measured so far: each list and mapping once, each scalar's text once
    # (node, None) to open a node; (node, (its lists and mappings, its scalars)) to measure it
    stack: list[tuple[yaml.Node, tuple[list[yaml.Node], list[yaml.ScalarNode]] | None]] = [(root, None)]
    while stack:
        node, inside = stack.pop()
        key = id(node)
        if inside is None:
            if key in sizes:  # reached through a second alias
                continue
            if key in opened:  # open still, so it holds itself
                raise _refusal(node, "an alias inside this node refers to the node itself")
            opened.add(key)
            children = _children(node)
            nested = [child for child in children if not isinstance(child, yaml.ScalarNode)]
            scalars = [child for child in children if isinstance(child, yaml.ScalarNode)]
            stack.append((node, (nested, scalars)))
            stack.extend((child, None) for child in nested if id(child) not in sizes)
            continue
        nested, scalars = inside
        written_nodes += 1 + len(scalars)
        for scalar in scalars:
            if id(scalar) not in texts:
                texts.add(id(scalar))
                written_chars += len(scalar.value)
        nodes = 1 + len(scalars) + sum(sizes[id(child)][0] for child in nested)
        chars = sum(len(scalar.value) for scalar in scalars) + sum(sizes[id(child)][1] for child in nested)
        sizes[key] = nodes, chars
        depths[key] = 1 + max((depths[id(child)] for child in nested), default=1 if scalars else 0)
        # all this node holds is measured by now: what the document does not spell out came from aliases
        if nodes > written_nodes + MAX_ALIAS_NODES:
            raise _refusal(node, f"aliases here expand to more than {MAX_ALIAS_NODES:,} nodes, beyond what shoal reads")
        if chars > written_chars + MAX_ALIAS_CHARS:
            raise _refusal(
                node, f"aliases here repeat more than {MAX_ALIAS_CHARS:,} characters of text, beyond what shoal reads"
            )
        if depths[key] > MAX_DEPTH:
            raise _refusal(node, f"nested more than {MAX_DEPTH} levels deep")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _refusal(node: yaml.Node, problem: str) -> yaml.composer.ComposerError:
    return yaml.composer.ComposerError(None, None, problem, node.start_mark)


def _problem(error: yaml.MarkedYAMLError) -> str:
    """What the parser or constructor found wrong, with what it was reading when that began
    elsewhere (``while parsing a flow sequence that starts at 2:15``)."""
    problem = error.problem or error.context or "not valid YAML"
    start, at = _mark(error.context_mark), _mark(error.problem_mark)
    if error.problem and error.context and start and start != at:
        problem += f" ({error.context} that starts at {start[0]}:{start[1]})"
    return problem


def _mark(mark: yaml.Mark | None) -> tuple[int, int] | None:
    return (mark.line + 1, mark.column + 1) if mark is not None else None


def _position(before: str) -> tuple[int, int]:
    """(line, column) from 1 of the character after ``before``."""
    return before.count("\n") + 1, len(before) - before.rfind("\n")
