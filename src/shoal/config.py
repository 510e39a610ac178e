"""Configuration: one pydantic model per algorithm, the same keys in Python, YAML and on the command line.

Batch-size names follow RLlib: ``train_batch_size`` agent steps are collected per
iteration as ``num_envs`` rows times ``rollout_fragment_length`` steps, then split into
``sgd_minibatch_size`` minibatches for ``num_sgd_iter`` epochs.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shoal.errors import ConfigError, did_you_mean
from shoal.imports import import_spec, is_spec, spec_of
from shoal.models.catalog import check_model_config, resolve_model


class TrainerConfig(BaseModel):
    """Keys every algorithm shares: environment, sampling, run outputs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, arbitrary_types_allowed=True)

    algo: Any = "ppo"  # an algorithm name, a shoal.Algorithm subclass or 'package.module:Class'
    env: Any = "CartPole-v1"
    env_config: dict[str, Any] = Field(default_factory=dict)
    vectorization_mode: Literal["vector_entry_point", "sync", "async"] | None = None
    seed: int = 0
    num_envs: int = Field(8, ge=1)
    num_workers: int = Field(0, ge=0)  # 0: envs step in this process; N: in N worker processes
    async_factor: int = Field(1, ge=1)  # worker groups stepping while the policy acts on another
    rollout_fragment_length: int | None = Field(None, ge=1)
    train_batch_size: int | None = Field(None, ge=1)
    total_timesteps: int = Field(100_000, ge=1)
    torch_threads: int = Field(1, ge=1)
    device: str = "cpu"
    metrics_num_episodes_for_smoothing: int = Field(100, ge=1)
    # the run lifecycle: outputs, checkpoints, evaluation, callbacks
    name: str | None = None
    run_dir: str | None = None
    save_outputs: bool = True
    verbose: int = Field(1, ge=0, le=2)
    checkpoint_interval: int = Field(100, ge=0)  # iterations; 0 = only at the end and when stopped
    keep_checkpoints: int = Field(3, ge=1)
    evaluation_interval: int | None = Field(None, ge=1)  # iterations; None = no periodic evaluation
    evaluation_num_episodes: int = Field(20, ge=1)
    evaluation_deterministic: bool = True
    callbacks: list[Any] = Field(default_factory=list)
    wandb_project: str | None = None
    wandb_mode: Literal["offline", "online"] = "offline"
    # discount, optimizer step size, and the network every policy is built with
    gamma: float = Field(0.98, ge=0.0, le=1.0)
    learning_rate: float = Field(1e-3, gt=0.0)
    lr_schedule: Literal["constant", "linear"] = "linear"
    model: Any = "mlp"  # "mlp", "cnn", a torch.nn.Module subclass or 'package.module:Class'
    # hiddens, activation, conv_filters, ... Written model_config everywhere; the attribute has
    # another name because pydantic reserves model_config for itself.
    model_options: dict[str, Any] = Field(default_factory=dict, alias="model_config")
    log_std_init: float = 0.0
    normalize_obs: bool = False
    normalize_reward: bool = False
    clip_obs: float = Field(10.0, gt=0.0)
    clip_reward: float = Field(10.0, gt=0.0)
    # the learning signal only (logged returns stay raw): True = sign, c = clip to [-c, c];
    # None = the env's default (sign for Atari games, off otherwise)
    clip_rewards: bool | float | None = None
    # several policies: id -> overrides of POLICY_KEYS; None = one shared "default_policy"
    policies: dict[str, dict[str, Any] | None] | list[str] | None = None
    # agent id, episode -> policy id, called at each episode start; a callable, 'module:function', or a
    # dict {agent id: policy id}. Default: the policy named like the agent, else the only policy.
    policy_mapping_fn: Any = None
    policies_to_train: list[str] | None = None  # None: all of them; the others are frozen
    # MAPPO: the value function sees every agent of the env ("team_obs") or the env's state() ("state");
    # the actor its own obs only
    central_critic: Literal["team_obs", "state"] | None = None

    # keys a policy in `policies` may override: its network, and how it learns
    POLICY_KEYS: ClassVar[tuple[str, ...]] = ("model", "model_config", "log_std_init", "learning_rate", "gamma")
    # keys that moved: old name -> what to write instead
    MOVED: ClassVar[dict[str, str]] = {
        "hiddens": "model_config={'hiddens': [64, 64]}",
        "activation": "model_config={'activation': 'relu'}",
    }

    @model_validator(mode="after")
    def _check_model(self) -> TrainerConfig:
        resolve_model(self.model)
        check_model_config(self.model, self.model_options)
        if isinstance(self.clip_rewards, float) and not isinstance(self.clip_rewards, bool) and self.clip_rewards <= 0:
            raise ConfigError(
                f"clip_rewards={self.clip_rewards} must be positive (rewards are clipped to [-c, c]), "
                f"True (their sign) or false."
            )
        return self

    @model_validator(mode="after")
    def _resolve_rollout_shape(self) -> TrainerConfig:
        """Fill whichever of train_batch_size / rollout_fragment_length is missing, and check they agree."""
        n, frag, batch = self.num_envs, self.rollout_fragment_length, self.train_batch_size
        if frag is None and batch is None:
            frag = 32
        if frag is None:
            if batch % n:
                lo = max(n, batch // n * n)
                raise ConfigError(
                    f"train_batch_size={batch} is not divisible by num_envs={n}: each iteration collects "
                    f"num_envs x rollout_fragment_length steps. Try train_batch_size={lo} or {lo + n}."
                )
            frag = batch // n
        elif batch is None:
            batch = n * frag
        elif batch != n * frag:
            raise ConfigError(
                f"train_batch_size={batch} must equal num_envs={n} x rollout_fragment_length={frag} = {n * frag}. "
                f"Set only two of the three, e.g. drop train_batch_size or use "
                f"rollout_fragment_length={max(1, batch // n)}."
            )
        self.rollout_fragment_length, self.train_batch_size = frag, batch
        return self

    @model_validator(mode="after")
    def _check_workers(self) -> TrainerConfig:
        n, w = self.num_envs, self.num_workers
        if w and self.vectorization_mode:
            raise ConfigError(
                f"num_workers={w} and vectorization_mode='{self.vectorization_mode}' both choose how envs "
                f"are stepped; set one of them."
            )
        if w and n % w:
            fits = [d for d in range(1, n + 1) if n % d == 0]
            near = min(fits, key=lambda d: abs(d - w))
            raise ConfigError(
                f"num_envs={n} must be a multiple of num_workers={w} (each worker steps the same "
                f"number of envs). Try num_workers={near} or num_envs={(n // w + 1) * w}."
            )
        f = self.async_factor
        if f > 1 and not w:
            raise ConfigError(
                f"async_factor={f} needs env worker processes to overlap with; set num_workers to a "
                f"multiple of {f} (e.g. num_workers={f}) or async_factor=1."
            )
        if f > 1 and w % f:
            fits = [d for d in range(1, w + 1) if w % d == 0]
            near = min(fits, key=lambda d: abs(d - f))
            raise ConfigError(
                f"num_workers={w} must be a multiple of async_factor={f} (each of the {f} groups gets "
                f"the same number of workers). Try async_factor={near} or num_workers={(w // f + 1) * f}."
            )
        cores = os.cpu_count() or 1
        if w > cores:
            warnings.warn(
                f"num_workers={w} is more than the {cores} CPU cores here; workers will contend for them.", stacklevel=2
            )
        return self

    @model_validator(mode="after")
    def _check_policies(self) -> TrainerConfig:
        if self.policies is None:
            if self.policies_to_train is not None or isinstance(self.policy_mapping_fn, dict):
                raise ConfigError(
                    "policies_to_train and a policy_mapping_fn dict name policies; set policies too, "
                    "e.g. policies={'main': {}, 'opponent': {}}."
                )
            return self
        if isinstance(self.policies, list):
            self.policies = dict.fromkeys(self.policies)
        if not self.policies:
            raise ConfigError("policies is empty; name at least one policy or leave it unset.")
        self.policies = {pid: dict(spec or {}) for pid, spec in self.policies.items()}
        for pid in self.policies:
            self.policy_config(pid)  # every override checked now, not when the trainer is half built
        named = list(self.policies_to_train or [])
        if isinstance(self.policy_mapping_fn, dict):
            named += self.policy_mapping_fn.values()
        for pid in named:
            if pid not in self.policies:
                raise ConfigError(
                    f"'{pid}' is not one of the policies {list(self.policies)}.{did_you_mean(pid, self.policies)}"
                )
        return self

    def policy_config(self, policy_id: str):
        """This config with policy ``policy_id``'s overrides applied (validated)."""
        overrides = (self.policies or {}).get(policy_id) or {}
        for key in overrides:
            if key not in self.POLICY_KEYS:
                raise ConfigError(
                    f"policy '{policy_id}' overrides '{key}', which is not a per-policy key."
                    f"{did_you_mean(key, self.POLICY_KEYS)} Per-policy keys: {', '.join(self.POLICY_KEYS)}."
                )
        if not overrides:
            return self
        fields = self.settings() | {"policies": None, "policies_to_train": None, "policy_mapping_fn": None}
        overrides = overrides | {"model_config": self.model_options | overrides.get("model_config", {})}
        try:
            return type(self).build(**fields | overrides)
        except ConfigError as e:
            raise ConfigError(f"policy '{policy_id}': {e}") from None

    @property
    def policy_ids(self) -> list[str]:
        return list(self.policies) if self.policies else ["default_policy"]

    def check_batch(self, agents_per_env: int = 1) -> None:
        """Checks that need the env's agent count; algorithms with minibatches override it."""

    @classmethod
    def keys(cls) -> list[str]:
        """The config's keys as users write them."""
        return [field.alias or name for name, field in cls.model_fields.items()]

    def settings(self) -> dict[str, Any]:
        """Every key's value, keyed as users write them (``build(**settings())`` rebuilds the config)."""
        return {field.alias or name: getattr(self, name) for name, field in type(self).model_fields.items()}

    @classmethod
    def build(cls, **overrides: Any):
        """Validate ``overrides`` into a config, turning pydantic's errors into one clear ConfigError."""
        known = cls.keys()
        unknown = [k for k in overrides if k not in known]
        if unknown:
            k = unknown[0]
            if k in cls.MOVED:
                raise ConfigError(
                    f"'{k}' is a model_config key now: {cls.MOVED[k]} (on the command line model_config.{k}=...)."
                )
            raise ConfigError(
                f"unknown config key '{k}' for {cls.__name__}.{did_you_mean(k, known)} "
                f"Valid keys: {', '.join(sorted(known))}."
            )
        try:
            return cls(**overrides)
        except ValidationError as e:
            first = e.errors()[0]
            if first["type"] == "value_error" and not first["loc"]:  # our own cross-key checks
                raise ConfigError(str(first["ctx"]["error"])) from None
            key = ".".join(str(p) for p in first["loc"]) or "config"
            value = overrides.get(str(first["loc"][0])) if first["loc"] else None
            raise ConfigError(f"bad value for '{key}': {value!r}: {first['msg']}.") from None

    def to_yaml_dict(self) -> dict[str, Any]:
        """The config as plain data, for config.yaml and checkpoints: an env object, a callback
        object or a policy_mapping_fn function becomes its repr (``env_is_object`` says which;
        such objects are passed again when a checkpoint is loaded)."""
        data = self.model_dump(by_alias=True)
        if not isinstance(data["env"], str):
            data["env"] = repr(self.env)
        for key in ("algo", "model"):  # classes are stored as 'module:Class', importable on load
            if isinstance(data[key], type):
                data[key] = spec_of(data[key])
        data["callbacks"] = [c if isinstance(c, str) else repr(c) for c in self.callbacks]
        if callable(self.policy_mapping_fn):
            data["policy_mapping_fn"] = repr(self.policy_mapping_fn)
        return data

    @property
    def env_is_object(self) -> bool:
        return not isinstance(self.env, str)


class PPOConfig(TrainerConfig):
    """PPO's keys. Defaults solve CartPole-v1 in well under 100k steps (rl-baselines3-zoo's CartPole settings)."""

    advantage_estimator: str = "gae"  # or 'package.module:function' (rollout, gamma, gae_lambda) -> [N, T]
    # the hand-fused learn step for the built-in MLP (the same numbers, faster); off: always autograd
    fused_update: bool = True
    sgd_minibatch_size: int = Field(256, ge=1)
    num_sgd_iter: int = Field(20, ge=1)
    gae_lambda: float = Field(0.8, ge=0.0, le=1.0)
    adam_eps: float = Field(1e-5, gt=0.0)
    clip_coef: float = Field(0.2, gt=0.0)
    vf_clip_coef: float | None = Field(None, gt=0.0)
    # The value loss is 0.5 * squared error, so vf_coef=1.0 weighs it as SB3's vf_coef=0.5 on plain MSE.
    vf_coef: float = Field(1.0, ge=0.0)
    ent_coef: float = Field(0.0, ge=0.0)
    max_grad_norm: float | None = Field(0.5, gt=0.0)
    norm_adv: bool = True
    target_kl: float | None = Field(None, gt=0.0)

    POLICY_KEYS: ClassVar[tuple[str, ...]] = (
        *TrainerConfig.POLICY_KEYS,
        "gae_lambda",
        "adam_eps",
        "clip_coef",
        "vf_clip_coef",
        "vf_coef",
        "ent_coef",
        "max_grad_norm",
        "norm_adv",
        "target_kl",
        "num_sgd_iter",
        "sgd_minibatch_size",
    )

    @model_validator(mode="after")
    def _check_estimator(self) -> PPOConfig:
        from shoal.algos.advantages import ESTIMATORS  # here: shoal.algos imports this module

        spec = self.advantage_estimator
        if spec not in ESTIMATORS:
            if not is_spec(spec):
                raise ConfigError(
                    f"advantage_estimator='{spec}' is not one of {list(ESTIMATORS)} nor a "
                    f"'package.module:function'.{did_you_mean(spec, ESTIMATORS)}"
                )
            import_spec(spec, "advantage_estimator")
        return self

    def check_batch(self, agents_per_env: int = 1) -> None:
        """The learner sees ``train_batch_size x agents_per_env`` agent steps per iteration;
        checked once the env's agent count is known."""
        if self.policies and len(self.policies) > 1:
            return  # each policy's share of the batch is split into near-equal minibatches instead
        batch, mb = self.train_batch_size * agents_per_env, self.sgd_minibatch_size
        if mb > batch or batch % mb:
            divisors = [d for d in range(1, batch + 1) if batch % d == 0]
            near = min(divisors, key=lambda d: (abs(math.log(d / mb)), -d))
            agents = f" x {agents_per_env} agents" if agents_per_env > 1 else ""
            raise ConfigError(
                f"sgd_minibatch_size={mb} must divide the {batch} agent steps of an iteration "
                f"(train_batch_size={self.train_batch_size} = num_envs={self.num_envs} x rollout_fragment_length="
                f"{self.rollout_fragment_length}{agents}). Try sgd_minibatch_size={near}."
            )


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Parse ``key=value`` command-line pairs; values are read as YAML (``model_config.hiddens=[64,64]``
    sets one key of a dict-valued key)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got '{pair}'.")
        value = yaml.safe_load(raw) if raw.strip() else None
        outer, dot, inner = key.strip().partition(".")
        out = merge_settings(out, {outer: {inner: value}} if dot else {outer: value})
    return out


def merge_settings(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, where a dict value updates the dict it replaces key by key
    (``model_config.hiddens=[32]`` on the command line keeps the YAML file's other model_config keys)."""
    out = dict(base)
    for key, value in extra.items():
        both_dicts = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = out[key] | value if both_dicts else value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file (safe_load only: YAML tags cannot build Python objects)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist.")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of key: value, got {type(data).__name__}.")
    return data
