"""The replay learners' gradient steps in bare PyTorch, with the fewest ops that compute them: the
ceiling replay_ceiling.py holds shoal's learners against.

Each maker returns ``step(count)``, which takes ``count`` minibatch steps on a replay of random
transitions held as flat tensors: draw indices, gather, loss, backward, fused Adam. Nothing reads
a value back to the host. Networks are ReLU MLPs of two 256-unit layers; twin critics are one
batched network (one ``baddbmm`` per layer over both).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

REPLAY = 100_000
HIDDEN = 256


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Twin(nn.Module):
    """Two MLPs ``in -> 256 -> 256 -> 1`` run as one: ``[2, B]`` values of ``[B, in]`` inputs."""

    def __init__(self, fan_in: int):
        super().__init__()
        sizes = [fan_in, HIDDEN, HIDDEN, 1]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.randn(2, a, b) / math.sqrt(a)) for a, b in itertools.pairwise(sizes)
        )
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(2, 1, b)) for b in sizes[1:])

    def forward(self, x: torch.Tensor, towers: int = 2) -> torch.Tensor:
        h = x.expand(towers, *x.shape)
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(b[:towers], h, w[:towers])
            if k < len(self.weights) - 1:
                h = h.relu()
        return h.squeeze(-1)


def replay(obs: int, act: int | None) -> dict[str, torch.Tensor]:
    """Random transitions: discrete actions when ``act`` is None, else ``act`` unit dims."""
    return {
        "obs": torch.randn(REPLAY, obs),
        "next_obs": torch.randn(REPLAY, obs),
        "action": torch.randint(2, (REPLAY,)) if act is None else torch.rand(REPLAY, act) * 2 - 1,
        "reward": torch.randn(REPLAY),
        "discount": 0.99 * (torch.rand(REPLAY) > 0.01).float(),
    }


def draw(data: dict[str, torch.Tensor], batch: int) -> list[torch.Tensor]:
    index = torch.randint(REPLAY, (batch,))
    return [data[key][index] for key in ("obs", "action", "reward", "discount", "next_obs")]


def adam(params) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=1e-3, fused=True)


def dqn(obs: int, act: int, batch: int, phase: int):
    """DQN without double Q-learning (SB3's): Huber loss, gradient norm clipped at 10."""
    data = replay(obs, None)
    q = mlp([obs, HIDDEN, HIDDEN, act])
    target = copy.deepcopy(q).requires_grad_(False)
    params = list(q.parameters())
    optimizer = adam(params)

    def step(count: int) -> None:
        for _ in range(count):
            o, a, r, d, o2 = draw(data, batch)
            with torch.no_grad():
                y = torch.addcmul(r, d, target(o2).amax(1))
            optimizer.zero_grad()
            F.smooth_l1_loss(q(o).gather(1, a.unsqueeze(1)).squeeze(1), y).backward()
            nn.utils.clip_grad_norm_(params, 10.0, foreach=True)
            optimizer.step()

    return step


def dqn_written_out(obs: int, act: int, batch: int, phase: int):
    """``dqn`` with its backward written out instead of autograd's: the same step, in fewer and
    cheaper ops (the gradients into views of one flat tensor, clipped without a host read), to
    show how far the autograd step is from what a hand-made one could reach."""
    data = replay(obs, None)
    sizes = [obs, HIDDEN, HIDDEN, act]
    q = mlp(sizes)
    target = copy.deepcopy(q).requires_grad_(False)
    flat = nn.Parameter(torch.cat([p.detach().t().reshape(-1) if p.dim() == 2 else p.detach() for p in q.parameters()]))
    flat.grad = torch.zeros_like(flat)
    weights, biases, grad_w, grad_b, offset = [], [], [], [], 0
    for fan_in, fan_out in itertools.pairwise(sizes):  # x @ W + b with W [in, out]: no transposes in the forward
        for shape, into, grads in (((fan_in, fan_out), weights, grad_w), ((fan_out,), biases, grad_b)):
            n = math.prod(shape)
            into.append(flat.data[offset : offset + n].view(shape))
            grads.append(flat.grad[offset : offset + n].view(shape))
            offset += n
    optimizer = adam([flat])
    grad_q = torch.zeros(batch, act)

    def forward(x: torch.Tensor) -> list[torch.Tensor]:
        outs = [x]
        for k, (w, b) in enumerate(zip(weights, biases)):
            h = torch.addmm(b, outs[-1], w)
            outs.append(h.relu_() if k < len(weights) - 1 else h)
        return outs

    def step(count: int) -> None:
        for _ in range(count):
            o, a, r, d, o2 = draw(data, batch)
            with torch.no_grad():
                y = torch.addcmul(r, d, target(o2).amax(1))
                outs = forward(o)
                taken = a.unsqueeze(1)
                g = (outs[-1].gather(1, taken).squeeze(1) - y).clamp_(-1.0, 1.0).div_(batch)  # Huber's gradient
                grad = grad_q.zero_().scatter_(1, taken, g.unsqueeze(1))
                for k in reversed(range(len(weights))):
                    torch.mm(outs[k].t(), grad, out=grad_w[k])
                    torch.sum(grad, 0, out=grad_b[k])
                    if k:
                        grad = torch.mm(grad, weights[k].t()).mul_(outs[k] > 0)
                norm = flat.grad.norm()
                flat.grad.mul_((10.0 / (norm + 1e-6)).clamp_(max=1.0))
            optimizer.step()

    return step


class Actor(nn.Module):
    """A 256x256 trunk with ``outputs`` heads' worth of outputs."""

    def __init__(self, obs: int, outputs: int):
        super().__init__()
        self.net = mlp([obs, HIDDEN, HIDDEN, outputs])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def squashed_sample(actor: Actor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A tanh-squashed Gaussian sample and its log-probability."""
    mean, log_std = actor(x).chunk(2, 1)
    log_std = log_std.clamp(-20.0, 2.0)
    noise = torch.randn_like(mean)
    u = mean + log_std.exp() * noise
    log_prob = -0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)
    log_prob = log_prob - 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))  # log(1 - tanh(u)^2)
    return torch.tanh(u), log_prob.sum(1)


@contextlib.contextmanager
def frozen(net: nn.Module):
    """Within it, ``net``'s parameters take no gradient (an actor's loss through the critics)."""
    net.requires_grad_(False)
    yield
    net.requires_grad_(True)


def optimize(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def critic_step(critic: Twin, optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    optimize(optimizer, 0.5 * (critic(x) - y).square().sum(0).mean())


def sac(obs: int, act: int, batch: int, phase: int):
    """SAC with a learned entropy coefficient."""
    data = replay(obs, act)
    actor, critic = Actor(obs, 2 * act), Twin(obs + act)
    target = copy.deepcopy(critic).requires_grad_(False)
    log_alpha = nn.Parameter(torch.zeros(()))
    optimizers = adam(actor.parameters()), adam(critic.parameters()), adam([log_alpha])
    online, targets = list(critic.parameters()), list(target.parameters())

    def step(count: int) -> None:
        for _ in range(count):
            o, a, r, d, o2 = draw(data, batch)
            action, log_prob = squashed_sample(actor, o)
            optimize(optimizers[2], -(log_alpha * (log_prob.detach() - act)).mean())
            alpha = log_alpha.detach().exp()
            with torch.no_grad():
                a2, log_prob2 = squashed_sample(actor, o2)
                y = r + d * (target(torch.cat([o2, a2], 1)).amin(0) - alpha * log_prob2)
            critic_step(critic, optimizers[1], torch.cat([o, a], 1), y)
            with frozen(critic):
                actor_loss = (alpha * log_prob - critic(torch.cat([o, action], 1)).amin(0)).mean()
            optimize(optimizers[0], actor_loss)
            torch._foreach_lerp_(targets, online, 0.005)

    return step


def td3(obs: int, act: int, batch: int, phase: int):
    """TD3: target smoothing; actor and targets every second step, the actor through Q_1 alone."""
    data = replay(obs, act)
    actor, critic = Actor(obs, act), Twin(obs + act)
    actor_target, critic_target = (copy.deepcopy(net).requires_grad_(False) for net in (actor, critic))
    actor_optimizer, critic_optimizer = adam(actor.parameters()), adam(critic.parameters())
    online = [*actor.parameters(), *critic.parameters()]
    targets = [*actor_target.parameters(), *critic_target.parameters()]
    steps = 0

    def step(count: int) -> None:
        nonlocal steps
        for _ in range(count):
            o, a, r, d, o2 = draw(data, batch)
            with torch.no_grad():
                a2 = torch.tanh(actor_target(o2)) + (0.2 * torch.randn(batch, act)).clamp_(-0.5, 0.5)
                y = r + d * critic_target(torch.cat([o2, a2.clamp_(-1.0, 1.0)], 1)).amin(0)
            critic_step(critic, critic_optimizer, torch.cat([o, a], 1), y)
            steps += 1
            if steps % 2 == 0:
                with frozen(critic):
                    actor_loss = -critic(torch.cat([o, torch.tanh(actor(o))], 1), towers=1).mean()
                optimize(actor_optimizer, actor_loss)
                torch._foreach_lerp_(targets, online, 0.005)

    return step


BARE = {"dqn": dqn, "sac": sac, "td3": td3}
