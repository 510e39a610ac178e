"""The training loop: collect -> learn -> (weights are already where the collector reads them) -> log.

``Trainer`` is algorithm-agnostic; an algorithm names its config class and learner. With the
in-process backends the collector and learner share one policy module, so the "sync weights"
step of seed 000 is a no-op today; remote backends will hook in at ``_sync_weights``.
"""

from __future__ import annotations

import random
import time
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from shoal.buffers.rollout import RolloutBuffer, torch_dtype
from shoal.collect import Collector, EpisodeTracker
from shoal.config import TrainerConfig
from shoal.envs.registry import env_name
from shoal.errors import ConfigError, EnvError
from shoal.logging import ProgressDisplay, RunLogger
from shoal.models import ActorCritic, ObsNormalizer, RewardScaler
from shoal.vector import VecBackend, make_backend


class Trainer:
    config_class: ClassVar[type[TrainerConfig]] = TrainerConfig
    algo_name: ClassVar[str] = "Trainer"

    def __init__(self, env: Any = None, config: dict[str, Any] | None = None, **overrides: Any):
        settings = dict(config or {})
        settings.update(overrides)
        if env is not None:
            settings["env"] = env
        self.config = self.config_class.build(**settings)
        c = self.config
        torch.set_num_threads(c.torch_threads)
        # Adam's second moments and annealed updates drift into denormal floats late in training,
        # which slows every CPU op several-fold; flushing them to zero costs nothing.
        torch.set_flush_denormal(True)
        self._seed_everything(c.seed)
        self.env_name = env_name(c.env)

        self.backend = self._make_backend(c.num_envs)
        spec = self.backend.obs_spec
        self.policy = ActorCritic(int(np.prod(spec.shape)), self.backend.act_spec, c.hiddens, c.activation,
                                  c.log_std_init).to(c.device)
        self.obs_normalizer = ObsNormalizer(spec.shape, c.clip_obs) if c.normalize_obs else None
        scaler = None
        if c.normalize_reward:
            scaler = RewardScaler(self.backend.num_rows, c.gamma, c.clip_reward)
        self.tracker = EpisodeTracker(self.backend.num_rows, c.metrics_num_episodes_for_smoothing)
        self.collector = Collector(self.backend, self.policy, self.tracker, self.obs_normalizer, scaler)
        self.buffer = RolloutBuffer(self.backend.num_rows, c.rollout_fragment_length, spec.shape,
                                    torch_dtype(spec.dtype), self.backend.act_spec.shape,
                                    torch_dtype(self.backend.act_spec.dtype), c.device)
        self.learner = self._make_learner()

        self.iteration = 0
        self.timesteps_total = 0
        self.time_total_s = 0.0
        self._schedule_end = c.total_timesteps
        self.collector.reset(c.seed)
        self.run_dir = self._resolve_run_dir()
        self.logger = RunLogger(self.run_dir, c.to_yaml_dict()) if self.run_dir else None

    # ----- set-up -------------------------------------------------------------------------
    def _make_learner(self):
        raise NotImplementedError

    def _make_backend(self, num_envs: int) -> VecBackend:
        c = self.config
        return make_backend(c.env, num_envs, c.env_config, c.vectorization_mode)

    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def _resolve_run_dir(self) -> Path | None:
        c = self.config
        if not c.save_outputs:
            return None
        if c.run_dir:
            return Path(c.run_dir)
        name = c.name or f"{self.algo_name}_{self.env_name}_seed{c.seed}_{datetime.now():%Y%m%d-%H%M%S}"
        return Path("runs") / name.replace("/", "_")

    # ----- the loop -----------------------------------------------------------------------
    def learning_rate(self) -> float:
        c = self.config
        if c.lr_schedule == "linear":
            remaining = 1.0 - self.timesteps_total / max(1, self._schedule_end)
            return c.learning_rate * max(remaining, 0.0)
        return c.learning_rate

    def train(self) -> dict[str, Any]:
        """One iteration: collect ``train_batch_size`` steps, update, log. Returns the result dict."""
        t0 = time.perf_counter()
        rollout = self.buffer.start_rollout()
        steps = self.collector.collect(rollout)
        self.buffer.add(rollout)
        t1 = time.perf_counter()
        stats = self.learner.update(rollout, self.learning_rate())
        self._sync_weights()
        t2 = time.perf_counter()

        self.iteration += 1
        self.timesteps_total += steps
        elapsed = t2 - t0
        self.time_total_s += elapsed
        result: dict[str, Any] = {
            "training_iteration": self.iteration,
            "timesteps_total": self.timesteps_total,
            "timesteps_this_iter": steps,
            **self.tracker.summarize(),
            "sps": steps / elapsed,
            "time_this_iter_s": elapsed,
            "time_total_s": self.time_total_s,
            "sample_time_ms": 1e3 * (t1 - t0),
            "learn_time_ms": 1e3 * (t2 - t1),
            "learning_rate": self.learner.optimizer.lr,
            **stats,
        }
        if self.logger is not None:
            self.logger.write(result)
        return result

    def _sync_weights(self) -> None:
        """Hand the new weights to whoever steps the envs (in process: they already share them)."""

    def learn(self, total_timesteps: int | None = None, progress: bool | None = None) -> dict[str, Any]:
        """Train for ``total_timesteps`` more env steps (default: the config's). Returns the last result."""
        total = self.config.total_timesteps if total_timesteps is None else int(total_timesteps)
        if total < 1:
            raise ConfigError(f"total_timesteps must be >= 1, got {total}.")
        start = self.timesteps_total
        self._schedule_end = start + total
        show = self.config.verbose > 0 if progress is None else progress
        result: dict[str, Any] = {}
        with ProgressDisplay(f"{self.algo_name} {self.env_name}", total, enabled=show) as display:
            while self.timesteps_total - start < total:
                result = self.train()
                display.update(self.timesteps_total - start, result)
        return result

    # ----- using the policy ---------------------------------------------------------------
    def _prepare_obs(self, obs: Any) -> tuple[torch.Tensor, bool]:
        """Batch of observations -> normalized float tensor; also says if the input was one obs."""
        spec = self.backend.obs_spec
        if spec.structured:
            single = not isinstance(obs, list)  # one Dict/Tuple observation, or a list of them
            items = [obs] if single else obs
            arr = np.stack([gym.spaces.flatten(spec.space, o) for o in items]).astype(np.float32)
        else:
            arr = np.asarray(obs, dtype=spec.dtype)
            single = arr.shape == spec.shape
            if single:
                arr = arr[None]
            if arr.shape[1:] != spec.shape:
                raise EnvError(f"compute_actions got observations of shape {arr.shape}; expected "
                               f"[batch, {', '.join(map(str, spec.shape))}] or one observation of shape {spec.shape}.")
        x = torch.as_tensor(arr, device=self.config.device)
        if self.obs_normalizer is not None:
            x = self.obs_normalizer.normalize(x)
        return x, single

    @torch.inference_mode()
    def compute_actions(self, obs: Any, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations (or one), ready to pass to the env."""
        x, single = self._prepare_obs(obs)
        action, _, _ = self.policy.act(x, deterministic=deterministic)
        action = self.backend.env_actions(action.cpu())
        return action[0] if single else action

    @torch.inference_mode()
    def evaluate(self, num_episodes: int | None = None, deterministic: bool = True, seed: int | None = None) -> dict[str, float]:
        """Run ``num_episodes`` fresh episodes, one per env copy, and summarise their returns."""
        n = num_episodes or self.config.evaluation_num_episodes
        backend = self._make_backend(n)
        try:
            backend.reset(self.config.seed + 10_000 if seed is None else seed)
            returns = np.zeros(n)
            lengths = np.zeros(n, dtype=np.int64)
            finished = np.zeros(n, dtype=bool)
            batch = backend.recv()
            while not finished.all():
                x = batch.obs if self.obs_normalizer is None else self.obs_normalizer.normalize(batch.obs)
                action, _, _ = self.policy.act(x, deterministic=deterministic)
                backend.send(action)
                batch = backend.recv()
                live = ~finished & batch.valid.numpy()
                returns[live] += batch.reward.numpy()[live]
                lengths[live] += 1
                finished |= live & (batch.terminated.numpy() | batch.truncated.numpy())
        finally:
            backend.close()
        return {
            "episode_reward_mean": float(returns.mean()),
            "episode_reward_std": float(returns.std()),
            "episode_reward_min": float(returns.min()),
            "episode_reward_max": float(returns.max()),
            "episode_len_mean": float(lengths.mean()),
            "episodes": n,
        }

    def close(self) -> None:
        self.backend.close()
        if self.logger is not None:
            self.logger.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{self.algo_name}(env={self.env_name!r}, timesteps_total={self.timesteps_total})"

