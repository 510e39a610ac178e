"""External simulators: CartPole processes that run their own loop and call a policy server for
actions, while PPO trains on the episodes they drive.

    python examples/external_cartpole.py [total_timesteps] [clients]
        serves PPO on CartPole-v1's spaces and starts the client processes (default 8)

    python examples/external_cartpole.py client http://127.0.0.1:9900 [seed]
        one simulator, for a server started elsewhere: shoal serve CartPole-v1 num_envs=8

A client needs only ``shoal.serve.client`` (the standard library and numpy), not torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import gymnasium as gym

from shoal.serve.client import PolicyClient, ServerError


# --8<-- [start:client]
def simulate(address: str, seed: int = 0) -> int:
    """Play CartPole-v1 episodes with the server's actions until the server stops; returns the
    number of episodes played."""
    env = gym.make("CartPole-v1")
    episodes = 0
    with PolicyClient(address) as client:
        try:
            while True:
                obs, _ = env.reset(seed=seed * 100_000 + episodes)
                episode_id = client.start_episode()
                done = False
                while not done:
                    action = client.get_action(episode_id, obs)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    client.log_returns(episode_id, reward)
                    done = terminated or truncated
                # a time limit cuts the episode short: the learner bootstraps from this observation
                client.end_episode(episode_id, obs, truncated=truncated and not terminated)
                episodes += 1
        except (ServerError, ConnectionError):  # the server finished training and closed
            return episodes


# --8<-- [end:client]


def main(total_timesteps: int, num_clients: int) -> None:
    from shoal.serve import PolicyServer, serve_training

    clients: list[subprocess.Popen[bytes]] = []

    def start_clients(server: PolicyServer) -> None:
        url = server.url
        clients.extend(subprocess.Popen([sys.executable, __file__, "client", url, str(i)]) for i in range(num_clients))

    start = time.perf_counter()
    settings = {
        "env": "CartPole-v1",
        "num_envs": num_clients,
        "seed": 1,
        "total_timesteps": total_timesteps,
        "save_outputs": False,
    }
    trainer, result = serve_training(settings, on_ready=start_clients, port=0)
    for process in clients:
        process.wait(timeout=60)
    evaluation = trainer.evaluate(20)
    print(
        json.dumps(
            {
                "clients": num_clients,
                "timesteps_total": trainer.timesteps_total,
                "episode_reward_mean": result.get("episode_reward_mean"),
                "evaluation_reward_mean": evaluation["episode_reward_mean"],
                "wall_time_s": round(time.perf_counter() - start, 1),
                "sps": round(trainer.timesteps_total / trainer.time_total_s),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        simulate(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000, int(sys.argv[2]) if len(sys.argv) > 2 else 8)
