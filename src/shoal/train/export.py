"""A trained policy as one file that runs without shoal: TorchScript (``torch.jit.load``) or ONNX
(onnxruntime, or any other ONNX runtime).

The file maps a batch of observations ``[B, *obs_shape]`` to the actions the policy takes
deterministically, as the env takes them: observation normalization, the network, the most likely
action and the action bounds are all inside it. Dict and Tuple observations go in flattened
(``gymnasium.spaces.flatten``, float32), as ``compute_actions`` reads them.
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

FORMATS = {".onnx": "onnx", ".pt": "torchscript"}
"""A file's suffix names its format."""


class DeterministicActor(nn.Module):
    """``obs [B, *obs_shape] -> actions [B, *act_shape]``: the policy's most likely actions, bounded
    as the env takes them. Traced once; the batch size stays free."""

    def __init__(self, policy: Policy, backend: VecBackend):
        super().__init__()
        self.policy = policy
        self.backend = backend  # not a module: its action bounds are traced in as constants

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        rows = obs.shape[0]
        first = torch.zeros(rows, dtype=torch.bool, device=obs.device)
        action, _, _ = self.policy.act(obs, self.policy.initial_state(rows), first, deterministic=True)
        return self.backend.bounded_actions(action)


def export_policy(policy: Policy, backend: VecBackend, path: str | Path, name: str) -> Path:
    """Write ``policy`` (called ``name`` in messages) acting in ``backend``'s envs to ``path``, in
    the format its suffix names (``.onnx`` or ``.pt``), atomically; returns the path."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix)
    if fmt is None:
        raise ConfigError(
            f"cannot export to '{path}': name a file ending in {' or '.join(FORMATS)} (ONNX, TorchScript)."
        )
    if any(isinstance(m, RecurrentModel) for m in policy.modules()):
        raise ConfigError(
            f"{name} is recurrent: its actions depend on a state carried from step to step, which an exported "
            f"file does not keep; export supports feedforward policies."
        )
    if backend.batch.action_mask is not None:
        raise ConfigError(
            f"{name} acts under action masks, which an exported file would not apply; export supports envs "
            f"without them."
        )
    spec = backend.obs_spec
    dtype = np.float32 if spec.structured else spec.dtype  # structured observations go in flattened
    example = torch.as_tensor(np.zeros((2, *spec.shape), dtype=dtype))
    # a copy on the CPU, where the action bounds are, in eval mode: the trainer's policy stays as it was
    actor = DeterministicActor(copy.deepcopy(policy).cpu(), backend).eval()
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
                _onnx(actor, example, traced)
        write_atomic(path, traced.read_bytes())
    finally:
        traced.unlink(missing_ok=True)
    return path


def _onnx(actor: DeterministicActor, example: torch.Tensor, path: Path) -> None:
    # the TorchScript-based exporter: the dynamo one needs onnxscript, and traces the same graph here
    torch.onnx.export(
        actor,
        (example,),
        str(path),
        dynamo=False,
        input_names=["obs"],
        output_names=["action"],
        dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
    )
