"""Non-finite numbers stopped on their way into the rollout, with the one to blame: a policy's
action before the env sees it (unless the env's observation was not finite already), the env's
observations and rewards before the learner does, where a NaN would pass for a diverged update."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from shoal.collect.policies import PolicyMap
from shoal.errors import EnvError, ShoalError, TrainingDiverged
from shoal.vector.base import StepBatch, VecBackend


def non_finite_action(
    action: torch.Tensor, batch: StepBatch, obs: torch.Tensor, policies: PolicyMap, backend: VecBackend
) -> ShoalError:
    """The error for a non-finite ``action`` the policies chose for ``batch`` from ``obs``: the
    policy is at fault, unless the env's observation was not finite already."""
    row = int((~torch.isfinite(action)).reshape(len(action), -1).any(1).nonzero()[0])
    policy = policies.ids[int(policies.row_policy[batch.rows][row])]
    env_id = int(backend.batch.env_id[batch.rows][row])
    if obs.is_floating_point() and not bool(torch.isfinite(obs[row]).all()):
        return EnvError(
            f"env '{backend.name}' (env {env_id}) returned a non-finite observation "
            f"({obs[row].flatten()[:8].tolist()}); observations must be finite."
        )
    value = action[row].flatten()[~torch.isfinite(action[row].flatten())][0].item()
    return TrainingDiverged(
        f"it chose a non-finite action ({value}) for env '{backend.name}' (env {env_id}); "
        f"the action was not sent to the env.",
        policy,
    )


def check_env_outputs(rollout: TensorDict, horizon: int, backend: VecBackend) -> None:
    """The env's rewards, and its observations when they are floats, are finite: a NaN from the
    env is the env's fault, and must not reach the learner to be taken for a diverged update."""
    obs = rollout["obs"]
    if obs.is_floating_point() and not bool(torch.isfinite(obs).all()):
        row, step = (~torch.isfinite(obs)).reshape(*obs.shape[:2], -1).any(-1).nonzero()[0].tolist()
        raise EnvError(
            f"env '{backend.name}' (env {int(backend.batch.env_id[row])}) returned a non-finite "
            f"observation ({obs[row, step].flatten()[:8].tolist()}) at step {step} of this rollout; "
            f"observations must be finite."
        )
    reward = rollout["reward"][:, :horizon]
    if not torch.isfinite(reward).all():
        row, step = (~torch.isfinite(reward)).nonzero()[0].tolist()
        env_id = int(backend.batch.env_id[row])
        raise EnvError(
            f"env '{backend.name}' (env {env_id}) returned a non-finite reward "
            f"({reward[row, step].item()}) at step {step} of this rollout; rewards must be finite floats."
        )
