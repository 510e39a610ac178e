"""Turn what the user passes as ``env`` into something that makes environments (RLlib-style env creators)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shoal.envs.atari import is_atari_id, is_minatar_id, make_atari_env, make_minatar_env
from shoal.envs.native import AgentEnv
from shoal.errors import EnvError, did_you_mean, shorten

# What env factories make: a gym.Env, a multi-agent env (RLlib's dict API, a PettingZoo ParallelEnv
# or AECEnv) or a shoal.AgentEnv. The backends tell them apart at run time (make_backend), so to
# the type checker an env is any object.
AnyEnv = Any
EnvCreator = Callable[[dict[str, Any]], AnyEnv] | Callable[[], AnyEnv]  # env_config -> env, or () -> env
_REGISTRY: dict[str, EnvCreator] = {}


def register_env(name: str, creator: EnvCreator) -> None:
    """Make ``name`` usable wherever an env id is accepted. ``creator(env_config)`` returns a gym.Env."""
    if not callable(creator):
        raise EnvError(f"register_env('{name}', ...) needs a callable creator(env_config) -> gym.Env, got {creator!r}.")
    _REGISTRY[name] = creator


def registered_envs() -> list[str]:
    return sorted(_REGISTRY)


def registered_creator(env: Any) -> EnvCreator | None:
    """The creator ``register_env`` gave the name ``env`` (None for anything else)."""
    return _REGISTRY.get(env) if isinstance(env, str) else None


PETTINGZOO = "pettingzoo:"


def is_parallel_env(env: Any) -> bool:
    """A PettingZoo ParallelEnv (checked by its API, so pettingzoo need not be imported)."""
    return (
        hasattr(env, "possible_agents")
        and hasattr(env, "observation_space")
        and not isinstance(env, gym.Env)
        and not is_aec_env(env)
    )


def is_aec_env(env: Any) -> bool:
    """A PettingZoo AECEnv (turn-based): it has agents but is stepped one ``agent_iter``/``last`` turn at a time."""
    return hasattr(env, "possible_agents") and hasattr(env, "agent_iter") and hasattr(env, "last")


def _pettingzoo_maker(env_id: str) -> Callable[..., AnyEnv]:
    """The module's ``parallel_env`` when it has one (every agent acts each step), else its ``env``:
    turn-based games only offer the AEC API."""
    path = env_id[len(PETTINGZOO) :]
    try:
        module = importlib.import_module(path)
    except ImportError as e:
        raise EnvError(
            f"env '{env_id}': cannot import PettingZoo env module '{path}' ({e}); e.g. "
            f"'pettingzoo:mpe2.simple_spread_v3' needs `pip install mpe2`."
        ) from None
    make: object = getattr(module, "parallel_env", None) or getattr(module, "env", None)
    if not callable(make):
        raise EnvError(
            f"env '{env_id}': module '{path}' has neither a parallel_env() nor an env() function; shoal "
            f"takes PettingZoo envs through their Parallel API, or their AEC API for turn-based ones."
        )
    return make


def _register_ale() -> None:
    import ale_py
    import cv2  # noqa: F401  (the preprocessing resizes frames with it)

    gym.register_envs(ale_py)  # the import registered the ids; this call only makes that explicit


def _register_minatar() -> None:
    import minatar.gym

    if "MinAtar/Breakout-v1" not in gym.registry:  # registering twice warns about every id
        minatar.gym.register_envs()


# Gymnasium knows these ids only once their package has registered them; the extra installs it.
_NAMESPACES = {"ALE/": (_register_ale, "atari"), "MinAtar/": (_register_minatar, "minatar")}


def _register_namespace(env_id: str) -> None:
    """Register the ids of the package behind ``env_id``'s namespace, or say how to install it.
    The import runs on every call (a dict look-up once imported) so a missing package always shows."""
    for prefix, (register, extra) in _NAMESPACES.items():
        if env_id.startswith(prefix):
            try:
                register()
            except ImportError as e:
                raise EnvError(
                    f"env '{env_id}' needs the '{extra}' extra ({e}): pip install 'shoal[{extra}]'."
                ) from None


def check_env_id(env_id: str) -> None:
    """Raise a clear error when ``env_id`` is neither a shoal nor a Gymnasium id.

    ``module:EnvId`` (Gymnasium's form) imports ``module`` first, which registers the id;
    ``pettingzoo:module`` names a PettingZoo env module with a ``parallel_env()`` or an ``env()``;
    ``ALE/...`` and ``MinAtar/...`` ids register their package's envs first."""
    if env_id in _REGISTRY:
        return
    _register_namespace(env_id.partition(":")[2] or env_id)
    if env_id in gym.registry:
        return
    if env_id.startswith(PETTINGZOO):
        _pettingzoo_maker(env_id)
        return
    module, sep, short = env_id.partition(":")
    if sep:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise EnvError(f"env '{env_id}': cannot import module '{module}' ({e}).") from None
        if short in _REGISTRY or short in gym.registry:
            return
        env_id = short
    known = list(_REGISTRY) + list(gym.registry)
    hint = did_you_mean(env_id, known)
    raise EnvError(
        f"unknown env id '{env_id}'.{hint} Use a Gymnasium id (e.g. 'CartPole-v1'), a name given to "
        f"shoal.register_env, a gym.Env instance, or a function returning one."
    )


def env_name(env: Any) -> str:
    """A short human name for error messages and run directories."""
    if isinstance(env, str):
        return env
    if isinstance(env, type):  # a class as the factory (a gym.Wrapper's class has a `spec` property)
        return env.__name__
    spec = getattr(env, "spec", None) or getattr(getattr(env, "unwrapped", None), "spec", None)
    if spec is not None:
        env_id: str = spec.id
        return env_id
    name: str = getattr(env, "__name__", type(env).__name__)
    return name


def env_creator(env: Any, env_config: dict[str, Any], evaluation: bool = False) -> Callable[[int], AnyEnv]:
    """Return ``make(index) -> env`` for an id, a registered name or a factory."""
    make = config_creator(env, evaluation)
    return lambda index: make(env_config)


def config_creator(env: Any, evaluation: bool = False) -> Callable[[dict[str, Any]], AnyEnv]:
    """Return ``make(env_config) -> env`` for an id, a registered name or a factory.

    A Gymnasium id gets ``env_config`` as ``gym.make`` keyword arguments; a factory may take
    ``env_config`` (RLlib style) or no argument. ``ALE/...`` ids get shoal's Atari
    preprocessing (``envs/atari.py``), in which ``evaluation`` turns off the loss-of-life terminals.
    """
    if isinstance(env, str) and env.startswith(PETTINGZOO):
        make = _pettingzoo_maker(env)
        return lambda env_config: make(**env_config)
    if isinstance(env, str):
        check_env_id(env)
        env = env.partition(":")[2] if ":" in env and env not in gym.registry else env
        if env in _REGISTRY:
            creator = _REGISTRY[env]
            return lambda env_config: _call_creator(creator, env_config, env)
        if is_atari_id(env):
            return lambda env_config: make_atari_env(env, env_config, evaluation)
        if is_minatar_id(env):
            return lambda env_config: make_minatar_env(env, env_config)
        return lambda env_config: gym_make(gym.make, env, env_config)
    if callable(env) and not isinstance(env, gym.Env) and not is_parallel_env(env) and not is_aec_env(env):
        return lambda env_config: _call_creator(env, env_config, env_name(env))
    raise EnvError(f"cannot make environments from {env!r}: expected an env id, a gym.Env, a VectorEnv or a factory.")


def gym_make(make: Callable[..., AnyEnv], env_id: str, env_config: dict[str, Any], **kwargs: Any) -> AnyEnv:
    """``make`` (``gym.make`` or ``gym.make_vec``) of ``env_id`` with ``env_config`` as keyword
    arguments; one the env does not take is an EnvError naming it, as for any other env."""
    try:
        return make(env_id, **kwargs, **env_config)
    except TypeError as e:
        if not env_config:
            raise
        # gymnasium's message repeats the keyword arguments: both are cut to a readable length
        raise EnvError(
            f"env '{env_id}' cannot be made with env_config={shorten(str(env_config))}: {shorten(str(e))}"
        ) from None


def _call_creator(creator: Callable[..., AnyEnv], env_config: dict[str, Any], name: str) -> AnyEnv:
    try:
        made = creator(dict(env_config))
    except TypeError as first:
        if env_config:
            raise
        try:
            made = creator()
        except TypeError:
            raise first from None
    if not isinstance(made, (gym.Env, AgentEnv)) and not is_parallel_env(made) and not is_aec_env(made):
        raise EnvError(
            f"env creator for '{name}' returned {type(made).__name__}, expected a gymnasium.Env (or a "
            f"multi-agent one with the dict API), a PettingZoo ParallelEnv or AECEnv, or a shoal.AgentEnv."
        )
    return made
