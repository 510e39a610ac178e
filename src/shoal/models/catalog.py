"""``model=`` and ``model_config=``: which network a policy gets, checked before training starts.

    model="mlp"                 separate actor and critic MLPs (the default)
    model="cnn"                 a CNN for image observations (one encoder per key for Dict/Tuple)
    model=MyModule / "pkg.mod:MyModule"   a torch.nn.Module of your own

Built-in models read ``model_config`` keys (checked, with did-you-mean): ``hiddens``, ``activation``,
``conv_filters``, ``shared_trunk``, ``channels``, and ``core`` / ``core_size`` / ``head_hiddens`` for
a recurrent core (``lstm`` or ``gru``) between the encoder and the heads (``shoal.models.recurrent``).
A module of your own is built as ``MyModule(obs_space, action_space, num_outputs, **model_config)``
and must return, from ``forward(obs)``, a pair ``(dist_inputs [B, num_outputs], value [B])``: the
action distribution's inputs (logits for Discrete, concatenated logits for MultiDiscrete, the mean
for Box: the log-std is the policy's own parameter) and the state value. ``obs`` is the raw batch
``[B, *obs_shape]`` in the stored dtype (uint8 images stay uint8: scale them yourself), or
normalized float32 with ``normalize_obs``. ``check_user_model`` runs it once on sample
observations and says exactly what does not fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

import gymnasium as gym
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError, did_you_mean, nearest_keys, shorten, warn
from shoal.imports import import_spec, is_spec
from shoal.models.distributions import make_distribution
from shoal.models.encoders import is_image, is_pixels, make_encoder
from shoal.models.layers import mlp
from shoal.models.networks import EncoderModel, MLPModel
from shoal.models.normalize import ObsNormalizer
from shoal.models.policy import ActorCriticPolicy
from shoal.models.qpolicy import QPolicy, RecurrentQPolicy
from shoal.models.recurrent import RecurrentActorCriticPolicy, RecurrentModel
from shoal.models.sde import SDEActorCriticPolicy

if TYPE_CHECKING:  # shoal.config imports this module
    from shoal.config import TrainerConfig

BUILT_IN = ("mlp", "cnn")


class ModelConfig(BaseModel):
    """``model_config`` of the built-in models; None means the model's own default."""

    model_config = ConfigDict(extra="forbid")

    hiddens: list[int] | None = None
    """Hidden layer sizes: of each MLP (mlp: `[64, 64]`), or after the convolutions (cnn: `[512]`). `[]` (with a
    recurrent core only) feeds the core the encoder's output directly."""
    activation: Literal["tanh", "relu"] | None = None
    """Activation of the hidden layers (mlp: `tanh`; cnn: `relu`)."""
    conv_filters: list[tuple[int, int, int]] | None = Field(
        default=None, min_length=1
    )  # (out_channels, kernel, stride)
    """The CNN's conv layers as `[out_channels, kernel, stride]` each; None: by image size (the Nature-DQN stack from
    36 px up, one 16x3x3 conv below)."""
    shared_trunk: bool | None = None
    """One trunk feeding both actor and critic heads (cnn), or a separate copy for the critic (mlp); with a
    recurrent core, the critic's copy has a core of its own too."""
    channels: Literal["first", "last"] | None = None
    """Where an image's channels are; None: detected from the shape (first when the first dim is the smallest)."""
    layer_norm: bool | None = None
    """A LayerNorm between each hidden layer and its activation, and over the channels between each conv layer of
    `model=cnn` and its activation (the Q-network of `algo=pqn`, where it is on by default); with separate actor and
    critic (`shared_trunk` false) each trunk is a plain MLP rather than the stacked towers. None: off, except for
    PQN."""
    core: Literal["lstm", "gru"] | None = None
    """A recurrent core after the encoder and hidden layers (one per trunk: see `shared_trunk`); None: feedforward."""
    core_size: int | None = Field(default=None, ge=1)
    """Units of each recurrent core (default 128); with a separate critic the state holds twice as many."""
    head_hiddens: list[int] | None = Field(default=None, min_length=1)
    """Hidden layers between a recurrent core and each head (with `activation`); None: the heads read the core
    directly."""
    use_prev_action: bool = False
    """Feed the recurrent core the previous action too (one-hot for discrete actions; zeros at an episode start)."""
    use_prev_reward: bool = False
    """Feed the recurrent core the previous reward too (the env's own; zero at an episode start)."""

    def check_core(self) -> None:
        if self.hiddens == [] and self.core is None:
            raise ConfigError(
                "bad value for 'model_config.hiddens': []: no hidden layers is only for a recurrent core (core='lstm' "
                "or 'gru'), which then reads the encoder's output; give at least one size, e.g. hiddens=[64]."
            )
        for key in ("core_size", "head_hiddens", "use_prev_action", "use_prev_reward"):
            if getattr(self, key) not in (None, False) and self.core is None:
                raise ConfigError(f"model_config.{key} shapes a recurrent core; set core='lstm' or 'gru' too.")


