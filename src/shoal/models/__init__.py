"""Networks, action distributions, normalizers, and the policy contract."""

from shoal.models.catalog import build_model, build_policy
from shoal.models.normalize import ObsNormalizer, RewardScaler, RunningMeanStd
from shoal.models.policy import ActorCriticPolicy, Policy

__all__ = [
    "ActorCriticPolicy",
    "ObsNormalizer",
    "Policy",
    "RewardScaler",
    "RunningMeanStd",
    "build_model",
    "build_policy",
]
