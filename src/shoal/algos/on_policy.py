"""The loop every on-policy learner shares: collect a rollout, then epochs of minibatch steps on it.

    training_step: collect [N, T+1] -> value of each truncated episode's last observation ->
        observation statistics -> each trained policy, on the steps it took:
            advantages -> sampler -> epochs x minibatches (step: loss, backward, optimizer)
            -> named statistics, target_kl

An algorithm subclasses ``OnPolicyAlgorithm`` and writes ``advantages`` (the estimate its loss
reads) and ``step`` (one minibatch: loss, backward, optimizer); a sampler other than shuffled
single transitions overrides ``sampler`` and ``minibatches``. PPO (``ppo.py``), the segment
learner (``ppo_segments.py``), GRPO (``grpo.py``), PQN (``pqn.py``) and ``examples/reinforce.py``
are built so.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol

import torch
from tensordict import TensorDict
from typing_extensions import TypeVar

from shoal.algos.base import SCALAR, Algorithm, Collector, Statistics
from shoal.algos.losses import explained_variance, past_target_kl
from shoal.algos.optim import AutogradOptimizer
from shoal.algos.returns import gae
from shoal.buffers import FlatSampler, RolloutBuffer, transition_view
from shoal.buffers.rollout import FieldSpec
from shoal.config import OnPolicyConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.imports import import_spec
from shoal.models.policy import ActorCriticPolicy, Policy

if TYPE_CHECKING:
    from shoal.collect import Truncations

ConfigT = TypeVar("ConfigT", bound=OnPolicyConfig, default=OnPolicyConfig)
PolicyT = TypeVar("PolicyT", bound=Policy, default=ActorCriticPolicy)


class Sampler(Protocol):
    """What the epoch loop reads of a sampler (``FlatSampler``, ``SegmentSampler``)."""

    data: TensorDict
    """The steps it draws from (``valid`` marks the real ones)."""
    padded: bool
    """Whether some of them are padding."""

    def __len__(self) -> int:
        """Minibatches per epoch."""
        ...


class Optimizer(Protocol):
    """What steps a learner's parameters: ``AutogradOptimizer``, or PPO's hand-fused step."""

    lr: float

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


OptimizerT = TypeVar("OptimizerT", bound=Optimizer, default=AutogradOptimizer)


@dataclass
class PolicyLearner(Generic[ConfigT, PolicyT, OptimizerT]):
    """One trained policy's learning: the policy, its config (with its ``policies`` overrides),
    what steps it, and the generator its minibatches are drawn with."""

    policy_id: str
    index: int
    """The policy's place in ``config.policy_ids``: its value in a rollout's ``policy_id`` field."""
    policy: PolicyT
    config: ConfigT
    optimizer: OptimizerT
    generator: torch.Generator


@dataclass
class Minibatch:
    """One minibatch of a learner's sampler, with what its step needs beside the data."""

    data: TensorDict
    """Transitions ``[B]`` or segments ``[S, L]``: a TensorDict of its own (fields may be replaced)."""
    mask: torch.Tensor | None
    """``data["valid"]`` when some steps are padding; None: every step is real."""
    start_states: TensorDict | None = None
    """A recurrent policy's state at each segment's start ``[S]``."""
    index: torch.Tensor | None = None
    """Which segments of the sampler's data these are (None: all of them)."""
    weights: torch.Tensor | None = None
    """Importance weights ``[S]`` of segments drawn by priority."""
    advantage_stats: tuple[torch.Tensor, torch.Tensor] | None = None
    """Advantage mean and std over all the minibatches of one accumulated optimizer step."""
    share: torch.Tensor | float = 1.0
    """This minibatch's share of the valid steps of its optimizer step (its loss is weighted so)."""
    ends_step: bool = True
    """The optimizer steps after this minibatch's backward."""