def check_model_config(model: Any, model_config: dict[str, Any]) -> None:
    """Reject bad keys and values of a built-in model's ``model_config`` (a user module takes any)."""
    if not isinstance(model, str) or model not in BUILT_IN:
        return
    for key in model_config:
        if key not in ModelConfig.model_fields:
            raise ConfigError(
                f"unknown model_config key {shorten(repr(key))} for model='{model}'."
                f"{nearest_keys(key, ModelConfig.model_fields)}"
            )
    try:
        built = ModelConfig(**model_config)
    except ValidationError as e:
        first = e.errors()[0]
        key = str(first["loc"][0])
        raise ConfigError(
            f"bad value for 'model_config.{key}': {shorten(repr(model_config.get(key)))}: {first['msg']}."
        ) from None
    built.check_core()
    sizes = {
        "hiddens": built.hiddens or [],
        "head_hiddens": built.head_hiddens or [],
        "conv_filters": [v for f in built.conv_filters or [] for v in f],
    }
    for key, values in sizes.items():
        if any(v < 1 for v in values):
            example = "[[16, 3, 1]]" if key == "conv_filters" else "[64, 64]"
            raise ConfigError(
                f"bad value for 'model_config.{key}': {shorten(repr(model_config[key]))}: every layer size, kernel and "
                f"stride must be a positive integer, e.g. {key}={example}."
            )


def resolve_model(model: Any) -> str | type[nn.Module]:
    """'mlp', 'cnn', or the user's module class (given as a class or 'package.module:Class')."""
    if isinstance(model, str) and model in BUILT_IN:
        return model
    if isinstance(model, str):
        if not is_spec(model):
            raise ConfigError(
                f"model={shorten(repr(model))} is not one of {list(BUILT_IN)}.{did_you_mean(model, BUILT_IN)} "
                f"A module of your own is given as a class or 'package.module:Class'."
            )
        model = import_spec(model, "model")
    if not (isinstance(model, type) and issubclass(model, nn.Module)):
        raise ConfigError(f"model must be 'mlp', 'cnn' or a torch.nn.Module subclass, got {shorten(repr(model))}.")
    return model


