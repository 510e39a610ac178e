"""``scheduler: {type: pbt, ...}``: population-based training (Jaderberg et al. 2017) over an
experiment's trials, on Ray Tune and without it alike.

At each multiple of ``perturbation_interval`` of ``time_attr``, a trial writes a checkpoint to
``<trial>/pbt/point_<k>`` and its metric to the population's book,
``OUT/<experiment>/pbt_population.json`` (under a file lock, as successive halving's rungs). If the
metric is in the worst ``quantile_fraction`` of those the trials had at that point (as Tune counts
them: at least one of two, at most half), the trial *exploits* one of the best: it takes that
trial's learned state (weights, optimizers, observation statistics) from its checkpoint there, and
*explores* from that trial's values: each searched value is redrawn from its space with
``resample_probability``, else moved (a number times 0.8 or 1.2, within its range; a list's value
to its neighbour). It then trains on from its own counters and episodes with the new values, which
its later checkpoints keep. The checkpoints at a point are deleted once every trial has passed it.
"""

from __future__ import annotations

import math
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shoal.algos.off_policy import OffPolicyAlgorithm
from shoal.buffers.replay import tensor_layout
from shoal.errors import ConfigError, warn
from shoal.experiments.books import Reading, locked_json
from shoal.experiments.spec import Path_, Population, Space, param_name
from shoal.models.sde import StateDependentNoise
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
    ``resample`` (or when it is not one of its list's values), else a number times 0.8 or 1.2
    (within ``[low, high]``; an int stays an int) or a list's value moved to a neighbour (held at
    the ends)."""
    out = dict(params)
    for path, space in spaces:
        name = param_name(path)
        listed = space.kind in ("grid_search", "choice")
        if rng.random() < resample or (listed and params[name] not in space.values):
            out[name] = space.values[int(rng.integers(len(space.values)))] if listed else space.sample(rng)
        elif listed:
            index = space.values.index(params[name]) + (1 if rng.random() < 0.5 else -1)
            out[name] = space.values[min(max(index, 0), len(space.values) - 1)]
        else:
            low, high = space.values
            moved = float(np.clip(params[name] * (0.8 if rng.random() < 0.5 else 1.2), low, high))
            out[name] = min(round(moved), high - 1) if space.kind == "randint" else moved
    return out


def movers(arrived: int, fraction: float) -> int:
    """How many of ``arrived`` trials at a point are the worst that move (and the best they move
    to): ``fraction`` of them rounded up, at most half, none of one trial (Tune's rule)."""
    return 0 if arrived < 2 else min(math.ceil(arrived * fraction), arrived // 2)


def shapes(trainer: Trainer) -> str:
    """A digest of the names, shapes and dtypes of the trainer's learned state: trials whose
    digests differ cannot take each other's state."""
    return tensor_layout(trainer.algorithm.state_dict() | {"replay": None})


class PopulationBook:
    """One trial's view of the population's book: records its metric and checkpoint at each
    perturbation point, and says when and whom to exploit. ``members``: the experiment's trials
    (entries of others, left by an earlier version of the experiment, are ignored)."""

    def __init__(
        self, population: Population, spaces: list[tuple[Path_, Space]], path: Path, trial: str, members: list[str]
    ):
        self.population, self.spaces, self.path, self.trial = population, spaces, path, trial
        self.members = set(members)
        self.time_attr = population.time_attr
        self.reading = Reading("scheduler", population.metric, population.time_attr)
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
        if (reading := self.reading(result)) is None:
            return None
        progress, value = reading
        k = int(progress // p.perturbation_interval)
        if k <= self.passed:
            return None
        self.passed = k
        own = trainer.save(self.path.parent / self.trial / POINTS / f"point_{k}")
        entry = {"score": value if p.mode == "max" else -value, "checkpoint": str(own), "params": self.params}
        with locked_json(self.path, {}) as book:
            there = book.setdefault(str(k), {})
            there[self.trial] = entry | {"shapes": shapes(trainer)}
            there = {name: e for name, e in there.items() if name in self.members}
            self._forget_passed(book)
        self._check_shapes(there)
        arrivals = list(there)  # worst first; among equal scores the later arrival counts as worse
        ranked = sorted(arrivals, key=lambda name: (there[name]["score"], -arrivals.index(name)))
        cut = movers(len(ranked), p.quantile_fraction)
        if self.trial not in ranked[:cut]:
            return None
        rng = np.random.default_rng([zlib.crc32(self.trial.encode()), k])
        donor = ranked[-cut:][int(rng.integers(cut))]
        checkpoint = Path(there[donor]["checkpoint"])
        if not checkpoint.is_dir():  # deleted with its run since: no move this time
            warn(f"population-based training: {donor}'s checkpoint '{checkpoint}' is gone; {self.trial} goes on.")
            return None
        new = explore(there[donor]["params"], self.spaces, p.resample_probability, rng)
        return Exploit(k * p.perturbation_interval, own, donor, checkpoint, new)

    def _check_shapes(self, there: dict[str, Any]) -> None:
        mine = there[self.trial]
        for name, other in there.items():
            if other.get("shapes") != mine["shapes"]:
                differ = sorted(k for k in mine["params"] if mine["params"][k] != other["params"].get(k))
                raise ConfigError(
                    f"population-based training: trials {self.trial} and {name} have networks of different shapes "
                    f"(their values differ in {', '.join(differ) or 'nothing searched'}), so neither can take the "
                    f"other's state; search only values that keep the shapes (not normalize_obs, a model's settings "
                    f"or the env)."
                )

    def _forget_passed(self, book: dict[str, Any]) -> None:
        """Delete the checkpoints at the points every trial has passed: no trial can move to them."""
        reached = [max((int(k) for k, there in book.items() if name in there), default=0) for name in self.members]
        for k in [int(k) for k in book if int(k) < min(reached)]:
            for entry in book.pop(str(k)).values():
                shutil.rmtree(entry["checkpoint"], ignore_errors=True)


def take_learned_state(trainer: Trainer, checkpoint: Path, before: Trainer | None = None) -> None:
    """Load the learned state (weights, optimizers, normalization statistics) of another trial's
    ``checkpoint`` into ``trainer``, whose counters, episodes and config stay its own. A replay
    learner keeps the buffer ``before`` (this trial as it reached the point) had, which goes on
    from its own envs, unless the move changed the buffer's layout (a searched ``buffer_size``,
    ``prioritized_replay``, a recurrent learner's sequence length). Then it holds the donor's
    buffer when the donor's checkpoint has one that fits, else it starts empty and refills for
    ``learning_starts`` env steps before learning again."""
    state, _ = ckpt.read_checkpoint(checkpoint)
    learned = state["algorithm"]
    replay = trainer.algorithm.replay if isinstance(trainer.algorithm, OffPolicyAlgorithm) else None
    old = None if before is None else before.algorithm
    own = old.replay.state_dict() if replay is not None and isinstance(old, OffPolicyAlgorithm) else None
    if replay is not None:
        own = own if own is not None and replay.fits(own) else None
        theirs = learned.get("replay")
        if own is not None or (theirs is not None and not replay.fits(theirs)):
            learned = learned | {"replay": None}  # not copied in only to be replaced, nor to warn
    # gSDE's count of collections counts this trial's own, as its envs' carried noise matrices
    # know it: with the donor's, one collection behind, they would not be drawn again (with the
    # donor's std) at the next collection
    counts = [
        (noise, noise.epoch.clone())
        for policy in trainer.algorithm.policies.values()
        for noise in policy.modules()
        if isinstance(noise, StateDependentNoise)
    ]
    try:
        trainer.algorithm.load_state_dict(learned)
    except (RuntimeError, KeyError, ValueError) as e:
        raise ConfigError(f"population-based training: '{checkpoint}' does not fit this trial: {e}") from None
    for noise, count in counts:
        noise.epoch.copy_(count)
    if replay is not None and own is not None:
        replay.load_state_dict(own)
    elif replay is not None and learned.get("replay") is not None:
        replay.unlink()  # the donor's buffer: its rows do not go on into this trial's envs
