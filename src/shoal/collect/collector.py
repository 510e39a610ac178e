"""The collector: runs the policy on a backend and writes the rollout in place.

Per step it does one policy forward over all agent rows and a fixed handful of tensor copies
into preallocated storage; nothing else is allocated.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from shoal.collect.episodes import EpisodeTracker
from shoal.errors import EnvError
from shoal.models.normalize import ObsNormalizer, RewardScaler
from shoal.vector.base import VecBackend


class Collector:
    def __init__(self, backend: VecBackend, policy: torch.nn.Module, tracker: EpisodeTracker,
                 obs_normalizer: ObsNormalizer | None = None, reward_scaler: RewardScaler | None = None):
        self.backend, self.policy, self.tracker = backend, policy, tracker
        self.obs_normalizer, self.reward_scaler = obs_normalizer, reward_scaler
        self._started = False
        self._reward_np = backend.batch.reward.numpy()
        self._truncated_np = backend.batch.truncated.numpy()  # numpy's any() costs a third of torch's

    def reset(self, seed: int | None) -> None:
        self.backend.reset(seed)
        self._started = True

    def _write_obs(self, raw: torch.Tensor, out: torch.Tensor, update: bool) -> torch.Tensor:
        if self.obs_normalizer is None:
            return out.copy_(raw)
        if update:
            self.obs_normalizer.stats.update(raw)
        return self.obs_normalizer.normalize(raw, out=out)

    @torch.inference_mode()
    def collect(self, rollout: TensorDict) -> int:
        """Fill ``rollout`` ([N, T+1]) with T steps; returns the number of env steps taken."""
        if not self._started:
            raise RuntimeError("Collector.reset(seed) must be called before collect()")
        backend, policy = self.backend, self.policy
        # Per-step views of the [N, T+1] storage, made once per rollout.
        obs, action, logp, value, final_value, reward, done, terminated, truncated, valid = (
            rollout[key].unbind(1) for key in ("obs", "action", "sample_log_prob", "value", "final_value",
                                               "reward", "done", "terminated", "truncated", "valid"))
        horizon = rollout.batch_size[1] - 1
        # The tracker reads raw env rewards once per rollout; the rollout's may be scaled.
        raw_reward = np.empty((horizon, backend.num_rows), dtype=np.float32)
        step_infos: dict[int, dict[int, dict]] = {}  # step -> row -> info of an episode's last step
        batch = backend.recv()
        for t in range(horizon):
            obs_t = self._write_obs(batch.obs, obs[t], update=True)
            a, lp, v = policy.act(obs_t)
            action[t].copy_(a)
            logp[t].copy_(lp)
            value[t].copy_(v)
            backend.send(a)
            batch = backend.recv()
            torch.logical_or(batch.terminated, batch.truncated, out=done[t])
            if self.reward_scaler is None:
                reward[t].copy_(batch.reward)
            else:
                self.reward_scaler.scale(batch.reward, done[t], out=reward[t])
            terminated[t].copy_(batch.terminated)
            truncated[t].copy_(batch.truncated)
            valid[t].copy_(batch.valid)
            raw_reward[t] = self._reward_np
            if backend.final_infos:  # only at episode ends, and only when an env sets infos
                step_infos[t] = dict(backend.final_infos)
            if backend.autoreset == "same_step" and self._truncated_np.any():
                rows = batch.truncated.nonzero().squeeze(-1)
                final_obs = self._write_obs(batch.final_obs[rows], torch.empty_like(obs[t][rows]), update=False)
                final_value[t][rows] = policy.value(final_obs)
        last = self._write_obs(batch.obs, obs[horizon], update=False)
        value[horizon].copy_(policy.value(last))
        steps = slice(0, horizon)
        self.tracker.add(raw_reward, rollout["done"].numpy()[:, steps].T, rollout["valid"].numpy()[:, steps].T,
                         step_infos)
        self._check_rewards(rollout, horizon)
        return backend.num_rows * horizon

    def _check_rewards(self, rollout: TensorDict, horizon: int) -> None:
        reward = rollout["reward"][:, :horizon]
        if not torch.isfinite(reward).all():
            row, step = (~torch.isfinite(reward)).nonzero()[0].tolist()
            env_id = int(self.backend.batch.env_id[row])
            raise EnvError(
                f"env '{self.backend.name}' (env {env_id}) returned a non-finite reward "
                f"({reward[row, step].item()}) at step {step} of this rollout; rewards must be finite floats."
            )
