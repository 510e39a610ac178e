"""Data-parallel learners: the few collectives shoal's learners and trainer need.

Under ``torchrun --nproc_per_node=N -m shoal train ...`` every rank runs the whole trainer on its
own envs. The ranks stay identical where it matters by agreeing on four things, each here:
gradients (averaged before the clip and the optimizer step, for autograd and the fused PPO step
alike), advantage statistics (those of the whole minibatch, across ranks), observation-normalizer
statistics (those of every rank's rollout), and the decisions that end loops (stop, early stop).

Gradients are averaged by one all-reduce of a flat buffer per optimizer step rather than by
wrapping the model in ``torch.nn.parallel.DistributedDataParallel``: shoal's learners call their
networks through several entry points (act, evaluate, segments) and the fused PPO step has no
autograd pass for DDP's hooks to ride on, while one flat all-reduce per step covers all of them
and is what DDP's bucketing amounts to for networks this small. Without a process group every
function here is a no-op, so a single process pays nothing.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def world_size() -> int:
    """How many ranks learn together (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if world_size() > 1 else 0


def is_main() -> bool:
    """Whether this process logs, checkpoints and prints (rank 0, or the only process)."""
    return rank() == 0


def launched() -> bool:
    """Whether a launcher (torchrun) started this process as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_environment(device: torch.device) -> bool:
    """Join the process group torchrun describes in the environment (gloo on the CPU, nccl on
    CUDA); a no-op when not launched that way or already joined. Returns whether it joined."""
    if not launched() or dist.is_initialized():
        return False
    if device.type == "cuda":  # gradients over nccl; the small CPU tensors of counters over gloo
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" is then this rank's GPU
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")
    return True


def leave() -> None:
    """Leave the process group, after the other ranks are done with it."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def sum_(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over the ranks, in place."""
    if world_size() > 1:
        dist.all_reduce(tensor)
    return tensor


def average_(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` averaged over the ranks, in place."""
    if world_size() > 1:
        dist.all_reduce(tensor)
        tensor.div_(world_size())
    return tensor


def maximum_(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s elementwise maximum over the ranks, in place."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any."""
    return flag if world_size() == 1 else bool(maximum_(torch.tensor([int(flag)])).item())


@torch.no_grad()
def broadcast_(tensors: list[torch.Tensor]) -> None:
    """Every rank's ``tensors`` made rank 0's, in place."""
    if world_size() > 1:
        for tensor in tensors:
            dist.broadcast(tensor, src=0)


def differing_keys(settings: dict[str, Any]) -> list[str]:
    """The keys of ``settings`` whose values are not the same on every rank."""
    if world_size() == 1:
        return []
    everyone: list[dict[str, Any] | None] = [None] * world_size()
    dist.all_gather_object(everyone, settings)
    return sorted(
        key
        for key in set().union(*(s or {} for s in everyone))
        if len({repr((s or {}).get(key)) for s in everyone}) > 1
    )
