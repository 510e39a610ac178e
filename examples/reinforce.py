"""REINFORCE with a learned baseline (Williams 1992), written as a shoal Algorithm.

The user guide's example of an algorithm of your own: a config with its keys, an ``Algorithm``
subclass that owns its storage and optimizer, and a ``training_step`` that collects one rollout
and takes one gradient step on it. It collects whole episodes (``batch_mode='complete_episodes'``),
so each return is the episode's own, with no value estimate where a fragment would cut it. The
unchanged trainer runs it, with everything else shoal does (logging, checkpoints and exact resume,
evaluation, video, several envs or worker processes):

    shoal train CartPole-v1 --algo examples.reinforce:Reinforce
    python examples/reinforce.py [total_timesteps]
"""

from __future__ import annotations

import sys
from typing import Literal

import torch
from pydantic import Field

import shoal
from shoal.buffers import RolloutBuffer, transition_view


class ReinforceConfig(shoal.TrainerConfig):
    """The common keys (env, num_envs, rollout_fragment_length, gamma, learning_rate, model...) and these."""

    rollout_fragment_length: int | None = Field(128, ge=1)  # at least this many steps per env, then on to episode ends
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = "complete_episodes"  # Monte Carlo returns
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    learning_rate: float = Field(3e-3, gt=0.0)
    vf_coef: float = Field(0.5, ge=0.0)
    ent_coef: float = Field(0.01, ge=0.0)
    max_grad_norm: float = Field(0.5, gt=0.0)


class Reinforce(shoal.Algorithm):
    name = "REINFORCE"
    config_class = ReinforceConfig

    def __init__(self, config: ReinforceConfig, env: shoal.EnvInfo):
        super().__init__(config, env)  # builds self.policies: the actor-critic that model / model_config name
        if len(self.policies) > 1:
            raise shoal.ConfigError("this REINFORCE example trains one policy; leave policies unset.")
        self.policy = self.policies["default_policy"]
        # [N, C+1] storage of the env fields and the policy's extras (sample_log_prob, value); with complete
        # episodes C leaves room for each env's last episode, and every row's slots after it are padding
        self.buffer = RolloutBuffer(env, config.rollout_capacity, self.extra_fields())
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.learning_rate)

    def training_step(self, collector) -> dict[str, float]:
        c = self.config
        rollout = self.buffer.start_rollout()
        self.collect(collector, rollout)  # as batch_mode says
        self.buffer.add(rollout)
        self.update_obs_stats(rollout)  # normalize_obs: the policy's statistics take in this rollout

        with torch.no_grad():
            final_value = torch.zeros_like(rollout["reward"])  # of each truncated episode's true last obs
            cut = collector.truncations
            final_value[cut.row, cut.step] = self.policy.value(cut.obs)
            returns = discounted_returns(rollout, final_value, c.gamma)

        steps = self.buffer.get(flatten=True)  # [N*C] transitions
        valid = steps["valid"]  # False on padding and next-step resets
        steps, returns = steps[valid], returns.reshape(-1)[valid]  # the steps taken
        logp, entropy, value = self.policy.evaluate(
            steps["obs"], steps["action"], action_mask=steps.get("action_mask", None)
        )
        advantage = (returns - value).detach()
        policy_loss = -(logp * advantage).mean()
        vf_loss = 0.5 * (value - returns).square().mean()
        entropy = entropy.mean()
        loss = policy_loss + c.vf_coef * vf_loss - c.ent_coef * entropy

        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(c)  # annealed when lr_schedule is linear
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.max_grad_norm)
        self.optimizer.step()
        return {"policy_loss": policy_loss.item(), "vf_loss": vf_loss.item(), "entropy": entropy.item()}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])


def discounted_returns(rollout, final_value: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` per row ``[N, T]``: 0 after a terminal step, the value of
    the true last observation after a truncation, and the value of the last observation where the
    rollout cuts an episode (never, with complete episodes)."""
    steps = transition_view(rollout)
    reward, terminated, truncated = steps["reward"], steps["terminated"], steps["truncated"]
    returns = torch.empty_like(reward)
    following = rollout["value"][:, -1]
    for t in reversed(range(reward.shape[1])):
        following = torch.where(truncated[:, t], final_value[:, t], following)
        following = reward[:, t] + gamma * following * ~terminated[:, t]
        returns[:, t] = following
    return returns


if __name__ == "__main__":
    with shoal.Trainer(algo=Reinforce, env="CartPole-v1", seed=1, save_outputs=False) as trainer:
        trainer.learn(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
        print(trainer.evaluate(20))
