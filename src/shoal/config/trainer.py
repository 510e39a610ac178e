"""``TrainerConfig``: the keys every algorithm shares, and the checks across them.

Batch-size names follow RLlib: ``train_batch_size`` env steps are collected per iteration as
``num_envs`` envs times ``rollout_fragment_length`` steps, then split into ``sgd_minibatch_size``
minibatches (of agent steps) for ``num_sgd_iter`` epochs. The names of the segment learner are
accepted too and mean the same run: ``batch_size`` (agent steps per iteration: ``train_batch_size``
times the agents of each env), ``minibatch_size`` (= ``sgd_minibatch_size``), ``update_epochs``
(= ``num_sgd_iter``), with ``bptt_horizon`` and ``accumulate_minibatches``; ``BatchLayout`` shows
what they add up to.

Each key is declared here once; an algorithm whose default differs says so in its ``DEFAULTS``
(``shoal.config.base``). The checks of workers and backends are in ``shoal.config.backends``,
those of several policies in ``shoal.config.policies``, those of the sampling keys in
``shoal.config.sampling``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import torch
from pydantic import Field, model_validator

from shoal.config.backends import check_workers
from shoal.config.base import ConfigModel
from shoal.config.offline import check_offline
from shoal.config.policies import check_policies, with_policy_overrides
from shoal.config.sampling import check_sampling
from shoal.envs.atari import is_atari_id
from shoal.envs.horizon import EpisodeRules, declared_episode_steps
from shoal.errors import ConfigError, shorten
from shoal.imports import spec_of
from shoal.models.catalog import check_model_config, resolve_model

if TYPE_CHECKING:
    from typing_extensions import Self


class TrainerConfig(ConfigModel):
    """Keys every algorithm shares: environment, sampling, run outputs, how the learner steps."""

    algo: Any = "ppo"
    """The algorithm: a registered name (`ppo`, `grpo`, or one given to `shoal.register_algorithm`), a `shoal.Algorithm`
    subclass, or `'package.module:Class'`."""
    env: Any = "CartPole-v1"
    """The environment: a Gymnasium id, `'module:EnvId'`, a name given to `shoal.register_env`,
    `'pettingzoo:<module>'`, `'vmas:<scenario>'`, an env instance, a factory or a Gymnasium `VectorEnv`. None: no
    env, with `input` (the datasets' spaces; no evaluation episodes). A run given `input` and no env takes the
    env its datasets were recorded on, or None when this machine does not have it."""
    tuned: bool = True
    """Start from the tuned config shoal ships for this (algo, env) pair, when there is one (`configs/<algo>/<env>.yaml`
    in a clone); every key you set still overrides it. False: as when there is none (see `kind_defaults`)."""
    kind_defaults: bool = True
    """With no tuned config: start from the algorithm's defaults for the env's kind, when it ships them (image
    observations, Box actions; `configs/<algo>/kinds/`). False: the defaults below."""
    env_config: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the env: keyword arguments of `gym.make` for an id, the dict a registered creator or factory
    receives, or the keyword arguments of a PettingZoo `parallel_env()` or VMAS scenario."""
    vectorization_mode: Literal["vector_entry_point", "sync", "async"] | None = None
    """Make the envs with `gym.make_vec` in this mode instead of one by one (`vector_entry_point`: the env's own
    vectorized implementation); not together with `num_workers`."""
    seed: int = Field(default=0, ge=0, le=2**32 - 1)  # numpy's global seed is a uint32
    """Seeds Python's, numpy's and torch's generators and the envs (evaluation envs get `seed + 10000`)."""
    num_envs: int = Field(default=8, ge=1)
    """Environments stepped together; each brings its agents as rows of the batch."""
    num_workers: int = Field(default=0, ge=0)
    """0: the envs step in this process; N: in N worker processes over shared memory (`num_envs` a multiple of N)."""
    async_factor: int = Field(default=1, ge=1)
    """Groups of worker processes: the policy acts on one group while the others step (`num_workers` a multiple of
    it)."""
    backend: Literal["local", "ray", "external"] = "local"
    """Who steps the envs: `local`, this process or its `num_workers` worker processes; `ray`, `num_workers` Ray actors,
    each acting with its own copy of the policies (`pip install 'shoal[ray]'`); `external`, simulators that call a
    policy server (`shoal serve`), `num_envs` episodes at a time in `async_factor` groups."""
    ray_address: str | None = None
    """The Ray cluster of `backend='ray'` (setting it chooses that backend): None starts a local one, `auto` finds a
    running one, `ray://host:10001` connects to a remote one."""
    num_cpus_per_worker: float = Field(default=1.0, gt=0)
    """CPU cores Ray reserves for each rollout worker actor (`backend='ray'`)."""
    remote_worker_envs: bool = False
    """`backend='ray'`: each env of a worker is a Ray actor of its own, stepped at the same time as the others and
    polled as its step completes (in `async_factor` groups); for envs whose step is slow."""
    num_cpus_per_env: float = Field(default=0.0, ge=0)
    """CPU cores Ray reserves for each env actor of `remote_worker_envs` (0: none, for envs that mostly wait)."""
    client_timeout_s: float = Field(default=60.0, gt=0)
    """`backend='external'`: an episode whose client sends nothing this long after its action is closed (truncated)."""
    rollout_fragment_length: int | None = Field(default=None, ge=1)
    """Steps of every env per collection (on-policy learners collect once per iteration); None: `train_batch_size /
    num_envs`, or 32 when that is unset too."""
    train_batch_size: int | None = Field(default=None, ge=1)
    """Env steps per iteration, `num_envs x rollout_fragment_length`: set any two of the three."""
    batch_size: int | None = Field(default=None, ge=1)
    """Agent steps per iteration: `train_batch_size` times the agents of each env (the same number for single-agent
    envs); set it instead of `train_batch_size`, or both when they agree."""
    total_timesteps: int = Field(default=100_000, ge=1)
    """Env steps of the whole run: `learn()` without an argument trains until this many."""
    torch_threads: int = Field(default=1, ge=1, le=1024)  # far more threads than a machine can start crashes torch
    """Threads torch uses for its ops (`torch.set_num_threads`)."""
    device: str = "cpu"
    """Torch device of the policies and the rollout storage."""
    metrics_num_episodes_for_smoothing: int = Field(default=100, ge=1)
    """Episodes that episode statistics (`episode_reward_mean`, custom metrics) are averaged over."""
    # the run lifecycle: outputs, checkpoints, evaluation, callbacks
    name: str | None = None
    """Name of the run directory `runs/<name>`; None: `<algo>_<env>_seed<seed>_<date>-<time>`."""
    run_dir: str | None = None
    """Directory of the run's outputs; None: `runs/<name>`."""
    save_outputs: bool = True
    """Write the run directory (config, logs, checkpoints, `result.json`); False writes nothing."""
    verbose: int = Field(default=1, ge=0, le=2)
    """0: no progress; 1: a live progress bar on a terminal, and a plain line every `log_interval_s` when the output
    is a file, a pipe or CI; 2: plain lines on a terminal too."""
    log_interval_s: float = Field(default=10.0, ge=0.0)
    """Seconds between plain progress lines (see `verbose`); 0: one after every iteration."""
    checkpoint_interval: int = Field(default=100, ge=0)
    """Iterations between checkpoints; 0: only at the end of `learn()` and when stopped."""
    keep_checkpoints: int = Field(default=3, ge=1)
    """How many of the newest checkpoints the run directory keeps."""
    evaluation_interval: int | None = Field(default=None, ge=1)
    """Iterations between evaluations on separate env copies during training, logged as `evaluation/...`; None: no
    periodic evaluation."""
    evaluation_num_episodes: int = Field(default=20, ge=1)
    """Episodes per evaluation (periodic, `evaluate()` without a count, and after `shoal train`)."""
    evaluation_deterministic: bool = True
    """Evaluate with the most likely action instead of a sampled one."""
    callbacks: list[Any] = Field(default_factory=list)
    """`shoal.Callback` objects, classes or `'package.module:Name'` strings; only the strings are kept in
    checkpoints."""
    wandb_project: str | None = None
    """Also log to this Weights & Biases project (the `wandb` extra); None: no W&B."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """`offline`: W&B files under the run directory, uploaded later with `wandb sync`; `online`: uploaded as the run
    goes."""
    # offline experience: where the steps go besides the learner, and where replay learners read them
    output: str | None = None
    """Also write every step collected for the trained policies to Minari datasets in this folder, one per policy
    (`<output>/<policy id>/part-<k>-v0`, each a whole dataset once closed; needs `shoal[offline]`). None: nothing."""
    output_max_file_size: int = Field(default=64 << 20, ge=1 << 16)
    """Bytes of one dataset shard of `output` before the next one starts."""
    input: Any = "sampler"
    """Where the replay learners (and the offline ones) get their steps: `sampler`, the envs; a dataset folder (a run's
    `output`, a Minari dataset, or a folder of them); a list of folders; or a dict of folder -> mixing weight. The env
    is still built, for its spaces and for evaluation."""
    off_policy_estimation_methods: list[Literal["is", "wis", "dm", "dr"]] = Field(default_factory=list)
    """At each evaluation, also estimate the policy's discounted return on recorded episodes: `is` (importance
    sampling), `wis` (weighted), `dm` (direct method, fitted Q evaluation) and `dr` (doubly robust); reported as
    `evaluation/off_policy_estimation/<method>` beside `v_behaviour`, the episodes' own. Discrete actions."""
    off_policy_estimation_input: str | None = None
    """The dataset those estimates read; None: `input` when it is one dataset folder."""
    off_policy_estimation_episodes: int = Field(default=100, ge=1)
    """Episodes of that dataset the estimates read (its first ones)."""
    off_policy_estimation_config: dict[str, Any] = Field(default_factory=dict)
    """Settings of fitted Q evaluation for `dm` and `dr` (`iterations`, `epochs_per_iteration`, `hidden`, `lr`,
    `batch_size`); unset ones are `3 / (1 - gamma)` (at most 300), 1, [64, 64], 1e-3 and 256."""
    # discount, the learner's steps, and the network every policy is built with
    gamma: float = Field(default=0.98, ge=0.0, le=1.0)
    """Discount factor of future rewards."""
    learning_rate: float = Field(default=1e-3, gt=0.0)
    """Adam's step size for every network the algorithm trains (annealed as `lr_schedule` says)."""
    lr_schedule: Literal["constant", "linear"] = "linear"
    """`linear`: anneal the step size linearly to 0 over each `learn()` call (`shoal train`: over
    `total_timesteps`; a later `learn(n)` after t steps goes on from progress t/(t+n)); `constant`: keep it."""
    sgd_minibatch_size: int = Field(default=256, ge=1)
    """Agent steps per minibatch (also written `minibatch_size`)."""
    max_grad_norm: float | None = Field(default=0.5, gt=0.0)
    """Clip the global norm of each step's gradient to this; None: no clipping."""
    adam_eps: float = Field(default=1e-5, gt=0.0)
    """Adam's epsilon."""
    model: Any = "mlp"
    """The network: `mlp`, `cnn`, a `torch.nn.Module` subclass or `'package.module:Class'`."""
    # hiddens, activation, conv_filters, ... Written model_config everywhere; the attribute has
    # another name because pydantic reserves model_config for itself.
    model_options: dict[str, Any] = Field(default_factory=dict, alias="model_config")
    """Settings of the model: the built-in models' keys (`hiddens`, `activation`, `conv_filters`, `shared_trunk`,
    `channels`, `core`, `core_size`, `head_hiddens`), or keyword arguments of your own module."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian over Box actions (a learned parameter)."""
    normalize_obs: bool = False
    """Normalize float observations by their running mean and std, inside the policy (the rollout keeps raw
    observations)."""
    normalize_reward: bool = False
    """Scale the rewards the learner sees by the running std of the discounted return."""
    clip_obs: float = Field(default=10.0, gt=0.0)
    """With `normalize_obs`: normalized observations are clipped to `[-clip_obs, clip_obs]`."""
    clip_reward: float = Field(default=10.0, gt=0.0)
    """With `normalize_reward`: scaled rewards are clipped to `[-clip_reward, clip_reward]`."""
    clip_rewards: bool | float | None = None
    """Clip the rewards the learner sees (logged returns stay raw): True: their sign; a number c: to `[-c, c]`; None:
    the env's default (the sign for Atari games, off otherwise)."""
    horizon: int | None = Field(default=None, ge=1)
    """End every episode after this many steps as a truncation (the learner bootstraps from the value of the last
    observation); None: the env's own limits only. Applies to evaluation too."""
    soft_horizon: bool = False
    """With `horizon`: cut the episode at the horizon for the metrics and the bootstrap but do not reset the env, which
    goes on from where it is (continuing tasks). Single-agent envs."""
    no_done_at_end: bool = False
    """Treat the env's terminations as truncations (bootstrapped): for envs that signal a time limit as terminal."""
    clip_actions: bool = True
    """Clip Box actions to the action space's bounds before the env gets them (the rollout keeps the policy's own
    sample). Off: the env gets them unclipped."""
    normalize_actions: bool = False
    """The policy acts in unit actions `[-1, 1]`, rescaled to the Box bounds (clipped to `[-1, 1]` first with
    `clip_actions`): one `log_std_init` then suits any bounds. Box action spaces with finite bounds."""
    info_keys: list[str] = Field(default_factory=list)
    """Keys of the env's step `info` whose values (numbers) are stored in the rollout at every step (field `info`)
    and reported as their per-episode mean, `custom_metrics/<key>_mean` (single-agent Gymnasium envs)."""
    restart_failed_envs: bool = False
    """An env that raises in `step` is made anew and reset instead of stopping the run: the step it failed is not
    learned, its episode is left out of the metrics, and `num_env_restarts` counts it (single-agent Gymnasium envs,
    in this process, worker processes or Ray rollout workers)."""
    recreate_failed_workers: bool = False
    """An env worker that dies (the OOM killer's SIGKILL, a lost node) is started anew with fresh envs instead of
    stopping the run: the step under way is lost (a Ray worker samples its fragment again), its envs' episodes are
    left out of the metrics, and `num_worker_restarts` counts it (`num_workers` > 0: worker processes of
    single-agent Gymnasium envs, or Ray rollout workers)."""
    max_restarts_per_hour: int = Field(default=100, ge=1, le=1_000_000)
    """More env and worker restarts than this within an hour stop the run: they are failing, not flaky (at most
    1,000,000)."""
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = "truncate_episodes"
    """`truncate_episodes`: each iteration takes `rollout_fragment_length` steps of every env, cutting episodes where
    it ends (the learner bootstraps there); `complete_episodes`: each env runs on past its fragment to its episode's
    end, so an iteration holds whole episodes only, at least `train_batch_size` steps (needs the longest episode:
    `horizon` or the env's declared limit)."""
    policies: dict[str, dict[str, Any] | None] | list[str] | None = None
    """Several policies: a list of ids, or ids -> per-policy overrides (`POLICY_KEYS`); None: one `default_policy`
    shared by every agent."""
    policy_mapping_fn: Any = None
    """`(agent_id, episode) -> policy id`, called at each episode start: a function, `'module:function'` or a dict
    `{agent id: policy id}`; None: the policy named like the agent, else the only one."""
    policies_to_train: list[str] | None = None
    """The policies that learn; the others are frozen (no gradient, no optimizer step). None: all of them."""
    central_critic: Literal["team_obs", "state"] | None = None
    """A centralized critic (MAPPO): `team_obs`: the value function sees every agent's observation of the env;
    `state`: the env's `state()`. The actor sees its own observation only. None: off."""

    # keys a policy in `policies` may override: its network, and how it learns
    POLICY_KEYS: ClassVar[tuple[str, ...]] = ("model", "model_config", "log_std_init", "learning_rate", "gamma")
    # other names of keys, as the segment learner writes them: alias -> key
    ALIASES: ClassVar[dict[str, str]] = {"minibatch_size": "sgd_minibatch_size"}
    READS_DATASETS: ClassVar[bool] = False
    """Whether the algorithm learns from recorded steps (``input``), as the replay learners do."""
    NEEDS_DATASET: ClassVar[bool] = False
    """Whether the algorithm learns only from recorded steps (the offline ones: ``input`` is required)."""
    NO_RESTARTS: ClassVar[str | None] = None
    """Why the algorithm cannot learn around an env or worker started anew (None: it can)."""
    MINIBATCH_DIVIDES_BATCH: ClassVar[bool] = False
    """Whether ``sgd_minibatch_size`` must divide the batch (a tuned config's is then rescaled with it)."""
    # keys that moved: old name -> what to write instead
    MOVED: ClassVar[dict[str, str]] = {
        "hiddens": "model_config={'hiddens': [64, 64]}",
        "activation": "model_config={'activation': 'relu'}",
    }

    @model_validator(mode="after")
    def _check_model(self) -> TrainerConfig:
        resolve_model(self.model)
        check_model_config(self.model, self.model_options)
        return self

    @model_validator(mode="after")
    def _check_sampling(self) -> TrainerConfig:
        check_sampling(self)
        return self

    @model_validator(mode="after")
    def _resolve_rollout_shape(self) -> TrainerConfig:
        """Fill whichever of train_batch_size / rollout_fragment_length is missing, and check they
        agree. ``batch_size`` alone (agent steps) waits for ``check_batch``, which knows the agents."""
        if self.batch_size is None or self.train_batch_size is not None:
            self._fill_rollout_shape()
        return self

    def _fill_rollout_shape(self) -> None:
        n, frag, batch = self.num_envs, self.rollout_fragment_length, self.train_batch_size
        if batch is None:
            frag = 32 if frag is None else frag
            batch = n * frag
        elif frag is None:
            if batch % n:
                lo = max(n, batch // n * n)
                raise ConfigError(
                    f"train_batch_size={batch} is not divisible by num_envs={n}: each iteration collects "
                    f"num_envs x rollout_fragment_length steps. Try train_batch_size={lo} or {lo + n}."
                )
            frag = batch // n
        elif batch != n * frag:
            raise ConfigError(
                f"train_batch_size={batch} must equal num_envs={n} x rollout_fragment_length={frag} = {n * frag}. "
                f"Set only two of the three, e.g. drop train_batch_size or use "
                f"rollout_fragment_length={max(1, batch // n)}."
            )
        self.rollout_fragment_length, self.train_batch_size = frag, batch

    @model_validator(mode="after")
    def _check_offline(self) -> TrainerConfig:
        check_offline(self)
        return self

    @model_validator(mode="after")
    def _check_workers(self) -> TrainerConfig:
        check_workers(self)
        return self

    @model_validator(mode="after")
    def _check_device(self) -> TrainerConfig:
        """A device string torch reads, of a backend this machine has."""
        given = f"device={shorten(repr(self.device))}"
        try:
            device = torch.device(self.device)
        except RuntimeError as e:  # torch's message quotes the string too
            raise ConfigError(f"{given} is not a torch device ({shorten(str(e))}); use e.g. 'cpu', 'cuda'.") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"{given}, but torch finds no CUDA device here; use device='cpu'.")
        if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"{given}, but there are {torch.cuda.device_count()} CUDA devices here "
                f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})."
            )
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise ConfigError(f"{given}, but torch finds no MPS device here; use device='cpu'.")
        return self

    @model_validator(mode="after")
    def _check_policies(self) -> TrainerConfig:
        check_policies(self)
        return self

    def policy_config(self, policy_id: str) -> Self:
        """This config with policy ``policy_id``'s overrides applied (validated)."""
        return with_policy_overrides(self, policy_id)

    @property
    def policy_ids(self) -> list[str]:
        return list(self.policies) if self.policies else ["default_policy"]

    def check_batch(self, agents_per_env: int = 1) -> None:
        """Checks that need the env's agent count (algorithms with minibatches extend it): here,
        ``batch_size`` (agent steps) becomes ``train_batch_size`` (env steps), or is checked against it."""
        if self.batch_size is None:
            self.batch_size = cast(int, self.train_batch_size) * agents_per_env  # filled when validated
            return
        agents = f" ({agents_per_env} agents per env)" if agents_per_env > 1 else ""
        if self.batch_size % agents_per_env:
            raise ConfigError(
                f"batch_size={self.batch_size} counts agent steps and must be a multiple of the "
                f"{agents_per_env} agents of each env."
            )
        env_steps = self.batch_size // agents_per_env
        if self.train_batch_size is not None and self.train_batch_size != env_steps:
            raise ConfigError(
                f"batch_size={self.batch_size} agent steps{agents} is train_batch_size={env_steps} env steps, "
                f"but train_batch_size={self.train_batch_size}; set one of them."
            )
        self.train_batch_size = env_steps
        self._fill_rollout_shape()

    def to_yaml_dict(self) -> dict[str, Any]:
        """The config as plain data, for config.yaml and checkpoints: an env object, a callback
        object or a policy_mapping_fn function becomes its repr (``env_is_object`` says which;
        such objects are passed again when a checkpoint is loaded)."""
        data = self.model_dump(by_alias=True)
        if self.env_is_object:
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
        return not isinstance(self.env, str) and self.env is not None

    @property
    def episode_rules(self) -> EpisodeRules:
        return EpisodeRules(self.horizon, self.soft_horizon, self.no_done_at_end)

    @property
    def reward_clipping(self) -> bool | float:
        """``clip_rewards`` as applied to what the learner reads: None is the sign for Atari games,
        off otherwise."""
        return is_atari_id(self.env) if self.clip_rewards is None else self.clip_rewards

    @property
    def longest_episode(self) -> int | None:
        """The most steps an episode can take: ``horizon`` or the env's declared limit (None: unknown)."""
        return self.horizon or declared_episode_steps(self.env, self.env_config)

    @property
    def rollout_capacity(self) -> int:
        """Slots of each row of an on-policy rollout: ``rollout_fragment_length``, or with complete
        episodes room for the fragment, the episode that ends it and the steps carried in from the
        last one (``shoal.collect.carry``)."""
        fragment = cast(int, self.rollout_fragment_length)  # filled when validated
        if self.batch_mode == "truncate_episodes":
            return fragment
        return fragment + 2 * cast(int, self.longest_episode)  # checked when validated

    @property
    def recurrent(self) -> bool:
        """Whether a policy has a recurrent core (``model_config`` ``core``)."""
        overrides = cast("dict[str, dict[str, Any]]", self.policies or {}).values()
        configs = (self.model_options, *(o.get("model_config") or {} for o in overrides))
        return any(isinstance(cfg, dict) and cfg.get("core") for cfg in configs)
