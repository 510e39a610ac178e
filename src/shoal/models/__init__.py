"""Networks, action distributions and normalizers."""

from shoal.models.flat import FlatAdam, flatten_parameters
from shoal.models.normalize import ObsNormalizer, RewardScaler, RunningMeanStd
from shoal.models.policy import ActorCritic

__all__ = ["ActorCritic", "FlatAdam", "ObsNormalizer", "RewardScaler", "RunningMeanStd", "flatten_parameters"]
