"""The Trainer: the run's lifecycle, the same for every algorithm.

    Trainer.train() -> algorithm.training_step(collector) -> result -> log / callbacks / checkpoint / evaluate

The trainer builds the envs (a backend), asks the algorithm named by ``algo`` to build its
policies, networks and storage for them, wires the collector between the two, and then owns only
the lifecycle: iterations and stop criteria, timing, the progress line, loggers, callbacks,
checkpoints (periodic, at the end, and on Ctrl-C / SIGTERM, which stop the run after the current
iteration), exact resume via ``from_checkpoint`` and evaluation on separate env copies. New
weights reach whoever acts on the envs through the collector: local envs share the policies'
modules, and Ray rollout workers receive the weights at the start of each collect.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, overload

import numpy as np
import numpy.typing as npt
import torch
from tensordict import TensorDict

from shoal import distributed, offline
from shoal.algos.base import Algorithm
from shoal.collect import build
from shoal.collect.episodes import Episode
from shoal.envs.registry import env_name
from shoal.errors import ConfigError, EnvError, OutputError, TrainingDiverged, did_you_mean, warn
from shoal.logging import MetricAnalysis, ProgressDisplay, RunLogger, log_record, progress_mode
from shoal.models.policy import Policy
from shoal.train import checkpoint as ckpt
from shoal.train import data_parallel, export, faults, lineage, run_state, setup, signals
from shoal.train.callbacks import CallbackList
from shoal.train.evaluation import act_once, evaluate_policies
from shoal.vector.restarts import EnvRestarts

if TYPE_CHECKING:
    from typing_extensions import Self


class Trainer:
    """Trains the algorithm ``algo`` names (``"ppo"``, an ``Algorithm`` subclass, or
    ``"package.module:Class"``) on ``env``; any config key as a keyword.

    Examples:
        >>> trainer = shoal.Trainer(algo="ppo", env="CartPole-v1", seed=1)
        >>> trainer.learn(100_000)
    """

    # set by presets such as shoal.PPO: the one algorithm they train (as ``algo`` is given)
    algo: ClassVar[str | type[Algorithm] | None] = None

    def __init__(self, env: Any = None, config: dict[str, Any] | None = None, **overrides: Any):
        settings = dict(config or {}) | overrides
        if env is not None:
            settings["env"] = env
        elif "env" not in settings and settings.get("input", "sampler") != "sampler":
            settings["env"] = offline.recorded_env(settings["input"])  # None: the datasets' spaces, no env
        algo_cls, settings, self._tuned = setup.algorithm_settings(self.algo, type(self).__name__, settings)
        self.tuned_config = self._tuned.path
        """The file the settings started from: the tuned config, or the defaults for the env's kind
        (None: neither; see the keys ``tuned`` and ``kind_defaults``)."""
        with self._tuned.named_in_errors():
            self.config = algo_cls.config_class.build(**settings)
        """The validated config (the algorithm's config class)."""
        c = self.config
        self._joined_ranks = data_parallel.join(c)  # under torchrun: one of several ranks, quiet unless rank 0
        if c.verbose:
            self._tuned.announce()
        setup.prepare_process(c)
        if c.off_policy_estimation_methods and c.evaluation_interval is None:
            warn(
                f"off_policy_estimation_methods={c.off_policy_estimation_methods} are reported at each evaluation, "
                f"and evaluation_interval is None: set it to have them in the metrics (estimate_off_policy() "
                f"estimates on demand)."
            )
        self.env_name = env_name(c.env) if c.env is not None else offline.recorded_name(c.input)
        self.run_dir = setup.run_dir(c, algo_cls.implementation(c).name, self.env_name)  # checked before envs start
        """Where logs and checkpoints go (None with ``save_outputs=False``)."""
        self.run_id = lineage.new_run_id()
        """The run's id, which its run.json and each of its checkpoints record (kept across resumes)."""
        self.callbacks = CallbackList(c.callbacks)
        self.env_restarts = EnvRestarts(c.max_restarts_per_hour, self.env_name)

        self.backend = setup.training_backend(c)
        try:
            with self._tuned.named_in_errors():
                c.check_batch(self.backend.rows_per_env)
            critic = build.central_critic(c.central_critic, self.backend, self.env_name)
            env_info = setup.env_info(self.backend, self.env_name, critic)
            self.algorithm: Algorithm = algo_cls.implementation(c, env_info)(c, env_info)
            self.algorithm_class = algo_cls
            """The algorithm asked for (``algo``), as config.yaml and checkpoints record it; ``algorithm``
            may be an instance of a class it hands this config to (PPO's segment learner)."""
            if self.callbacks.has("on_postprocess_trajectory"):
                self.algorithm.trajectory_hooks.append(lambda t: self.callbacks("on_postprocess_trajectory", self, t))
            self.policy_map = build.policy_map(self.policies, self.backend, c.policy_mapping_fn)
            on_episode_end = self._on_episode_end if self.callbacks.has("on_episode_end") else None
            self.tracker = build.episode_tracker(c, self.backend, on_episode_end)
            extras = self.algorithm.stored_extras()
            self.collector = offline.dataset_reader(c, env_info) or build.collector(
                c, self.backend, self.policy_map, self.tracker, extras, critic
            )
            self.collector.take_restarts = self.env_restarts.take
            self.collector.reset(c.seed)
            # the estimates' dataset read and checked now: a bad one stops the run before it trains or writes
            self._estimator = offline.OffPolicyEstimator(c, env_info) if c.off_policy_estimation_methods else None
            self.dataset_writer = offline.dataset_writer(
                c,
                env_info,
                self.algorithm.name,
                self.algorithm.trained_policy_ids,
                setup.env_spec_json(c.env, c.env_config),
                self.backend.bounded_actions,
            )
            """The writer of ``output`` (None without it), closed with the trainer."""
            if self.dataset_writer is not None:
                self.algorithm.rollout_sinks.append(self.dataset_writer)
        except BaseException:  # the envs (worker processes, Ray actors) must not outlive a failed start
            self.backend.close()
            raise

        self.iteration = 0
        """Iterations (``train()`` calls) so far, across resumes."""
        self.timesteps_total = 0
        """Env steps so far, across resumes (one step of a multi-agent env counts once)."""
        self.time_total_s = 0.0
        self._schedule_end = c.total_timesteps
        self._saved: tuple[int, Path] | None = None  # the iteration of the newest run checkpoint, and its path
        self.analysis = MetricAnalysis()
        self.stop_reason: str | None = None
        """Why ``learn`` stopped early: ``"SIGINT"``, ``"SIGTERM"``, ``"callback"``; None otherwise."""
        self._resume_point: tuple[int, int] | None = None  # set by from_checkpoint: logs continue after it
        self._logger: RunLogger | None = None
        try:
            data_parallel.start(self)
        except BaseException:
            self.close()  # the envs, worker processes and process group go too
            raise

    # ----- set-up -------------------------------------------------------------------------
    @property
    def algo_name(self) -> str:
        """The algorithm's ``name`` (``PPO``, or yours)."""
        return self.algorithm.name

    @property
    def policies(self) -> dict[str, Policy]:
        """Policy id -> policy, as the algorithm built them."""
        return self.algorithm.policies

    @property
    def logger(self) -> RunLogger | None:
        """Opened on first use, so loading a checkpoint to evaluate it writes nothing. Opening it
        makes the run directory its own: config.yaml, run.json and the checkpoints it must not
        overwrite or prune set aside (``shoal.train.lineage.claim``)."""
        if self._logger is None and self.run_dir is not None:
            c = self.config
            config = c.to_yaml_dict()
            with faults.run_writes("the run directory", None, self.run_dir):
                self._logger = RunLogger(self.run_dir, config, self._resume_point, c.wandb_project, c.wandb_mode)
                resumed_at = None if self._resume_point is None else self._resume_point[0]
                lineage.claim(self.run_dir, self.run_id, config, self.env_name, resumed_at)
        return self._logger

    # ----- the loop -----------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """One iteration: the algorithm's training step, then evaluation if due, logging,
        callbacks, a checkpoint if due. Returns the result dict."""
        c = self.config
        collector = self.collector
        t0 = time.perf_counter()
        steps_before, sample_before = collector.env_steps, collector.sample_time_s
        stats = self._training_step()
        elapsed = time.perf_counter() - t0
        steps = data_parallel.total_steps(collector.env_steps - steps_before)
        sample_s = collector.sample_time_s - sample_before

        self.iteration += 1
        self.timesteps_total += steps
        self.time_total_s += elapsed
        agents = self.backend.rows_per_env  # agent rows per env, padding included
        result: dict[str, Any] = {
            "training_iteration": self.iteration,
            "timesteps_total": self.timesteps_total,
            "agent_timesteps_total": self.timesteps_total * agents,
            "timesteps_this_iter": steps,
            "time_total_s": self.time_total_s,
            **data_parallel.episode_stats(self.tracker.summarize(), c.metrics_num_episodes_for_smoothing),
            "sps": steps / elapsed,
            "agent_sps": steps * agents / elapsed,
            "time_this_iter_s": elapsed,
            "sample_time_ms": 1e3 * sample_s,
            "learn_time_ms": 1e3 * (elapsed - sample_s),
            **collector.iteration_stats(),
            **({"num_env_restarts": self.env_restarts.total} if c.restart_failed_envs else {}),
            **({"num_worker_restarts": self.env_restarts.workers} if c.recreate_failed_workers else {}),
            **stats,
        }
        plays = c.env is not None  # a run with no env estimates from datasets only
        if (
            c.evaluation_interval
            and self.iteration % c.evaluation_interval == 0
            and (plays or c.off_policy_estimation_methods)
        ):
            result["evaluation"] = self.evaluate() if plays else {}
            if c.off_policy_estimation_methods:
                result["evaluation"]["off_policy_estimation"] = self.estimate_off_policy()
            self.callbacks("on_evaluate_end", self, result["evaluation"])
        record = log_record(result)
        self.analysis.add(record)
        with faults.run_writes("the metrics", None, self.run_dir):
            if self.logger is not None:
                self.logger.write(record)
        self.callbacks("on_train_result", self, result)
        if self.run_dir is not None and c.checkpoint_interval and self.iteration % c.checkpoint_interval == 0:
            self.save()
        return result

    def _training_step(self) -> dict[str, Any]:
        """The algorithm's training step, told how far through the schedule it is; a diverged
        update or a failed env stops the run, saying what was kept."""
        end = max(1, self._schedule_end)
        self.algorithm.progress = self.timesteps_total / end
        after = self.timesteps_total + self.algorithm.steps_per_iteration * distributed.world_size()  # every rank's
        self.algorithm.progress_end = min(1.0, after / end)
        try:
            stats = self.algorithm.training_step(self.collector)  # a collector over remote envs sends them the weights
            if (broken := faults.non_finite_weights(self.policies)) is not None:
                raise broken
        except TrainingDiverged as e:
            raise faults.diverged(e, self, self.iteration + 1) from e
        except EnvError as e:  # an env raised or a worker died: keep what the learner has first
            faults.save_learner(self, e)
            raise
        if self.iteration == 0 and (skipped := self.algorithm.skipped_collect_steps()):
            warn(
                f"{self.algo_name} called collector.collect itself, so {' and '.join(skipped)} did not apply; "
                f"collect through self.collect(collector, rollout) in training_step."
            )
        return stats

    def _on_episode_end(self, episode: Episode) -> None:
        self.callbacks("on_episode_end", self, episode)

    def learn(self, total_timesteps: int | None = None, progress: bool | None = None) -> dict[str, Any]:
        """Train for ``total_timesteps`` more env steps (default: what the config's total leaves).

        Ctrl-C or SIGTERM stops after the current iteration, as does a callback returning True;
        the run is checkpointed and ``result.json`` written either way. A second Ctrl-C stops at
        once with ``shoal.errors.RunInterrupted`` (a ``KeyboardInterrupt`` whose message names what was
        kept), the checkpoint being written (if any) left unwritten.
        """
        c = self.config
        total = max(c.total_timesteps - self.timesteps_total, 0) if total_timesteps is None else int(total_timesteps)
        if total < 1 and total_timesteps is not None:
            raise ConfigError(f"total_timesteps must be >= 1, got {total}.")
        start = self.timesteps_total
        # the budget's end; a run already past it (its last phase overshot) keeps it, not where it stands
        self._schedule_end = c.total_timesteps if total_timesteps is None else start + total
        self._saved = None  # a checkpoint written before this call may not hold the state it ends with
        verbose = c.verbose if progress is None else (max(c.verbose, 1) if progress else 0)
        if verbose and self.iteration == 0 and (layout := self.algorithm.describe()):
            print(layout, file=sys.stderr)  # beside the progress line, leaving stdout to results
        result: dict[str, Any] = {}
        # The handlers stay through the last checkpoint: SIGTERM then lets it finish, and a second
        # Ctrl-C stops it at once, leaving the previous checkpoint the newest.
        with signals.stop_requests(self):
            _ = self.logger  # the run directory exists before the first iteration, which may fail
            mode = progress_mode(verbose)
            with ProgressDisplay(f"{self.algo_name} {self.env_name}", total, mode, c.log_interval_s) as display:
                while self.timesteps_total - start < total and not data_parallel.agreed_stop(self):
                    result = self.train()
                    display.update(self.timesteps_total - start, result)
            if self.callbacks.stop_requested and self.stop_reason is None:
                self.stop_reason = "callback"
            if self.run_dir is not None:  # the last iteration's own checkpoint, if it wrote one, is the one
                last = self._saved[1] if self._saved and self._saved[0] == self.iteration else self.save()
                run_state.write_summary(self, last)
        return result

    # ----- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit, as tensors and plain data."""
        return run_state.gather(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned: the run continues exactly where it was saved."""
        run_state.restore(self, state)

    def save(self, checkpoint_dir: str | Path | None = None) -> Path:
        """Write a checkpoint (default: ``<run_dir>/checkpoints/checkpoint_<iteration>``, keeping
        the newest ``keep_checkpoints``); returns its directory. Weights that are not finite are
        never saved (``TrainingDiverged``)."""
        if (broken := faults.non_finite_weights(self.policies)) is not None:
            raise faults.diverged(broken, self, self.iteration)
        if checkpoint_dir is None:
            if self.run_dir is None:
                raise ConfigError("save() needs a directory when save_outputs=False.")
            root = self.run_dir / "checkpoints"
            path = root / f"{ckpt.PREFIX}{self.iteration:06d}"
        else:
            path, root = Path(checkpoint_dir), None
        with faults.run_writes("the checkpoint", path, self.run_dir):
            if root is not None:
                lineage.make_way(path, self.run_id)
            ckpt.write_checkpoint(path, self.state_dict(), self.checkpoint_meta())
            if root is not None:
                lineage.rotate(root, self.config.keep_checkpoints, self.run_id)
        if root is not None:
            self._saved = (self.iteration, path)
        self.callbacks("on_checkpoint", self, path)
        return path

    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint records beside the state: algorithm, env, counters, shoal version, time."""
        return run_state.meta(self)

    @classmethod
    def from_checkpoint(cls, path: str | Path, **overrides: Any) -> Self:
        """Rebuild a trainer from a checkpoint (or the newest good one in a run directory) and
        restore its whole state; ``overrides`` replace config keys (e.g. ``total_timesteps``), and
        a dict updates the stored dict key by key at every depth (``policies={"p": {"gamma": 0.9}}``
        changes one setting of policy p and keeps the rest), as ``key.sub=value`` does on the
        command line. The checkpoint must belong to the run it is loaded into (its ``run_dir``):
        same run id, algorithm and config fingerprint (``shoal.train.lineage``). Without
        ``total_timesteps`` the run trains on to the budget it was given (its last ``learn``'s)."""
        path = ckpt.resolve_checkpoint(path)
        settings, state, meta = run_state.saved_run(path, cls.algo, overrides)
        trainer = cls(**settings)
        trainer.load_state_dict(state)
        run_state.continue_run(trainer, path, meta, "total_timesteps" in overrides)
        return trainer

    # ----- using the policy ---------------------------------------------------------------
    def get_policy(self, policy_id: str | None = None) -> Policy:
        """The policy ``policy_id`` (RLlib's name); without one, the only policy."""
        if policy_id is None and len(self.policies) == 1:
            return next(iter(self.policies.values()))
        if policy_id is None:
            raise ConfigError(
                f"this run has {len(self.policies)} policies, {list(self.policies)}: name one (policy_id)."
            )
        if policy_id not in self.policies:
            raise ConfigError(
                f"no policy {policy_id!r}; the policies are {list(self.policies)}."
                f"{did_you_mean(str(policy_id), self.policies)}"
            )
        return self.policies[policy_id]

    def initial_state(self, batch: int = 1, policy_id: str | None = None) -> TensorDict:
        """The state of policy ``policy_id`` (default: the only one) for ``batch`` observations at an
        episode start, to pass to ``compute_actions``: the recurrent core's zeros, or an empty
        TensorDict for a feedforward policy."""
        return self.get_policy(policy_id).initial_state(batch)

    @overload
    def compute_actions(
        self, obs: Any, state: None = None, deterministic: bool = False, policy_id: str | None = None
    ) -> npt.NDArray[Any] | np.generic: ...

    @overload
    def compute_actions(
        self, obs: Any, state: TensorDict, deterministic: bool = False, policy_id: str | None = None
    ) -> tuple[npt.NDArray[Any] | np.generic, TensorDict]: ...

    @torch.inference_mode()
    def compute_actions(
        self, obs: Any, state: TensorDict | None = None, deterministic: bool = False, policy_id: str | None = None
    ) -> npt.NDArray[Any] | np.generic | tuple[npt.NDArray[Any] | np.generic, TensorDict]:
        """Actions of policy ``policy_id`` (default: the only one) for a batch of observations (or
        one: then its one action, a numpy scalar for a Discrete space), ready to pass to the env.

        Without ``state`` each call acts from the policy's initial state, as at an episode start.
        With ``state`` (from ``initial_state`` at an episode start, then what the last call
        returned) it returns ``(actions, next_state)``: a recurrent policy remembers the episode so
        far. Keep one state row per observation row; give a row ``initial_state`` again when its
        episode starts over."""
        return act_once(self.get_policy(policy_id), self.backend, obs, state, deterministic, self.config.device)

    def export_policy(self, path: str | Path, policy_id: str | None = None, format: str | None = None) -> Path:
        """Write policy ``policy_id`` (default: the only one) to ``path`` as a file that acts without
        shoal, in ``format`` ``onnx`` or ``torchscript`` (default: as the suffix says, ``.onnx`` or
        ``.pt``): observations in, the actions the policy takes deterministically out, as
        ``compute_actions(obs, deterministic=True)`` gives them. A recurrent policy's file also takes
        its state and returns the next (``shoal.train.export``). Returns the path written.

        Examples:
            >>> algo.export_policy("policy.onnx")
            >>> onnxruntime.InferenceSession("policy.onnx").run(None, {"obs": batch})[0]
        """
        name = f"policy {policy_id!r}" if policy_id is not None else "the policy"
        return export.export_policy(self.get_policy(policy_id), self.backend, path, name, format)

    @torch.inference_mode()
    def evaluate(
        self,
        num_episodes: int | None = None,
        deterministic: bool | None = None,
        seed: int | None = None,
        video_dir: str | Path | None = None,
        policy_mapping_fn: Any = None,
    ) -> dict[str, Any]:
        """Play ``num_episodes`` fresh episodes on separate env copies and summarise their returns.

        Evaluation never touches the training envs or random state, and sees the raw env: no
        reward clipping, no training-only env wrappers (Atari's life-loss terminals). With
        ``video_dir`` each episode is also written there as an mp4 (the env must render
        ``rgb_array`` frames). With several policies, ``policy_mapping_fn`` may replace the
        config's (e.g. to play a fixed opponent), and ``policy_reward_mean/<policy>`` gives each
        policy's mean agent return.
        """
        c = self.config
        if c.env is None:
            raise ConfigError(
                f"this run has no env to evaluate in: it learns from datasets recorded on '{self.env_name}'. Give "
                f"env=... (shoal.{type(self).__name__}.from_checkpoint(run, env=...) for a saved run), or set "
                f"off_policy_estimation_methods to estimate the policy's return from the data."
            )
        video = None if video_dir is None else Path(video_dir)
        writes = faults.run_writes("the evaluation video", video, self.run_dir, within=video) if video else None
        with writes or contextlib.nullcontext():
            return evaluate_policies(
                c,
                self.policies,
                self.env_name,
                num_episodes=num_episodes or c.evaluation_num_episodes,
                deterministic=c.evaluation_deterministic if deterministic is None else deterministic,
                seed=c.seed + 10_000 if seed is None else seed,
                video=None if video is None else (video, f"iter{self.iteration:06d}_"),
                policy_mapping_fn=policy_mapping_fn or c.policy_mapping_fn,
            )

    def estimate_off_policy(self) -> dict[str, float]:
        """The policy's discounted return as each of ``off_policy_estimation_methods`` estimates it
        on recorded episodes, and ``v_behaviour``, theirs (``shoal.offline.estimation``)."""
        if self._estimator is None:
            raise ConfigError("estimate_off_policy needs off_policy_estimation_methods set (e.g. ['is', 'wis']).")
        return self._estimator(self.get_policy())

    def close(self) -> None:
        """Close the envs (and their worker processes), the datasets of ``output`` and the loggers;
        ``with`` calls it on exit."""
        self.backend.close()
        try:
            if self.dataset_writer is not None:
                self.dataset_writer.close()
            if self._logger is not None:
                with faults.run_writes("the metrics", None, self.run_dir):
                    self._logger.close()
        finally:
            if self._joined_ranks:
                distributed.leave()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(OutputError):  # the error under way says what went wrong (a full disk) already
            self.close()

    def __repr__(self) -> str:
        name, steps = type(self).__name__, self.timesteps_total
        return f"{name}(algo={self.algo_name!r}, env={self.env_name!r}, timesteps_total={steps})"
