"""``input=DIR``: recorded episodes in place of the envs, for the replay learners.

``DatasetReader`` is a collector that steps no env: it fills the same ``[N, T+1]`` rollout the
envs would, each agent row playing recorded episodes back one after another, so the replay buffer,
n-step returns and every learner read a dataset exactly as they read the envs' steps. A truncated
episode's final observation goes into ``truncations`` as the collector's would. Each row takes its
next episode from one of the inputs, drawn by their mixing weights; each input is read in passes
(epochs), each pass over its episodes in a new random order (seeded by ``seed``), so that the
buffer fills with a sample of the whole dataset from the start. Episodes are read one at a time,
so a dataset larger than memory trains (the replay buffer keeps the newest ``buffer_size`` steps).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from shoal.collect.truncations import Truncations
from shoal.envs.spaces import EnvInfo
from shoal.offline.minari_files import (
    DatasetError,
    DatasetFile,
    EpisodeArrays,
    dataset_folders,
    owning_policy,
    same_space,
)
from shoal.offline.structured import is_structured
from shoal.offline.writer import stored_spaces


def dataset_inputs(spec: Any) -> dict[str, float]:
    """``input`` as folders (``~`` expanded) and mixing weights: one folder, a list (equal weights)
    or a dict of folder -> weight."""
    if isinstance(spec, str):
        spec = [spec]
    weights = dict.fromkeys(spec, 1.0) if isinstance(spec, list) else dict(spec)
    return {str(Path(path).expanduser()): float(weight) for path, weight in weights.items()}


MAX_OPEN_FILES = 64
"""Dataset files a pass keeps open at once; an input of more opens each file per episode read."""


@dataclass
class Source:
    """One input: its datasets, read in passes."""

    path: Path
    files: list[DatasetFile]
    weight: float

    @property
    def total_steps(self) -> int:
        return sum(f.total_steps for f in self.files)

    def episodes(self, rng: np.random.Generator) -> Iterator[tuple[str, EpisodeArrays]]:
        """(where, episode) for every episode, pass after pass, each pass in a new random order of all
        the episodes of every dataset file (shards interleave: a run's output, whose shards follow
        its training, is not read one stage at a time), read one at a time."""
        counts = [f.total_episodes for f in self.files]
        while True:
            orders = [rng.permutation(n).tolist() for n in counts]
            streams = [iter(zip(order, self._read(f, order))) for order, f in zip(orders, self.files)]
            for f in rng.permutation(np.repeat(np.arange(len(self.files)), counts)).tolist():
                k, episode = next(streams[f])
                yield f"dataset '{self.files[f].folder}' episode_{k}", episode

    def _read(self, file: DatasetFile, order: list[int]) -> Iterator[EpisodeArrays]:
        """``file``'s episodes in ``order``: through one open file, or, with more files than
        ``MAX_OPEN_FILES`` interleaved, opening it for each episode (files stay within the limit)."""
        if len(self.files) <= MAX_OPEN_FILES:
            return file.episodes(order)
        return (episode for k in order for episode in file.episodes([k]))


def open_source(path: Path, weight: float, env: EnvInfo, policy_id: str) -> Source:
    """The datasets at ``path`` for policy ``policy_id``, checked against the env's spaces."""
    if not path.exists():
        raise DatasetError(f"input '{path}' does not exist.")
    folders = dataset_folders(path)
    owner = {f: owning_policy(path, f) for f in folders}
    owners = sorted({o for o in owner.values() if o is not None})
    if policy_id in owners:  # the output of a run with several policies: this policy's own
        folders = [f for f in folders if owner.get(f) == policy_id]
    elif len(owners) > 1:
        raise DatasetError(
            f"input '{path}' holds the datasets of policies {owners}, none named '{policy_id}'; give the folder "
            f"of one of them (e.g. '{path / owners[0]}')."
        )
    if not folders:
        raise DatasetError(f"input '{path}' holds no dataset (no data/metadata.json under it).")
    files = [DatasetFile.open(folder) for folder in folders]
    obs_space, act_space = stored_spaces(env)
    for file in files:
        # a dataset of a Dict, Tuple or discrete space (Minari's) holds the env's own space, flattened
        # as it is read; shoal's own datasets hold what the rollout stores
        structured = is_structured(file.observation_space)
        for key, mine, theirs in (
            ("observation_space", env.obs_spec.space if structured else obs_space, file.observation_space),
            ("action_space", act_space, file.action_space),
        ):
            if not same_space(mine, theirs):
                raise DatasetError(
                    f"dataset '{file.folder / 'metadata.json'}' field '{key}' is {theirs}; env '{env.name}' has "
                    f"{mine}. Train on the env the data was recorded from."
                )
    source = Source(path, files, weight)
    if not source.total_steps:
        raise DatasetError(f"input '{path}' holds no steps ({len(files)} empty dataset(s)).")
    return source


