"""Recurrent actor-critics: ``encoder -> hiddens -> LSTM or GRU core -> head_hiddens -> heads``.

``model_config={"core": "lstm", "core_size": 128}`` puts a recurrent core behind any encoder (the
MLP over flat observations, the CNN, one encoder per key of a Dict), shared by both heads or, with
a separate critic, one per head. The core's state is one TensorDict row per agent (``h``, and
``c`` for an LSTM), carried by the collector from step to step and zeroed where an episode starts.

Acting runs the core one step at a time; learning replays each ``[segments, bptt_horizon]``
segment from the state stored at its start, zeroing it again at every episode start inside the
segment, so a training forward with unchanged weights reproduces what the rollout computed. Both
use the same cell's parameters (``nn.LSTMCell`` / ``nn.GRUCell``): acting steps it, learning runs
the recurrence over whole segments in one fused call (``shoal.models.cores``).

``use_prev_action`` / ``use_prev_reward`` add the previous action (one-hot per category for
discrete actions) and the previous reward to the core's input, zeros at an episode start. They
live in the state too (``prev_action``, ``prev_reward``): ``act`` writes the action it took, the
collector the reward the step returned, so a segment that starts mid-episode replays from the
stored ones; inside a segment the learner reads them from the stored actions and rewards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict
from torch import nn
from torch.nn import functional as F

from shoal.envs.spaces import ActionSpec
from shoal.models.cores import Core, cut_at_resets, make_cell, run_segments, step_cell
from shoal.models.layers import linear_head, mlp
from shoal.models.networks import POLICY_GAIN, VALUE_GAIN
from shoal.models.normalize import ObsNormalizer
from shoal.models.policy import ActorCriticPolicy


class RecurrentModel(nn.Module):
    """One tower ``trunk -> core`` (a trunk maps observations ``[B, ...]`` to features ``[B,
    feature_dim]``, the core has ``size`` units) whose output feeds both heads; or, given two
    trunks, a second tower for the value head, so the critic's memory neither shares the actor's
    units nor pulls on them. Each head can have hidden layers (``head_hiddens``) between the core
    and its output.

    The state of two towers is the actor's and the critic's side by side (``h`` and ``c`` of
    ``2 * size`` units): to the collector and the learner it is one state like any other."""

    def __init__(
        self,
        trunks: Sequence[nn.Module],
        feature_dim: int,
        num_outputs: int,
        core: Core,
        size: int,
        *,
        head_hiddens: list[int] | None = None,
        activation: str = "tanh",
        prev_action: ActionSpec | None = None,
        prev_reward: bool = False,
    ):
        """``prev_action`` (the action space) and ``prev_reward``: feed the core the previous action
        and reward as well (see the module docstring)."""
        super().__init__()
        self.prev_action = prev_action
        self.action_width = 0 if prev_action is None else action_width(prev_action)
        self.prev_reward = prev_reward
        feature_dim += self.action_width + int(prev_reward)
        if len(trunks) not in (1, 2):
            raise ValueError(f"a recurrent model has one trunk (shared) or two (actor, critic), got {len(trunks)}")
        self.trunks = nn.ModuleList(trunks)
        self.cells = nn.ModuleList(make_cell(core, feature_dim, size) for _ in trunks)
        # size: units of each core; width: of the state, the towers' units side by side
        self.core, self.size, self.width = core, size, size * len(trunks)
        self.state_keys = ("h", "c") if core == "lstm" else ("h",)
        # the previous action and reward ride along with the state (zeros at an episode start)
        self.input_widths = {"prev_action": self.action_width} if prev_action is not None else {}
        if prev_reward:
            self.input_widths["prev_reward"] = 1
        hiddens = head_hiddens or []
        head_in = hiddens[-1] if hiddens else size
        self.policy_head = nn.Sequential(mlp(size, hiddens, activation), linear_head(head_in, num_outputs, POLICY_GAIN))
        self.value_head = nn.Sequential(mlp(size, hiddens, activation), linear_head(head_in, 1, VALUE_GAIN))

    @property
    def carried_keys(self) -> tuple[str, ...]:
        """The state's keys: the core's, then the previous action's and reward's."""
        return (*self.state_keys, *self.input_widths)

    def initial_state(self, rows: int, device: torch.device | str = "cpu") -> TensorDict:
        """Zeros: the state of ``rows`` agent rows at an episode start."""
        widths = dict.fromkeys(self.state_keys, self.width) | self.input_widths
        return TensorDict(
            {key: torch.zeros(rows, width, device=device) for key, width in widths.items()},
            batch_size=[rows],
            device=device,
        )

    def with_inputs(
        self, features: torch.Tensor, inputs: list[torch.Tensor], first: torch.Tensor | None
    ) -> torch.Tensor:
        """``features [..., F]`` with the previous action and reward ``inputs`` appended (zeros where
        ``first``), as the core reads them."""
        if not inputs:
            return features
        extra = torch.cat(inputs, dim=-1)
        if first is not None:
            extra = extra.masked_fill(first.unsqueeze(-1), 0.0)
        return torch.cat((features, extra), dim=-1)

    def tower_state(self, state: tuple[torch.Tensor, ...], tower: int) -> tuple[torch.Tensor, ...]:
        """Tower ``tower``'s part (0: the actor's, 1: the critic's) of each tensor of ``state``."""
        return tuple(s[..., tower * self.size : (tower + 1) * self.size] for s in state)

    def core_step(self, features: list[torch.Tensor], state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """One step of the core(s) on each tower's ``features``: the new state (its first tensor is
        the output)."""
        if len(self.cells) == 1:
            return step_cell(self.cells[0], features[0], state)
        towers = [
            step_cell(cell, x, self.tower_state(state, i)) for i, (cell, x) in enumerate(zip(self.cells, features))
        ]
        return tuple(torch.cat(parts, dim=-1) for parts in zip(*towers))

    def heads(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution inputs from the actor's units, values from the critic's (the same units
        with one tower)."""
        return self.policy_head(out[..., : self.size]), self.value_head(out[..., -self.size :]).squeeze(-1)

    def forward(
        self, obs: torch.Tensor, state: TensorDict, first: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """One step for a batch of rows: distribution inputs ``[B, P]``, values ``[B]`` and the next
        state (as a tuple in ``state_keys`` order). Rows where ``first`` is True start from zeros."""
        prev = tuple(state[key] for key in self.state_keys)
        if first is not None:
            reset = first.unsqueeze(1)
            prev = tuple(x.masked_fill(reset, 0.0) for x in prev)
        inputs = [state[key] for key in self.input_widths]
        nxt = self.core_step([self.with_inputs(trunk(obs), inputs, first) for trunk in self.trunks], prev)
        return (*self.heads(nxt[0]), nxt)

    def forward_sequence(
        self,
        obs: torch.Tensor,
        start_state: TensorDict,
        first: torch.Tensor,
        action: torch.Tensor | None = None,
        reward: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Segments ``obs [S, L, ...]`` replayed from ``start_state [S]``, zeroing the state where
        ``first [S, L]`` is True: distribution inputs ``[S, L, P]`` and values ``[S, L]``. The
        segments' ``action`` and ``reward`` are needed when the core reads the previous ones.

        Each tower runs its trunk over every step at once, then its core over all the segments in
        one fused call (``cores.run_segments``): the recurrence of ``unroll``, which steps the
        cell once per time step, without a Python step per time step."""
        segments, length = first.shape
        pieces = cut_at_resets(first)
        start = tuple(start_state[key] for key in self.state_keys)
        inputs = self.sequence_inputs(start_state, first, action, reward)
        outputs = []
        for i, (trunk, cell) in enumerate(zip(self.trunks, self.cells)):
            features = trunk(obs.flatten(0, 1)).unflatten(0, (segments, length))
            features = self.with_inputs(features, inputs, first)
            outputs.append(run_segments(cell, features, self.tower_state(start, i), pieces))
        # the actor's units feed the policy head, the critic's the value head (one tower: the same)
        return self.policy_head(outputs[0]), self.value_head(outputs[-1]).squeeze(-1)

    def sequence_inputs(
        self, start_state: TensorDict, first: torch.Tensor, action: torch.Tensor | None, reward: torch.Tensor | None
    ) -> list[torch.Tensor]:
        """The previous action and reward at every step of segments ``[S, L]``: the stored ones
        (``start_state``) at each segment's start, the segment's own from then on."""
        segments, length = first.shape
        missing = "this core reads the previous action and reward: pass the segments' {}"
        inputs = []
        if self.prev_action is not None:
            if action is None:
                raise ValueError(missing.format("actions"))
            taken = encode_actions(action.flatten(0, 1), self.prev_action).view(segments, length, -1)
            inputs.append(torch.cat((start_state["prev_action"].unsqueeze(1), taken[:, :-1]), dim=1))
        if self.prev_reward:
            if reward is None:
                raise ValueError(missing.format("rewards"))
            inputs.append(torch.cat((start_state["prev_reward"].unsqueeze(1), reward[:, :-1, None]), dim=1))
        return inputs

    def unroll(
        self,
        obs: torch.Tensor,
        start_state: TensorDict,
        first: torch.Tensor,
        action: torch.Tensor | None = None,
        reward: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """The state after each step of segments ``obs [S, L, ...]`` replayed from ``start_state
        [S]``, zeroing it where ``first [S, L]`` is True: one ``[S, L, width]`` tensor per state key
        (the first, ``h``, is the core's output)."""
        segments, length = first.shape
        resets = first.unsqueeze(2).unbind(1)
        start = tuple(start_state[key] for key in self.state_keys)
        inputs = self.sequence_inputs(start_state, first, action, reward)
        towers = []
        # each tower whole: its trunk over every step at once, then its core one step at a time (a
        # second tower doubles the Python steps, but joins the towers' outputs once, not per step)
        for i, (trunk, cell) in enumerate(zip(self.trunks, self.cells)):
            features = trunk(obs.flatten(0, 1)).unflatten(0, (segments, length))
            features = self.with_inputs(features, inputs, first).unbind(1)
            state = self.tower_state(start, i)
            steps = []
            for t in range(length):
                state = step_cell(cell, features[t], tuple(s.masked_fill(resets[t], 0.0) for s in state))
                steps.append(state)
            towers.append([torch.stack(parts, dim=1) for parts in zip(*steps)])
        return tuple(towers[0] if len(towers) == 1 else (torch.cat(parts, dim=-1) for parts in zip(*towers)))


def action_width(spec: ActionSpec) -> int:
    """Width of ``encode_actions``: one slot per category, or the Box's dimensions."""
    return sum(spec.nvec) if spec.kind != "continuous" else spec.shape[0]


def encode_actions(action: torch.Tensor, spec: ActionSpec) -> torch.Tensor:
    """Actions ``[B, ...]`` as core inputs ``[B, action_width]``: one-hot per category for
    discrete actions, the vector itself for Box actions."""
    if spec.kind == "continuous":
        return action.float()
    parts = action.reshape(action.shape[0], -1).unbind(1)
    return torch.cat([F.one_hot(part, n) for part, n in zip(parts, spec.nvec)], dim=-1).float()


class RecurrentActorCriticPolicy(ActorCriticPolicy):
    """An actor-critic with a recurrent core: ``act`` carries each row's state, ``evaluate_segments``
    replays stored segments for learning (see the module docstring)."""

    model: RecurrentModel

    def __init__(
        self,
        model: RecurrentModel,
        action: ActionSpec,
        obs_normalizer: ObsNormalizer | None = None,
        log_std_init: float = 0.0,
    ):
        super().__init__(model, action, obs_normalizer, None, log_std_init)

    def initial_state(self, rows: int) -> TensorDict:
        return self.model.initial_state(rows, next(self.model.parameters()).device)

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
        """Like ``ActorCriticPolicy.act``, one step of the core from ``state`` (zeros where
        ``first``); returns the next state as a new TensorDict (``state`` is left as it was)."""
        obs, _ = self.normalize(obs)
        params, value, nxt = self.model(obs, state, first)
        action, logp = self.sample(params, action_mask, deterministic)
        carried = dict(zip(self.model.state_keys, nxt))
        if self.model.prev_action is not None:
            carried["prev_action"] = encode_actions(action, self.model.prev_action)
        if self.model.prev_reward:  # the collector writes the reward once the step returns it
            carried["prev_reward"] = torch.zeros_like(state["prev_reward"])
        next_state = TensorDict(carried, batch_size=state.batch_size)
        return action, self.write_extras(logp, value, out), next_state

    def value(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None, state: TensorDict | None = None
    ) -> torch.Tensor:
        """Values ``[B]`` of raw observations seen from ``state`` (the state the rows had when they
        saw them; zeros when None)."""
        obs, _ = self.normalize(obs)
        if state is None:
            state = self.initial_state(obs.shape[0])
        step: tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]] = self.model(obs, state)
        return step[1]

    def forward(self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution inputs and values of observations as episode starts (from zeros); learning
        and acting go through ``evaluate_segments`` and ``act``, which carry the state."""
        step: tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]] = self.model(
            self.normalize(obs)[0], self.initial_state(obs.shape[0])
        )
        return step[0], step[1]

    def evaluate_segments(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        first: torch.Tensor,
        start_state: TensorDict,
        *,
        entropy: bool = True,
        action_mask: torch.Tensor | None = None,
        reward: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``evaluate`` over segments ``[S, L]``: log-probabilities, entropies (None when not
        asked for) and values, each ``[S, L]``, replayed from each segment's ``start_state``
        (``reward``: the segments' rewards, for a core that reads the previous one)."""
        obs, _ = self.normalize(obs)
        params, value = self.model.forward_sequence(obs, start_state, first, action, reward)
        flat_mask = None if action_mask is None else action_mask.flatten(0, 1)
        logp, ent = self.score(params.flatten(0, 1), action.flatten(0, 1), entropy, flat_mask)
        shape = first.shape
        return logp.view(shape), None if ent is None else ent.view(shape), value
