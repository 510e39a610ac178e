"""MADDPG (Lowe et al. 2017, arXiv:1706.02275): decentralized actors, each trained against a centralized critic
that sees every agent's observation and action in its env.

A minibatch of a trained policy is ``sgd_minibatch_size`` of its agents' stored steps, each with
its whole team's step (the rows of the same env at the same column): ``x`` is every agent's
observation features side by side and a one-hot of the learning agent's slot (so one critic serves
a policy shared by several agents), ``a`` every agent's action (one-hot for Discrete, unit actions
for Box). Each step:

    critic: minimize 0.5 * (Q(x, a) - y)^2,  y = r + discount * Q_target(x', a'),
            a' = every agent's action by its policy's target actor at x'
    actor:  maximize Q(x, a with the agent's own action replaced by its actor's, differentiably)
    targets: actor and critic targets move tau toward theirs

Discrete actors differentiate through a straight-through Gumbel-Softmax sample (see
``GumbelSoftmaxPolicy``). Rows without an agent at the step (padding, agents done early) show the
critic zeros for their observation and action. With one agent this is DDPG.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from shoal.algos.critics import ReplayActorCritic, TargetActorLearner
from shoal.algos.off_policy import bootstrapped, transitions
from shoal.config.maddpg import MADDPGConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError, warn
from shoal.models.actors import (
    DeterministicPolicy,
    GumbelSoftmaxPolicy,
    QTowers,
    feedforward,
    network_sizes,
)
from shoal.models.catalog import obs_normalizers

MADDPGActor = DeterministicPolicy | GumbelSoftmaxPolicy
TeamActions = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]
"""``MADDPGAlgorithm.team_actions``: (raw observations, their policy ids, by target actors?) -> actions."""


NOISE_KEYS = ("exploration_noise", "noise_type")  # read by the Box actors only
NOISE_DEFAULTS = {key: MADDPGConfig.model_fields[key].default for key in NOISE_KEYS}


class MADDPGAlgorithm(ReplayActorCritic[MADDPGConfig, MADDPGActor, "MADDPGLearner"]):
    name = "MADDPG"
    config_class = MADDPGConfig
    STAT_NAMES = ("critic_loss", "actor_loss", "q_mean")
    HIDDENS = (64, 64)

    def __init__(self, config: MADDPGConfig, env: EnvInfo):
        kind = env.act_spec.kind
        if kind == "multi_discrete":
            raise ConfigError(f"MADDPG takes Discrete or Box actions; '{env.name}' acts in {env.act_spec.space}.")
        if env.turn_based:
            raise ConfigError(
                f"MADDPG's critics learn from the team's simultaneous actions, and '{env.name}' is turn-based: one "
                f"agent moves at a time. Use algo=ppo, or algo=dqn (Discrete actions) or sac (Box)."
            )
        self.action_width = env.act_spec.nvec[0] if kind == "discrete" else env.act_spec.shape[0]
        """Width of one agent's action as the critics read it."""
        super().__init__(config, env)
        # values, not the keys given: a resumed run's config and a policy's own are rebuilt from every key
        noise = sorted(
            {
                key
                for pc in self.policy_configs.values()
                for key in NOISE_KEYS
                if getattr(pc, key) != NOISE_DEFAULTS[key]
            }
        )
        if kind == "discrete" and noise:
            warn(
                f"{', '.join(noise)} set for MADDPG on '{env.name}', whose actions are Discrete: its actors explore "
                f"by sampling their Gumbel-Softmax (gumbel_temperature), and the noise settings are not read."
            )

    def make_policy(self, policy_id: str, config: MADDPGConfig) -> MADDPGActor:
        """A Gumbel-Softmax actor for Discrete actions, a deterministic one with exploration noise for Box."""
        hiddens, activation = network_sizes(config, self.env, self.HIDDENS, "MADDPG")
        obs_dim = int(np.prod(self.env.obs_spec.shape))
        actor = feedforward(obs_dim, hiddens, self.action_width, activation)
        normalizer = obs_normalizers(config, self.env)[0]
        if self.env.act_spec.kind == "discrete":
            return GumbelSoftmaxPolicy(actor, self.action_width, normalizer, config.gumbel_temperature)
        return DeterministicPolicy(actor, self.env.act_spec, normalizer, config.exploration_noise, config.noise_type)

    def critic(self, policy_id: str) -> QTowers:
        """One Q-network over the team's observation features, the learning agent's slot and the team's actions."""
        hiddens, activation = network_sizes(self.policy_configs[policy_id], self.env, self.HIDDENS, "MADDPG")
        agents = self.env.rows_per_env
        width = agents * (int(np.prod(self.env.obs_spec.shape)) + 1 + self.action_width)
        return QTowers(width, hiddens, 1, activation).to(self.config.device)

    def make_learner(self, policy_id: str, config: MADDPGConfig) -> MADDPGLearner:
        return MADDPGLearner(self.policies[policy_id], self.critic(policy_id), config, self.team_actions)

    def minibatch(self, index: torch.Tensor, policy_id: str) -> TensorDict:
        """The sampled steps' teams: ``team`` ``[B, agents]`` (the ``transitions`` of every row of
        the env at the same column) and ``slot`` ``[B]``, the learning agent's row in it."""
        columns, agents = self.replay.columns, self.env.rows_per_env
        row, col = index // columns, index % columns
        first = row - row % agents
        team_rows = first.unsqueeze(1) + torch.arange(agents, device=index.device)
        team_index = (team_rows * columns + col.unsqueeze(1)).view(-1)
        c = self.config
        gamma = self.policy_configs[policy_id].gamma  # the learning policy's discount
        team = transitions(self.replay, team_index, n_step=c.n_step, gamma=gamma).view(len(index), agents)
        return TensorDict({"team": team, "slot": row % agents}, batch_size=[len(index)])

    def team_actions(self, obs: torch.Tensor, policy_id: torch.Tensor, target: bool) -> torch.Tensor:
        """Each row's action by its own policy's actor (its target copy with ``target``, for trained
        policies) as critics read it: ``obs`` ``[R, ...]`` raw, ``policy_id`` ``[R]``."""
        chosen = []
        for pid, policy in self.policies.items():
            learner = self.learners.get(pid)
            actor = learner.actor_target.module if target and learner is not None else None
            chosen.append(policy.critic_action(policy.features(obs), actor))
        actions = chosen[0]
        for index, action in enumerate(chosen[1:], 1):
            actions = torch.where((policy_id == index).unsqueeze(1), action, actions)
        return actions


