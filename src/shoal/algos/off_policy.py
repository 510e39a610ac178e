"""The loop every replay learner shares: collect a phase, store it, learn from replay.

    training_step: phases until timesteps_per_iteration env steps are in, each:
        collect [N, T+1] (T = train_freq, or an episode of each env) -> replay.add -> once warmed_up:
        gradient_steps x (each trained policy: sample its rows -> transitions: the buffer's n-step
        windows -> n_step_returns [-> importance_weights] -> learner.prepare -> learner.learn
        [-> priorities])

From a uniform replay a phase's minibatches are drawn and gathered at once, and ``prepare`` runs
once per gathered chunk (``phase_minibatches``): nothing a step does changes what the others draw, and
what a learner computes from networks that hold through the phase (DQN's target values) is then
one forward instead of one per minibatch. A prioritized replay draws step by step.

An algorithm subclasses ``OffPolicyAlgorithm`` with its learner (one per trained policy: the
networks, targets and optimizers of one policy, ``prepare(batch)`` and ``learn(batch, weights)``)
and, when it needs them, hooks before each phase (DQN's epsilon) and after it (DQN's target updates).
Minibatches are drawn from the steps of the learner's own policy, so in multi-agent runs the one
buffer serves as one buffer per policy. The buffer stores and gathers; the return math is the
pure functions of ``shoal.algos.returns``, called here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, Generic, Protocol

import torch
from tensordict import TensorDict
from typing_extensions import TypeVar

from shoal import distributed
from shoal.algos.base import Algorithm, Collector, Statistics
from shoal.algos.optim import AutogradOptimizer
from shoal.algos.returns import importance_weights, n_step_returns
from shoal.buffers import PrioritizedReplayBuffer, ReplayBuffer, RolloutBuffer
from shoal.config import OffPolicyConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import warn
from shoal.models.policy import Policy

GATHER_BYTES = 32 << 20
"""Bytes of drawn steps gathered in one go: a phase's draw larger than this is gathered in chunks."""


