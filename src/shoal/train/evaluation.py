"""Evaluation episodes on their own env copies, optionally filmed to mp4.

One episode per env copy, all stepped together through a backend, so evaluation uses the same
data path as training. Filming wraps each copy in ``Filmer`` (``ParallelFilmer`` for PettingZoo
Parallel envs), which streams the frames of that copy's first episode into an mp4 (the frame after
each step is taken before the backend's autoreset, so the last frame is the true final state).
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch
from tensordict import TensorDict

from shoal.collect import build
from shoal.collect.episodes import mark_episode_starts
from shoal.config import TrainerConfig
from shoal.envs.horizon import EpisodeRules, with_rules
from shoal.envs.registry import config_creator, is_parallel_env
from shoal.envs.spaces import ObsSpec
from shoal.errors import ConfigError, EnvError
from shoal.models.policy import Policy
from shoal.vector import VecBackend, adapted
from shoal.vector.build import build_backend, with_action_rules
from shoal.vector.vmas import is_vmas

if TYPE_CHECKING:  # imageio is an optional extra
    from imageio.core.format import Format


class FrameWriter:
    """Streams the rgb_array frames of ``env``'s first episode to ``path`` as it goes."""

    def __init__(self, env: Any, path: Path, fps: int):
        self.film_env, self.path, self.fps = env, path, fps
        self.writer: Format.Writer | None = None
        self.frames = 0
        self.filming = True

    def _film(self) -> None:
        if not self.filming:
            return
        frame = self.film_env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3:
            raise EnvError(f"env render() returned {type(frame).__name__}, not an rgb_array frame [H, W, 3].")
        if self.writer is None:
            import imageio.v2 as imageio

            # macro_block_size=1 keeps odd frame sizes as they are instead of resizing with a warning
            self.writer = imageio.get_writer(self.path, fps=self.fps, macro_block_size=1)
        self.writer.append_data(frame)
        self.frames += 1

    def stop(self) -> None:
        self.filming = False
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self._check_written()

    def _check_written(self) -> None:
        """ffmpeg, which writes the file, ends quietly when the disk is full: count what it wrote,
        and remove a video that was cut short."""
        import imageio_ffmpeg

        try:
            written = imageio_ffmpeg.count_frames_and_secs(str(self.path))[0]
        except (RuntimeError, OSError):  # not even a readable header
            written = 0
        if written < self.frames:
            self.path.unlink(missing_ok=True)
            reason = f"ffmpeg wrote {written} of its {self.frames} frames (is the disk full?)"
            raise OSError(errno.EIO, reason, str(self.path))


class Filmer(FrameWriter, gym.Wrapper):
    """A Gymnasium env whose first episode is filmed."""

    def __init__(self, env: gym.Env[Any, Any], path: Path, fps: int):
        gym.Wrapper.__init__(self, env)
        FrameWriter.__init__(self, env, path, fps)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        out = self.env.reset(**kwargs)
        self._film()
        return out

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        out = self.env.step(action)
        self._film()
        if out[2] or out[3]:
            self.stop()
        return out


