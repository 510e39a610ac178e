"""``Algorithm``: what every learning algorithm in shoal is, and what a user writes to add one.

The trainer owns the run (iterations, stop criteria, logging, checkpoints, evaluation); an
algorithm owns the learning: its policies and their networks, optimizers, storage and schedules,
and ``training_step(collector)``, which gathers experience through the collector it is handed
and learns from it. To add one, subclass ``Algorithm``:

    class MyAlgo(shoal.Algorithm):
        name = "MyAlgo"
        config_class = MyConfig                    # shoal.TrainerConfig plus your own keys

        def __init__(self, config, env):
            super().__init__(config, env)          # builds self.policies from model / model_config
            self.buffer = RolloutBuffer(env, config.rollout_capacity, self.extra_fields())
            ...                                    # optimizers, schedules

        def training_step(self, collector) -> dict:
            self.collect(collector, self.buffer.rollout)  # [N, T+1]: obs, action, reward, flags + extras
            ...                                    # learn; return statistics to log

and train it with the unchanged trainer: ``shoal.Trainer(algo=MyAlgo, env="CartPole-v1").learn()``.
``examples/reinforce.py`` is a whole one. The collector stores, besides the env fields, the
per-step ``extras`` the policies' ``act`` returns (the default actor-critic policy gives
``sample_log_prob`` and ``value``). ``Algorithm.collect`` fills the rollout as ``batch_mode``
says and then hands each policy's steps to ``postprocess_trajectory`` and to the callbacks'
``on_postprocess_trajectory``, which may change rewards or add fields before the learner reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol

import torch
from tensordict import TensorDict
from typing_extensions import TypeVar

from shoal.buffers.rollout import FieldSpec
from shoal.config import TrainerConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.models.catalog import build_policy
from shoal.models.policy import Policy

if TYPE_CHECKING:
    from shoal.collect import Truncations

SCALAR: FieldSpec = ((), torch.float32)  # one float per agent step, as every built-in extra

ConfigT = TypeVar("ConfigT", bound=TrainerConfig, default=TrainerConfig)
PolicyT = TypeVar("PolicyT", bound=Policy, default=Policy)


class Collector(Protocol):
    """What an algorithm may ask of the collector it is handed (``shoal.collect.Collector``)."""

    truncations: Truncations | None
    """The last rollout's truncated steps and the true final observation of each (None before the
    first ``collect``)."""
    raw_reward: torch.Tensor
    """``[N, T+1]``: the last rollout's rewards as the env gave them, before scaling and clipping."""

    def collect(
        self,
        rollout: TensorDict,
        start_states: list[TensorDict] | None = None,
        until_done: bool = False,
        complete_episodes: int | None = None,
    ) -> int:
        """Fill the ``[N, T+1]`` rollout in place (env fields and the algorithm's extras), and each
        policy's state at every segment start into ``start_states`` (``[N, K]`` each) when given;
        returns the env steps taken. ``until_done``: each group of envs stops as soon as every env in
        it has ended an episode, and its unfilled steps are padding (``valid`` False).
        ``complete_episodes=T``: every row takes at least T steps and its data ends at an episode
        end; the rest of the storage is padding, and the steps stepped beyond start the next rollout."""
        ...

    def reset(self, seed: int | Sequence[int] | None) -> None:
        """Reset every env: one seed (env ``i`` gets ``seed + i``), one per env, or None; the
        episodes under way are abandoned."""
        ...


