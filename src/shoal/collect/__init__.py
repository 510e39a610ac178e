"""Collection: the policy acting on a backend, writing the rollout."""

from shoal.collect.collector import Collector
from shoal.collect.episodes import EpisodeTracker

__all__ = ["Collector", "EpisodeTracker"]