class ParallelFilmer(FrameWriter):
    """A PettingZoo Parallel env whose first episode is filmed; everything else passes through, so
    the backend still sees a Parallel env."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.film_env, name)

    def reset(self, **kwargs: Any) -> Any:
        out = self.film_env.reset(**kwargs)
        self._film()
        return out

    def step(self, actions: dict[str, Any]) -> Any:
        out = self.film_env.step(actions)
        self._film()
        terminated, truncated = out[2], out[3]
        if not self.film_env.agents or all(terminated[a] or truncated[a] for a in terminated):
            self.stop()
        return out


def filmed_backend(
    make_env: Callable[[dict[str, Any]], Any],
    env_config: dict[str, Any],
    num_envs: int,
    video_dir: Path,
    prefix: str,
    name: str,
    *,
    rules: EpisodeRules | None = None,
) -> tuple[VecBackend, list[FrameWriter]]:
    """A serial backend of ``num_envs`` copies made with ``render_mode="rgb_array"``, each filmed
    (Gymnasium and PettingZoo Parallel envs), under ``rules`` (horizons) when given."""
    try:
        import imageio.v2  # noqa: F401  (fail here, before any env is built)
    except ImportError:
        raise ConfigError("video needs imageio with ffmpeg: pip install 'shoal[video]'.") from None
    video_dir.mkdir(parents=True, exist_ok=True)
    filmers: list[FrameWriter] = []

    def make(index: int) -> Any:
        env = make_env({**env_config, "render_mode": "rgb_array"})
        if getattr(env, "render_mode", None) != "rgb_array":
            raise EnvError(
                f"env '{name}' was made with render_mode={getattr(env, 'render_mode', None)!r}; video needs "
                f"'rgb_array' (a registered creator should pass env_config['render_mode'] on to its env)."
            )
        if rules is not None and rules.active:  # inside the filmer, which stops at the episode's end
            env = with_rules(env, rules, name)
        path, fps = video_dir / f"{prefix}episode_{index:03d}.mp4", int(env.metadata.get("render_fps", 30))
        if is_parallel_env(env):
            filmer: FrameWriter = ParallelFilmer(env, path, fps)
        elif isinstance(env, gym.Env):
            filmer = Filmer(env, path, fps)
        else:
            raise EnvError(f"video films Gymnasium and PettingZoo Parallel envs; '{name}' is a {type(env).__name__}.")
        filmers.append(filmer)
        return filmer

    make_adapted, backend_class = adapted(make, name)  # multi-agent envs step through their adapters
    return backend_class(make_adapted, num_envs, name), filmers


def run_episodes(
    backend: VecBackend,
    act: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor],
    seed: int,
    row_policy: tuple[list[str], npt.NDArray[np.int64]] | None = None,
    rewarded: Callable[[torch.Tensor], None] | None = None,
) -> dict[str, Any]:
    """Play one episode on each of the backend's envs; summarise returns and lengths.

    ``act(obs, action_mask, first)`` gives the rows' actions; ``first`` marks the rows whose
    observation starts an episode (recurrent policies reset their state there). With named
    agents, an episode's return is the sum over its agents (each row's first episode), its length
    the longest agent's; anonymous agents (native envs) each count as an episode. ``row_policy``
    (policy ids, and each row's index into them) adds each policy's mean agent return as
    ``policy_reward_mean``. ``rewarded(reward)`` is told each step's rewards (for policies whose
    core reads the previous reward)."""
    n = backend.num_rows
    backend.reset(seed)
    returns = np.zeros(n)
    lengths = np.zeros(n, dtype=np.int64)
    finished = np.zeros(n, dtype=bool)
    first = torch.ones(n, dtype=torch.bool)
    batch = backend.recv()
    while not finished.all():
        backend.send(act(batch.obs, batch.action_mask, first))
        batch = backend.recv()
        if rewarded is not None:
            rewarded(batch.reward)
        live = ~finished  # every reward counts, a step where the row acted, a done even where it did not
        returns[live] += batch.reward.numpy()[live]
        lengths[live & batch.valid.numpy()] += 1
        finished |= live & (batch.terminated.numpy() | batch.truncated.numpy())
        done = batch.terminated | batch.truncated
        mark_episode_starts(done, batch.valid, backend.autoreset, backend.rows_per_env, first, batch.env_done)
    per_policy: dict[str, dict[str, float]] = {}
    if row_policy is not None:
        ids, index = row_policy
        per_policy = {
            "policy_reward_mean": {
                pid: float(returns[index == i].mean()) for i, pid in enumerate(ids) if (index == i).any()
            }
        }
    if backend.agents:
        returns = returns.reshape(backend.num_envs, -1).sum(1)
        lengths = lengths.reshape(backend.num_envs, -1).max(1)
    return {
        "episode_reward_mean": float(returns.mean()),
        "episode_reward_std": float(returns.std()),
        "episode_reward_min": float(returns.min()),
        "episode_reward_max": float(returns.max()),
        "episode_len_mean": float(lengths.mean()),
        "episodes": len(returns),
        **per_policy,
    }


def prepare_obs(spec: ObsSpec, obs: Any, device: str) -> tuple[torch.Tensor, bool]:
    """A batch of observations as the policy takes them (flattened when structured, in the stored
    dtype); also says whether the input was one observation."""
    if spec.structured:
        single = not isinstance(obs, list)  # one Dict/Tuple observation, or a list of them
        items = [obs] if single else obs
        flat = [cast("npt.NDArray[Any]", gym.spaces.flatten(spec.space, o)) for o in items]  # flattenable spaces
        arr = np.stack(flat).astype(np.float32)
    else:
        arr = np.asarray(obs, dtype=spec.dtype)
        single = arr.shape == spec.shape
        if single:
            arr = arr[None]
        if arr.shape[1:] != spec.shape:
            raise EnvError(
                f"compute_actions got observations of shape {arr.shape}; expected "
                f"[batch, {', '.join(map(str, spec.shape))}] or one observation of shape {spec.shape}."
            )
    return torch.as_tensor(arr, device=device), single


def act_once(
    policy: Policy, backend: VecBackend, obs: Any, state: TensorDict | None, deterministic: bool, device: str
) -> npt.NDArray[Any] | np.generic | tuple[npt.NDArray[Any] | np.generic, TensorDict]:
    """``Trainer.compute_actions``: the policy's env-ready actions for a batch of observations (or
    one), from its initial state, or from ``state`` and then with the next state."""
    x, single = prepare_obs(backend.obs_spec, obs, device)
    rows = x.shape[0]
    given = state is not None
    if state is None:
        state = policy.initial_state(rows)
    elif state.batch_size[:1] != torch.Size([rows]):
        raise ConfigError(
            f"compute_actions got a state for {state.batch_size[0] if state.batch_dims else 0} rows and "
            f"{rows} observations; pass initial_state({rows}) at an episode start, then the state it returned."
        )
    first = torch.full((rows,), not given, dtype=torch.bool)
    action, _, next_state = policy.act(x, state, first, deterministic=deterministic)
    actions = backend.env_actions(action.cpu())
    out = actions[0] if single else actions
    return (out, next_state) if given else out


def evaluate_policies(
    config: TrainerConfig,
    policies: dict[str, Policy],
    env_name: str,
    *,
    num_episodes: int,
    deterministic: bool,
    seed: int,
    video: tuple[Path, str] | None,
    policy_mapping_fn: Any,
) -> dict[str, Any]:
    """``Trainer.evaluate``: ``num_episodes`` fresh episodes of ``config``'s env, one per env copy,
    acted by ``policies`` (mapped by ``policy_mapping_fn``), with ``video`` (a directory and a
    file name prefix) each filmed to an mp4. The training's random state is left as it was."""
    filmers: list[FrameWriter] = []
    if video is not None and is_vmas(config.env):
        raise ConfigError(
            f"video needs Gymnasium envs that render rgb_array frames; '{env_name}' is a VMAS "
            f"scenario, which shoal does not film yet."
        )
    if video is None:
        backend = build_backend(config, num_episodes, evaluation=True)
    else:
        creator = config_creator(config.env, evaluation=True)
        filmed, filmers = filmed_backend(
            creator, config.env_config, num_episodes, *video, env_name, rules=config.episode_rules
        )
        backend = with_action_rules(filmed, config)
    try:
        policy_map = build.policy_map(policies, backend, policy_mapping_fn)
        policy_map.start_episodes(range(backend.num_envs))
        rows = slice(0, backend.num_rows)

        def act(obs: torch.Tensor, action_mask: torch.Tensor | None, first: torch.Tensor) -> torch.Tensor:
            return policy_map.act(obs, first, action_mask, rows, deterministic=deterministic)[0]

        with torch.random.fork_rng(devices=[]):
            row_policy = None if policy_map.single else (policy_map.ids, policy_map.row_policy.numpy())
            fed = (lambda reward: policy_map.feed_rewards(reward, rows)) if policy_map.reward_fed else None
            out = run_episodes(backend, act, seed, row_policy, fed)
    finally:
        for filmer in filmers:
            filmer.stop()
        backend.close()
    if filmers:
        out["videos"] = [str(f.path) for f in filmers]
    return out
