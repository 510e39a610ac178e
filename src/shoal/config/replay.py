"""The off-policy algorithms' configs: the replay keys they share (``OffPolicyConfig``), and each one's own."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, cast

from pydantic import Field, model_validator

from shoal.buffers.sequence import window_columns
from shoal.config.exploration import EpsilonGreedyConfig
from shoal.config.trainer import TrainerConfig
from shoal.errors import ConfigError


class OffPolicyConfig(TrainerConfig):
    """Keys of the algorithms that learn from a replay buffer. Each iteration runs collection phases of
    `rollout_fragment_length` (also written `train_freq`) steps of every env, each followed by `gradient_steps`
    minibatch steps, until `timesteps_per_iteration` env steps are in."""

    buffer_size: int = Field(default=1_000_000, ge=2)
    """Agent steps the replay buffer holds (split evenly over the agent rows); the oldest are overwritten."""
    learning_starts: int = Field(default=100, ge=0)
    """Env steps collected before the first gradient step (the buffer fills with them first; the actor-critics act
    uniformly at random meanwhile). A run resumed from a checkpoint without its buffer collects as
    many again, with its trained policy, before its next gradient step."""
    gradient_steps: int = Field(default=1, ge=-1)
    """Minibatch steps after each collection phase; -1: as many as the env steps the phase collected."""
    train_freq_unit: Literal["step", "episode"] = "step"
    """What a collection phase counts: `step`, `rollout_fragment_length` steps of every env; `episode`, each env
    plays until it has ended an episode (at most the longest episode: `horizon` or the env's declared limit), so
    the policy holds still through whole episodes and learns between them, and `rollout_fragment_length` does
    not apply. `train_freq=[1, "episode"]`, as rl-baselines3-zoo writes it, sets it."""
    timesteps_per_iteration: int = Field(default=1000, ge=1)
    """Env steps per iteration (one logged result): whole collection phases until at least this many."""
    n_step: int = Field(default=1, ge=1)
    """Rewards summed per learning target (n-step returns); a sum stops at an episode's end."""
    tau: float = Field(default=1.0, gt=0.0, le=1.0)
    """Target network update: `target <- tau * online + (1 - tau) * target`; 1.0 copies (a hard update)."""
    prioritized_replay: bool = False
    """Draw minibatches by priority, the TD error of each step (Schaul et al. 2016), with importance weights."""
    prioritized_replay_alpha: float = Field(default=0.6, ge=0.0)
    """How strongly priorities skew sampling: probability proportional to priority ** alpha (0: uniform)."""
    prioritized_replay_beta: float = Field(default=0.4, ge=0.0, le=1.0)
    """The importance-weight exponent at the start of `learn()`; it rises linearly to 1 by the end."""
    prioritized_replay_eps: float = Field(default=1e-6, gt=0.0)
    """Added to each absolute TD error, so no step's priority is 0."""
    store_buffer_in_checkpoints: bool = False
    """Write the replay buffer into checkpoints (large; needed for a resume that continues bit for bit;
    without it a resumed run refills the buffer for `learning_starts` env steps before it learns)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "rollout_fragment_length": 1,
        "lr_schedule": "constant",
        "max_grad_norm": 10.0,
        "adam_eps": 1e-8,
    }
    NOTES: ClassVar[dict[str, str]] = {
        "rollout_fragment_length": "Replay learners (also written `train_freq`): each collection phase is followed "
        "by `gradient_steps` minibatch steps, and an iteration runs phases until `timesteps_per_iteration` env steps "
        "are in.",
        "sgd_minibatch_size": "Replay learners draw them from the buffer (SB3's `batch_size`).",
    }
    POLICY_KEYS: ClassVar[tuple[str, ...]] = (*TrainerConfig.POLICY_KEYS, "max_grad_norm", "adam_eps")
    READS_DATASETS: ClassVar[bool] = True
    ALIASES: ClassVar[dict[str, str]] = {"train_freq": "rollout_fragment_length", **TrainerConfig.ALIASES}

    @model_validator(mode="before")
    @classmethod
    def _read_train_freq_pair(cls, data: Any) -> Any:
        """Stable-Baselines3's pair: `train_freq=[n, "step"]` is `n` steps, `[1, "episode"]` is
        `train_freq_unit="episode"`."""
        if not isinstance(data, dict):
            return data
        for key in ("train_freq", "rollout_fragment_length"):
            pair = data.get(key)
            if not isinstance(pair, list | tuple):
                continue
            count, unit = pair if len(pair) == 2 else (None, None)
            if unit not in ("step", "episode") or not isinstance(count, int) or count < 1:
                raise ConfigError(
                    f"{key}={pair!r}: give a step count, or a pair [n, 'step'] or [1, 'episode'] (Stable-Baselines3's "
                    f"train_freq)."
                )
            if unit == "episode" and count != 1:
                raise ConfigError(
                    f"{key}={pair!r}: a collection phase plays one episode per env; use [1, 'episode'], or count "
                    f"steps with [n, 'step']."
                )
            data = dict(data)
            if unit == "step":
                data[key] = count
                continue
            del data[key]
            counted = [k for k in ("train_freq", "rollout_fragment_length") if data.get(k) is not None]
            if counted:
                raise ConfigError(
                    f"{key}={pair!r} has each phase play an episode per env, and {counted[0]}={data[counted[0]]} "
                    f"counts steps; set one of them."
                )
            if data.setdefault("train_freq_unit", "episode") != "episode":
                raise ConfigError(f"{key}={pair!r} and train_freq_unit={data['train_freq_unit']!r} disagree; set one.")
        return data

    @model_validator(mode="after")
    def _check_gradient_steps(self) -> OffPolicyConfig:
        if self.gradient_steps == 0:
            raise ConfigError("gradient_steps=0 would never learn; give a positive count, or -1 (one per env step).")
        if self.model_options.get("use_prev_action") or self.model_options.get("use_prev_reward"):
            raise ConfigError(
                "model_config use_prev_action / use_prev_reward feed a recurrent core the previous action and reward "
                "with algo=ppo; the replay learners' sequences do not replay them yet. Leave them off."
            )
        if self.batch_mode == "complete_episodes":
            raise ConfigError(
                "batch_mode='complete_episodes' shapes the rollouts of on-policy learners; a replay learner samples "
                "transitions from its buffer, whole episodes or not. Leave batch_mode='truncate_episodes'."
            )
        return self

    @model_validator(mode="after")
    def _check_episode_phases(self) -> OffPolicyConfig:
        if self.train_freq_unit == "step":
            return self
        if self.longest_episode is None:
            raise ConfigError(
                f"train_freq_unit='episode' keeps room for each env's longest episode, and env '{self.env}' declares "
                f"no step limit; set horizon=N (the most steps an episode takes)."
            )
        reads = self.input != "sampler"
        if reads or self.recurrent:
            raise ConfigError(
                "train_freq_unit='episode' paces collection from live envs by their episodes; "
                + (
                    "a dataset (input) is read in phases of steps: pass train_freq_unit='step' (a tuned config's "
                    "train_freq=[1, 'episode'] sets 'episode')."
                    if reads
                    else "sequence replay (a recurrent core) stores states every few steps: count steps instead."
                )
            )
        return self

    @property
    def rollout_capacity(self) -> int:
        """Slots of each row of a collection phase's rollout: ``rollout_fragment_length`` steps, or
        with ``train_freq_unit='episode'`` the longest episode."""
        if self.train_freq_unit == "episode":
            return cast(int, self.longest_episode)  # checked when validated
        return cast(int, self.rollout_fragment_length)  # filled when validated

    @property
    def phases(self) -> int:
        """Collection phases per iteration (with ``train_freq_unit='episode'``, as many as it takes)."""
        batch = int(self.train_batch_size or 1)  # filled when validated
        return max(1, -(-self.timesteps_per_iteration // batch))

    def check_batch(self, agents_per_env: int = 1) -> None:
        """The buffer must hold more than a collection phase of every agent row."""
        super().check_batch(agents_per_env)
        rows = self.num_envs * agents_per_env
        frag = self.rollout_capacity
        if self.buffer_size // rows <= frag:
            phase = "an episode" if self.train_freq_unit == "episode" else "rollout_fragment_length"
            raise ConfigError(
                f"buffer_size={self.buffer_size} holds {self.buffer_size // rows} steps of each of the {rows} agent "
                f"rows, not more than a collection phase ({phase}={frag}); try buffer_size={rows * (frag + 1) * 10}."
            )


class DQNConfig(OffPolicyConfig, EpsilonGreedyConfig):
    """DQN's keys (and the replay keys of `OffPolicyConfig`, the exploration keys of `EpsilonGreedyConfig`).
    Defaults are rl-baselines3-zoo's CartPole-v1 settings, which solve it within 50k steps: one env, 256-step phases
    each followed by 128 minibatch steps of 64, a 2-layer 256-unit ReLU Q-network, epsilon from 1 to 0.04 over the
    first 16% of the run; plus double Q-learning, which those settings lack (with it 5 of 5 seeds end at 500 on
    CartPole-v1, without it 4 of 5)."""

    double_q: bool = True
    """Double DQN: the online network picks the next action and the target network values it (van Hasselt et al.
    2016); False: the target network's max (Stable-Baselines3's DQN)."""
    dueling: bool = False
    """Dueling heads: `Q = V + A - mean(A)` from the model's value and action outputs (Wang et al. 2016)."""
    advantage_learning: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Advantage learning's alpha (Bellemare et al. 2016): the target of `Q(s, a)` is lowered by `alpha` times the
    target network's action gap `max_b Q(s, b) - Q(s, a)`, which widens the gap between the greedy action and the
    others so that small value errors do not flip the greedy choice; 0: plain DQN."""
    target_update_interval: int = Field(default=10, ge=1)
    """Env steps between target network updates (several due in one phase compound into one update with
    `1 - (1 - tau) ** k`)."""
    replay_sequence_length: int = Field(default=16, ge=2)
    """With a recurrent core (`model_config` `core`): steps of each replayed sequence, burn-in included (R2D2's
    sequence replay). A minibatch is `sgd_minibatch_size` learned steps, rounded up to whole sequences."""
    replay_burn_in: int = Field(default=8, ge=0)
    """With a recurrent core: first steps of each sequence that only bring the state stored at its start up to date
    (no loss, no gradient). Sequences start every `replay_sequence_length - replay_burn_in` steps, which must divide
    `train_freq`, so they overlap by the burn-in."""
    replay_priority_eta: float = Field(default=0.9, ge=0.0, le=1.0)
    """With a recurrent core and `prioritized_replay`: a sequence's priority is `eta * max + (1 - eta) * mean` of its
    learned steps' absolute TD errors (R2D2's mix)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "num_envs": 1,
        "gamma": 0.99,
        "learning_rate": 2.3e-3,
        "buffer_size": 100_000,
        "learning_starts": 1000,
        "rollout_fragment_length": 256,
        "gradient_steps": 128,
        "sgd_minibatch_size": 64,
    }
    POLICY_KEYS: ClassVar[tuple[str, ...]] = (*OffPolicyConfig.POLICY_KEYS, "double_q", "dueling", "advantage_learning")

    @model_validator(mode="after")
    def _check_sequences(self) -> DQNConfig:
        length, burn_in = self.replay_sequence_length, self.replay_burn_in
        if burn_in >= length and self.recurrent:  # the sequence keys are read with a recurrent core only
            raise ConfigError(
                f"replay_burn_in={burn_in} must be less than replay_sequence_length={length}: a sequence is its "
                f"burn-in followed by the steps learned from. Try replay_burn_in={length // 2}."
            )
        return self

    @property
    def sequence_stride(self) -> int:
        """Steps between the starts of replayed sequences (where the recurrent state is stored)."""
        return self.replay_sequence_length - self.replay_burn_in

    def check_batch(self, agents_per_env: int = 1) -> None:
        """With a recurrent core, collection phases are whole strides of sequence starts and the buffer
        holds a sequence of each agent row."""
        super().check_batch(agents_per_env)
        if not self.recurrent:
            return
        frag, length, burn_in, stride = (
            cast(int, self.rollout_fragment_length),  # filled when validated
            self.replay_sequence_length,
            self.replay_burn_in,
            self.sequence_stride,
        )
        if frag % stride:
            fits = [b for b in range(length) if frag % (length - b) == 0]
            raise ConfigError(
                f"rollout_fragment_length (train_freq)={frag} must be a multiple of replay_sequence_length - "
                f"replay_burn_in = {length} - {burn_in} = {stride}: the recurrent state is stored every {stride} "
                f"steps, where sequences start. Try train_freq={max(stride, round(frag / stride) * stride)} or "
                f"replay_burn_in={min(fits, key=lambda b: abs(b - burn_in))}."
            )
        rows = self.num_envs * agents_per_env
        columns = self.buffer_size // rows // stride * stride  # the sequence buffer keeps whole strides
        need = max(window_columns(length, stride), frag + stride)
        if columns < need:
            raise ConfigError(
                f"buffer_size={self.buffer_size} holds {columns} steps (whole strides of {stride}) of each of the "
                f"{rows} agent rows, too few for a collection phase (train_freq={frag}) and a sequence of "
                f"replay_sequence_length={length} behind the newest step; try buffer_size={rows * need * 10}."
            )
