"""``QPolicy``: a policy that acts on learned action values, epsilon-greedily (DQN's policy)."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn

from shoal.models.normalize import ObsNormalizer
from shoal.models.policy import Policy


class QPolicy(Policy):
    """Greedy actions on ``Q(obs, .)``, or with probability ``epsilon`` a uniformly random legal one.

    ``model`` is any network of the actor-critic contract, ``obs -> (outputs [B, n], value [B])``:
    its outputs are the Q-values, or with ``dueling`` the advantages ``A`` that combine with the
    value ``V`` into ``Q = V + A - mean(A)`` (Wang et al. 2016). The algorithm sets ``epsilon``
    from its exploration schedule; ``deterministic`` acting (evaluation) is greedy.
    """

    def __init__(
        self, model: nn.Module, num_actions: int, obs_normalizer: ObsNormalizer | None = None, dueling: bool = False
    ):
        super().__init__()
        self.model, self.num_actions, self.dueling = model, num_actions, dueling
        self.obs_normalizer = obs_normalizer
        self.epsilon = 0.0
        """The probability of a random action when acting not deterministically."""

    def q_values(self, obs: torch.Tensor, model: nn.Module | None = None) -> torch.Tensor:
        """``Q(obs, .)`` ``[B, n]`` of raw observations, by ``model`` (default: the policy's own; the
        learner passes its target copy, which shares the observation statistics)."""
        outputs, value = (self.model if model is None else model)(self.normalize(obs)[0])
        if not self.dueling:
            return outputs  # type: ignore[no-any-return]  # the model's contract: a float tensor
        return value.unsqueeze(1) + outputs - outputs.mean(1, keepdim=True)  # type: ignore[no-any-return]

    def act(
        self,
        obs: torch.Tensor,
        state: TensorDict,
        first: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        *,
        deterministic: bool = False,
        out: TensorDict | None = None,
        critic_obs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, TensorDict, TensorDict]:
        """Epsilon-greedy actions within ``action_mask``; no extras, and the state passes through."""
        action = greedy(self.q_values(obs), action_mask)
        if not deterministic and self.epsilon > 0:
            rows = len(obs)
            explore = torch.rand(rows, device=obs.device) < self.epsilon
            if action_mask is None:
                random = torch.randint(self.num_actions, (rows,), device=obs.device)
            else:  # uniform over the legal actions: the largest of uniform draws where legal
                random = torch.rand(rows, self.num_actions, device=obs.device).masked_fill_(~action_mask, -1).argmax(1)
            action = torch.where(explore, random, action)
        return action, out if out is not None else TensorDict({}, batch_size=[len(obs)]), state


def greedy(q: torch.Tensor, action_mask: torch.Tensor | None) -> torch.Tensor:
    """The legal action of highest value in each row."""
    if action_mask is not None:
        q = q.masked_fill(~action_mask, -torch.inf)
    return q.argmax(1)