def holds_image(space: gym.Space[Any]) -> bool:
    """An image, or a Dict/Tuple with an image somewhere inside."""
    if isinstance(space, gym.spaces.Dict):
        return any(holds_image(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return any(holds_image(s) for s in space.spaces)
    return is_image(space)


def build_model(model: Any, model_config: dict[str, Any], env: EnvInfo, num_outputs: int) -> nn.Module:
    kind = resolve_model(model)
    space = env.obs_spec.space
    if not isinstance(kind, str):
        if env.critic_dim:
            raise ConfigError(
                "central_critic needs the built-in model='mlp' (its critic tower takes the critic's "
                f"input); got model={kind.__name__}."
            )
        return check_user_model(kind, model_config, env, num_outputs)
    cfg = ModelConfig(**model_config)
    image = kind == "cnn"
    if image and not holds_image(space):
        raise ConfigError(
            f"model='cnn' needs image observations (a 3-D Box or a 2-D one of at least 8x8, or a "
            f"Dict/Tuple holding one); "
            f"'{env.name}' observes {space}. Use model='mlp'."
        )
    hiddens = cfg.hiddens if cfg.hiddens is not None else ([512] if image else [64, 64])
    activation = cfg.activation or ("relu" if image else "tanh")
    shared = cfg.shared_trunk if cfg.shared_trunk is not None else image
    if cfg.core is None:
        if env.critic_dim and (image or shared):
            raise ConfigError("central_critic needs model='mlp' with separate actor and critic (shared_trunk false).")
        if not image and not shared and not cfg.layer_norm:
            return MLPModel(int(np.prod(env.obs_spec.shape)), num_outputs, hiddens, activation, env.critic_dim)
    # model='mlp' reads any observation flat (images too); 'cnn' encodes it by its structure
    encoder_space = space if image else gym.spaces.Box(-np.inf, np.inf, (int(np.prod(env.obs_spec.shape)),))
    try:
        if cfg.core is not None:
            return recurrent_model(
                cfg, env, num_outputs, encoder_space, hiddens=hiddens, activation=activation, shared=shared
            )
        return EncoderModel(
            lambda: make_encoder(encoder_space, cfg.conv_filters, cfg.channels, bool(cfg.layer_norm)),
            num_outputs,
            hiddens,
            activation,
            shared,
            bool(cfg.layer_norm),
        )
    except ValueError as e:  # the encoder's checks of conv_filters and channels against the image
        raise ConfigError(
            f"model={kind!r} with model_config={shorten(str(model_config))} does not fit '{env.name}': {e}"
        ) from None


def recurrent_model(
    cfg: ModelConfig,
    env: EnvInfo,
    num_outputs: int,
    space: gym.Space[Any],
    *,
    hiddens: list[int],
    activation: str,
    shared: bool,
) -> RecurrentModel:
    """``encoder -> hidden layers -> core`` (``cfg.core``) -> the heads (each behind ``head_hiddens``),
    with a second encoder, hidden layers and core for the critic unless ``shared``."""
    if env.critic_dim:
        raise ConfigError(
            f"central_critic is not supported with a recurrent core (model_config.core={cfg.core!r}); drop one of them."
        )
    encoders = [
        make_encoder(space, cfg.conv_filters, cfg.channels, bool(cfg.layer_norm)) for _ in range(1 if shared else 2)
    ]
    trunks = [
        nn.Sequential(encoder, mlp(encoder.out_dim, hiddens, activation, bool(cfg.layer_norm))) for encoder in encoders
    ]
    return RecurrentModel(
        trunks,
        hiddens[-1] if hiddens else encoders[0].out_dim,
        num_outputs,
        cfg.core or "lstm",
        cfg.core_size or 128,
        head_hiddens=cfg.head_hiddens,
        activation=activation,
        prev_action=env.act_spec if cfg.use_prev_action else None,
        prev_reward=cfg.use_prev_reward,
    )


def check_user_model(cls: type[nn.Module], model_config: dict[str, Any], env: EnvInfo, num_outputs: int) -> nn.Module:
    """Build the user's module and run it once on two sample observations; any mismatch with the
    contract (see the module docstring) is a ConfigError naming what came back."""
    name = cls.__name__
    try:
        module = cls(env.obs_spec.space, env.act_spec.space, num_outputs, **model_config)
    except TypeError as e:
        raise ConfigError(
            f"model {name} cannot be built as {name}(obs_space, action_space, num_outputs, "
            f"**model_config) with model_config={shorten(str(model_config))}: {shorten(str(e))}."
        ) from None
    if not any(p.requires_grad for p in module.parameters()):
        raise ConfigError(f"model {name} has no trainable parameters.")
    spec = env.obs_spec
    sample = np.stack([spec.flat_sample() for _ in range(2)])
    with torch.no_grad():
        out = module(torch.as_tensor(sample))
    want = f"(dist_inputs [B, {num_outputs}], value [B]) as float tensors, here B = 2"
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(x, torch.Tensor) for x in out)):
        raise ConfigError(f"model {name}.forward returned {_describe(out)}; expected a pair {want}.")
    dist_inputs, value = out
    if tuple(dist_inputs.shape) != (2, num_outputs) or not dist_inputs.is_floating_point():
        raise ConfigError(
            f"model {name}.forward returned dist_inputs of shape {list(dist_inputs.shape)} and dtype "
            f"{dist_inputs.dtype}; expected [2, {num_outputs}] float for {env.act_spec.space} "
            f"(the pair should be {want})."
        )
    if tuple(value.shape) != (2,) or not value.is_floating_point():
        hint = " (squeeze the last dim)" if tuple(value.shape) == (2, 1) else ""
        raise ConfigError(
            f"model {name}.forward returned value of shape {list(value.shape)} and dtype {value.dtype}; "
            f"expected [2] float{hint} (the pair should be {want})."
        )
    return module


def _describe(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return f"one tensor of shape {list(out.shape)}"
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}: " + ", ".join(_describe(x) for x in out)
    return type(out).__name__


