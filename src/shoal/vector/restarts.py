"""The restart budget: envs made anew after they failed (``restart_failed_envs``) and workers
started anew after they died (``recreate_failed_workers``) are counted, and too many within an
hour stop the run as a crash loop. The trainer keeps one over all its envs; a Ray rollout worker
keeps its own, so a crash loop inside it stops as it happens rather than after its fragment."""

from __future__ import annotations

import time
from collections import deque

from shoal.errors import EnvError, warn


class EnvRestarts:
    """Counts the envs (``restart_failed_envs``) and env worker processes (``recreate_failed_workers``)
    started anew after they failed, warns at each env's first failure and at each worker's death
    (the counts are in ``num_env_restarts`` / ``num_worker_restarts``), and stops the run when more
    than ``per_hour`` of them fall within an hour: a crash loop, not a flaky env."""

    def __init__(self, per_hour: int, env_name: str, warn: bool = True):
        """``warn=False``: count and keep to the budget only (a Ray worker's own check; the trainer warns)."""
        self.per_hour, self.env_name, self.warn = per_hour, env_name, warn
        self.total = 0
        """Envs made anew."""
        self.workers = 0
        """Worker processes started anew."""
        self._times: deque[float] = deque(maxlen=per_hour + 1)
        self._warned: set[int] = set()

    def take(self, envs: list[tuple[int, str]], workers: list[str]) -> None:
        """Count ``envs`` ((env id, error) pairs) and ``workers`` (why each died); both are emptied."""
        now = time.monotonic()
        for env_id, error in envs if self.warn else ():
            if env_id not in self._warned:
                self._warned.add(env_id)
                warn(
                    f"env '{self.env_name}' (env {env_id}) failed ({error}) and was made anew; its later failures "
                    f"are counted in num_env_restarts."
                )
        for why in workers if self.warn else ():
            warn(f"{why}; it was started anew with fresh envs (recreate_failed_workers).")
        self.total += len(envs)
        self.workers += len(workers)
        self._times.extend([now] * (len(envs) + len(workers)))
        last = f"env {envs[-1][0]}: {envs[-1][1]}" if envs else workers[-1]
        envs.clear()
        workers.clear()
        if len(self._times) > self.per_hour and now - self._times[0] < 3600:
            raise EnvError(
                f"{len(self._times)} envs or workers of '{self.env_name}' failed within the last hour, more than "
                f"max_restarts_per_hour={self.per_hour}: they keep failing (the last: {last}). Fix the env, or "
                f"raise max_restarts_per_hour if it is only flaky."
            )
