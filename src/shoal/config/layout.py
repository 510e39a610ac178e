"""``BatchLayout``: what a run's batch keys add up to, from the envs to the optimizer steps.

One iteration collects ``rollout_fragment_length`` steps from each of ``num_envs`` envs (``agents``
rows each), stepped ``envs_per_batch`` at a time (``num_envs / async_factor``). The learner views
those agent steps as ``segments`` of ``bptt_horizon`` steps, takes ``minibatch_segments`` of them
per minibatch, and steps the optimizer once every ``accumulate_minibatches`` minibatches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchLayout:
    num_envs: int
    agents_per_env: int
    async_factor: int
    num_workers: int
    rollout_fragment_length: int
    minibatch_size: int
    bptt_horizon: int
    accumulate_minibatches: int
    update_epochs: int

    @property
    def envs_per_batch(self) -> int:
        """Envs in each forward pass of the rollout (one of the ``async_factor`` groups)."""
        return self.num_envs // self.async_factor

    @property
    def agent_rows(self) -> int:
        return self.num_envs * self.agents_per_env

    @property
    def env_steps(self) -> int:
        """``train_batch_size``."""
        return self.num_envs * self.rollout_fragment_length

    @property
    def agent_steps(self) -> int:
        """``batch_size``."""
        return self.agent_rows * self.rollout_fragment_length

    @property
    def segments(self) -> int:
        return self.agent_steps // self.bptt_horizon

    @property
    def minibatch_segments(self) -> int:
        return self.minibatch_size // self.bptt_horizon

    @property
    def num_minibatches(self) -> int:
        return self.agent_steps // self.minibatch_size

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per epoch."""
        return self.num_minibatches // self.accumulate_minibatches

    def describe(self) -> str:
        """The layout as lines of ``value  (how it is made)``, printed when a run starts."""
        workers = f", {self.num_workers} workers" if self.num_workers else ""
        rows = [
            (
                "envs per batch",
                self.envs_per_batch,
                f"{self.num_envs} envs / async_factor {self.async_factor}{workers}",
            ),
            ("agent rows", self.agent_rows, f"{self.num_envs} envs x {self.agents_per_env} agents"),
            ("collection steps", self.rollout_fragment_length, f"{self.agent_steps:,} / {self.agent_rows:,} rows"),
            (
                "batch_size",
                self.agent_steps,
                f"agent steps = train_batch_size {self.env_steps:,} x {self.agents_per_env}",
            ),
            ("segments", self.segments, f"{self.agent_steps:,} / bptt_horizon {self.bptt_horizon}"),
            ("minibatches", self.num_minibatches, f"{self.agent_steps:,} / minibatch_size {self.minibatch_size:,}"),
            ("minibatch segments", self.minibatch_segments, f"{self.minibatch_size:,} / {self.bptt_horizon}"),
            (
                "optimizer steps",
                self.optimizer_steps * self.update_epochs,
                f"{self.num_minibatches} / accumulate_minibatches {self.accumulate_minibatches}"
                f" x update_epochs {self.update_epochs}",
            ),
        ]
        width = max(len(f"{value:,}") for _, value, _ in rows)
        return "\n".join(f"  {name:<19}{value:>{width},}  ({how})" for name, value, how in rows)