def build_policy(config: TrainerConfig, env: EnvInfo) -> ActorCriticPolicy:
    """The actor-critic of one policy: ``config`` is the policy's config (with its overrides)."""
    num_outputs = make_distribution(env.act_spec).param_dim
    spec = env.obs_spec
    if "model" not in config.model_fields_set and is_pixels(spec.space):
        warn(
            f"observations are images {list(spec.shape)} {spec.space.dtype}; model='cnn' is usually "
            f"far better than the default model='mlp' over {int(np.prod(spec.shape))} flattened inputs (set "
            f"model='mlp' to keep it without this warning)."
        )
    model = build_model(config.model, config.model_options, env, num_outputs)
    normalizer, critic_normalizer = obs_normalizers(config, env)
    if getattr(config, "use_sde", False):
        features = sde_features(model, env)
        sample_freq = cast(int, getattr(config, "sde_sample_freq", -1))
        return SDEActorCriticPolicy(
            model, env.act_spec, features, normalizer, critic_normalizer, config.log_std_init, sample_freq
        )
    if isinstance(model, RecurrentModel):
        return RecurrentActorCriticPolicy(model, env.act_spec, normalizer, config.log_std_init)
    return ActorCriticPolicy(model, env.act_spec, normalizer, critic_normalizer, config.log_std_init)


def sde_features(model: nn.Module, env: EnvInfo) -> int:
    """The width of the features gSDE's noise reads (the actor's last hidden layer); the model
    and the actions must suit it."""
    if env.act_spec.kind != "continuous":
        raise ConfigError(
            f"use_sde=True explores Box actions; '{env.name}' acts in {env.act_spec.space}. Leave use_sde false."
        )
    if isinstance(model, MLPModel):
        return int(model.weights[-1].shape[-1])
    if isinstance(model, EncoderModel):
        return model.policy_head.in_features
    raise ConfigError(
        f"use_sde=True reads the actor's last hidden layer, which the built-in feedforward models expose; got "
        f"{type(model).__name__}. Use model='mlp' or 'cnn', or leave use_sde false."
    )


def obs_normalizers(config: TrainerConfig, env: EnvInfo) -> tuple[ObsNormalizer | None, ObsNormalizer | None]:
    """The observation (and centralized critic input) statistics ``normalize_obs`` asks for."""
    if not config.normalize_obs:
        return None, None
    if env.obs_spec.dtype != np.float32:
        raise ConfigError(
            f"normalize_obs=True normalizes float observations; '{env.name}' observes "
            f"{env.obs_spec.dtype} {list(env.obs_spec.shape)} (images are scaled inside the CNN)."
        )
    normalizer = ObsNormalizer(env.obs_spec.shape, config.clip_obs)
    return normalizer, ObsNormalizer((env.critic_dim,), config.clip_obs) if env.critic_dim else None


# Q-networks default to one trunk (the heads share it: dueling's value and advantage streams) of
# two 256-unit ReLU layers, the size rl-baselines3-zoo's DQN settings use on classic control, and
# keep torch's default layer init: the orthogonal init with a tiny head that suits policy
# gradients held DQN on CartPole-v1 far below the same network with torch's init.
Q_NETWORK_DEFAULTS = {"shared_trunk": True, "hiddens": [256, 256], "activation": "relu"}


def build_q_policy(
    config: TrainerConfig, env: EnvInfo, dueling: bool, defaults: dict[str, Any] | None = None
) -> QPolicy:
    """The Q-network policy of one policy (``config`` has its overrides): ``model`` with one output
    per action; built-in models take ``Q_NETWORK_DEFAULTS`` (updated with the algorithm's
    ``defaults``) for the ``model_config`` keys not given, and a recurrent core (``core``) makes it
    a ``RecurrentQPolicy``."""
    spec = env.act_spec
    if spec.kind != "discrete":
        raise ConfigError(
            f"Q-learning needs Discrete actions; '{env.name}' acts in {spec.space}. For Box actions use "
            f"algo=sac, algo=td3 or algo=ppo; for MultiDiscrete or MultiBinary ones, algo=ppo."
        )
    if env.critic_dim:
        raise ConfigError(
            "central_critic feeds an actor-critic's value function, which a Q-learner (DQN, PQN) has not; drop "
            "central_critic."
        )
    built_in = isinstance(config.model, str) and config.model in BUILT_IN
    options = config.model_options
    if built_in:
        options = ({"shared_trunk": True} if config.model == "cnn" else Q_NETWORK_DEFAULTS) | (defaults or {}) | options
    model = build_model(config.model, options, env, spec.nvec[0])
    if built_in:  # torch's default layer init, see Q_NETWORK_DEFAULTS (a recurrent core keeps its own)
        for layer in model.modules():
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                layer.reset_parameters()
    kind = RecurrentQPolicy if isinstance(model, RecurrentModel) else QPolicy
    return kind(model, spec.nvec[0], obs_normalizers(config, env)[0], dueling)