class Learner(Protocol):
    """One trained policy's learning: its networks, targets and optimizers."""

    optimizers: list[AutogradOptimizer]
    """Every optimizer the learner steps; the algorithm sets their step size before each phase."""

    def prepare(self, batch: TensorDict) -> TensorDict:
        """``batch`` (``transitions``' fields of one or more minibatches) with what the learner
        computes for all of them at once before stepping (DQN: the target network's values, which
        hold through a phase), or as it is."""
        ...

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One minibatch step on ``batch`` (``transitions``' fields) with importance
        ``weights`` (None: uniform); returns the step's statistics by name (``STAT_NAMES``) and
        each step's absolute TD error, the new priorities."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


ConfigT = TypeVar("ConfigT", bound=OffPolicyConfig, default=OffPolicyConfig)
PolicyT = TypeVar("PolicyT", bound=Policy, default=Policy)
LearnerT = TypeVar("LearnerT", bound=Learner, default=Learner)


def transitions(replay: ReplayBuffer, index: torch.Tensor, *, n_step: int, gamma: float) -> TensorDict:
    """The sampled steps at flat ``index`` as a learner reads them: the stored fields of each, with
    ``reward`` the discounted sum of up to ``n_step`` rewards from it on and ``discount`` the
    bootstrap's (``n_step_returns`` over the buffer's windows: stopping at an episode's end or the
    newest stored step, ``gamma ** k`` for ``k`` rewards, 0 after a terminal step), and ``next_obs``
    (and ``next_action_mask``) after the last step summed, from the buffer's ``bootstrap``."""
    batch, window = replay.gather(index, n_step)
    shape = window.start.shape  # [B], or [B, L] for sequences
    valid = None if window.valid is None else window.valid.reshape(-1, n_step)
    reward, discount, last = n_step_returns(
        window.reward.reshape(-1, n_step),
        window.terminated.reshape(-1, n_step),
        window.truncated.reshape(-1, n_step),
        gamma=gamma,
        valid_t=valid,
    )
    batch["reward"], batch["discount"] = reward.view(shape), discount.view(shape)
    for key, value in replay.bootstrap(window.start, last.view(shape)).items():
        batch[key] = value
    return batch


def played(rollout: TensorDict) -> TensorDict:
    """The slots of a rollout collected episode by episode (``until_done``) that its envs stepped: up
    to the last step any row took, and the observation after it. The padding behind would take
    replay columns and hold nothing to learn from."""
    stepped = rollout["valid"][:, :-1].any(0).nonzero()
    return rollout[:, : int(stepped[-1]) + 2] if len(stepped) else rollout


def bootstrapped(batch: TensorDict, next_value: torch.Tensor) -> torch.Tensor:
    """The learning target ``R_n + discount * V(s_n)`` of ``transitions``' ``batch``: ``discount``
    is 0 after a terminal step, where ``next_value`` is not read (it may be inf)."""
    reward: torch.Tensor = batch["reward"]
    discount: torch.Tensor = batch["discount"]
    return reward + torch.where(discount > 0, discount * next_value, 0.0)


class OffPolicyAlgorithm(Algorithm[ConfigT, PolicyT], Generic[ConfigT, PolicyT, LearnerT]):
    """Base of the replay learners: the phase loop, the replay buffer, per-policy learners
    (``LearnerT``, built by ``make_learner``)."""

    config_class = OffPolicyConfig
    extras: ClassVar[tuple[str, ...] | None] = ()  # the buffer keeps the env fields only
    STAT_NAMES: ClassVar[tuple[str, ...]] = ()
    """The statistics each learner's ``learn`` returns by name, averaged over an iteration's steps."""

    def __init__(self, config: ConfigT, env: EnvInfo):
        super().__init__(config, env)
        self.rollout = RolloutBuffer(env, config.rollout_capacity, self.extra_fields(), config.device)
        self.replay = self.make_replay()
        self.generator = torch.Generator().manual_seed(config.seed)  # on the CPU: draws move to the buffer's device
        self.learners: dict[str, LearnerT] = {
            pid: self.make_learner(pid, self.policy_configs[pid]) for pid in self.trained_policy_ids
        }
        for pid, learner in self.learners.items():
            if not callable(getattr(learner, "prepare", None)):
                raise TypeError(
                    f"{type(learner).__name__}, the learner of policy '{pid}', has no prepare(batch): a replay "
                    "learner returns from it the batch its steps read (the batch as it is, when no network holds "
                    "still through a phase); see shoal.algos.off_policy.Learner."
                )
        ids = list(self.policies)
        self._owner = {pid: None if len(ids) == 1 else ids.index(pid) for pid in self.learners}
        # which rows each learner samples: a policy index into the stored policy_id (None: all rows)
        self.timesteps = 0
        """Env steps collected so far (``learning_starts`` and the target schedule count them)."""
        self.gradient_steps = 0
        """Minibatch steps taken so far (per trained policy)."""
        self._watching_turns = not env.turn_based  # through the first iteration: see _watch_for_turns
        self._last_valid: torch.Tensor | None = None
        self._holding: set[str] = set()  # trained policies whose rows the buffer is known to hold steps of

    def make_replay(self) -> ReplayBuffer:
        """The replay buffer: uniform or prioritized (subclasses may store more, e.g. sequences)."""
        c, fields = self.config, self.extra_fields()
        if c.prioritized_replay:
            alpha, policies = c.prioritized_replay_alpha, len(c.policy_ids)
            return PrioritizedReplayBuffer(self.env, c.buffer_size, fields, c.device, alpha, policies)
        return ReplayBuffer(self.env, c.buffer_size, fields, c.device)

    def rollout_states(self) -> list[TensorDict] | None:
        """Each policy's state storage the collector fills at segment starts (None: no states)."""
        return None

    def make_learner(self, policy_id: str, config: ConfigT) -> LearnerT:
        raise NotImplementedError(f"{type(self).__name__} must implement make_learner(policy_id, config)")

    @property
    def steps_per_iteration(self) -> int:
        if self.config.train_freq_unit == "episode":
            return self.config.timesteps_per_iteration  # about: the last phase's episodes may run past it
        return self.config.phases * super().steps_per_iteration

    def phase_progress(self, steps: int) -> float:
        """How far the ``learn()`` call has gone ``steps`` env steps into this iteration (between
        ``progress`` and ``progress_end``), for schedules that move within an iteration."""
        share = min(steps / self.steps_per_iteration, 1.0)
        return self.progress + (self.progress_end - self.progress) * share

    def before_phase(self, progress: float) -> None:
        """Called before each collection phase: sets every learner's step size (each policy's own
        ``learning_rate``, as ``lr_schedule`` says); subclasses add theirs (e.g. the exploration rate)."""
        for pid, learner in self.learners.items():
            lr = self.learning_rate(self.policy_configs[pid])
            for optimizer in learner.optimizers:
                optimizer.lr = lr

    def after_phase(self, steps_before: int) -> None:
        """Called after each phase is stored, with the env step count before it (e.g. for targets)."""

    def training_step(self, collector: Collector) -> dict[str, Any]:
        c = self.config
        device = torch.device(c.device)
        totals = {pid: Statistics(self.STAT_NAMES, device) for pid in self.learners}
        collected = 0
        by_episode = c.train_freq_unit == "episode"
        while collected < c.timesteps_per_iteration:
            self.before_phase(self.phase_progress(collected))
            rollout = self.rollout.start_rollout()
            steps = self.collect(collector, rollout, self.rollout_states(), until_done=by_episode)
            self.rollout.add(rollout)
            if by_episode:
                rollout = played(rollout)
            self.update_obs_stats(rollout)
            if self._watching_turns:
                self._watch_for_turns(rollout)
            self.replay.add(rollout, collector.truncations)
            before = self.timesteps
            self.timesteps += steps
            collected += steps
            self.after_phase(before)
            if not self.learners or not self.warmed_up():
                continue
            beta = c.prioritized_replay_beta + (1.0 - c.prioritized_replay_beta) * self.phase_progress(collected)
            self.learn_from_replay(c.gradient_steps if c.gradient_steps > 0 else steps, beta, totals)
        self._watching_turns = False
        stats: dict[str, Any] = {"replay_size": len(self.replay), "num_gradient_steps": self.gradient_steps}
        single = len(self.policies) == 1
        per_policy = {pid: total.means() for pid, total in totals.items() if total.count}
        if single:
            return stats | next(iter(per_policy.values()), {})
        return stats | {"learner": {f"{pid}/{k}": v for pid, out in per_policy.items() for k, v in out.items()}}

    def _watch_for_turns(self, rollout: TensorDict) -> None:
        """Through the first iteration of an env not declared turn-based, warn when an agent's row
        acts again after a step it did not act on, within one episode (an env that takes turns
        undeclared): a stored step's successor is then taken to be the next column, another
        agent's turn. Padding (an agent that left, an env group parked early) acts again only in a
        new episode. Slot T is not read (the collector has not written it); the last step of the
        rollout before is."""
        valid, first = rollout["valid"][:, :-1], rollout["first"][:, :-1]
        before = valid[:, :1] if self._last_valid is None else self._last_valid
        self._last_valid = valid[:, -1:].clone()
        acted = torch.cat([before, valid], 1)
        if bool((~acted[:, :-1] & acted[:, 1:] & ~first).any()):
            self._watching_turns = False
            warn(
                f"{self.name} on '{self.env.name}': agents act in turns, but the env does not say so, and a replay "
                f"learner then takes the step after each decision for its successor, which is another agent's turn. "
                f"Its targets bootstrap from positions its agent does not act in, and a reward that lands on another "
                f"agent's turn (a board game's loss) is never learned. Set turn_based = True on the env class (a "
                f"native AgentEnv also sets self.env_done where its game ends), and the learner links each decision "
                f"to its agent's next one."
            )

    def data_parallel_problem(self) -> str | None:
        if self.config.train_freq_unit == "episode":
            return (
                "train_freq in episodes: each rank's phases end when its own envs end their episodes, so the ranks "
                "would take different numbers of optimizer steps; give train_freq in env steps"
            )
        return None

    def warmed_up(self) -> bool:
        """The learners step once ``learning_starts`` env steps are in and the replay buffer holds
        as many (or is full). The two differ after a resume from a checkpoint without the buffer:
        the run refills it first, as networks fitted to the few steps of a nearly empty buffer
        would forget what they had learned."""
        envs, need = self.env.num_envs, self.config.learning_starts
        return self.timesteps >= need and self.replay.size * envs >= min(need, (self.replay.columns - 1) * envs)

    def minibatch(self, index: torch.Tensor, policy_id: str) -> TensorDict:
        """What policy ``policy_id``'s learner learns from for the sampled steps at flat ``index``:
        by default their ``transitions`` with the configured n-step returns, discounted by the
        policy's ``gamma`` (a per-policy key)."""
        gamma = self.policy_configs[policy_id].gamma
        return transitions(self.replay, index, n_step=self.config.n_step, gamma=gamma)

    def learn_from_replay(self, updates: int, beta: float, totals: dict[str, Statistics]) -> None:
        """A phase's ``updates`` minibatch steps of each trained policy (step by step, each policy
        in turn), importance weights annealed to ``beta``; each step's statistics are added to the
        policy's ``totals``."""
        ready = [pid for pid in self.learners if self._holds_steps(pid)]
        if self.replay.can_draw_ahead:
            minibatches = {pid: self.phase_minibatches(pid, updates) for pid in ready}
            for _ in range(updates):
                for pid in ready:
                    totals[pid].add(self.learners[pid].learn(next(minibatches[pid]), None)[0])
        else:
            for _ in range(updates):
                for pid, out in self.learn_step(beta, ready):
                    totals[pid].add(out)
        if ready:  # not while every policy waits for steps it may draw
            self.gradient_steps += updates

    def _holds_steps(self, policy_id: str) -> bool:
        """Whether the buffer (on every data-parallel rank) holds steps of the policy's rows that
        it may draw: a policy that has not acted yet (a rarely mapped one) waits, and so does every
        policy of a turn-based game until an agent has moved twice. Once it holds some, it is not
        asked again (each asking is a scan of the buffer)."""
        if policy_id in self._holding:
            return True
        owner = self._owner[policy_id]
        # every data-parallel rank must step the same learners: each holds steps of its own envs
        if not distributed.any_rank(not self.replay.holds(owner)):
            self._holding.add(policy_id)
            return True
        return False

    def phase_minibatches(self, policy_id: str, updates: int) -> Iterator[TensorDict]:
        """The minibatches of ``updates`` steps of one policy, drawn at once from a uniform replay
        and gathered in chunks of about ``GATHER_BYTES``, each chunk prepared by the learner as one
        batch (one ``prepare`` in place of one per minibatch)."""
        size, learner = self.config.sgd_minibatch_size, self.learners[policy_id]
        index = self.replay.sample(updates * size, self.generator, self._owner[policy_id])
        per_gather = size * max(1, GATHER_BYTES // (size * self.replay.row_bytes))
        for first in range(0, len(index), per_gather):
            prepared = learner.prepare(self.minibatch(index[first : first + per_gather], policy_id))
            for start in range(0, len(prepared), size):
                yield prepared[start : start + size]

    def learn_step(self, beta: float, policy_ids: list[str]) -> list[tuple[str, dict[str, torch.Tensor]]]:
        """One minibatch step of each of the trained policies ``policy_ids``, on steps of its own rows."""
        c = self.config
        out = []
        for pid in policy_ids:
            learner, owner = self.learners[pid], self._owner[pid]
            index = self.replay.sample(c.sgd_minibatch_size, self.generator, owner)
            weights = None
            if isinstance(self.replay, PrioritizedReplayBuffer):
                prob = self.replay.probabilities(index, owner)
                least = self.replay.min_probability(owner)  # weights <= 1, as in the paper
                weights = importance_weights(prob, size=len(self.replay), beta=beta, min_prob=least)
            stats, td_error = learner.learn(learner.prepare(self.minibatch(index, pid)), weights)
            if isinstance(self.replay, PrioritizedReplayBuffer):
                self.replay.update_priorities(index, td_error + c.prioritized_replay_eps, owner)
            out.append((pid, stats))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "learners": {pid: learner.state_dict() for pid, learner in self.learners.items()},
            "generator": self.generator.get_state(),
            "timesteps": self.timesteps,
            "gradient_steps": self.gradient_steps,
            "replay": self.replay.state_dict() if self.config.store_buffer_in_checkpoints else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for pid, learner in self.learners.items():
            learner.load_state_dict(state["learners"][pid])
        self.generator.set_state(state["generator"])
        self.timesteps, self.gradient_steps = state["timesteps"], state["gradient_steps"]
        if (stored := state["replay"]) is None:
            return
        if self.replay.fits(stored):
            self.replay.load_state_dict(stored)
            return
        rows, columns = stored["sampleable"].shape
        warn(
            f"the checkpoint's replay buffer ({rows} x {columns} steps) does not fit this run's "
            f"{type(self.replay).__name__} ({self.replay.num_rows} x {self.replay.columns}): a changed buffer_size, "
            f"num_envs, prioritized_replay or sequence length changes it, and so does a checkpoint from a shoal "
            f"whose buffer stored other fields. It is not loaded; a run left without a buffer refills it for "
            f"learning_starts={self.config.learning_starts} env steps before it learns again."
        )
