"""PettingZoo AEC (turn-based) envs as agent rows of the flat batch: one row per possible agent.

Each backend step is one turn: only the agent to move (``agent_selection``) acts, and its row is
the only ``valid`` one; the other rows' sampled actions are ignored. Every row still gets the
reward PettingZoo gave its agent on that turn (the loser of a board game gets its -1 on the
winner's move), so GAE folds it into that agent's previous decision.

An agent's row gets its done flag on the turn its agent is terminated or truncated, and is
padding from then on. Dead agents must then be stepped out with ``None`` actions, as the AEC API
requires; the adapter does that itself between turns. When no agent is left the env is reset in
the same step (``same_step`` autoreset), and truncated agents keep their last observation in
``final_obs``.

Rows are laid out and written exactly as for Parallel envs (``ParallelEnvAdapter``): only how a
step is taken differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.envs.pettingzoo import ParallelEnvAdapter
from shoal.errors import EnvError


class AECEnvAdapter(ParallelEnvAdapter):
    """Steps one PettingZoo AECEnv a turn at a time, writing into the rows it is bound to."""

    def __init__(self, env: Any, name: str, env_state: bool = False):
        super().__init__(env, name, env_state)
        self.turn_based = True
        self.done = np.zeros(self.num_agents, dtype=bool)  # rows whose agent has left this episode

    def reset(self, seed: int | None) -> None:
        self.env.reset(seed=seed)
        self._new_game()
        self.out["terminated"][:] = False
        self.out["truncated"][:] = False
        self.out["valid"][:] = True  # as ParallelEnvAdapter does: no turn has been taken yet

    def _new_game(self) -> None:
        self.done[:] = False
        self._write_current()

    def step(self, actions: npt.NDArray[Any]) -> None:
        """One turn of the agent to move, then the None steps of agents that died, then a reset if
        the game is over. ``valid`` marks the mover's row. The rewards of all these env steps go to
        the rows still playing at the start of the turn."""
        env, out = self.env, self.out
        mover = self._slot_of(env.agent_selection)
        out["valid"][:] = False
        out["valid"][mover] = True
        out["reward"][:] = 0.0
        out["terminated"][:] = False
        out["truncated"][:] = False
        self.final_infos.clear()
        playing = ~self.done
        env.step(int(actions[mover]) if self.discrete else np.asarray(actions[mover]))
        self._absorb(playing)
        while env.agents and self._is_dead(env.agent_selection):
            agent = env.agent_selection
            env.step(None)
            if agent in env.agents:
                raise EnvError(
                    f"env '{self.name}': stepping the dead agent '{agent}' with None did not remove it; "
                    f"an AEC env must drop dead agents in step(None) (see AECEnv._was_dead_step)."
                )
            self._absorb(playing)
        if env.agents:
            self._write_current()
        else:
            self._game_over()
            self._write_state("final_state")
            env.reset()
            self._new_game()

    def _is_dead(self, agent: str) -> bool:
        return bool(self.env.terminations[agent] or self.env.truncations[agent])

    def _absorb(self, playing: npt.NDArray[np.bool_]) -> None:
        """Add the rewards of the env's last internal step to the rows in ``playing``, and set the
        done flags of agents that died in it.

        ``env.rewards`` holds the rewards of the last step only, whereas ``_cumulative_rewards``
        sums them since each agent last acted (what ``last()`` hands out): reading that every
        turn would count a reward again on each turn until its agent moves."""
        env, out = self.env, self.out
        for agent, r in env.rewards.items():
            slot = self._slot_of(agent)
            if playing[slot]:
                out["reward"][slot] += r
        # read once: on wrapped envs every attribute read walks the wrapper chain
        terminations, truncations = env.terminations, env.truncations
        for agent in env.agents:
            slot = self._slot_of(agent)
            if self.done[slot] or not (terminations[agent] or truncations[agent]):
                continue
            self.done[slot] = True
            te = bool(terminations[agent])
            out["terminated"][slot], out["truncated"][slot] = te, not te
            info = env.infos.get(agent)
            if info:
                self.final_infos[slot] = info
            if not te:
                self.layout.write_obs(slot, out["final_obs"][slot], env.observe(agent), None)

    def _write_current(self) -> None:
        """Every agent still playing gets what it observes now; rows of agents that left are padding."""
        self._write_all({a: self.env.observe(a) for a in self.env.agents if not self.done[self._slot_of(a)]})
