"""Atari (ALE) and MinAtar envs as shoal makes them from an id.

Every ``ALE/...`` id gets the standard DQN-style preprocessing, so ``shoal train ALE/Breakout-v5``
trains on what papers report: random no-ops after reset, 4 frames per action with the last two
max-pooled (Atari sprites flicker between frames), 84x84 grayscale, a loss of life ending the
learning episode, and the last 4 frames stacked. Rewards stay raw here: the collector clips the
learning signal only, so logged returns are the game's score.

``MinAtar/...`` ids need no preprocessing; they get a tiny ``render()`` that does not need seaborn.

Wrapper state is kept as numbers and numpy arrays, which ``envs/snapshot.py`` can checkpoint;
the ALE emulator itself is not plain data, so Atari snapshots are inexact whatever we do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsFloat, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium.core import RenderFrame

from shoal.errors import ConfigError, EnvError

if TYPE_CHECKING:  # ale_py is an optional extra
    from ale_py import AtariEnv

Frame = npt.NDArray[np.uint8]  # a grayscale screen [H, W], or a stack of them
StepResult = tuple[Frame, SupportsFloat, bool, bool, dict[str, Any]]

NOOP = 0  # ALE puts NOOP first in every game's action set (checked in make_atari_env)
DEFAULTS = {"noop_max": 30, "frame_skip": 4, "screen_size": 84, "frame_stack": 4, "episodic_life": True}


def is_atari_id(env: Any) -> bool:
    return isinstance(env, str) and env.startswith("ALE/")


def is_minatar_id(env: Any) -> bool:
    return isinstance(env, str) and env.startswith("MinAtar/")


class NoopReset(gym.Wrapper):
    """After a real reset, take 1..``noop_max`` no-ops, so a deterministic game does not always
    start from the same frame. The count comes from the env's np_random, so seeds reproduce it."""

    def __init__(self, env: gym.Env, noop_max: int):
        super().__init__(env)
        self.noop_max = noop_max

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Frame, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self.noop_max == 0:
            return obs, info
        for _ in range(int(self.np_random.integers(1, self.noop_max + 1))):
            obs, _, terminated, truncated, info = self.env.step(NOOP)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Repeat the action ``skip`` times, sum the rewards, and return the pixel-wise max of the last
    two frames seen (objects drawn on alternate frames would vanish from a single one)."""

    def __init__(self, env: gym.Env, skip: int):
        super().__init__(env)
        self.skip = skip
        frames = cast("gym.spaces.Box[np.uint8]", env.observation_space)  # ALE's grayscale screens
        self.frames = np.zeros((2, *frames.shape), frames.dtype)

    def step(self, action: int) -> StepResult:
        total = 0.0
        for i in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            self.frames[i % 2] = obs
            total += float(reward)
            if terminated or truncated:
                break
        # after one frame only, the other slot holds a frame from an earlier step: do not pool it
        pooled = np.maximum(self.frames[0], self.frames[1]) if i > 0 else self.frames[0].copy()
        return pooled, total, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """Losing a life ends the learning episode (``terminated=True``) but not the game.

    Such a step carries ``info["episode_continues"] = True``; the next ``reset()`` takes one
    no-op step instead of restarting, and returns its observation. The reward of that no-op step
    is dropped (it is almost always zero: the game is between lives). A seeded reset, or one
    after the real game over, restarts the game. Training only: evaluation plays whole games."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: int) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = info["lives"]
        if 0 < lives < self.lives and not self.game_over:
            terminated = True
            info["episode_continues"] = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Frame, dict[str, Any]]:
        if self.game_over or seed is not None or options:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(NOOP)
            if terminated or truncated:
                obs, info = self.env.reset()
        self.game_over = False
        self.lives = info["lives"]
        return obs, info


