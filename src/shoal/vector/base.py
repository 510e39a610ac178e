"""The flat agent batch: the one contract every env backend fulfils.

A backend steps ``num_envs`` environments and shows them as ``num_rows`` agent rows (one per env
for single-agent Gymnasium). Its fields are preallocated tensors that share memory with numpy
arrays the backend writes in place; the collector reads them without copies.

Protocol: ``reset(seed)`` (one int for all envs, or one per env), then ``recv()`` once per group
to get each group's first batch, then repeat ``send(actions, batch)`` and ``batch = recv()``. A
backend steps its envs in ``async_factor`` fixed groups; ``recv()`` returns whichever group finished first, and
``batch.rows`` (a slice, so the batch is a view of the shared arrays) and ``batch.env_id`` say
which agent rows and envs it covers. Synchronous backends have one group covering every row.

Autoreset: after a done step the env is reset at once (``same_step``): ``obs`` holds the first
observation of the next episode and, for truncated rows, ``final_obs`` holds the true last
observation so the learner can bootstrap from it. Gymnasium vector envs in ``next_step`` mode
instead return the final observation and reset on the following step; that following step is
not a transition, and the backend marks its rows ``valid=False`` so every loss skips them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch

from shoal.envs.snapshot import env_state, fits, load_env_state
from shoal.envs.spaces import ActionSpec, ObsSpec
from shoal.errors import ConfigError, EnvError


class EnvStepError(EnvError):
    """An env raised inside reset() or step(); ``env_id`` says which one."""

    def __init__(self, message: str, env_id: int):
        super().__init__(message)
        self.env_id = env_id

    def __reduce__(self) -> tuple[type[EnvStepError], tuple[str, int]]:
        """Pickled with its env id (Ray sends it from an env actor to the worker)."""
        return type(self), (str(self), self.env_id)


@dataclass
class StepBatch:
    """Views of a backend's buffers. The same object is returned by every ``recv()``."""

    obs: torch.Tensor  # [A, *obs_shape]
    reward: torch.Tensor  # [A] float32
    terminated: torch.Tensor  # [A] bool
    truncated: torch.Tensor  # [A] bool
    valid: torch.Tensor  # [A] bool: False where this step was a next-step reset, not a transition
    final_obs: torch.Tensor  # [A, *obs_shape]: last obs of rows truncated this step (same_step mode)
    env_id: torch.Tensor  # [A] int64
    agent_id: torch.Tensor  # [A] int64: the row's agent slot within its env
    action_mask: torch.Tensor | None  # [A, n] bool, True = allowed; None when no env masks actions
    state: torch.Tensor | None  # [A, S]: the env's global state() on each of its rows, when asked for
    final_state: torch.Tensor | None  # [A, S]: state() before an autoreset (bootstrapping truncations)
    info: torch.Tensor | None  # [A, K] float32: the step's values of the K ``info_keys`` (nan where absent)
    env_done: torch.Tensor | None  # [A] bool: the row's env ended its episode this step (turn-based envs only)
    rows: slice  # agent rows this batch covers


Seed = int | Sequence[int] | None
"""What ``reset`` takes: one int (env ``i`` gets ``seed + i``), one int per env of the backend, or
None (unseeded)."""
Buffers = dict[str, npt.NDArray[Any]]  # the flat-batch arrays by field name, [rows, ...] each
Allocator = Callable[[tuple[int, ...], npt.DTypeLike], npt.NDArray[Any]]  # (shape, dtype) -> zeroed array