class DatasetReader:
    """The collector of ``input=``: recorded episodes, row by row, into the rollout."""

    def __init__(
        self,
        sources: list[Source],
        env: EnvInfo,
        seed: int,
        gamma: float = 0.99,
        unit_actions: bool = False,
        clip_rewards: bool | float = False,
    ):
        """``unit_actions`` (``normalize_actions``): the policy acts in [-1, 1], so the recorded Box
        actions, which are the env's, are rescaled from its bounds. ``clip_rewards``: the recorded
        rewards, which are the env's, are clipped as the collector clips the envs' (True: to their
        sign; a number c: to [-c, c]), returns to go included."""
        self.sources, self.env, self.gamma, self.clip_rewards = sources, env, gamma, clip_rewards
        space = env.act_spec.space
        self.unit = None
        if unit_actions and isinstance(space, gym.spaces.Box):
            self.unit = ((space.high + space.low) / 2, (space.high - space.low) / 2)
        weights = np.array([s.weight for s in sources])
        self.weights = weights / weights.sum()
        self.rng = np.random.default_rng(seed)
        self.streams = [s.episodes(self.rng) for s in sources]
        self.env_steps = 0
        self.sample_time_s = 0.0
        self.truncations: Truncations | None = None
        self.take_restarts: Any = None  # no envs to restart
        self.current: list[EpisodeArrays | None] = [None] * env.num_rows
        self.returns: list[Any] = [None] * env.num_rows  # each row's episode's returns to go, when asked for
        self.position = np.zeros(env.num_rows, dtype=np.int64)
        self.raw_reward = torch.zeros(0, 0)  # the rollout's rewards (no env: no episode returns read them)

    def reset(self, seed: int | Sequence[int] | None) -> None:
        """Each row starts a new episode at its next collect (the inputs are drawn anew from ``seed``)."""
        self.current = [None] * self.env.num_rows
        if seed is not None:
            self.rng = np.random.default_rng(seed if isinstance(seed, int) else list(seed))
            self.streams = [s.episodes(self.rng) for s in self.sources]

    def _next_episode(self) -> EpisodeArrays:
        k = 0 if len(self.streams) == 1 else int(self.rng.choice(len(self.streams), p=self.weights))
        where, episode = next(self.streams[k])
        check_episode(episode, where, self.env)
        if self.unit is not None:
            center, half_range = self.unit
            episode.actions = ((episode.actions - center) / half_range).astype(np.float32)
        if self.clip_rewards is True:
            episode.rewards = np.sign(episode.rewards)
        elif self.clip_rewards:
            episode.rewards = np.clip(episode.rewards, -self.clip_rewards, self.clip_rewards)
        return episode

    def collect(
        self,
        rollout: TensorDict,
        start_states: list[TensorDict] | None = None,
        until_done: bool = False,
        complete_episodes: int | None = None,
    ) -> int:
        start = time.perf_counter()
        horizon = rollout.batch_size[1] - 1
        obs, action, reward = rollout["obs"], rollout["action"], rollout["reward"]
        self.raw_reward = reward
        term, trunc, first = rollout["terminated"], rollout["truncated"], rollout["first"]
        mask = rollout.get("action_mask", None)
        to_go = rollout.get("return_to_go", None)
        rollout["valid"].fill_(True)
        rollout["policy_id"].zero_()
        first.zero_()
        cut_rows, cut_steps, cut_obs = [], [], []
        for row in range(self.env.num_rows):
            t = 0
            while t <= horizon:
                episode = self.current[row]
                if episode is None or self.position[row] == len(episode):
                    episode = self.current[row] = self._next_episode()
                    self.position[row] = 0
                    if to_go is not None:
                        self.returns[row] = returns_to_go(episode.rewards, self.gamma)
                pos = int(self.position[row])
                first[row, t] = pos == 0
                if t == horizon:  # the last slot: the observation the next rollout starts from
                    obs[row, t] = torch.from_numpy(np.asarray(episode.observations[pos]))
                    if mask is not None:
                        mask[row, t] = _mask(episode, pos, 1)
                    break
                k = min(horizon - t, len(episode) - pos)
                steps = slice(t, t + k)
                obs[row, steps] = torch.from_numpy(np.asarray(episode.observations[pos : pos + k]))
                action[row, steps] = torch.from_numpy(np.asarray(episode.actions[pos : pos + k]))
                reward[row, steps] = torch.from_numpy(np.asarray(episode.rewards[pos : pos + k], dtype=np.float32))
                term[row, steps] = torch.from_numpy(np.asarray(episode.terminations[pos : pos + k], dtype=bool))
                trunc[row, steps] = torch.from_numpy(np.asarray(episode.truncations[pos : pos + k], dtype=bool))
                if mask is not None:
                    mask[row, steps] = _mask(episode, pos, k)
                if to_go is not None:
                    to_go[row, steps] = torch.from_numpy(self.returns[row][pos : pos + k])
                if pos + k == len(episode):  # the episode ends here
                    last = t + k - 1
                    if not term[row, last]:  # an episode cut short counts as truncated
                        trunc[row, last] = True
                        cut_rows.append(row)
                        cut_steps.append(last)
                        cut_obs.append(np.asarray(episode.observations[-1]))
                self.position[row] = pos + k
                t += k
        rollout["done"].copy_(term | trunc)
        self.truncations = self._truncations(cut_rows, cut_steps, cut_obs, obs)
        steps_taken = horizon * self.env.num_envs
        self.env_steps += steps_taken
        self.sample_time_s += time.perf_counter() - start
        return steps_taken

    def _truncations(self, rows: list[int], steps: list[int], final: list[Any], obs: torch.Tensor) -> Truncations:
        if not rows:
            none = torch.zeros(0, dtype=torch.long)
            return Truncations(none, none, obs[:0, 0].clone(), None, [])
        stacked = torch.from_numpy(np.stack(final)).to(obs.dtype)
        return Truncations(torch.tensor(rows), torch.tensor(steps), stacked, None, [])

    def iteration_stats(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"env_steps": self.env_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env_steps = int(state.get("env_steps", 0))


def returns_to_go(rewards: Any, gamma: float) -> Any:
    """Each step's discounted sum of the rewards from it to the episode's end, float32."""
    out = np.empty(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):  # once per episode read, not per minibatch
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out.astype(np.float32)


def _mask(episode: EpisodeArrays, pos: int, k: int) -> torch.Tensor:
    """The recorded action masks of observations ``pos .. pos + k`` (all actions allowed without: a
    dataset recorded without masks, such as a DataCollector's), broadcast into the rollout's slots."""
    recorded = episode.infos.get("action_mask")
    if recorded is None:
        return torch.tensor(True)
    masks = torch.from_numpy(np.asarray(recorded[pos : pos + k], dtype=bool))
    return masks[0] if k == 1 else masks


def check_episode(episode: EpisodeArrays, where: str, env: EnvInfo) -> None:
    """Lengths that agree, numbers that are finite, and observations and actions of the env's
    shapes (and Discrete actions in range), or one message naming the field."""
    n = len(episode.rewards)
    if n == 0:
        raise DatasetError(f"{where} has an episode of no steps.")
    for key in ("actions", "terminations", "truncations"):
        if len(getattr(episode, key)) != n:
            raise DatasetError(f"{where}: field '{key}' has {len(getattr(episode, key))} rows, 'rewards' {n}.")
    if len(episode.observations) != n + 1:
        raise DatasetError(f"{where}: field 'observations' has {len(episode.observations)} rows; expected {n + 1}.")
    for key in ("observations", "actions", "rewards"):
        values = np.asarray(getattr(episode, key))
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            bad = int(np.argwhere(~np.isfinite(values))[0][0])
            raise DatasetError(f"{where}: field '{key}' holds {values.reshape(len(values), -1)[bad]} at step {bad}.")
    obs, act = episode.observations, np.asarray(episode.actions)
    if obs.shape[1:] != env.obs_spec.shape:
        raise DatasetError(
            f"{where}: field 'observations' has rows of shape {obs.shape[1:]}; env '{env.name}' observes "
            f"{env.obs_spec.shape}."
        )
    if act.shape[1:] != env.act_spec.shape:
        raise DatasetError(
            f"{where}: field 'actions' has rows of shape {act.shape[1:]}; env '{env.name}' acts with "
            f"{env.act_spec.shape}."
        )
    space = env.act_spec.space
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        low, high = space.start, space.start + (space.n if isinstance(space, gym.spaces.Discrete) else space.nvec)
        outside = (act.astype(np.int64) != act) | (act < low) | (act >= high)
        if outside.any():
            bad = int(np.argwhere(outside)[0][0])
            raise DatasetError(f"{where}: field 'actions' holds {act[bad]} at step {bad}, outside {space}.")
    elif isinstance(space, gym.spaces.Box):  # the env's actions, within its bounds (give float rounding room)
        low, high = space.low, space.high
        below, above = (
            act < low - 1e-5 * np.maximum(1.0, np.abs(low)),
            act > high + 1e-5 * np.maximum(1.0, np.abs(high)),
        )
        outside = (below | above).reshape(n, -1).any(axis=1)
        if outside.any():
            bad = int(np.flatnonzero(outside)[0])
            raise DatasetError(
                f"{where}: field 'actions' holds {act[bad]} at step {bad}, outside the bounds of {space}: a dataset "
                f"holds the actions the env took."
            )