class MADDPGLearner(TargetActorLearner):
    """One policy's centralized critic, target actor and the minibatch step the module describes."""

    policy: MADDPGActor

    def __init__(self, policy: MADDPGActor, critic: QTowers, config: MADDPGConfig, team_actions: TeamActions):
        super().__init__(policy, critic, config)
        self.team_actions = team_actions

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        policy, critic = self.policy, self.critic
        team: TensorDict = batch["team"]
        rows, agents = team.batch_size
        slot = nn.functional.one_hot(batch["slot"], agents).float()
        x = self.critic_view(team["obs"], team["valid"], slot)
        actions = self.present(policy.critic_input(team["action"].flatten(0, 1)).view(rows, agents, -1), team["valid"])
        target = self.td_target(batch)
        critic_loss, q, td_error = critic.learn(x, actions.flatten(1), target, weights)
        with critic.frozen():
            own_obs = team["obs"][torch.arange(rows, device=slot.device), batch["slot"]]
            mine = policy.critic_action(policy.features(own_obs)).unsqueeze(1)
            actions = torch.where(slot.bool().unsqueeze(2), mine, actions)
            actor_loss = -critic.values(x, actions.flatten(1))[0].mean()
        self.step_actor(actor_loss)
        self.update_targets()
        return {"critic_loss": critic_loss, "actor_loss": actor_loss.detach(), "q_mean": q.mean()}, td_error

    @torch.no_grad()
    def td_target(self, batch: TensorDict) -> torch.Tensor:
        """``r + discount * Q_target(x', a')`` of the learning agent, ``a'`` every agent's action by
        its policy's target actor."""
        team: TensorDict = batch["team"]
        rows, agents = team.batch_size
        slot = nn.functional.one_hot(batch["slot"], agents).float()
        next_obs = team["next_obs"].flatten(0, 1)
        next_actions = self.team_actions(next_obs, team["policy_id"].flatten(), True).view(rows, agents, -1)
        next_x = self.critic_view(team["next_obs"], team["valid"], slot)
        next_value = self.critic.target_min(next_x, self.present(next_actions, team["valid"]).flatten(1))
        return bootstrapped(team[torch.arange(rows, device=slot.device), batch["slot"]], next_value)

    def critic_view(self, obs: torch.Tensor, valid: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """What the critic sees besides the actions: every agent's observation features ``obs`` ``[B,
        agents, ...]`` (zeros for rows without an agent), then the learning agent's slot."""
        rows, agents = valid.shape
        features = self.policy.features(obs.flatten(0, 1)).view(rows, agents, -1)
        return torch.cat([self.present(features, valid).flatten(1), slot], 1)

    @staticmethod
    def present(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``values`` ``[B, agents, k]`` with the rows of absent agents (padding, done early) zeroed."""
        return torch.where(valid.unsqueeze(2), values, 0.0)
