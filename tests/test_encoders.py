"""Observation encoders: channel order, conv stacks, uint8 scaling, and Dict/Tuple leaves checked
against the leaves encoded one by one."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.models.encoders import (
    NATURE_FILTERS,
    SMALL_FILTERS,
    CNNEncoder,
    DictEncoder,
    FlattenEncoder,
    default_conv_filters,
    image_channels_first,
    make_encoder,
)


@pytest.mark.parametrize(
    "shape,first",
    [
        ((4, 84, 84), True),
        ((84, 84, 4), False),
        ((10, 10, 4), False),
        ((64, 64, 3), False),
        ((3, 3, 3), False),
        ((1, 8, 8), True),
    ],
)
def test_channel_guess(shape, first):
    assert image_channels_first(shape) is first


def test_channel_override_and_bad_value():
    assert image_channels_first((84, 84, 4), "first") is True
    assert image_channels_first((4, 84, 84), "last") is False
    with pytest.raises(ValueError, match="'middle'.*'first', 'last'"):
        image_channels_first((4, 84, 84), "middle")


def test_default_stack_threshold():
    assert default_conv_filters(84, 84) == NATURE_FILTERS
    assert default_conv_filters(36, 100) == NATURE_FILTERS
    assert default_conv_filters(35, 100) == SMALL_FILTERS
    # the smallest image each stack is given must still come out at least 1x1
    assert CNNEncoder((1, 36, 36), np.float32).out_dim == 64
    assert CNNEncoder((1, 35, 35), np.float32).out_dim == 16 * 33 * 33


def test_nature_channels_last_matches_channels_first():
    torch.manual_seed(0)
    first = CNNEncoder((4, 84, 84), np.uint8)
    last = CNNEncoder((84, 84, 4), np.uint8)
    assert first.out_dim == last.out_dim == 3136
    last.load_state_dict(first.state_dict())
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    out = first(x)
    assert out.shape == (3, 3136)
    torch.testing.assert_close(last(x.permute(0, 2, 3, 1).contiguous()), out)
    # the override reads the same array the other way round
    assert CNNEncoder((4, 84, 84), np.uint8, channels="last").net[0].in_channels == 84


def test_uint8_is_scaled_by_1_over_255():
    torch.manual_seed(0)
    as_bytes = CNNEncoder((3, 40, 40), torch.uint8)
    as_floats = CNNEncoder((3, 40, 40), np.float32)
    as_floats.load_state_dict(as_bytes.state_dict())
    x = torch.randint(0, 256, (2, 3, 40, 40), dtype=torch.uint8)
    torch.testing.assert_close(as_bytes(x), as_floats(x.float() / 255))
    # the scale follows the declared dtype, not the tensor's: a uint8 leaf of a Dict arrives as float
    torch.testing.assert_close(as_bytes(x.float()), as_bytes(x))


def test_minatar_bool_uses_small_stack():
    enc = make_encoder(gym.spaces.Box(0, 1, (10, 10, 4), bool))
    assert isinstance(enc, CNNEncoder) and enc.filters == SMALL_FILTERS
    assert enc.out_dim == 16 * 8 * 8
    x = torch.rand(5, 10, 10, 4) < 0.3
    torch.testing.assert_close(enc(x), enc(x.float()))
    assert enc(x).shape == (5, enc.out_dim)


def test_init_is_orthogonal_with_relu_gain():
    enc = CNNEncoder((10, 10, 4), np.float32)
    w = enc.net[0].weight.reshape(16, -1)  # 16 rows of 36: orthogonal rows, each of norm sqrt(2)
    torch.testing.assert_close(w @ w.T, 2 * torch.eye(16), atol=1e-5, rtol=0)
    assert not enc.net[0].bias.any()


def _flat_batch(space, n):
    space.seed(0)
    samples = [space.sample() for _ in range(n)]
    flat = torch.as_tensor(np.stack([gym.spaces.flatten(space, s) for s in samples]).astype(np.float32))
    return samples, flat


def test_dict_image_and_vector():
    space = gym.spaces.Dict(image=gym.spaces.Box(0, 255, (3, 16, 16), np.uint8), vec=gym.spaces.Box(-1, 1, (5,)))
    torch.manual_seed(0)
    enc = make_encoder(space)
    assert isinstance(enc, DictEncoder)
    assert enc.leaves == [(("image",), "image", 0, 768), (("vec",), "vector", 768, 5)]
    samples, flat = _flat_batch(space, 3)
    cnn = enc.cnns[0]
    image = torch.as_tensor(np.stack([s["image"] for s in samples]))  # uint8, as a bare Box would be stored
    vec = torch.as_tensor(np.stack([s["vec"] for s in samples]))
    expected = torch.cat([cnn(image), vec], dim=1)
    out = enc(flat)
    assert out.shape == (3, enc.out_dim) == (3, cnn.out_dim + 5)
    torch.testing.assert_close(out, expected)


def test_nested_dict_tuple():
    space = gym.spaces.Dict(
        {
            "z": gym.spaces.MultiBinary(2),
            "obs": gym.spaces.Tuple((gym.spaces.Box(0, 255, (12, 12), np.uint8), gym.spaces.Discrete(3, start=1))),
            "map": gym.spaces.Box(0, 1, (10, 10, 4), bool),
            "pos": gym.spaces.Box(-5, 5, (2,), np.float64),
        }
    )
    torch.manual_seed(0)
    enc = DictEncoder(space)
    # gymnasium sorts a Dict's keys; the Tuple keeps its order
    assert enc.leaves == [
        (("map",), "image", 0, 400),
        (("obs", 0), "image", 400, 144),
        (("obs", 1), "vector", 544, 3),
        (("pos",), "vector", 547, 2),
        (("z",), "vector", 549, 2),
    ]
    samples, flat = _flat_batch(space, 4)
    rows = []
    for s in samples:  # slow reference: each leaf by hand, from the unflattened sample
        one_hot = [1.0 if s["obs"][1] == k else 0.0 for k in (1, 2, 3)]
        rows.append(
            torch.cat(
                [
                    enc.cnns[0](torch.as_tensor(s["map"])[None]),
                    enc.cnns[1](torch.as_tensor(s["obs"][0])[None]),
                    torch.tensor([one_hot + list(s["pos"]) + list(s["z"])], dtype=torch.float32),
                ],
                dim=1,
            )
        )
    out = enc(flat)
    assert out.shape == (4, enc.out_dim) == (4, 16 * 8 * 8 + 16 * 10 * 10 + 7)
    torch.testing.assert_close(out, torch.cat(rows))


def test_dict_input_is_not_modified():
    space = gym.spaces.Dict(image=gym.spaces.Box(0, 255, (12, 12), np.uint8))
    _, flat = _flat_batch(space, 2)
    before = flat.clone()
    make_encoder(space)(flat)
    assert torch.equal(flat, before)


# stored_shape: how shoal stores one observation (Discrete/MultiDiscrete as a one-hot vector)
@pytest.mark.parametrize(
    "space,stored_shape,out_dim",
    [
        (gym.spaces.Box(-1, 1, (7,)), (7,), 7),
        (gym.spaces.Box(-1, 1, (3, 4)), (3, 4), 12),
        (gym.spaces.Box(-1, 1, ()), (), 1),
        (gym.spaces.Discrete(4), (4,), 4),
        (gym.spaces.MultiDiscrete([2, 3]), (5,), 5),
    ],
)
def test_flat_spaces(space, stored_shape, out_dim):
    enc = make_encoder(space)
    assert isinstance(enc, FlattenEncoder) and enc.out_dim == out_dim
    assert enc(torch.zeros(2, *stored_shape)).shape == (2, out_dim)


def test_errors():
    with pytest.raises(ValueError, match=r"Box.*\(2, 3, 8, 8\).*4 dims"):
        make_encoder(gym.spaces.Box(0, 1, (2, 3, 8, 8)))
    with pytest.raises(ValueError, match=r"\(32, 8, 4\).*\(20, 20, 3\)"):
        CNNEncoder((20, 20, 3), np.uint8, conv_filters=NATURE_FILTERS)
    with pytest.raises(ValueError, match=r"\(2, 2, 1\).*below 1x1"):
        make_encoder(gym.spaces.Dict(tiny=gym.spaces.Box(0, 1, (2, 2, 1))))
    with pytest.raises(ValueError, match="Text"):
        make_encoder(gym.spaces.Text(5))
    with pytest.raises(ValueError, match=r"\[B, \*\(4, 84, 84\)\], got \(2, 84, 84, 4\)"):
        CNNEncoder((4, 84, 84), np.uint8)(torch.zeros(2, 84, 84, 4, dtype=torch.uint8))
