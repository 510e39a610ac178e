"""Collection: the policies acting on a backend, writing the rollout."""

from shoal.collect.collector import Collector, Truncations
from shoal.collect.episodes import EPISODE_CONTINUES, EpisodeTracker

__all__ = ["EPISODE_CONTINUES", "Collector", "EpisodeTracker", "Truncations"]
