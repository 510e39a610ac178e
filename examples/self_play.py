"""Self-play on Connect Four with two policies: "main" learns, "past_self" stays frozen.

Each env's seats are given to policies when its episode starts, so "main" alternates sides.
Evaluation plays "main" against the frozen initial policy, sampling moves (deterministic play
would repeat one game per side): "main"'s mean return is its win rate minus its loss rate.

    pip install 'shoal[multiagent]'
    python examples/self_play.py [total_timesteps]
"""

from __future__ import annotations

import sys

import shoal


# --8<-- [start:mapping]
def alternate_sides(agent_id: str, episode: shoal.EpisodeStart) -> str:
    """Odd episodes give "main" the second seat."""
    return "main" if (episode.episode_id + (agent_id == "player_1")) % 2 == 0 else "past_self"


# --8<-- [end:mapping]


if __name__ == "__main__":
    total_timesteps = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    with shoal.PPO(
        env="pettingzoo:pettingzoo.classic.connect_four_v3",
        policies={"main": {}, "past_self": {}},
        policy_mapping_fn=alternate_sides,
        policies_to_train=["main"],
        seed=1,
    ) as algo:
        algo.learn(total_timesteps)
        print(algo.evaluate(100, deterministic=False)["policy_reward_mean"])
