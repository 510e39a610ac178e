"""How fast the PPO learner learns a recurrent policy on CPU, and how much memory it needs beyond
the rollout, the model and the interpreter.

    python benchmarks/recurrent_learner.py [--quick] [--repeats 3] [--threads N] [--obs-dim 32]

The configuration the project quotes: a batch of 65,536 agent steps (``--envs`` 1,024 rows x
``--length`` 64 steps), ``sgd_minibatch_size`` 4,096, ``bptt_horizon`` 16, one epoch, one MLP
trunk ``[128]`` feeding one LSTM core of 128 units for both heads (``shared_trunk``), a Box of
``--obs-dim`` floats observed and Discrete(4) actions. The rollout is random (about 2% of steps
terminate, the next step is an episode start; every step is valid) with random segment start
states. Each row of the table
times the segment learner's update (``SegmentPPO.learn``: ``SegmentSampler`` minibatches of 256 segments
replayed from their start states) ``--repeats`` times after a warm-up call; learner samples/s is
agent steps x epochs / seconds. Rows: the LSTM, a GRU core, ``advantage_estimator="vtrace"``
and ``prio_alpha=0.6`` (``--quick``: the LSTM only). Run it on an idle machine: a process busy on
one of the cores stalls torch's threads at every parallel op (updates 10x slower and more with
2 threads on 2 cores); the script says which rows varied.

Memory: the LSTM configuration runs again in a fresh process of its own (``--memory-only``:
build, warm-up and one update), whose peak RSS is set against the rollout buffer's tensors, the
model's parameters x 4 (weights, gradients, Adam's two moments) and a fresh interpreter that has
imported torch and shoal. The estimated activations of one minibatch's BPTT are printed beside
them: what a learner needs on top of buffer and model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from shoal.algos import PPOAlgorithm, SegmentPPO
from shoal.config import PPOConfig
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec

CORE_SIZE, HIDDENS, BPTT, MINIBATCH = 128, [128], 16, 4_096
# label -> (core, the config keys the row adds)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "lstm": ("lstm", {}),
    "gru": ("gru", {}),
    "lstm vtrace": ("lstm", {"advantage_estimator": "vtrace"}),
    "lstm prio_alpha=0.6": ("lstm", {"prio_alpha": 0.6}),
}
GATES = {"lstm": 4, "gru": 3}
MIB = 2**20


def build(args: argparse.Namespace, variant: str, seed: int = 0) -> tuple[SegmentPPO, TensorDict]:
    """The segment learner of ``variant``, its rollout filled with random steps and start states."""
    core, keys = VARIANTS[variant]
    config = PPOConfig.build(
        num_envs=args.envs,
        rollout_fragment_length=args.length,
        sgd_minibatch_size=MINIBATCH,
        bptt_horizon=BPTT,
        num_sgd_iter=1,
        model_config={"core": core, "core_size": CORE_SIZE, "hiddens": HIDDENS, "shared_trunk": True},
        seed=seed,
        **keys,
    )
    config.check_batch()
    space = gym.spaces.Box(-np.inf, np.inf, (args.obs_dim,), np.float32)
    env = EnvInfo("random", obs_spec(space), action_spec(gym.spaces.Discrete(4)), args.envs, 1)
    torch.manual_seed(seed)
    algo = PPOAlgorithm.implementation(config)(config, env)
    buffer = algo.buffer
    g = torch.Generator().manual_seed(seed)
    rollout = buffer.start_rollout()
    for key in ("obs", "reward", "value", "sample_log_prob"):
        rollout[key].normal_(generator=g)  # in place: no temporary the size of the field
    rollout["action"].random_(0, 4, generator=g)
    rollout["terminated"].bernoulli_(0.02, generator=g)
    rollout["done"].copy_(rollout["terminated"])
    rollout["first"][:, 1:].copy_(rollout["done"][:, :-1])
    rollout["valid"].fill_(True)
    buffer.add(rollout)
    for tensor in buffer.start_states[0].values():
        tensor.normal_(generator=g)
    return algo, rollout


def update(algo: SegmentPPO, rollout: TensorDict) -> None:
    algo.learn(algo.learners["default_policy"], rollout, None)


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def time_variant(args: argparse.Namespace, variant: str) -> list[float]:
    """Seconds of each of ``--repeats`` updates after a warm-up one."""
    algo, rollout = build(args, variant)
    update(algo, rollout)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        update(algo, rollout)
        times.append(time.perf_counter() - start)
    return times


def memory_only(args: argparse.Namespace, variant: str) -> None:
    """Build ``variant``, update twice (warm-up and one more), print the sizes and peak RSS as JSON."""
    algo, rollout = build(args, variant)
    buffer = algo.buffer
    for _ in range(2):
        update(algo, rollout)
    states = [t for s in buffer.start_states or [] for t in s.values(include_nested=True, leaves_only=True)]
    sizes = {
        "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # KiB on Linux
        "buffer": nbytes(buffer.rollout.values(include_nested=True, leaves_only=True)) + nbytes(states),
        # weights, grads, Adam's exp_avg and exp_avg_sq
        "model": 4 * nbytes(algo.learners["default_policy"].policy.parameters()),
    }
    print(json.dumps(sizes))


def run_fresh(*argv: str) -> str:
    """The output of ``python argv...`` in a process whose peak RSS starts from zero. A child
    exec'd straight from this process inherits its peak RSS at the exec (Linux keeps the larger
    of ``ru_maxrss`` and the old memory's high-water mark across exec), so the child is started
    through a shell that forks it: a fork gets a fresh count, and the shell's own is small."""
    cmd = ["sh", "-c", '"$@"; exit $?', "sh", sys.executable, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def interpreter_bytes() -> int:
    """Peak RSS of a fresh interpreter that has imported torch and shoal."""
    code = "import torch, shoal, resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    return int(run_fresh("-c", code).split()[-1]) * 1024


def activation_bytes(core: str) -> tuple[int, int]:
    """Estimated activations of one minibatch's BPTT: its steps x gates x core units in float32
    (the gate pre-activations the backward needs at every step), and the trunk's features
    (each hidden layer's output before and after its activation)."""
    steps = MINIBATCH // BPTT * BPTT  # segments x bptt_horizon
    return steps * GATES[core] * CORE_SIZE * 4, steps * sum(HIDDENS) * 2 * 4


def report_memory(args: argparse.Namespace, variant: str) -> None:
    argv = [os.path.abspath(__file__), "--memory-only", variant, "--threads", str(args.threads)]
    argv += ["--obs-dim", str(args.obs_dim), "--envs", str(args.envs), "--length", str(args.length)]
    sizes = json.loads(run_fresh(*argv).strip().splitlines()[-1])
    interp = interpreter_bytes()
    known = sizes["buffer"] + sizes["model"] + interp
    gates, trunk = activation_bytes(VARIANTS[variant][0])
    print(f"\nmemory of '{variant}' in a fresh process (build, warm-up and one update):")
    print(f"  rollout buffer (every tensor + start states)  {sizes['buffer'] / MIB:>8.1f} MiB")
    print(f"  model (parameters x 4: weights, grads, Adam)  {sizes['model'] / MIB:>8.1f} MiB")
    print(f"  interpreter with torch and shoal imported     {interp / MIB:>8.1f} MiB")
    print(f"  sum                                           {known / MIB:>8.1f} MiB")
    print(f"  peak RSS                                      {sizes['peak'] / MIB:>8.1f} MiB")
    print(f"  beyond the sum                                {(sizes['peak'] - known) / MIB:>8.1f} MiB")
    print(f"  ratio peak / sum                              {sizes['peak'] / known:>8.2f}")
    print(
        f"  est. BPTT activations of one minibatch: {MINIBATCH // BPTT} segments x {BPTT} steps x "
        f"{GATES[VARIANTS[variant][0]]} gates x {CORE_SIZE} units x 4 B = {gates / MIB:.1f} MiB, "
        f"+ trunk features {trunk / MIB:.1f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=1_024, help="agent rows of the rollout")
    parser.add_argument("--length", type=int, default=64, help="rollout_fragment_length: steps per row")
    parser.add_argument("--obs-dim", type=int, default=32, help="floats per observation")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per row, after a warm-up")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: all cores)")
    parser.add_argument("--quick", action="store_true", help="only the LSTM row")
    parser.add_argument("--memory-only", choices=list(VARIANTS), help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_only:
        memory_only(args, args.memory_only)
        return

    steps = args.envs * args.length
    print(
        f"SegmentPPO.learn on {steps:,} agent steps ({args.envs:,} rows x {args.length}), minibatch {MINIBATCH:,}, "
        f"bptt_horizon {BPTT}, 1 epoch, hiddens {HIDDENS} + core {CORE_SIZE}, obs {args.obs_dim} floats, "
        f"Discrete(4); torch {torch.__version__}, {os.cpu_count()} CPU cores, "
        f"torch.get_num_threads() = {torch.get_num_threads()}; {args.repeats} timed updates after a warm-up; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'variant':<22}{'median s':>9}{'min s':>8}{'samples/s median':>18}{'samples/s best':>16}")
    noisy = []
    for variant in ["lstm"] if args.quick else VARIANTS:
        times = time_variant(args, variant)
        median, best = statistics.median(times), min(times)
        print(f"{variant:<22}{median:>9.2f}{best:>8.2f}{steps / median:>18,.0f}{steps / best:>16,.0f}")
        if max(times) > 1.5 * best:
            noisy.append(variant)
    if noisy:
        print(
            f"noisy: {', '.join(noisy)} (slowest update over 1.5x the fastest; load average now "
            f"{os.getloadavg()[0]:.1f}). Another process on the cores stalls every parallel op of "
            f"{torch.get_num_threads()} torch threads; trust the best, or rerun idle or with --threads 1."
        )
    report_memory(args, "lstm")


if __name__ == "__main__":
    main()