@dataclass
class Trajectory:
    """One policy's steps of a finished rollout, as ``postprocess_trajectory`` sees them."""

    policy_id: str
    rollout: TensorDict
    """The whole rollout, ``[N, C+1]`` (every policy's rows; C is ``config.rollout_capacity``):
    change ``reward`` or add fields in place, at ``mask``, and the learner reads them. The
    episode returns the metrics report are counted already, from the env's own rewards."""
    mask: torch.Tensor
    """``[N, C]`` bool: the steps this policy took (padding and other policies' steps are False)."""
    rows_per_env: int
    """Agent rows of each env (1 for single-agent envs)."""

    @property
    def agents(self) -> TensorDict:
        """The rollout as ``[envs, agents, T+1]``: each env's agents side by side at the same steps,
        so a policy's steps can be read with the other agents' of the same env."""
        n, t = self.rollout.batch_size
        return self.rollout.reshape(n // self.rows_per_env, self.rows_per_env, t)


class Statistics:
    """Named diagnostics of minibatch steps, summed on the learner's device and read once, averaged
    (an epoch's minibatches of an on-policy learner, an iteration's steps of a replay learner)."""

    def __init__(self, names: tuple[str, ...], device: torch.device):
        self.names = names
        self.sums = torch.zeros(len(names), device=device)
        self.count = 0

    def reset(self) -> None:
        self.sums.zero_()
        self.count = 0

    def add(self, values: dict[str, torch.Tensor]) -> None:
        self.sums += torch.stack([values[name] for name in self.names])
        self.count += 1

    def mean(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(f"no statistic {name!r}; the step records {self.names}")
        return self.sums[self.names.index(name)] / max(self.count, 1)

    def means(self) -> dict[str, float]:
        return dict(zip(self.names, (self.sums / max(self.count, 1)).tolist()))


class Algorithm(Generic[ConfigT, PolicyT]):
    """Base class of every learning algorithm: it owns its policies, optimizers, storage and
    schedules, and the trainer calls ``training_step(collector)`` once per iteration.

    Subclasses set ``name`` and ``config_class``, build their storage and optimizers in
    ``__init__`` (after ``super().__init__``, which builds ``self.policies``), implement
    ``training_step`` and extend ``state_dict`` / ``load_state_dict`` with their own state.
    ``Algorithm[MyConfig, MyPolicy]`` types ``self.config`` and ``self.policies`` as the config
    class and the policies ``make_policy`` builds.
    """

    name: ClassVar[str] = "Algorithm"
    """Shown in the progress line, run names and checkpoints."""
    config_class: ClassVar[type[TrainerConfig]] = TrainerConfig
    """The config model: ``TrainerConfig`` plus the algorithm's own keys."""
    extras: ClassVar[tuple[str, ...] | None] = None
    """The per-step fields the collector stores from the policies' ``act`` (e.g. PPO's
    ``("sample_log_prob", "value")``); None: all the policies give."""
    extra_specs: ClassVar[dict[str, FieldSpec]] = {}
    """Shape and dtype, ``(shape, dtype)`` per agent step, of each stored extra that is not one
    float per step; the others get ``SCALAR``."""

    def __init__(self, config: ConfigT, env: EnvInfo):
        self.config: ConfigT = config
        self.env = env
        self.progress = 0.0
        """How far the current ``learn()`` call has gone, from 0 to 1: the trainer sets it before each
        ``training_step`` to ``timesteps_total / (timesteps at the call's start + its steps)``, so a
        call ``learn(n)`` made after ``t`` steps goes from ``t / (t + n)`` to 1. Schedules such as
        ``learning_rate`` read it."""
        self.progress_end = 0.0
        """How far the current ``learn()`` call will have gone once this iteration's steps are in
        (1 on its last iteration), for schedules that must reach their end value."""
        self.policy_configs: dict[str, ConfigT] = {pid: config.policy_config(pid) for pid in config.policy_ids}
        """Policy id -> the config with that policy's overrides (``policies``) applied."""
        self.policies: dict[str, PolicyT] = {
            pid: self.make_policy(pid, pc).to(config.device) for pid, pc in self.policy_configs.items()
        }
        """Policy id -> policy, built by ``make_policy`` with the policy's config, in the order of
        ``config.policy_ids`` (a rollout's ``policy_id`` field indexes this order)."""
        for pid, policy in self.policies.items():
            policy.policy_id = pid
        trained = config.policy_ids if config.policies_to_train is None else config.policies_to_train
        self.trained_policy_ids = [pid for pid in config.policy_ids if pid in trained]
        """The ids of the policies that learn (``policies_to_train``; all by default)."""
        self.collected = False
        """Whether ``collect`` has run: ``batch_mode`` and the postprocessing hooks act through it."""
        self.trajectory_hooks: list[Callable[[Trajectory], None]] = []
        """Called after ``postprocess_trajectory`` with each policy's ``Trajectory`` (the trainer adds
        its callbacks' ``on_postprocess_trajectory`` here)."""
        self.rollout_sinks: list[Callable[[TensorDict, Collector], None]] = []
        """Called after each collect with the rollout as the envs gave it (before postprocessing) and
        the collector (its truncations and the env's own rewards); the trainer adds the dataset
        writer of ``output`` here."""

    @classmethod
    def implementation(cls, config: TrainerConfig, env: EnvInfo | None = None) -> type[Algorithm[Any, Any]]:
        """The class that learns with ``config`` on ``env`` (None: not built yet, when only the
        name is asked for): this one, unless the algorithm hands some configurations or envs to a
        class of their own (PPO's segment learner, CQL's Discrete and Box learners)."""
        return cls

    @property
    def steps_per_iteration(self) -> int:
        """Env steps a ``training_step`` collects (``train_batch_size`` unless the algorithm says
        otherwise), which the trainer's ``progress_end`` counts on."""
        steps = self.config.train_batch_size
        assert steps is not None  # filled when the config is validated
        return steps

    def make_policy(self, policy_id: str, config: ConfigT) -> PolicyT:
        """The policy ``policy_id`` (``config`` has its overrides): by default the actor-critic
        that ``model`` and ``model_config`` describe."""
        policy: PolicyT = build_policy(config, self.env)  # type: ignore[assignment]  # the default PolicyT
        return policy

    def stored_extras(self) -> tuple[str, ...]:
        """The per-step fields the collector stores from the policies' ``act``: ``extras``, or
        when that is None all the policies give."""
        return self.extras if self.extras is not None else next(iter(self.policies.values())).extras

    def extra_fields(self) -> dict[str, FieldSpec]:
        """Storage specs of the stored extras for a rollout buffer: one float per step each, unless
        ``extra_specs`` says otherwise."""
        return {key: self.extra_specs.get(key, SCALAR) for key in self.stored_extras()}

    def collect(
        self,
        collector: Collector,
        rollout: TensorDict,
        start_states: list[TensorDict] | None = None,
        until_done: bool = False,
    ) -> int:
        """Fill ``rollout`` (``[N, config.rollout_capacity + 1]``) as ``batch_mode`` says (or, with
        ``until_done``, each env's first episode), then postprocess each policy's steps; returns
        the env steps it holds. With complete episodes each row's valid steps end at an episode
        end and the rest is padding (``valid`` False)."""
        c = self.config
        whole = c.rollout_fragment_length if c.batch_mode == "complete_episodes" else None
        if whole is not None and rollout.batch_size[1] != c.rollout_capacity + 1:
            raise ConfigError(
                f"batch_mode='complete_episodes' needs a rollout of config.rollout_capacity + 1 = "
                f"{c.rollout_capacity + 1} slots per row (room for each env's last episode); {type(self).__name__}'s "
                f"has {rollout.batch_size[1]}: build its RolloutBuffer with config.rollout_capacity."
            )
        self.collected = True
        for policy in self.policies.values():
            policy.start_collection()
        steps = collector.collect(rollout, start_states, until_done, whole)
        for sink in self.rollout_sinks:
            sink(rollout, collector)
        if self.trajectory_hooks or type(self).postprocess_trajectory is not Algorithm.postprocess_trajectory:
            valid = rollout["valid"][:, :-1]
            for index, pid in enumerate(self.policies):
                mask = valid if len(self.policies) == 1 else valid & (rollout["policy_id"][:, :-1] == index)
                trajectory = Trajectory(pid, rollout, mask, self.env.rows_per_env)
                self.postprocess_trajectory(trajectory)
                for hook in self.trajectory_hooks:
                    hook(trajectory)
        return steps

    def skipped_collect_steps(self) -> list[str]:
        """What the config asks of ``collect`` that did not happen because this algorithm never
        called it (it filled its rollout with ``collector.collect`` itself)."""
        if self.collected:
            return []
        own_hook = type(self).postprocess_trajectory is not Algorithm.postprocess_trajectory
        asked = (
            ("batch_mode='complete_episodes'", self.config.batch_mode == "complete_episodes"),
            ("the on_postprocess_trajectory callbacks", bool(self.trajectory_hooks)),
            ("its postprocess_trajectory", own_hook),
            ("output (the dataset writer)", bool(self.rollout_sinks)),
        )
        return [what for what, wanted in asked if wanted]

    def postprocess_trajectory(self, trajectory: Trajectory) -> None:
        """Change the rewards of, or add fields to, one policy's steps of each finished rollout
        before the learner reads them (an intrinsic reward, a relabelled goal); called once per
        policy after every collect. Does nothing unless overridden."""

    def learning_rate(self, config: ConfigT) -> float:
        """``config.learning_rate``; when ``lr_schedule`` is linear, times ``1 - progress``, so it falls
        linearly to 0 over each ``learn()`` call."""
        if config.lr_schedule == "linear":
            return config.learning_rate * max(1.0 - self.progress, 0.0)
        return config.learning_rate

    @torch.no_grad()
    def update_obs_stats(self, rollout: TensorDict) -> None:
        """Fold the rollout's observations (valid steps, each into its own policy) into the
        policies' normalization statistics; a no-op for policies without them."""
        normalized = [(i, p) for i, p in enumerate(self.policies.values()) if p.obs_normalizer is not None]
        if not normalized:  # slicing the rollout costs more than a small off-policy step's learning
            return
        steps = rollout[:, :-1]
        valid = steps["valid"]
        owner = steps["policy_id"]
        for index, policy in normalized:
            keep = valid if len(self.policies) == 1 else valid & (owner == index)
            critic_obs = steps.get("critic_obs", None)
            policy.update_obs_stats(steps["obs"][keep], None if critic_obs is None else critic_obs[keep])

    def describe(self) -> str:
        """What the trainer prints when a run starts (nothing by default)."""
        return ""

    def data_parallel_problem(self) -> str | None:
        """Why this algorithm, as configured, cannot learn on several data-parallel ranks (None: it
        can). Ranks average gradients step by step, so every rank must take the same number of
        optimizer steps in an update, whatever its own data holds."""
        return None

    def training_step(self, collector: Collector) -> dict[str, Any]:
        """Collect experience and learn from it once; returns statistics to log."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_step(collector)")

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs; subclasses add their optimizers and schedules."""
        return {"policies": {pid: policy.state_dict() for pid, policy in self.policies.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; subclasses restore their own state too."""
        for pid, policy in self.policies.items():
            policy.load_state_dict(state["policies"][pid])