class OnPolicyAlgorithm(Algorithm[ConfigT, PolicyT], Generic[ConfigT, PolicyT, OptimizerT]):
    """Base of the on-policy learners: the rollout, the per-policy learners, the epoch loop."""

    extras: ClassVar[tuple[str, ...] | None] = ("sample_log_prob", "value")
    """Stored per step: the behaviour policy's log-probability and value."""
    STAT_NAMES: ClassVar[tuple[str, ...]] = ()
    """The diagnostics ``step`` records, averaged over the last epoch's minibatches."""
    LEARN_KEYS: ClassVar[tuple[str, ...]] = ("obs", "action", "sample_log_prob", "value", "return", "advantage")
    """The rollout fields a minibatch carries (``valid`` always, ``action_mask`` and
    ``critic_obs`` whenever the env gives them)."""

    def __init__(self, config: ConfigT, env: EnvInfo):
        if "approx_kl" not in self.STAT_NAMES:  # any policy's target_kl: each learner reads its own
            for pid in config.policy_ids:
                if (kl := config.policy_config(pid).target_kl) is not None:
                    whose = "" if kl == config.target_kl else f" (policy {pid!r})"
                    raise ConfigError(
                        f"target_kl={kl}{whose} stops the epochs on the approximate KL, which {self.name} does "
                        f"not record (it records {list(self.STAT_NAMES)}); leave target_kl unset."
                    )
        super().__init__(config, env)
        self.buffer = self.make_buffer()
        if "final_value" in self.buffer.rollout.keys():  # noqa: SIM118 (a TensorDict)
            self.check_values()
        self.learners: dict[str, PolicyLearner[ConfigT, PolicyT, OptimizerT]] = {
            pid: PolicyLearner(
                pid,
                index,
                self.policies[pid],
                self.policy_configs[pid],
                self.make_optimizer(self.policies[pid], self.policy_configs[pid]),
                torch.Generator().manual_seed(config.seed + index),  # on the CPU: a checkpoint resumes on any device
            )
            for index, pid in enumerate(config.policy_ids)
            if pid in self.trained_policy_ids
        }
        """Policy id -> its learner, for each trained policy."""

    def check_values(self) -> None:
        """Every policy can value an observation, as bootstrapping a truncated episode asks: said
        when the algorithm is built rather than at the first truncation, hours in."""
        for pid, policy in self.policies.items():
            if type(policy).value is Policy.value:
                raise ConfigError(
                    f"{self.name} bootstraps truncated episodes with the policy's value(obs, critic_obs, state), which "
                    f"policy '{pid}' ({type(policy).__name__}) does not implement."
                )

    # ----- what an algorithm provides --------------------------------------------------------
    def rollout_fields(self) -> dict[str, FieldSpec]:
        """The rollout's fields beside the env's: the stored extras, ``advantage``, and with a
        value ``return`` and ``final_value`` (the value of a truncated episode's last observation)."""
        fields = self.extra_fields() | {"advantage": SCALAR}
        if "value" in fields:
            fields |= {"return": SCALAR, "final_value": SCALAR}
        return fields

    def make_buffer(self) -> RolloutBuffer:
        return RolloutBuffer(self.env, self.config.rollout_capacity, self.rollout_fields(), self.config.device)

    def make_optimizer(self, policy: PolicyT, config: ConfigT) -> OptimizerT:
        """Adam on autograd over the policy's parameters."""
        optimizer = AutogradOptimizer(
            policy, config.learning_rate, config.adam_eps, config.max_grad_norm, owner=policy.policy_id
        )
        return optimizer  # type: ignore[return-value]  # OptimizerT's default; other optimizers override this

    def advantages(self, learner: PolicyLearner[ConfigT, PolicyT, OptimizerT], rollout: TensorDict) -> None:
        """Write ``advantage`` (and ``return`` when the loss reads it) into ``rollout[:, :-1]``;
        runs without gradient, over the whole rollout."""
        raise NotImplementedError(f"{type(self).__name__} must implement advantages(learner, rollout)")

    def step(
        self, learner: PolicyLearner[ConfigT, PolicyT, OptimizerT], minibatch: Minibatch, stats: Statistics | None
    ) -> None:
        """Learn from one minibatch: loss, backward and (when ``minibatch.ends_step``) the
        optimizer step; add its diagnostics (``STAT_NAMES``) to ``stats`` when given."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(learner, minibatch, stats)")

    def sampler(
        self, learner: PolicyLearner[ConfigT, PolicyT, OptimizerT], rollout: TensorDict, select: torch.Tensor | None
    ) -> Sampler:
        """Shuffled single transitions of the steps ``select`` (bool ``[N, T]``; None: all)."""
        data = transition_view(rollout.select(*self.learn_keys(rollout)))
        return FlatSampler(data, learner.config.sgd_minibatch_size, learner.generator, select)

    def minibatches(
        self, learner: PolicyLearner[ConfigT, PolicyT, OptimizerT], sampler: Sampler
    ) -> Iterator[Minibatch]:
        """One epoch of the sampler's minibatches."""
        assert isinstance(sampler, FlatSampler)  # sampler() made it
        for data in sampler:
            yield Minibatch(data, data["valid"] if sampler.padded else None)

    def learn_keys(self, rollout: TensorDict) -> tuple[str, ...]:
        present = rollout.keys()
        return (*self.LEARN_KEYS, "valid", *(key for key in ("action_mask", "critic_obs") if key in present))

    # ----- the loop ----------------------------------------------------------------------------
    def training_step(self, collector: Collector) -> dict[str, Any]:
        return self.learn_policies(self.collect_rollout(collector))

    def collect_rollout(self, collector: Collector, until_done: bool = False) -> TensorDict:
        """Fill the rollout. Truncated episodes' final values are taken with the statistics the
        rollout was acted on, like its stored values. Then the observation statistics take in this
        rollout before learning from it: they move little once a few rollouts are in, and waiting a
        rollout to use them makes the first iterations learn from unnormalized inputs."""
        rollout = self.buffer.start_rollout()
        self.collect(collector, rollout, self.buffer.start_states, until_done)
        self.buffer.add(rollout)
        if "final_value" in rollout.keys():  # noqa: SIM118 (a TensorDict)
            assert collector.truncations is not None  # collect() sets them
            self.bootstrap_truncations(rollout, collector.truncations)
        self.update_obs_stats(rollout)
        return rollout

    def learn_policies(self, rollout: TensorDict, select: torch.Tensor | None = None) -> dict[str, Any]:
        """Each trained policy learns from the steps it took (of ``select`` when given); one
        policy's statistics are top-level result keys, several go under ``learner`` as
        ``<policy>/<stat>``."""
        single = len(self.policies) == 1
        stats: dict[str, Any] = {}
        for pid, learner in self.learners.items():
            steps = self.steps_of(learner, rollout, select)
            if steps is not None and not steps.any():
                continue  # the mapping gave this policy no rows this iteration
            out = self.learn(learner, rollout, steps)
            stats |= out if single else {f"{pid}/{k}": v for k, v in out.items()}
        return stats if single else {"learner": stats}

    def steps_of(
        self, learner: PolicyLearner[ConfigT, PolicyT, OptimizerT], rollout: TensorDict, select: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Bool ``[N, T]``: the learner's policy's steps, less the padding after complete
        episodes, within ``select``; None: every step. A row changes policy only between
        episodes, so advantages are still computed over whole rows."""
        parts = [] if select is None else [select]
        if len(self.policies) > 1:
            parts.append(rollout["policy_id"][:, :-1] == learner.index)
        if self.config.batch_mode == "complete_episodes":  # padding after each row's last episode
            parts.append(rollout["valid"][:, :-1])
        return functools.reduce(operator.and_, parts) if parts else None

    def learn(
        self, learner: PolicyLearner[ConfigT, PolicyT, OptimizerT], rollout: TensorDict, select: torch.Tensor | None
    ) -> dict[str, float]:
        """One update of ``learner``'s policy: advantages, then epochs of minibatch steps.
        Diagnostics are kept for the last epoch (and for every epoch when ``target_kl`` needs
        them): they cost a dozen ops per minibatch."""
        c = learner.config
        learner.optimizer.lr = lr = self.learning_rate(c)
        with torch.no_grad():
            self.advantages(learner, rollout)
        sampler = self.sampler(learner, rollout, select)
        stats = Statistics(self.STAT_NAMES, sampler.data.device or torch.device("cpu"))
        optimizer_steps = epoch = 0
        for epoch in range(1, c.num_sgd_iter + 1):
            stats.reset()
            track = c.target_kl is not None or epoch == c.num_sgd_iter
            for minibatch in self.minibatches(learner, sampler):
                self.step(learner, minibatch, stats if track else None)
                optimizer_steps += minibatch.ends_step
            if c.target_kl is not None and past_target_kl(stats.mean("approx_kl"), c.target_kl):
                break
        result = {"learning_rate": lr, **stats.means(), "num_sgd_epochs": epoch, "num_sgd_steps": optimizer_steps}
        if "return" in sampler.data.keys():  # noqa: SIM118 (a TensorDict)
            value, returns, valid = sampler.data["value"], sampler.data["return"], sampler.data["valid"]
            result["explained_variance"] = explained_variance(value[valid], returns[valid])
        return result

    @torch.no_grad()
    def bootstrap_truncations(self, rollout: TensorDict, truncations: Truncations) -> None:
        """``final_value`` at each truncated step: the acting policy's value of the episode's true
        last observation (the next slot already holds the next episode's first), seen with the
        state the policy had then. With next-step autoreset the rollout's next step is that
        observation, and its stored value is that value."""
        if not len(truncations):
            return
        row, step = truncations.row, truncations.step
        if truncations.next_step:
            rollout["final_value"][row, step] = rollout["value"][row, step + 1]
            return
        owner = rollout["policy_id"][row, step]
        for index, policy in enumerate(self.policies.values()):
            mine = (owner == index).nonzero().squeeze(1)
            if len(mine):
                critic = None if truncations.critic_obs is None else truncations.critic_obs[mine]
                state = truncations.states[index][mine] if truncations.states else None
                rollout["final_value"][row[mine], step[mine]] = policy.value(truncations.obs[mine], critic, state)

    def data_parallel_problem(self) -> str | None:
        if self.config.batch_mode == "complete_episodes":
            return (
                "batch_mode='complete_episodes': each rank's iteration holds a different number of steps, and so "
                "of minibatches, while every rank must take the same optimizer steps"
            )
        if len(self.learners) > 1:
            return (
                f"{self.name} with several trained policies ({', '.join(self.learners)}): a rank's share of each "
                f"policy's steps, and so its number of minibatches, differs from rank to rank"
            )
        return None

    def state_dict(self) -> dict[str, Any]:
        learners = {
            pid: {"optimizer": learner.optimizer.state_dict(), "generator": learner.generator.get_state()}
            for pid, learner in self.learners.items()
        }
        return {**super().state_dict(), "learners": learners}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for pid, learner in self.learners.items():
            learner.optimizer.load_state_dict(state["learners"][pid]["optimizer"])
            learner.generator.set_state(state["learners"][pid]["generator"])


# ----- advantage estimators over a rollout ---------------------------------------------------------
AdvantageFn = Callable[[TensorDict, float, float], torch.Tensor]
"""``(rollout [N, T+1], gamma, gae_lambda) -> advantages [N, T]``: what ``advantage_estimator`` names."""


def decisions(valid: torch.Tensor) -> torch.Tensor | None:
    """``valid`` as the return functions take it: None when every step is a decision (padding rows
    and next-step resets exist only with some backends), so nothing needs folding."""
    return None if bool(valid.all()) else valid


def rollout_gae(rollout: TensorDict, gamma: float, gae_lambda: float) -> torch.Tensor:
    """``returns.gae`` over a ``[N, T+1]`` rollout's fields."""
    steps = rollout[:, :-1]
    return gae(
        steps["reward"],
        rollout["value"],
        steps["terminated"],
        steps["truncated"],
        steps["final_value"],
        gamma=gamma,
        gae_lambda=gae_lambda,
        valid_t=decisions(steps["valid"]),
    )


# Before any learning the policy is the one that collected the rollout: every importance ratio is 1,
# where V-trace is GAE (to float rounding where steps fold); the segment learner recomputes V-trace
# with the current ratios for each minibatch.
ESTIMATORS: dict[str, AdvantageFn] = {"gae": rollout_gae, "vtrace": rollout_gae}
"""``advantage_estimator`` name -> estimator; a ``'package.module:function'`` of the same signature
may be given instead."""


def advantage_estimator(spec: str) -> AdvantageFn:
    """The advantage function ``advantage_estimator`` names (checked when the config is built)."""
    if spec in ESTIMATORS:
        return ESTIMATORS[spec]
    estimator: AdvantageFn = import_spec(spec, "advantage_estimator")
    return estimator
