"""Observation encoders: a batch of observations in, flat features ``[B, out_dim]`` out.

The policy puts its MLP towers and heads on top of ``out_dim`` features. Which encoder a space
gets (``make_encoder``) follows how shoal stores observations (``shoal/envs/spaces.py``): a Box
keeps its shape and dtype, so an image Box reaches ``CNNEncoder`` as uint8 / bool / float32; a
Dict or Tuple arrives as one float32 vector in gymnasium's flatten order, which ``DictEncoder``
cuts back into its leaves. Scaling uint8 by 1/255 happens inside the network so the rollout
keeps an image Box at one byte per pixel (an image inside a Dict is stored as float32 with the
rest of the vector, four bytes per pixel).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, TypeGuard, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch
from torch import nn

NATURE_FILTERS = [(32, 8, 4), (64, 4, 2), (64, 3, 1)]  # Mnih et al. 2015, Nature 518
# MinAtar's network (Young & Tian 2019, arXiv:1903.03176): one conv of 16 3x3 filters, stride 1.
SMALL_FILTERS = [(16, 3, 1)]
# The Nature stack maps a side of n px to ((n - 8) // 4 - 3) // 2 - 1, which is >= 1 exactly when
# n >= 36: the smallest side it fits. Below that the small stack needs only 3 px.
NATURE_MIN_SIDE = 36
MIN_IMAGE_SIDE_2D = 8  # a 2-D Box smaller than this is a table of numbers, not a picture
CHANNELS = ("first", "last")


def image_channels_first(shape: tuple[int, int, int], channels: str | None = None) -> bool:
    """Whether a 3-D image shape is ``[C, H, W]`` (True) or ``[H, W, C]`` (False).

    ``channels`` ("first" / "last") overrides the guess. The guess: channels-first when the first
    dim is smaller than both others (``[4, 84, 84]``); otherwise channels-last (``[84, 84, 4]``,
    MinAtar's ``[10, 10, 4]``). Ties such as ``[3, 3, 3]`` are taken as channels-last, Gymnasium's
    convention for image observations.
    """
    if channels is not None and channels not in CHANNELS:
        raise ValueError(f"channels={channels!r} is not allowed: use 'first', 'last' or None (guess).")
    if len(shape) != 3:
        raise ValueError(f"image shape {tuple(shape)} has {len(shape)} dims; channel order needs 3.")
    if channels is not None:
        return channels == "first"
    return shape[0] < shape[1] and shape[0] < shape[2]


def default_conv_filters(height: int, width: int) -> list[tuple[int, int, int]]:
    """``(out_channels, kernel, stride)`` per conv: the Nature-DQN stack if the image fits it,
    else MinAtar's single small conv."""
    return list(NATURE_FILTERS if min(height, width) >= NATURE_MIN_SIDE else SMALL_FILTERS)


def is_image(space: gym.Space[Any]) -> TypeGuard[gym.spaces.Box[Any]]:
    """A Box the CNN should see: 3-D, or 2-D (one channel) of at least 8x8."""
    if not isinstance(space, gym.spaces.Box):
        return False
    shape = space.shape
    return len(shape) == 3 or (len(shape) == 2 and min(shape) >= MIN_IMAGE_SIDE_2D)


def is_pixels(space: gym.Space[Any]) -> bool:
    """An image of pixels (uint8 or bool), not a grid of other numbers such as an int8 game board."""
    return is_image(space) and space.dtype in (np.uint8, np.bool_)


def _is_uint8(dtype: np.dtype[Any] | torch.dtype) -> bool:
    if isinstance(dtype, torch.dtype):
        return dtype == torch.uint8
    return np.dtype(dtype) == np.uint8


class Encoder(nn.Module):
    """Base of the observation encoders: ``forward`` maps ``[B, ...]`` to ``[B, out_dim]`` features."""

    out_dim: int


class ChannelNorm(nn.Module):
    """LayerNorm over the channels at each position of a ``[B, C, H, W]`` map: each pixel's feature
    vector normalized on its own, as a LayerNorm over a channels-last map's last axis does."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed: torch.Tensor = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return normed


class CNNEncoder(Encoder):
    """Conv stack (ReLU after each, padding 0) over ``[B, *shape]`` images, flattened to ``[B, out_dim]``.

    ``shape`` is ``[C, H, W]``, ``[H, W, C]`` (see ``image_channels_first``) or ``[H, W]``.
    ``dtype`` is the observation space's dtype; uint8 is scaled by 1/255 whatever dtype the tensor
    arrives in, because a uint8 leaf of a Dict arrives as float 0..255 (``DictEncoder``).
    ``layer_norm`` puts a ``ChannelNorm`` between each conv and its ReLU.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: np.dtype[Any] | torch.dtype,
        conv_filters: list[tuple[int, int, int]] | None = None,
        channels: str | None = None,
        layer_norm: bool = False,
    ):
        super().__init__()
        self.shape = tuple(int(n) for n in shape)
        if len(self.shape) == 2:
            self.channels_last = False  # one channel, added in forward
            in_channels, height, width = 1, *self.shape
        elif len(self.shape) == 3:
            self.channels_last = not image_channels_first(self.shape, channels)
            in_channels, height, width = (self.shape[2], *self.shape[:2]) if self.channels_last else self.shape
        else:
            raise ValueError(f"CNNEncoder needs an image shape [C, H, W], [H, W, C] or [H, W]; got {self.shape}.")
        filters = default_conv_filters(height, width) if conv_filters is None else list(conv_filters)
        if not filters or any(len(f) != 3 or min(f) < 1 for f in filters):
            raise ValueError(
                f"conv_filters={conv_filters!r} must be a non-empty list of positive "
                f"(out_channels, kernel, stride) triples."
            )
        self.scale = 1.0 / 255.0 if _is_uint8(dtype) else None
        layers: list[nn.Module] = []
        for out_channels, kernel, stride in filters:
            if min(height, width) < kernel:
                order = "[H, W, C]" if self.channels_last else "[C, H, W]"
                raise ValueError(
                    f"conv_filters {filters} shrink image shape {self.shape}, read as {order}, "
                    f"below 1x1 (a {kernel}x{kernel} kernel meets a {height}x{width} map); use a "
                    f"smaller stack (e.g. {SMALL_FILTERS}) or, if the channel order is wrong, "
                    f"set channels: first|last."
                )
            conv = nn.Conv2d(in_channels, out_channels, kernel, stride)
            # sqrt(2) is ReLU's gain: it keeps the activations' scale through the stack.
            nn.init.orthogonal_(conv.weight, math.sqrt(2))
            assert conv.bias is not None  # built with a bias (the default)
            nn.init.zeros_(conv.bias)
            layers += [conv, ChannelNorm(out_channels), nn.ReLU()] if layer_norm else [conv, nn.ReLU()]
            in_channels, height, width = out_channels, (height - kernel) // stride + 1, (width - kernel) // stride + 1
        self.net = nn.Sequential(*layers, nn.Flatten())
        self.filters = filters
        self.out_dim = in_channels * height * width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.shape[1:] != self.shape:
            raise ValueError(f"CNNEncoder expects observations [B, *{self.shape}], got {tuple(obs.shape)}.")
        # Not in place: a float input may be a view of the caller's tensor (DictEncoder's slices).
        x = obs.float() if self.scale is None else obs.float() * self.scale
        if len(self.shape) == 2:
            x = x.unsqueeze(1)
        elif self.channels_last:
            x = x.permute(0, 3, 1, 2)
        features: torch.Tensor = self.net(x)
        return features


