"""``scheduler: {type: pbt, ...}``: population-based training (Jaderberg et al. 2017) over an
experiment's trials, on Ray Tune and without it alike.

At each multiple of ``perturbation_interval`` of ``time_attr``, a trial writes a checkpoint to
``<trial>/pbt/point_<k>`` and its metric to the population's book,
``OUT/<experiment>/pbt_population.json`` (under a file lock, as successive halving's rungs). If the
metric is in the worst ``quantile_fraction`` of those the trials had at that point, the trial
*exploits* one of the best: it takes that trial's learned state (weights, optimizer, observation
statistics) from its checkpoint there, and *explores* from that trial's values: each searched value
is redrawn from its space with ``resample_probability``, else moved (a number times 0.8 or 1.2,
within its range; a list's value to its neighbour). It then trains on from its own counters and
episodes with the new values, which its later checkpoints keep.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shoal.errors import ConfigError
from shoal.experiments.spec import Path_, Population, Space, param_name
from shoal.files import write_atomic
from shoal.train import checkpoint as ckpt

if TYPE_CHECKING:
    from shoal.train.trainer import Trainer

BOOK = "pbt_population.json"  # in OUT/<experiment>/
POINTS = "pbt"  # in a trial's directory: its checkpoint at each perturbation point


@dataclass
class Exploit:
    """A trial's move at a perturbation point: from its ``own`` checkpoint there, train on with
    ``donor``'s learned state (from the donor's ``checkpoint`` there) and ``params``."""

    point: float
    own: Path
    donor: str
    checkpoint: Path
    params: dict[str, Any]


def explore(
    params: dict[str, Any], spaces: list[tuple[Path_, Space]], resample: float, rng: np.random.Generator
) -> dict[str, Any]:
    """``params`` (searched values by name) perturbed: each redrawn from its space with probability
    ``resample``, else a number times 0.8 or 1.2 (within ``[low, high]``; an int stays an int) or a
    list's value moved to a neighbour (held at the ends)."""
    out = dict(params)
    for path, space in spaces:
        name = param_name(path)
        if rng.random() < resample:
            out[name] = space.sample(rng) if space.kind != "grid_search" else _pick(space.values, rng)
        elif space.kind in ("grid_search", "choice"):
            index = space.values.index(params[name]) + (1 if rng.random() < 0.5 else -1)
            out[name] = space.values[min(max(index, 0), len(space.values) - 1)]
        else:
            low, high = space.values
            moved = float(np.clip(params[name] * (0.8 if rng.random() < 0.5 else 1.2), low, high))
            out[name] = min(round(moved), high - 1) if space.kind == "randint" else moved
    return out


def _pick(values: list[Any], rng: np.random.Generator) -> Any:
    return values[int(rng.integers(len(values)))]


class PopulationBook:
    """One trial's view of the population's book: records its metric and checkpoint at each
    perturbation point, and says when and whom to exploit."""

    def __init__(self, population: Population, spaces: list[tuple[Path_, Space]], path: Path, trial: str):
        self.population, self.spaces, self.path, self.trial = population, spaces, path, trial
        self.time_attr = population.time_attr
        self.params: dict[str, Any] = {}  # the trial's searched values now
        self.passed = 0  # the last point the trial reached

    def point_of(self, trainer: Trainer) -> int:
        """The last perturbation point ``trainer`` has reached (0: none yet)."""
        progress = {"timesteps_total": trainer.timesteps_total, "training_iteration": trainer.iteration}
        return int(progress.get(self.time_attr, trainer.time_total_s) // self.population.perturbation_interval)

    def at_point(self, trainer: Trainer, result: dict[str, Any]) -> Exploit | None:
        """Called with each result: at a new perturbation point, the trial's checkpoint is written
        there and recorded in the book with its metric, and the exploit is returned if the trial is
        among the worst there (None otherwise, or before the first point, or without the metric)."""
        p = self.population
        progress, value = result.get(p.time_attr), result.get(p.metric)
        if progress is None or not isinstance(value, (int, float)) or np.isnan(value):
            return None
        k = int(progress // p.perturbation_interval)
        if k <= self.passed:
            return None
        self.passed = k
        own = trainer.save(self.path.parent / self.trial / POINTS / f"point_{k}")
        score = float(value) if p.mode == "max" else -float(value)
        with self._locked() as book:
            there = book.setdefault(str(k), {})
            there[self.trial] = {"score": score, "checkpoint": str(own), "params": self.params}
        arrivals = list(there)  # worst first; among equal scores the later arrival counts as worse
        ranked = sorted(arrivals, key=lambda name: (there[name]["score"], -arrivals.index(name)))
        cut = int(len(ranked) * p.quantile_fraction)
        if cut == 0 or self.trial not in ranked[:cut]:
            return None
        rng = np.random.default_rng([zlib.crc32(self.trial.encode()), k])
        donor = ranked[-cut:][int(rng.integers(cut))]
        new = explore(there[donor]["params"], self.spaces, p.resample_probability, rng)
        return Exploit(k * p.perturbation_interval, own, donor, Path(there[donor]["checkpoint"]), new)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            book = json.loads(self.path.read_text()) if self.path.is_file() else {}
            yield book
            write_atomic(self.path, json.dumps(book, indent=1))


def take_learned_state(trainer: Trainer, checkpoint: Path) -> None:
    """Load the learned state (weights, optimizers, normalization statistics) of another trial's
    ``checkpoint`` into ``trainer``, whose counters, episodes and config stay its own."""
    state, _ = ckpt.read_checkpoint(checkpoint)
    try:
        trainer.algorithm.load_state_dict(state["algorithm"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise ConfigError(f"population-based training: '{checkpoint}' does not fit this trial: {e}") from None
