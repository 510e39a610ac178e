"""The collector: runs the policy on a backend and writes the rollout in place.

Batches arrive in whatever order the backend's env groups finish stepping (``async_factor``
groups; one when synchronous). Every agent row keeps its own write position, so each row's
trajectory is whole however the groups interleave. A group that has taken its ``T`` steps is
*parked*: its latest observation goes in slot ``T`` as the bootstrap, and it waits, not stepping,
until the next rollout starts from exactly that observation.

Per batch it does one forward per policy over the rows that policy owns (``PolicyMap``; with a
single policy, one forward over all rows) and a fixed handful of copies into views of the
preallocated storage (made once per rollout storage and batch). When an env ends its episode the
mapping is asked again for its agents' policies.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from shoal.collect.critic import _CriticInput
from shoal.collect.episodes import EpisodeTracker, env_episode_ends
from shoal.collect.policies import PolicyMap
from shoal.errors import EnvError
from shoal.models.normalize import ObsNormalizer, RewardScaler
from shoal.vector.base import StepBatch, VecBackend

_FIELDS = ("obs", "action", "sample_log_prob", "value", "final_value", "reward", "done", "terminated",
           "truncated", "valid", "raw_reward", "policy_id")


class Collector:
    def __init__(self, backend: VecBackend, policies: PolicyMap, tracker: EpisodeTracker,
                 obs_normalizer: ObsNormalizer | None = None, reward_scaler: RewardScaler | None = None,
                 critic: _CriticInput | None = None):
        self.backend, self.policies, self.tracker, self.critic = backend, policies, tracker, critic
        self.obs_normalizer, self.reward_scaler = obs_normalizer, reward_scaler
        self._parked: list[StepBatch] = []  # groups whose current obs has not been acted on
        self._position = np.zeros(backend.num_rows, dtype=np.int64)  # next step each row writes
        self._views: dict[int, dict[str, tuple[torch.Tensor, ...]]] = {}
        self._views_of: TensorDict | None = None
        self._raw_reward: torch.Tensor | None = None  # [N, T+1]: the tracker reads unscaled rewards

    def reset(self, seed: int | None) -> None:
        """Reset every env; all groups start parked on their first observation."""
        self.backend.reset(seed)
        self.policies.start_episodes(range(self.backend.num_envs), self.backend.first_env_id)
        self._parked = [self.backend.recv() for _ in range(self.backend.async_factor)]

    def _write_obs(self, raw: torch.Tensor, out: torch.Tensor, update: bool) -> torch.Tensor:
        if self.obs_normalizer is None:
            return out.copy_(raw)
        if update:
            self.obs_normalizer.stats.update(raw)
        return self.obs_normalizer.normalize(raw, out=out)

    def _views_for(self, rollout: TensorDict, batch: StepBatch) -> dict[str, tuple[torch.Tensor, ...]]:
        """Per-step views ``field[t] -> [rows of batch, ...]`` of the storage, made once."""
        if self._views_of is not rollout:
            self._views, self._views_of = {}, rollout
            self._raw_reward = torch.zeros(rollout.batch_size)
            if self.critic is not None:
                self.critic.init(rollout["critic_obs"])
        views = self._views.get(id(batch))
        if views is None:
            keys = _FIELDS + tuple(key for key in ("action_mask", "critic_obs") if key in rollout.keys())
            views = {key: (self._raw_reward if key == "raw_reward" else rollout[key])[batch.rows].unbind(1)
                     for key in keys}
            for key in ("terminated", "truncated", "valid"):  # numpy's any() costs a third of torch's
                views[f"{key}_np"] = getattr(batch, key).numpy()
            self._views[id(batch)] = views
        return views

    @torch.inference_mode()
    def collect(self, rollout: TensorDict) -> int:
        """Fill ``rollout`` ([N, T+1]) with T steps of every row; returns the number of env steps
        (agent steps divided by the agent rows per env)."""
        if not self._parked:
            raise RuntimeError("Collector.reset(seed) must be called before collect()")
        backend, policies = self.backend, self.policies
        horizon = rollout.batch_size[1] - 1
        step_infos: dict[int, dict[int, dict]] = {}  # step -> row -> info of an episode's last step
        ready, self._parked = self._parked, []
        num_groups = len(ready)
        self._position[:] = 0
        while len(self._parked) < num_groups:
            if ready:  # parked since the last rollout: its obs is current, no step result to record
                batch = ready.pop()
                views = self._views_for(rollout, batch)
                t = 0
            else:
                batch = backend.recv()
                views = self._views_for(rollout, batch)
                t = int(self._position[batch.rows.start])
                self._record_step(batch, views, t - 1, step_infos)
            if t < horizon:
                obs_t = self._write_obs(batch.obs, views["obs"][t], update=True)
                mask = None if batch.action_mask is None else views["action_mask"][t].copy_(batch.action_mask)
                critic_obs = None if self.critic is None else self.critic.write(batch, obs_t, views["critic_obs"][t])
                if not policies.single:
                    views["policy_id"][t].copy_(policies.row_policy[batch.rows])
                a, _, _ = policies.act(obs_t, mask, batch.rows, critic_obs=critic_obs,
                                       out=(views["action"][t], views["sample_log_prob"][t], views["value"][t]))
                backend.send(a, batch)
                self._position[batch.rows] = t + 1
            else:  # T steps taken: bootstrap from the current obs and park until the next rollout
                last = self._write_obs(batch.obs, views["obs"][horizon], update=False)
                critic_obs = None if self.critic is None else self.critic.write(batch, last,
                                                                                 views["critic_obs"][horizon])
                views["value"][horizon].copy_(policies.value(last, batch.rows, critic_obs=critic_obs))
                self._parked.append(batch)
        steps = slice(0, horizon)
        if backend.autoreset == "next_step":  # the true final obs of a truncation is the next step's obs
            truncated = rollout["truncated"][:, steps]
            rollout["final_value"][:, steps] = torch.where(truncated, rollout["value"][:, 1:],
                                                           rollout["final_value"][:, steps])
        self.tracker.add(self._raw_reward[:, steps].numpy().T, rollout["done"].numpy()[:, steps].T,
                         rollout["valid"].numpy()[:, steps].T, step_infos, rollout["policy_id"].numpy()[:, steps].T)
        self._check_rewards(rollout, horizon)
        return backend.num_envs * horizon

    def _record_step(self, batch: StepBatch, views: dict, t: int, step_infos: dict[int, dict[int, dict]]) -> None:
        """Write the result of step ``t`` (reward, flags, bootstrap values) for ``batch``'s rows."""
        done = torch.logical_or(batch.terminated, batch.truncated, out=views["done"][t])
        if self.reward_scaler is None:
            views["reward"][t].copy_(batch.reward)
        else:
            self.reward_scaler.scale(batch.reward, done, out=views["reward"][t], rows=batch.rows)
        views["raw_reward"][t].copy_(batch.reward)
        views["terminated"][t].copy_(batch.terminated)
        views["truncated"][t].copy_(batch.truncated)
        views["valid"][t].copy_(batch.valid)
        if self.backend.final_infos:  # only at episode ends, and only when an env sets infos
            step_infos.setdefault(t, {}).update(self.backend.final_infos)
        if self.backend.autoreset == "same_step" and views["truncated_np"].any():
            rows = batch.truncated.nonzero().squeeze(-1)
            final_obs = self._write_obs(batch.final_obs[rows], torch.empty_like(views["obs"][t][rows]),
                                        update=False)
            critic_obs = None if self.critic is None else self.critic.final(
                batch, rows, lambda obs: self._write_obs(obs, torch.empty_like(obs, dtype=torch.float32), update=False))
            views["final_value"][t][rows] = self.policies.value(final_obs, batch.rows, rows, critic_obs)
        if not self.policies.single and (views["terminated_np"].any() or views["truncated_np"].any()):
            self._start_episodes(batch, views)

    def _start_episodes(self, batch: StepBatch, views: dict) -> None:
        """Envs whose episode ended this step (an agent finished and none is left acting) start a
        new one: their agents are mapped to policies again."""
        k = self.backend.rows_per_env
        done = views["terminated_np"] | views["truncated_np"]
        ended = np.flatnonzero(env_episode_ends(done, views["valid_np"], k)) + batch.rows.start // k
        self.policies.start_episodes(ended, self.backend.first_env_id)

    def _check_rewards(self, rollout: TensorDict, horizon: int) -> None:
        reward = rollout["reward"][:, :horizon]
        if not torch.isfinite(reward).all():
            row, step = (~torch.isfinite(reward)).nonzero()[0].tolist()
            env_id = int(self.backend.batch.env_id[row])
            raise EnvError(
                f"env '{self.backend.name}' (env {env_id}) returned a non-finite reward "
                f"({reward[row, step].item()}) at step {step} of this rollout; rewards must be finite floats."
            )