class FlattenEncoder(Encoder):
    """Any observation as a flat float vector: ``[B, ...] -> [B, out_dim]``."""

    def __init__(self, out_dim: int):
        super().__init__()
        self.out_dim = int(out_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        flat = obs.reshape(obs.shape[0], -1)
        return flat if flat.is_floating_point() else flat.float()  # a float64 model keeps float64 inputs


LeafPath = tuple[str | int, ...]  # Dict keys and Tuple indices from the root to a leaf


def _walk(space: gym.Space[Any], path: LeafPath = ()) -> Iterator[tuple[LeafPath, gym.Space[Any]]]:
    """(key path, leaf space) in gymnasium's flatten order: Dict and Tuple in their own order, nested."""
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _walk(sub, (*path, key))
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _walk(sub, (*path, i))
    else:
        yield path, space


class DictEncoder(Encoder):
    """A Dict/Tuple observation, flattened by ``gymnasium.spaces.flatten`` to ``[B, flatdim]``, cut
    back into its leaves: image leaves (see ``is_image``) go through a ``CNNEncoder`` each, the rest
    pass through flat, and everything is concatenated in leaf order.

    ``leaves``: (key path, "image" | "vector", offset, size) per leaf; ``cnns``: the image leaves'
    encoders, in leaf order.
    """

    def __init__(
        self,
        space: gym.spaces.Dict | gym.spaces.Tuple[Any],
        conv_filters: list[tuple[int, int, int]] | None = None,
        channels: str | None = None,
        layer_norm: bool = False,
    ):
        super().__init__()
        if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            raise ValueError(f"DictEncoder needs a Dict or Tuple space, got {space}.")
        self.leaves: list[tuple[LeafPath, str, int, int]] = []
        self.cnns = nn.ModuleList()
        offset = image_features = 0
        for path, leaf in _walk(space):
            if not leaf.is_np_flattenable:
                raise ValueError(
                    f"leaf {path} of observation space {space} is {leaf}, which gymnasium "
                    f"cannot flatten; use Box, Discrete, MultiDiscrete or MultiBinary leaves."
                )
            size, kind = int(gym.spaces.flatdim(leaf)), "vector"
            if is_image(leaf):
                kind = "image"
                cnn = CNNEncoder(leaf.shape, leaf.dtype, conv_filters, channels, layer_norm)
                self.cnns.append(cnn)
                image_features += cnn.out_dim
            self.leaves.append((path, kind, offset, size))
            offset += size
        self.flatdim = offset
        self._check_layout(space)
        self.out_dim = image_features + sum(n for _, k, _, n in self.leaves if k == "vector")

    def _check_layout(self, space: gym.Space[Any]) -> None:
        """The offsets must match gymnasium's own flatten, or every leaf would read its neighbour's data."""
        if self.flatdim != gym.spaces.flatdim(space):
            raise ValueError(
                f"leaf sizes of {space} add up to {self.flatdim}, but gymnasium's flatdim "
                f"is {gym.spaces.flatdim(space)}."
            )
        # every leaf is np-flattenable (checked in __init__), so each flattens to one array
        sample = space.sample()
        flat = cast("npt.NDArray[Any]", gym.spaces.flatten(space, sample))
        for (path, _, offset, size), (_, leaf) in zip(self.leaves, _walk(space)):
            value: Any = sample  # a nested dict / tuple of the leaves' samples
            for key in path:
                value = value[key]
            leaf_flat = cast("npt.NDArray[Any]", gym.spaces.flatten(leaf, value))
            if not np.array_equal(flat[offset : offset + size], leaf_flat):
                raise ValueError(f"leaf {path} of {space} is not at offset {offset} of gymnasium's flatten.")

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.ndim != 2 or obs.shape[1] != self.flatdim:
            raise ValueError(f"DictEncoder expects flat observations [B, {self.flatdim}], got {tuple(obs.shape)}.")
        features, cnns = [], iter(self.cnns)
        for _, kind, offset, size in self.leaves:
            part = obs[:, offset : offset + size]
            if kind == "vector":
                features.append(part.float())
            else:
                cnn = cast(CNNEncoder, next(cnns))  # cnns holds the image leaves' CNNEncoders
                features.append(cnn(part.reshape(obs.shape[0], *cnn.shape)))
        return torch.cat(features, dim=1)


def make_encoder(
    space: gym.Space[Any],
    conv_filters: list[tuple[int, int, int]] | None = None,
    channels: str | None = None,
    layer_norm: bool = False,
) -> Encoder:
    """The encoder for observations of ``space`` as shoal stores them; every one has ``out_dim``.
    ``layer_norm``: a LayerNorm over the channels after each conv layer of an image's CNN."""
    if is_image(space):
        return CNNEncoder(space.shape, space.dtype, conv_filters, channels, layer_norm)
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return DictEncoder(space, conv_filters, channels, layer_norm)
    if isinstance(space, gym.spaces.Box):
        if len(space.shape) > 2:
            raise ValueError(
                f"observation space {space} has {len(space.shape)} dims; shoal encodes Box "
                f"observations of 0-2 dims (flat) or images of 3 dims."
            )
        return FlattenEncoder(int(np.prod(space.shape)))
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return FlattenEncoder(int(gym.spaces.flatdim(space)))
    raise ValueError(
        f"observation space {space} has no encoder: use Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple."
    )
