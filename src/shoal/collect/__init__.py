"""Collection: the policies acting on a backend, writing the rollout."""

from shoal.collect.collector import Collector
from shoal.collect.episodes import EPISODE_CONTINUES, EpisodeTracker
from shoal.collect.truncations import Truncations

__all__ = ["EPISODE_CONTINUES", "Collector", "EpisodeTracker", "Truncations"]
