"""Replay buffers: the throughput of prioritized against uniform replay, and the memory of pixels.

1. Throughput at capacity 1e6 (CartPole-sized steps, 8 agent rows, filled first): one cycle adds
   a 32-step rollout of the 8 rows, draws a minibatch of 256 and gathers it with its 1-step returns
   (``shoal.algos.off_policy.transitions``, as the replay learners read minibatches), and for the
   prioritized buffer writes 256 new priorities; cycles per second and samples per second.
2. Memory: a buffer of --frames 84x84 uint8 observations (1e6 by default: about 7 GB; the machine
   needs that much free) is allocated and written through; its resident size (RSS growth) against
   the raw bytes of the frames.

    python benchmarks/replay_buffer.py [--cycles 300] [--frames 1000000] [--skip-memory]
"""

from __future__ import annotations

import argparse
import resource
import time

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from shoal.algos.off_policy import transitions
from shoal.buffers import PrioritizedReplayBuffer, ReplayBuffer
from shoal.buffers.rollout import env_fields
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec

CAPACITY = 1_000_000
ROWS, HORIZON, BATCH = 8, 32, 256


def fake_rollout(env: EnvInfo, horizon: int) -> TensorDict:
    """A rollout as the collector writes it: random observations, no episode ends."""
    specs = env_fields(env)
    td = TensorDict(
        {key: torch.zeros(env.num_rows, horizon + 1, *shape, dtype=dtype) for key, (shape, dtype) in specs.items()},
        batch_size=[env.num_rows, horizon + 1],
    )
    if td["obs"].is_floating_point():
        td["obs"].normal_()
    else:
        td["obs"].random_(0, 256)
    td["valid"].fill_(True)
    return td


def throughput(kind: type[ReplayBuffer], cycles: int) -> tuple[float, float]:
    env = EnvInfo("bench", obs_spec(gym.spaces.Box(-1, 1, (4,))), action_spec(gym.spaces.Discrete(2)), ROWS, 1)
    buffer = kind(env, CAPACITY)
    rollout = fake_rollout(env, HORIZON)
    chunk = fake_rollout(env, CAPACITY // ROWS - 2)
    buffer.add(chunk)  # filled to capacity before timing
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(cycles):
        buffer.add(rollout)
        index = buffer.sample(BATCH, generator)
        transitions(buffer, index, n_step=1, gamma=0.99)
        if isinstance(buffer, PrioritizedReplayBuffer):
            buffer.update_priorities(index, torch.rand(BATCH, generator=generator) + 0.01)
    elapsed = time.perf_counter() - start
    return cycles / elapsed, cycles * BATCH / elapsed


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def memory(frames: int) -> tuple[int, int]:
    """(resident bytes the buffer added, raw bytes of its frames)."""
    env = EnvInfo(
        "pixels", obs_spec(gym.spaces.Box(0, 255, (84, 84), np.uint8)), action_spec(gym.spaces.Discrete(4)), 1, 1
    )
    before = rss_bytes()
    buffer = ReplayBuffer(env, frames)
    for tensor in [*buffer.storage.values(), buffer.sampleable, buffer.final_obs, buffer.final_slot]:
        tensor.view(-1)[::512].fill_(1)  # touch every page, as a full buffer would
    used = rss_bytes() - before
    return used, frames * 84 * 84


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"| buffer (capacity {CAPACITY:,}) | cycles / s: add {ROWS}x{HORIZON}, sample {BATCH}, gather"
        " (, priorities) | samples / s |"
    )
    print("|---|---|---|")
    rates = {}
    for name, kind in (("uniform", ReplayBuffer), ("prioritized", PrioritizedReplayBuffer)):
        cycles, samples = throughput(kind, args.cycles)
        rates[name] = cycles
        print(f"| {name} | {cycles:,.0f} | {samples:,.0f} |", flush=True)
    print(f"prioritized / uniform: {rates['prioritized'] / rates['uniform']:.2f}x")
    if not args.skip_memory:
        used, raw = memory(args.frames)
        print(
            f"\n{args.frames:,} x 84x84 uint8: {used / 2**30:.2f} GiB resident for {raw / 2**30:.2f} GiB of frames "
            f"({used / raw:.3f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
