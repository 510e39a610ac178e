"""Load on the policy server over loopback: requests per second, get_action latency and the batch
sizes the server formed, for 1, 8 and 64 client processes.

    python benchmarks/serve_load.py [--clients 1 8 64] [--seconds 10] [--mode inference training]

Each client is a process playing CartPole-v1 through the protocol (start_episode, get_action,
log_returns, end_episode) as fast as the server answers, for ``--seconds``. ``inference``: the
server serves a checkpoint (an untrained PPO policy: the forward pass costs the same) and
batches the waiting get_action calls with a 2 ms bound. ``training``: PPO trains on the clients'
episodes, one slot per client, so the requests include the pauses while PPO updates. Latency is
each get_action's round trip as the client measures it. The clients load the client module by
its path, with numpy and the standard library only, as a simulator's process would.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

CLIENT_FILE = Path(__file__).resolve().parents[1] / "src" / "shoal" / "serve" / "client.py"


def client_main(url: str, seconds: float, seed: int, out: str) -> None:
    """One simulator: CartPole through the server; writes its get_action latencies (seconds)."""
    spec = importlib.util.spec_from_file_location("policy_client", CLIENT_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    latencies, requests = [], 0
    began = time.time()
    end = time.perf_counter() + seconds
    with module.PolicyClient(url) as client:
        try:
            while time.perf_counter() < end:
                obs, _ = env.reset(seed=seed)
                episode_id, done = client.start_episode(), False
                requests += 1
                while not done and time.perf_counter() < end:
                    start = time.perf_counter()
                    action = client.get_action(episode_id, obs)
                    latencies.append(time.perf_counter() - start)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    client.log_returns(episode_id, reward)
                    requests += 2
                    done = terminated or truncated
                if done:
                    client.end_episode(episode_id, obs, truncated=truncated and not terminated)
                    requests += 1
        except (module.ServerError, ConnectionError):
            pass  # a training server that finished
    np.save(out, np.asarray(latencies))
    Path(out + ".json").write_text(json.dumps({"requests": requests, "began": began, "ended": time.time()}))


def start_clients(url: str, n: int, seconds: float, workdir: str) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, __file__, "--client", url, str(seconds), str(i), f"{workdir}/c{i}.npy"])
        for i in range(n)
    ]


def gather(workdir: str, n: int) -> dict[str, Any]:
    """Requests per second over the time the clients ran (not their start-up), and the latencies."""
    latencies = np.concatenate([np.load(f"{workdir}/c{i}.npy") for i in range(n)])
    counts = [json.loads(Path(f"{workdir}/c{i}.npy.json").read_text()) for i in range(n)]
    window = max(c["ended"] for c in counts) - min(c["began"] for c in counts)
    return {
        "requests_per_s": sum(c["requests"] for c in counts) / window,
        "p50_ms": 1e3 * float(np.percentile(latencies, 50)),
        "p99_ms": 1e3 * float(np.percentile(latencies, 99)),
    }


def batch_summary(sizes: dict[Any, int]) -> str:
    """Mean, median and largest clients per forward pass."""
    values = np.repeat([int(k) for k in sizes], list(sizes.values()))
    return f"{values.mean():.1f} / {int(np.median(values))} / {values.max()}" if len(values) else "-"


def run_inference(n: int, seconds: float) -> dict[str, Any]:
    import shoal
    from shoal.serve import PolicyClient, checkpoint_server

    with tempfile.TemporaryDirectory() as workdir:
        with shoal.PPO(env="CartPole-v1", run_dir=f"{workdir}/run", verbose=0) as algo:
            checkpoint = algo.save()
        with checkpoint_server(checkpoint, port=0, max_wait_ms=2.0, max_requests_per_s=1e6) as server:
            for process in start_clients(server.url, n, seconds, workdir):
                process.wait()
            stats = PolicyClient(server.url).info()["stats"]
        return {**gather(workdir, n), "batches": batch_summary(stats["batch_sizes"])}


def run_training(n: int, seconds: float) -> dict[str, Any]:
    from shoal.serve import serve_training

    with tempfile.TemporaryDirectory() as workdir:
        clients: list[subprocess.Popen[bytes]] = []
        backends: list[Any] = []

        def on_ready(server: Any) -> None:
            backends.append(server.session)
            clients.extend(start_clients(server.url, n, seconds, workdir))

            def stop_when_done() -> None:
                for process in clients:
                    process.wait()
                os.kill(os.getpid(), signal.SIGINT)  # stops the run at its next wait for clients

            threading.Thread(target=stop_when_done, daemon=True).start()

        settings = dict(
            env="CartPole-v1", num_envs=n, total_timesteps=10**9, save_outputs=False, verbose=0, client_timeout_s=1.0
        )
        serve_training(settings, on_ready=on_ready, port=0, max_requests_per_s=1e6)
        return {**gather(workdir, n), "batches": batch_summary(backends[0].batch_sizes)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--mode", nargs="+", choices=["inference", "training"], default=["inference", "training"])
    args = parser.parse_args()
    rows = []
    for mode in args.mode:
        for n in args.clients:
            row = (run_inference if mode == "inference" else run_training)(n, args.seconds)
            rows.append({"mode": mode, "clients": n, **row})
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(f"\nserve_load: loopback, {args.seconds:g} s per row, {os.cpu_count()} cores")
    print(
        "| mode | clients | requests/s | get_action p50 | get_action p99 | clients per forward (mean / median / max) |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['clients']} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} ms | "
            f"{r['p99_ms']:.2f} ms | {r['batches']} |"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        client_main(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main()