def mixed_seed(*parts: int) -> int:
    """One well-mixed 32-bit seed from several numbers (a run's seed, a counter, an id...)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators, which envs and policies may draw from."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def env_seeds(seed: Seed, num_envs: int, first_env_id: int, name: str) -> list[int | None]:
    """The reset seed of each of ``num_envs`` envs: ``seed + first_env_id + i`` for an int (each env
    its own stream), the list as given for a list (``num_envs`` of them, e.g. the same seed for a
    group of envs that must start alike), None for each when None."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, int):
        return [seed + first_env_id + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(
            f"env '{name}': reset(seed) got {len(seeds)} seeds ({seeds[:4]}{'...' if len(seeds) > 4 else ''}); "
            f"a list of seeds must hold one int per env ({num_envs})."
        )
    return [int(s) for s in seeds]


def allocate_buffers(
    num_rows: int,
    obs: ObsSpec,
    alloc: Allocator,
    mask_size: int = 0,
    state_size: int = 0,
    info_size: int = 0,
    turn_based: bool = False,
) -> Buffers:
    """The flat-batch arrays of ``num_rows`` rows, each made by ``alloc(shape, dtype)`` (zeroed);
    with ``mask_size``, also the ``[rows, mask_size]`` action mask; with ``state_size``, the env
    state (and its value before an autoreset) on every row; with ``info_size``, the step's values
    of that many ``info_keys``; ``turn_based``, where each env's episode ended (``env_done``)."""
    extra = {"action_mask": alloc((num_rows, mask_size), np.bool_)} if mask_size else {}
    if state_size:
        extra |= {key: alloc((num_rows, state_size), np.float32) for key in ("state", "final_state")}
    if info_size:
        extra["info"] = alloc((num_rows, info_size), np.float32)
    if turn_based:  # a waiting agent's row is not valid either, so the flags cannot tell where a game ended
        extra["env_done"] = alloc((num_rows,), np.bool_)
    return extra | {
        "obs": alloc((num_rows, *obs.shape), obs.dtype),
        "final_obs": alloc((num_rows, *obs.shape), obs.dtype),
        "reward": alloc((num_rows,), np.float32),
        "terminated": alloc((num_rows,), np.bool_),
        "truncated": alloc((num_rows,), np.bool_),
        "valid": alloc((num_rows,), np.bool_),
    }


def batch_view(buffers: Buffers, rows: slice, env_id: torch.Tensor, agent_id: torch.Tensor) -> StepBatch:
    """A StepBatch whose tensors share memory with ``buffers[rows]``."""
    optional = {
        key: None if key not in buffers else torch.from_numpy(buffers[key][rows])
        for key in ("action_mask", "state", "final_state", "info", "env_done")
    }
    return StepBatch(
        obs=torch.from_numpy(buffers["obs"][rows]),
        reward=torch.from_numpy(buffers["reward"][rows]),
        terminated=torch.from_numpy(buffers["terminated"][rows]),
        truncated=torch.from_numpy(buffers["truncated"][rows]),
        valid=torch.from_numpy(buffers["valid"][rows]),
        final_obs=torch.from_numpy(buffers["final_obs"][rows]),
        env_id=env_id,
        agent_id=agent_id,
        rows=rows,
        **optional,
    )


class VecBackend:
    """Shared buffers and bookkeeping; subclasses implement ``reset`` and ``send``."""

    autoreset: Literal["same_step", "next_step"] = "same_step"
    async_factor: int = 1
    agents: list[str] | None = None  # named agents: each row slot's name; None: one agent, or anonymous native ones
    turn_based = False  # agents take turns (see EnvInfo.turn_based); set when the buffers have ``env_done``
    unsaved_state: str | None = None  # why env state cannot be checkpointed (a resume starts new episodes)
    clip_actions, normalize_actions = True, False  # see configure_actions
    logs_actions = False  # some rows' actions are chosen by the env's side (external clients): see ``logged``

    def __init__(
        self,
        name: str,
        num_envs: int,
        obs: ObsSpec,
        act: ActionSpec,
        rows_per_env: int = 1,
        buffers: Buffers | None = None,
        first_env_id: int = 0,
        mask_size: int = 0,
        state_size: int = 0,
        info_size: int = 0,
        turn_based: bool = False,
    ):
        self.name = name
        self.first_env_id = first_env_id
        self.num_envs = num_envs
        self.rows_per_env = rows_per_env
        self.num_rows = num_envs * rows_per_env
        self.obs_spec, self.act_spec = obs, act
        if buffers is None:
            buffers = allocate_buffers(self.num_rows, obs, np.zeros, mask_size, state_size, info_size, turn_based)
        self._buffers = buffers
        if "env_done" in buffers:
            self.turn_based = True
        self._obs, self._final_obs = buffers["obs"], buffers["final_obs"]
        self._reward, self._terminated, self._truncated = buffers["reward"], buffers["terminated"], buffers["truncated"]
        self._valid = buffers["valid"]
        self._valid[:] = True
        env_id = np.repeat(np.arange(first_env_id, first_env_id + num_envs), rows_per_env)
        agent_id = np.tile(np.arange(rows_per_env), num_envs)
        self.batch = batch_view(buffers, slice(0, self.num_rows), torch.from_numpy(env_id), torch.from_numpy(agent_id))
        # Rows whose episode ended in the last send(), mapped to their last step's info (only
        # non-empty infos travel): the tracker turns their numbers into custom metrics.
        self.final_infos: dict[int, dict[str, Any]] = {}
        self.restarted: list[tuple[int, str]] = []
        """(env id, error) of each env made anew after it failed (``restart_failed_envs``) since the
        trainer last took them."""
        self.worker_restarts: list[str] = []
        """Why each env worker was started anew (``recreate_failed_workers``) since the trainer last took them."""
        self.failed_rows: list[int] = []
        """Rows whose step under way failed with their worker: the collector gives them the observation
        the step was taken from as the final one, then empties this."""
        space = act.space
        if isinstance(space, gym.spaces.Box):  # continuous actions
            self._act_low = torch.as_tensor(space.low, dtype=torch.float32)
            self._act_high = torch.as_tensor(space.high, dtype=torch.float32)

    def _failed(self, index: int, phase: str, error: Exception) -> EnvStepError:
        """The error for env ``index`` of this backend raising in ``reset`` or ``step``."""
        env_id = self.first_env_id + index
        return EnvStepError(
            f"env '{self.name}' (env {env_id}) raised {type(error).__name__} in {phase}(): {error}", env_id
        )

    def configure_actions(self, clip: bool = True, normalize: bool = False) -> None:
        """How the policies' Box actions become the env's: ``normalize`` reads them as unit actions
        in [-1, 1] and rescales them to the bounds; ``clip`` first clips them to the bounds (to
        [-1, 1] when normalized). Other action spaces are unaffected."""
        space = self.act_spec.space
        if (
            normalize
            and isinstance(space, gym.spaces.Box)
            and not (space.is_bounded() and (space.high > space.low).all())
        ):
            raise ConfigError(
                f"normalize_actions=True rescales [-1, 1] to the action bounds of env '{self.name}', but its action "
                f"space {space} has infinite or zero-width bounds; leave normalize_actions off for it."
            )
        self.clip_actions, self.normalize_actions = clip, normalize
        if normalize and isinstance(space, gym.spaces.Box):
            self._act_center = (self._act_high + self._act_low) / 2  # read only when normalizing
            self._act_half_range = (self._act_high - self._act_low) / 2

    def bounded_actions(self, actions: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Continuous actions as the env takes them (see ``configure_actions``), into ``out`` when
        given. The policy's own sample stays in the rollout, so log-probabilities match what it drew."""
        if self.act_spec.kind != "continuous":
            return actions if out is None else out.copy_(actions)
        if self.normalize_actions:
            if not self.clip_actions:
                return torch.addcmul(self._act_center, actions, self._act_half_range, out=out)
            scaled = torch.addcmul(self._act_center, actions.clamp(-1.0, 1.0), self._act_half_range, out=out)
            return scaled.clamp_(self._act_low, self._act_high)  # float rounding can land one step outside
        if self.clip_actions:
            return torch.clamp(actions, self._act_low, self._act_high, out=out)
        return actions if out is None else out.copy_(actions)

    def env_actions(self, actions: torch.Tensor) -> npt.NDArray[Any]:
        """Actions as the env wants them (``bounded_actions``), as an array."""
        return self.bounded_actions(actions).numpy()

    def reset(self, seed: Seed = None) -> None:
        """Reset every env: ``seed`` an int (env ``i`` of the backend gets ``seed + i``), a list of
        one int per env, or None."""
        raise NotImplementedError

    def recv(self) -> StepBatch:
        return self.batch

    def send(self, actions: torch.Tensor, batch: StepBatch | None = None) -> None:
        raise NotImplementedError

    def logged(self, actions: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """With ``logs_actions``: ``actions`` with the rows whose env chose its own action replaced
        by that action, which is what the step takes and the rollout stores."""
        return actions

    # ----- checkpoints: where every env is, so a resumed run continues the same episodes -----
    def _snapshot_envs(self) -> list[Any]:
        """The env objects whose attributes hold this backend's env state."""
        raise NotImplementedError

    def _snapshot_buffers(self) -> Buffers:
        return dict(self._buffers)

    def state_dict(self) -> dict[str, Any]:
        if self.unsaved_state:
            return {"exact": False, "reason": self.unsaved_state, "envs": [], "buffers": {}}
        envs = [env_state(env) for env in self._snapshot_envs()]
        exact = all(s["exact"] for s in envs)
        return {
            "exact": exact,
            "reason": next((s["reason"] for s in envs if not s["exact"]), ""),
            "envs": envs if exact else [],
            "buffers": {k: torch.from_numpy(v.copy()) for k, v in self._snapshot_buffers().items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Put every env back where it was; returns False (and changes nothing) for an inexact snapshot."""
        if not state["exact"]:
            return False
        envs = self._snapshot_envs()
        if len(envs) != len(state["envs"]) or not all(fits(env, saved) for env, saved in zip(envs, state["envs"])):
            state["reason"] = "its wrappers differ from the checkpoint's, e.g. horizon or no_done_at_end changed"
            return False
        for env, saved in zip(envs, state["envs"], strict=True):
            load_env_state(env, saved)
        for key, buf in self._snapshot_buffers().items():
            buf[...] = state["buffers"][key].numpy()
        return True

    def close(self) -> None:
        pass
