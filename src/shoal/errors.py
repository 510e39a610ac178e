"""Errors shoal raises on bad input. Each message names the bad value and what is allowed."""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Iterable


class ShoalError(ValueError):
    """Base class: a problem with what the user asked for, not a bug in shoal."""

    def add_line(self, line: str) -> None:
        """Append ``line`` to the message: what was done about the error, or what to do next."""
        self.args = (f"{self.args[0]}\n{line}", *self.args[1:]) if self.args else (line,)


class ConfigError(ShoalError):
    """A config key or value that cannot be used."""


class EnvError(ShoalError):
    """An environment that cannot be created or returned something outside its contract."""


class OutputError(ShoalError):
    """A file of the run could not be written (a full disk, a read-only mount, no permission); the
    message names the file, the free space, the checkpoint kept and the command that resumes."""


class TrainingDiverged(ShoalError):
    """An update produced a non-finite loss, gradient, parameter or action: the run stops before
    the non-finite values reach the envs or a checkpoint. ``policy`` names the policy (None:
    not known, e.g. an optimizer of an algorithm of the user's that was given no owner)."""

    def __init__(self, message: str, policy: str | None = None):
        super().__init__(message)
        self.policy = policy


class RunInterrupted(KeyboardInterrupt):
    """A second Ctrl-C stopped the run at once; the message says what was kept and how to go on."""


class RequestError(Exception):
    """A request to the policy server that is refused: ``status`` is the HTTP status it is answered
    with, and ``retry_after_s`` (when set) says the same request may succeed that much later. Not a
    ShoalError: the server answers it, the run goes on."""

    def __init__(self, status: int, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.status, self.retry_after_s = status, retry_after_s


class ShoalWarning(UserWarning):
    """Something the user may want to change, which does not stop the run."""


# modules a warning is not attributed to: shoal's own, and torch's decorators it runs under
_INTERNAL = ("shoal", "torch", "contextlib")


def warn(message: str, category: type[Warning] = ShoalWarning) -> None:
    """``warnings.warn`` attributed to the first caller outside shoal (and torch, whose decorators
    wrap some of shoal's functions), so that the file and line it shows are the user's code."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] in _INTERNAL:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def nearest_keys(word: str, choices: Iterable[str], n: int = 3) -> str:
    """' Did you mean 'x'? Nearest keys: 'x', 'y', 'z'.': the ``n`` choices closest to ``word``,
    however far, where a list of every key would bury the one meant."""
    choices = sorted(set(choices))
    ranked = sorted(choices, key=lambda c: -difflib.SequenceMatcher(None, word, c).ratio())[:n]
    return f"{did_you_mean(word, choices)} Nearest keys: {', '.join(repr(c) for c in ranked)}."


def shorten(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out: what a user passed (a
    value, a file's text) is quoted in messages, and a message must stay readable whatever its size."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"
