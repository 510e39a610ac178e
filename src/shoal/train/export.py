"""A trained policy as one file that runs without shoal: TorchScript (``torch.jit.load``) or ONNX
(onnxruntime, or any other ONNX runtime).

The file maps a batch of observations ``[B, *obs_shape]`` to the actions the policy takes
deterministically, as the env takes them: observation normalization, the network, the most likely
action and the action bounds are all inside it. Dict and Tuple observations go in flattened
(``gymnasium.spaces.flatten``, float32), as ``compute_actions`` reads them.

A recurrent policy's file also takes its state, one input per state tensor (``h``, and ``c`` for an
LSTM; zeros at an episode start), and returns the next state after the actions (``next_h``,
``next_c``), for the caller to pass back in on the next step.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.jit import TracerWarning  # type: ignore[attr-defined]

from shoal.errors import ConfigError
from shoal.files import write_atomic
from shoal.models.recurrent import RecurrentModel

if TYPE_CHECKING:
    from shoal.models.policy import Policy
    from shoal.vector import VecBackend

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
"""Each format and the suffix of its files."""


class DeterministicActor(nn.Module):
    """``(obs [B, *obs_shape], *state) -> actions [B, *act_shape]`` (and ``*next_state`` when the
    policy has a state): the policy's most likely actions, bounded as the env takes them. Traced
    once; the batch size stays free."""

    def __init__(self, policy: Policy, backend: VecBackend, state_keys: tuple[str, ...]):
        super().__init__()
        self.policy = policy
        self.backend = backend  # not a module: its action bounds are traced in as constants
        self.state_keys = state_keys

    def forward(self, obs: torch.Tensor, *state: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        rows = obs.shape[0]
        first = torch.zeros(rows, dtype=torch.bool, device=obs.device)  # the caller zeros a new episode's state
        start = self.policy.initial_state(rows)  # what the deterministic actions do not read (gSDE's noise) stays fresh
        start.update(dict(zip(self.state_keys, state)))
        action, _, nxt = self.policy.act(obs, start, first, deterministic=True)
        bounded = self.backend.bounded_actions(action)
        return (bounded, *(nxt[key] for key in self.state_keys)) if state else bounded


def format_of(path: str | Path, fmt: str | None) -> tuple[Path, str]:
    """The file to write and its format, from ``fmt`` (``onnx`` or ``torchscript``) or else the
    suffix of ``path``; a suffix the format does not take is added."""
    path = Path(path)
    by_suffix = {suffix: name for name, suffix in FORMATS.items()}
    if fmt is None:
        if path.suffix not in by_suffix:
            raise ConfigError(
                f"cannot export to '{path}': name a file ending in {' or '.join(by_suffix)}, or give the "
                f"format ({' or '.join(FORMATS)})."
            )
        return path, by_suffix[path.suffix]
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}: allowed are {', '.join(FORMATS)}.")
    if path.suffix in by_suffix and by_suffix[path.suffix] != fmt:
        raise ConfigError(f"cannot export {fmt} to '{path}': its suffix names {by_suffix[path.suffix]}.")
    return (path if path.suffix == FORMATS[fmt] else path.with_name(path.name + FORMATS[fmt])), fmt


def export_policy(policy: Policy, backend: VecBackend, path: str | Path, name: str, fmt: str | None = None) -> Path:
    """Write ``policy`` (called ``name`` in messages) acting in ``backend``'s envs to ``path`` in
    format ``fmt`` (default: the one its suffix names, ``.onnx`` or ``.pt``), atomically; returns
    the path written."""
    path, fmt = format_of(path, fmt)
    if backend.batch.action_mask is not None:
        raise ConfigError(
            f"{name} acts under action masks, which an exported file would not apply; export supports envs "
            f"without them."
        )
    spec = backend.obs_spec
    dtype = np.float32 if spec.structured else spec.dtype  # structured observations go in flattened
    obs = torch.as_tensor(np.zeros((2, *spec.shape), dtype=dtype))
    # a copy on the CPU, where the action bounds are, in eval mode: the trainer's policy stays as it was
    policy = copy.deepcopy(policy).cpu()
    start = policy.initial_state(2)
    state_keys = next((m.carried_keys for m in policy.modules() if isinstance(m, RecurrentModel)), ())
    actor = DeterministicActor(policy, backend, state_keys).eval()
    example = (obs, *(start[key] for key in state_keys))
    path.parent.mkdir(parents=True, exist_ok=True)
    traced = path.with_name(f".{path.name}.traced")  # the exporters write a path; the file appears whole
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # tracing warns about the Python values it keeps as constants (the action bounds, the
            # shapes), and torch 2.13 calls TorchScript and the TorchScript-based ONNX exporter deprecated
            warnings.simplefilter("ignore", TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            if fmt == "torchscript":
                # frozen: the weights become constants, so its actions need no torch.no_grad() to read
                traced_actor = torch.jit.trace(actor, example, check_trace=False)  # type: ignore[no-untyped-call]
                torch.jit.freeze(traced_actor).save(str(traced))
            else:
                _onnx(actor, example, state_keys, traced)
        write_atomic(path, traced.read_bytes())
    finally:
        traced.unlink(missing_ok=True)
    return path


def _onnx(
    actor: DeterministicActor, example: tuple[torch.Tensor, ...], state_keys: tuple[str, ...], path: Path
) -> None:
    # the TorchScript-based exporter: the dynamo one needs onnxscript, and traces the same graph here
    inputs = ["obs", *state_keys]
    outputs = ["action", *(f"next_{key}" for key in state_keys)]
    torch.onnx.export(
        actor,
        example,
        str(path),
        dynamo=False,
        input_names=inputs,
        output_names=outputs,
        dynamic_axes={name: {0: "batch"} for name in inputs + outputs},
    )
