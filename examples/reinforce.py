"""REINFORCE with a learned baseline (Williams 1992), written on shoal's on-policy base.

The user guide's example of an algorithm of your own: a config (shoal's on-policy keys, its own
defaults as data, one key of its own) and an ``OnPolicyAlgorithm`` subclass that says what its
advantages are and what one minibatch step does. The base collects the rollout, bootstraps cut
episodes, runs the epochs of minibatches and names the statistics; the unchanged trainer adds
everything else (logging, checkpoints and exact resume, evaluation, video, worker processes):

    shoal train CartPole-v1 --algo examples.reinforce:Reinforce
    python examples/reinforce.py [total_timesteps]
"""

import sys
from typing import ClassVar

from pydantic import Field

import shoal
from shoal.algos import OnPolicyAlgorithm
from shoal.algos.losses import masked_mean
from shoal.algos.on_policy import rollout_gae
from shoal.config import OnPolicyConfig


class ReinforceConfig(OnPolicyConfig):
    """The on-policy keys (minibatches, epochs, Adam), REINFORCE's defaults, and ``vf_coef``."""

    # one gradient step per rollout of whole episodes, so each return is its episode's own
    DEFAULTS: ClassVar[dict] = dict(rollout_fragment_length=128, batch_mode="complete_episodes", gamma=0.99)
    DEFAULTS |= dict(learning_rate=3e-3, num_sgd_iter=1, sgd_minibatch_size=1_000_000, ent_coef=0.01)
    vf_coef: float = Field(0.5, ge=0.0)
    """Weight of the baseline's squared error."""


class Reinforce(OnPolicyAlgorithm[ReinforceConfig]):
    name = "REINFORCE"
    config_class = ReinforceConfig
    STAT_NAMES = ("policy_loss", "vf_loss", "entropy")

    def advantages(self, learner, rollout) -> None:
        """Discounted returns minus the baseline: GAE with lambda 1 (a cut episode is valued where it stops)."""
        advantage = rollout_gae(rollout, learner.config.gamma, 1.0)
        rollout["advantage"][:, :-1] = advantage
        rollout["return"][:, :-1] = advantage + rollout["value"][:, :-1]

    def step(self, learner, minibatch, stats) -> None:
        c, batch, mask = learner.config, minibatch.data, minibatch.mask
        logp, entropy, value = learner.policy.evaluate(
            batch["obs"], batch["action"], True, batch.get("action_mask", None)
        )
        terms = {
            "policy_loss": masked_mean(-logp * batch["advantage"], mask),
            "vf_loss": masked_mean(0.5 * (value - batch["return"]).square(), mask),
            "entropy": masked_mean(entropy, mask),
        }
        learner.optimizer.backward(terms["policy_loss"] + c.vf_coef * terms["vf_loss"] - c.ent_coef * terms["entropy"])
        learner.optimizer.step()  # clipped to max_grad_norm; a non-finite step is refused
        if stats is not None:
            stats.add({name: term.detach() for name, term in terms.items()})


if __name__ == "__main__":
    with shoal.Trainer(algo=Reinforce, env="CartPole-v1", seed=1, save_outputs=False) as trainer:
        trainer.learn(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
        print(trainer.evaluate(20))
