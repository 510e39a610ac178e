"""Ray rollout workers on two nodes: a head node and a second one, both on this machine (Ray's
``cluster_utils.Cluster``), told apart by a custom resource each. The workers spread over both
nodes, a run learns, and losing the second node mid-run either brings its worker back on the head
(``recreate_failed_workers``) or checkpoints the learner and stops with one message."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

import shoal

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

# Ray is optional, and imported where it is used: only by these slow tests, so that leaving them
# out does not pay for the import
if importlib.util.find_spec("ray") is None:
    pytest.skip("could not import 'ray'", allow_module_level=True)

# Logical CPUs. The head has room for both workers (and their replacements once the second node
# is gone), and so many CPUs that Ray's default placement, which fills the driver's node up to
# half its CPUs first, would put both workers on it.
HEAD_CPUS, SECOND_CPUS = 4, 2


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    """A head node with the driver connected to it; ``second_node`` adds the other. The session's
    one-node Ray (``ray_cluster`` in conftest.py), if earlier tests started it, is shut down first
    (a process holds one Ray connection) and started again, as conftest starts it, afterwards."""
    import ray
    from ray.cluster_utils import Cluster

    # the actors run ``node_of``, and cannot import tests
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    restore = ray.is_initialized()
    if restore:
        ray.shutdown()
    # Cluster writes its address to <RAY_TMPDIR>/ray/ray_current_cluster, where any other
    # ray.init() on this machine would find it and join this cluster instead of starting its own
    temp_dir = tempfile.mkdtemp(prefix="shoal-ray-")  # short: Ray's socket paths must fit in 107 bytes
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("RAY_TMPDIR", temp_dir)
            cluster = Cluster()
            try:
                cluster.add_node(num_cpus=HEAD_CPUS, resources={"head": 1}, include_dashboard=False)
                ray.init(address=cluster.address, log_to_driver=False)
                yield cluster
            finally:
                ray.shutdown()
                cluster.shutdown()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
        if restore:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


@pytest.fixture
def second_node(two_nodes: Cluster) -> Iterator[Any]:
    node = two_nodes.add_node(num_cpus=SECOND_CPUS, resources={"second": 1})
    yield node
    if node in two_nodes.worker_nodes:  # not removed by the test
        two_nodes.remove_node(node)


def node_of(worker: Any) -> str:
    """Run in a rollout worker's actor (``__ray_call__``): the id of the node it runs on."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


def worker_nodes(algo: shoal.Trainer) -> list[str]:
    """Where each of ``algo``'s rollout workers runs: "head" or "second", by the nodes' resources."""
    import ray

    names = {node["NodeID"]: name for node in ray.nodes() for name in ("head", "second") if name in node["Resources"]}
    return [names[node] for node in ray.get([worker.__ray_call__.remote(node_of) for worker in algo.backend.workers])]


@dataclass
class RemoveNode(shoal.Callback):
    """Kills ``node`` (all its Ray processes, the worker actors on it among them) after iteration
    ``after``: the next iteration finds its worker dead."""

    cluster: Cluster
    node: Any
    after: int

    def on_train_result(self, trainer: Any, result: dict[str, Any]) -> None:
        if trainer.iteration == self.after:
            self.cluster.remove_node(self.node)


@pytest.mark.slow
def test_workers_spread_over_two_nodes_learn_cartpole_and_the_lost_node_s_worker_comes_back_on_the_head(
    two_nodes, second_node
):
    """PPO with the defaults of the short CartPole run in test_ppo.py, losing the second node a
    third of the way through: its worker is started anew on the head, and the run still learns."""
    removal = RemoveNode(two_nodes, second_node, after=50)  # of the 157 iterations of 256 steps
    config = dict(env="CartPole-v1", backend="ray", ray_address=two_nodes.address, num_workers=2, seed=1)
    config |= dict(recreate_failed_workers=True, callbacks=[removal], save_outputs=False, verbose=0)
    died = r"Ray rollout worker \d \(envs \d-\d of 'CartPole-v1'\) died .* started anew"
    with shoal.PPO(**config) as algo, pytest.warns(UserWarning, match=died):
        assert sorted(worker_nodes(algo)) == ["head", "second"]
        result = algo.learn(40_000)
        assert result["num_worker_restarts"] == 1
        assert worker_nodes(algo) == ["head", "head"]
        assert result["timesteps_total"] == algo.iteration * algo.config.train_batch_size  # the lost fragment resampled
        assert algo.evaluate(20)["episode_reward_mean"] >= 300


@pytest.mark.slow
def test_without_recreate_failed_workers_a_lost_node_stops_the_run_after_the_learner_is_checkpointed(
    two_nodes, second_node, tmp_path
):
    run = tmp_path / "run"
    config = dict(env="CartPole-v1", backend="ray", ray_address=two_nodes.address, num_workers=2, num_envs=4)
    config |= dict(rollout_fragment_length=64, seed=2, run_dir=str(run), verbose=0)
    with shoal.PPO(**config) as algo, pytest.raises(shoal.EnvError) as caught:
        assert sorted(worker_nodes(algo)) == ["head", "second"]
        algo.train()
        two_nodes.remove_node(second_node)
        algo.train()
    message = str(caught.value)
    assert re.match(r"Ray rollout worker \d \(envs \d-\d of 'CartPole-v1'\) died \(", message), message
    assert "; set recreate_failed_workers=True" in message
    assert message.endswith(f"iteration 1 was checkpointed first; continue with: shoal train --resume {run}")
    with (
        pytest.warns(UserWarning, match="starts new episodes"),  # the envs were in the actors
        pytest.warns(UserWarning, match="written as a Ray worker died and holds no worker's state"),
        shoal.PPO.from_checkpoint(run) as resumed,
    ):
        assert worker_nodes(resumed) == ["head", "head"]  # the printed resume goes on with the node that is left
        assert resumed.iteration == 1 and resumed.train()["timesteps_total"] == 2 * 256
