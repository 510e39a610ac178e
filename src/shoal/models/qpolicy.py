"""``QPolicy``: a policy that acts on learned action values, epsilon-greedily (DQN's policy), and
``RecurrentQPolicy``, the same with a recurrent core (recurrent DQN, R2D2-style)."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn

from shoal.models.normalize import ObsNormalizer
from shoal.models.policy import Policy
from shoal.models.recurrent import RecurrentModel


class QPolicy(Policy):
    """Greedy actions on ``Q(obs, .)``, or with probability ``epsilon`` a uniformly random legal one.

    ``model`` is any network of the actor-critic contract, ``obs -> (outputs [B, n], value [B])``:
    its outputs are the Q-values, or with ``dueling`` the advantages ``A`` that combine with the
    value ``V`` into ``Q = V + A - mean(A)`` (Wang et al. 2016). The algorithm sets ``epsilon``
    from its exploration schedule; ``deterministic`` acting (evaluation) is greedy.

    Its one extra is ``value``, the greedy value ``max_a Q(obs, a)`` over the legal actions, which
    an on-policy Q-learner (PQN) stores per step to build its returns; replay learners store none.
    """

    extras = ("value",)
    synced_attributes = ("epsilon",)

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
        return self.combine(*(self.model if model is None else model)(self.normalize(obs)[0]))

    def combine(self, outputs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Q-values ``[..., n]`` from the model's outputs ``[..., n]`` and value ``[...]``."""
        if not self.dueling:
            return outputs
        return value.unsqueeze(-1) + outputs - outputs.mean(-1, keepdim=True)

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
        """Epsilon-greedy actions within ``action_mask``, and the greedy value when ``out`` asks for
        it; the state passes through."""
        action, extras = self.choose(self.q_values(obs), action_mask, deterministic, out)
        return action, extras, state

    def value(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None, state: TensorDict | None = None
    ) -> torch.Tensor:
        """The greedy value ``max_a Q(obs, a)`` ``[B]`` of raw observations, over every action (the
        on-policy base bootstraps truncated episodes with it; their last action mask is not kept)."""
        return self.q_values(obs).amax(-1)

    def choose(
        self, q: torch.Tensor, action_mask: torch.Tensor | None, deterministic: bool, out: TensorDict | None
    ) -> tuple[torch.Tensor, TensorDict]:
        """Epsilon-greedy actions on the Q-values ``q`` ``[B, n]``, and the extras: ``value`` written
        into ``out`` when it holds that field, or returned in a new TensorDict without ``out``."""
        masked = q if action_mask is None else q.masked_fill(~action_mask, -torch.inf)
        best, action = masked.max(-1)
        if action_mask is not None:  # a row with no legal action (another agent's turn): its max over all actions
            best = torch.where(action_mask.any(-1), best, q.amax(-1))
        if out is None:
            out = TensorDict({"value": best}, batch_size=[len(q)])
        elif "value" in out.keys():  # noqa: SIM118 (a TensorDict)
            out["value"].copy_(best)
        return self.explore(action, action_mask, deterministic), out

    def explore(self, action: torch.Tensor, action_mask: torch.Tensor | None, deterministic: bool) -> torch.Tensor:
        """``action``, replaced in each row with probability ``epsilon`` by a uniformly random legal one."""
        if deterministic or self.epsilon <= 0:
            return action
        rows, device = len(action), action.device
        explore = torch.rand(rows, device=device) < self.epsilon
        if action_mask is None:
            random = torch.randint(self.num_actions, (rows,), device=device)
        else:  # uniform over the legal actions: the largest of uniform draws where legal
            random = torch.rand(rows, self.num_actions, device=device).masked_fill_(~action_mask, -1).argmax(1)
        return torch.where(explore, random, action)


class RecurrentQPolicy(QPolicy):
    """A ``QPolicy`` on a ``RecurrentModel``: ``act`` carries each row's state (zeroed where ``first``)
    and takes one step of the core; learning replays stored sequences (``unroll``) and values the
    observation after a step from the state after it (``q_values`` with ``state``)."""

    model: RecurrentModel

    def initial_state(self, rows: int) -> TensorDict:
        return self.model.initial_state(rows, next(self.model.parameters()).device)

    def q_values(
        self, obs: torch.Tensor, model: nn.Module | None = None, state: TensorDict | None = None
    ) -> torch.Tensor:
        """``Q(obs, .)`` ``[B, n]`` after one step of the core from ``state`` (zeros when None: the
        observations start episodes)."""
        state = self.initial_state(len(obs)) if state is None else state
        outputs, value, _ = (self.model if model is None else model)(self.normalize(obs)[0], state)
        return self.combine(outputs, value)

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
        """Epsilon-greedy actions after one step of the core from ``state`` (zeros where ``first``);
        returns the next state as a new TensorDict."""
        outputs, value, nxt = self.model(self.normalize(obs)[0], state, first)
        action, extras = self.choose(self.combine(outputs, value), action_mask, deterministic, out)
        next_state = TensorDict(dict(zip(self.model.state_keys, nxt)), batch_size=state.batch_size)
        return action, extras, next_state

    def unroll(
        self,
        obs: torch.Tensor,
        start_state: TensorDict,
        first: torch.Tensor,
        burn_in: int = 0,
        model: RecurrentModel | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """The core's state after each step of sequences ``obs [B, L, ...]`` replayed from
        ``start_state [B]`` (zeroed where ``first [B, L]``), for the steps past the first
        ``burn_in``: ``[B, L - burn_in, width]`` per state key. The burn-in steps only bring the
        state up to date, without gradient (R2D2's burn-in)."""
        model = self.model if model is None else model
        obs = self.normalize(obs)[0]
        if burn_in:
            with torch.no_grad():
                warm = model.unroll(obs[:, :burn_in], start_state, first[:, :burn_in])
            start_state = TensorDict(
                {key: value[:, -1] for key, value in zip(model.state_keys, warm)}, batch_size=start_state.batch_size
            )
        return model.unroll(obs[:, burn_in:], start_state, first[:, burn_in:])

    def q_of(self, states: tuple[torch.Tensor, ...], model: RecurrentModel | None = None) -> torch.Tensor:
        """Q-values ``[..., n]`` read from states the core of ``model`` (default: the policy's own)
        reached (``unroll``'s)."""
        return self.combine(*(self.model if model is None else model).heads(states[0]))


def greedy(q: torch.Tensor, action_mask: torch.Tensor | None) -> torch.Tensor:
    """The legal action of highest value along the last dim."""
    if action_mask is not None:
        q = q.masked_fill(~action_mask, -torch.inf)
    return q.argmax(-1)
