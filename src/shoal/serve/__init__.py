"""A policy server for external simulators (``shoal serve``) and the client they call it with.

``serve_training`` trains on the episodes clients drive (the run's envs are the server's slots);
``serve_checkpoint`` answers clients with a trained policy and learns nothing. Both speak the
protocol of ``shoal.serve.protocol`` through ``PolicyServer``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.errors import ConfigError, RunInterrupted
from shoal.serve.client import PolicyClient, ServerError

if TYPE_CHECKING:
    from shoal.serve.server import PolicyServer

__all__ = ["PolicyClient", "PolicyServer", "ServerError", "checkpoint_server", "serve_training"]


def __getattr__(name: str) -> Any:
    # the server (torch, the trainer) loads on first use: a simulator importing the client needs none of it
    if name == "PolicyServer":
        from shoal.serve.server import PolicyServer

        return PolicyServer
    raise AttributeError(f"module 'shoal.serve' has no attribute {name!r}")


def serve_training(
    settings: dict[str, Any], resume: str | Path | None = None, on_ready: Any = None, **server: Any
) -> tuple[Any, dict[str, Any]]:
    """Train on the episodes that clients drive until the run's ``total_timesteps`` (or Ctrl-C):
    ``settings`` are the run's config keys (``backend='external'`` is implied; ``env`` names the
    spaces), ``resume`` a run directory to continue, ``server`` the ``PolicyServer`` options.
    ``on_ready(server)`` is called once the server listens. Returns the trainer and its last result."""
    from shoal.serve.server import PolicyServer
    from shoal.train import Trainer
    from shoal.vector.external import ExternalBackend

    _check_access(server)
    settings = {**settings, "backend": "external"}
    trainer = Trainer.from_checkpoint(resume, **settings) if resume else Trainer(**settings)
    backend = trainer.backend
    assert isinstance(backend, ExternalBackend)  # backend='external' builds one
    backend.stop_requested = lambda: trainer.stop_reason is not None
    backend.accepts_logged_actions = not trainer.algorithm.stored_extras()  # replay learners store none
    with trainer, PolicyServer(backend, **server) as policy_server:
        if trainer.config.verbose:
            print(
                f"shoal: serving {trainer.algo_name} on the spaces of {trainer.env_name} at {policy_server.url} "
                f"(training; {backend.num_envs} episodes at a time)",
                file=sys.stderr,
            )
        if on_ready is not None:
            on_ready(policy_server)
        try:
            result = trainer.learn()
        except RunInterrupted:  # a second Ctrl-C: the run stopped at once, and its message says what it kept
            raise
        except KeyboardInterrupt:  # stopped while no client was connected: keep what was learned
            trainer.stop_reason = trainer.stop_reason or "SIGINT"
            result = {}
            if trainer.run_dir is not None:
                trainer.save()
    return trainer, result


def checkpoint_server(
    path: str | Path,
    max_batch: int = 256,
    max_wait_ms: float = 2.0,
    deterministic: bool = True,
    policy_id: str | None = None,
    client_timeout_s: float = 600.0,
    **server: Any,
) -> PolicyServer:
    """A server (not yet started) answering clients with the policy of a checkpoint, or of a run's
    newest; nothing is learned. An episode whose client sends nothing for ``client_timeout_s``
    gives its row back. ``server``: the ``PolicyServer`` options."""
    from shoal.serve.inference import InferenceSession
    from shoal.serve.server import PolicyServer
    from shoal.train import Trainer
    from shoal.train.checkpoint import resolve_checkpoint

    _check_access(server)
    checkpoint = resolve_checkpoint(path)
    local = {"ray_address": None, "num_workers": 0, "async_factor": 1, "vectorization_mode": None}
    local["remote_worker_envs"] = False
    local |= {"horizon": None, "soft_horizon": False, "no_done_at_end": False}  # the clients end their episodes
    with warnings.catch_warnings():  # that no episode goes on is the point here, not news
        warnings.filterwarnings("ignore", message=".*starts new episodes", category=UserWarning)
        try:  # slots, not envs: only the spaces are read, so an env class declaring nothing else serves too
            trainer = Trainer.from_checkpoint(checkpoint, save_outputs=False, verbose=0, backend="external", **local)
        except ConfigError as e:
            if "several agents" not in str(e):
                raise
            # a multi-agent env's copies give its agents' spaces (one policy of them serves)
            trainer = Trainer.from_checkpoint(checkpoint, save_outputs=False, verbose=0, backend="local", **local)
    trainer.close()
    session = InferenceSession(
        trainer.get_policy(policy_id),
        trainer.backend,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        deterministic=deterministic,
        client_timeout_s=client_timeout_s,
    )
    return PolicyServer(session, **server)


def _check_access(server: dict[str, Any]) -> None:
    """The server's token checked before a run or checkpoint is loaded: a weak one is refused at
    once, not after the loading, and leaves no run directory behind."""
    from shoal.serve.server import DEFAULT_HOST, check_access

    check_access(server.get("host", DEFAULT_HOST), server.get("token"))