class FrameStack(gym.Wrapper):
    """Observations ``[k, *frame]``: the last ``k`` frames, oldest first, newest last.

    A reset fills the stack with the reset frame, also after a soft reset (EpisodicLife): the
    learning episode before it ended in a terminal, so its frames must not show in the next."""

    def __init__(self, env: gym.Env, k: int):
        super().__init__(env)
        inner = cast("gym.spaces.Box[np.uint8]", env.observation_space)  # the resized screens
        self.observation_space = gym.spaces.Box(0, 255, (k, *inner.shape), np.uint8)
        self.frames = np.zeros(self.observation_space.shape, np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Frame, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.frames[:] = obs
        return self.frames.copy(), info

    def step(self, action: int) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = obs
        return self.frames.copy(), reward, terminated, truncated, info


def _split_config(env_id: str, env_config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(shoal's preprocessing options, the keyword arguments left for gym.make), checked."""
    options = {key: env_config.get(key, default) for key, default in DEFAULTS.items()}
    rest = {key: value for key, value in env_config.items() if key not in DEFAULTS}
    for key in ("noop_max", "frame_skip", "screen_size", "frame_stack"):
        value, least = options[key], 0 if key == "noop_max" else 1
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ConfigError(
                f"env '{env_id}': env_config {key}={value!r} is not allowed; use an int >= {least} "
                f"(default {DEFAULTS[key]})."
            )
    if not isinstance(options["episodic_life"], bool):
        raise ConfigError(
            f"env '{env_id}': env_config episodic_life={options['episodic_life']!r} is not allowed; "
            f"use true or false (default true)."
        )
    if "frameskip" in rest:
        raise ConfigError(
            f"env '{env_id}': env_config frameskip={rest['frameskip']!r} is ALE's own frame skip, "
            f"which shoal turns off to max-pool the last two frames; set frame_skip instead (default 4)."
        )
    if rest.get("obs_type", "grayscale") != "grayscale":
        raise ConfigError(
            f"env '{env_id}': env_config obs_type={rest['obs_type']!r} is not allowed; shoal's Atari "
            f"preprocessing needs 'grayscale' (render_mode='rgb_array' still films colour videos)."
        )
    return options, rest


def make_atari_env(env_id: str, env_config: dict[str, Any], evaluation: bool) -> gym.Env[Frame, int]:
    """``gym.make(env_id)`` with ALE's frame skip off, wrapped in shoal's Atari preprocessing.

    Observations are ``[frame_stack, screen_size, screen_size]`` uint8. ALE v5's sticky actions
    (``repeat_action_probability=0.25``) stay on unless ``env_config`` sets them."""
    options, rest = _split_config(env_id, env_config)
    env = gym.make(env_id, **{"obs_type": "grayscale", **rest, "frameskip": 1})
    meanings = cast("AtariEnv", env.unwrapped).get_action_meanings()
    if meanings[NOOP] != "NOOP":
        raise EnvError(f"env '{env_id}': action {NOOP} is {meanings[NOOP]!r}, but the no-op reset needs NOOP there.")
    env = NoopReset(env, options["noop_max"])
    env = MaxAndSkip(env, options["frame_skip"])
    size = options["screen_size"]
    env = gym.wrappers.ResizeObservation(env, (size, size))  # cv2.INTER_AREA
    if options["episodic_life"] and not evaluation:
        env = EpisodicLife(env)
    env = FrameStack(env, options["frame_stack"])
    # the emulator runs at 60 frames a second and an agent step is frame_skip frames: films play in real time
    env.metadata = {**env.metadata, "render_fps": 60 / options["frame_skip"]}
    return env


# one colour per MinAtar channel, in channel order (the games have at most 10)
PALETTE = np.array(
    [
        [230, 60, 60],
        [60, 180, 75],
        [255, 225, 25],
        [0, 130, 200],
        [245, 130, 48],
        [145, 30, 180],
        [70, 240, 240],
        [240, 50, 230],
        [210, 245, 60],
        [250, 190, 212],
    ],
    np.uint8,
)
CELL = 16  # pixels per MinAtar cell in rendered frames, so a 10x10 board films at 160x160


class MinAtarRender(gym.Wrapper):
    """``render()`` in ``rgb_array`` mode as a colour per channel on black, drawn here so that
    seaborn (which MinAtar's own renderer needs) is not a dependency. Where channels overlap,
    the last one shows."""

    def render(self) -> RenderFrame | list[RenderFrame] | None:
        if self.render_mode != "rgb_array":
            return self.env.render()
        minatar_env: Any = self.unwrapped  # MinAtar's gym env: ``game`` is its minatar Environment
        state: npt.NDArray[np.bool_] = minatar_env.game.state()  # [10, 10, channels]
        channels = state.shape[-1]
        top = np.max(state * np.arange(1, channels + 1), axis=-1)  # 0 where no channel is set
        colours = np.concatenate([np.zeros((1, 3), np.uint8), np.resize(PALETTE, (channels, 3))])
        frame: npt.NDArray[np.uint8] = colours[top].repeat(CELL, axis=0).repeat(CELL, axis=1)
        return frame


def make_minatar_env(env_id: str, env_config: dict[str, Any]) -> gym.Env[Any, Any]:
    return MinAtarRender(gym.make(env_id, **env_config))
