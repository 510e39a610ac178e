"""Datasets on disk in Minari's layout, so that ``minari.load_dataset`` reads what shoal writes and
shoal reads what Minari's ``DataCollector`` writes.

A Minari dataset is a folder ``<id>/data/`` holding ``metadata.json`` (the spaces as JSON, the
episode and step counts, the format) and ``main_data.hdf5``, with one group ``episode_<k>`` per
episode: ``observations`` (``T + 1`` of them: the last is the episode's final observation),
``actions``, ``rewards``, ``terminations`` and ``truncations`` (``T`` each), and ``infos`` (arrays of
``T + 1`` rows, row ``t`` for observation ``t``). shoal writes this layout with h5py directly, so
writing needs neither Minari nor its ``jax`` dependency; reading another storage format (Minari's
``arrow``) goes through Minari when it is installed.

What Minari has no field for goes into ``infos`` (see ``docs/offline.md``): ``action_mask``
(the legal actions at each observation), ``action_log_prob`` (the behaviour policy's
log-probability of the action taken at each observation, NaN where unknown) and the values of
``info_keys`` (row ``t + 1`` holds the info of step ``t``; row 0, the reset's, is NaN). A
multi-agent run writes one dataset per policy, each agent's episode as one Minari episode.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from shoal.errors import ConfigError
from shoal.offline.structured import flatten_steps, is_structured, read_node

METADATA = "metadata.json"
MAIN_FILE = "main_data.hdf5"
FORMAT_VERSION = "0.5.0"
"""The Minari dataset version whose layout shoal writes: every Minari 0.5 release reads it."""

Array = npt.NDArray[Any]


class DatasetError(ConfigError):
    """A dataset that cannot be read: missing, truncated, of other spaces than the env's, or holding
    values that are not numbers. The message names the file and the field."""


@dataclass
class EpisodeArrays:
    """One agent's episode as a dataset stores it."""

    observations: Array
    """``[T + 1, ...]``: every observation, the final one last."""
    actions: Array
    rewards: Array
    terminations: Array
    truncations: Array
    infos: dict[str, Array] = field(default_factory=dict)
    """Arrays of ``T + 1`` rows (row ``t`` belongs to observation ``t``)."""

    def __len__(self) -> int:
        return len(self.rewards)


# ----- spaces -------------------------------------------------------------------------------------
def space_to_json(space: gym.Space[Any]) -> str:
    """``space`` as Minari's metadata holds it (Box, Discrete, MultiDiscrete, MultiBinary)."""
    if isinstance(space, gym.spaces.Box):
        body: dict[str, Any] = {"type": "Box", "dtype": str(space.dtype), "shape": list(space.shape)}
        body |= {"low": space.low.tolist(), "high": space.high.tolist()}
    elif isinstance(space, gym.spaces.Discrete):
        body = {"type": "Discrete", "dtype": "int64", "start": int(space.start), "n": int(space.n)}
    elif isinstance(space, gym.spaces.MultiDiscrete):
        body = {"type": "MultiDiscrete", "dtype": str(space.dtype), "nvec": space.nvec.tolist()}
        body["start"] = space.start.tolist()
    elif isinstance(space, gym.spaces.MultiBinary):
        body = {"type": "MultiBinary", "n": space.n}
    else:
        raise DatasetError(f"a dataset cannot hold the space {space}: use Box, Discrete, MultiDiscrete or MultiBinary.")
    return json.dumps(body)


def space_from_json(text: str, where: str) -> gym.Space[Any]:
    """The space Minari's metadata describes (``where`` names the file and key for errors)."""
    try:
        body = json.loads(text) if isinstance(text, str) else text
        kind = body["type"]
        if kind == "Box":
            dtype = np.dtype(body["dtype"])
            low, high = np.array(body["low"], dtype=dtype), np.array(body["high"], dtype=dtype)
            return gym.spaces.Box(low=low, high=high, shape=tuple(body["shape"]), dtype=dtype)
        if kind == "Discrete":
            return gym.spaces.Discrete(int(body["n"]), start=int(body.get("start", 0)))
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(body["nvec"], dtype=body["dtype"], start=body.get("start"))
        if kind == "MultiBinary":
            return gym.spaces.MultiBinary(body["n"])
        if kind == "Dict":  # observations only: read flattened (shoal.offline.structured)
            return gym.spaces.Dict({k: space_from_json(sub, where) for k, sub in body["subspaces"].items()})
        if kind == "Tuple":
            return gym.spaces.Tuple([space_from_json(sub, where) for sub in body["subspaces"]])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DatasetError(f"{where}: not a space Minari writes ({e!r}).") from None
    raise DatasetError(
        f"{where}: shoal reads Box, Discrete, MultiDiscrete, MultiBinary, Dict and Tuple spaces, not {kind}."
    )


def same_space(a: gym.Space[Any], b: gym.Space[Any]) -> bool:
    """Whether two spaces hold the same values (Box bounds compared with NaN-free equality)."""
    if type(a) is not type(b) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if isinstance(a, gym.spaces.Box):
        assert isinstance(b, gym.spaces.Box)
        return bool(np.array_equal(a.low, b.low) and np.array_equal(a.high, b.high))
    return bool(a == b)


# ----- writing ------------------------------------------------------------------------------------
class ShardWriter:
    """One Minari dataset being written into ``folder``: built in a hidden folder there and moved to
    the next free ``part-<k>-v0`` in one rename by ``close``, so a crash or a full disk leaves the
    whole shards before it and no part of this one, and writers sharing a folder (two runs with one
    ``output``) each take a name of their own."""

    def __init__(self, folder: Path, observation_space: gym.Space[Any], action_space: gym.Space[Any], **meta: Any):
        import h5py  # only when writing: the extra shoal[offline]

        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        # hidden (readers skip it), unique, and made with the umask's permissions (mkdtemp's are 0700)
        self.tmp = folder / f".part-{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp"
        (self.tmp / "data").mkdir(parents=True)
        self.metadata: dict[str, Any] = {
            "minari_version": FORMAT_VERSION,
            "data_format": "hdf5",
            "jpeg_encoding": False,
            "observation_space": space_to_json(observation_space),
            "action_space": space_to_json(action_space),
            "total_episodes": 0,
            "total_steps": 0,
            **meta,
        }
        self.file = h5py.File(self.tmp / "data" / MAIN_FILE, "w")

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return int(self.file.id.get_filesize())

    def add(self, episode: EpisodeArrays) -> None:
        # h5py's low-level calls: the same groups, datasets and attributes as its high-level API
        # writes, in half the time (a short episode costs more in those calls than in its bytes)
        from h5py import h5g

        index = self.metadata["total_episodes"]
        group = h5g.create(self.file.id, f"episode_{index}".encode())
        _write_scalar(group, b"id", index)
        _write_scalar(group, b"total_steps", len(episode))
        for key in ("observations", "actions", "rewards", "terminations", "truncations"):
            _write_array(group, key.encode(), getattr(episode, key))
        if episode.infos:
            infos = h5g.create(group, b"infos")
            for key, value in episode.infos.items():
                _write_array(infos, key.encode(), value)
        self.metadata["total_episodes"] = index + 1
        self.metadata["total_steps"] += len(episode)

    def close(self) -> Path:
        """Finish the file and move the shard into place; returns its final folder."""
        self.file.close()
        final = claim_shard(self.folder)
        self.metadata["dataset_id"] = f"{self.folder.name}/{final.name}"
        self.metadata["dataset_size"] = round(os.path.getsize(self.tmp / "data" / MAIN_FILE) / 1e6, 1)
        with open(self.tmp / "data" / METADATA, "w") as f:
            json.dump(self.metadata, f)
            f.flush()
            os.fsync(f.fileno())
        with open(self.tmp / "data" / MAIN_FILE, "rb+") as f:
            os.fsync(f.fileno())
        self.tmp.replace(final)  # onto the empty folder claimed, which no reader lists
        return final

    def abandon(self) -> None:
        """Drop the shard under way (after a failed write)."""
        with contextlib.suppress(Exception):  # a file that failed to grow may fail to close too
            self.file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def claim_shard(folder: Path) -> Path:
    """The next free ``part-<k>-v0`` of ``folder``, after every shard there, made as an empty folder:
    making it fails if another writer took that name first, and then the next is tried."""
    taken = [int(p.name.split("-")[1]) for p in folder.glob("part-*-v0") if p.name.split("-")[1].isdigit()]
    k = max(taken, default=-1) + 1
    while True:
        try:
            (folder / f"part-{k:05d}-v0").mkdir()
            return folder / f"part-{k:05d}-v0"
        except FileExistsError:
            k += 1


def _write_array(group: Any, name: bytes, array: Array) -> None:
    """A contiguous dataset ``name`` in ``group`` (an h5py GroupID) holding ``array``."""
    from h5py import h5d, h5s, h5t

    array = np.ascontiguousarray(array)
    dataset = h5d.create(group, name, h5t.py_create(array.dtype, logical=True), h5s.create_simple(array.shape))
    dataset.write(h5s.ALL, h5s.ALL, array)


def _write_scalar(group: Any, name: bytes, value: int) -> None:
    """An int64 attribute ``name`` of ``group`` (an h5py GroupID)."""
    from h5py import h5a, h5s, h5t

    data = np.asarray(value, dtype=np.int64)
    h5a.create(group, name, h5t.py_create(data.dtype), h5s.create(h5s.SCALAR)).write(data)


# ----- reading ------------------------------------------------------------------------------------
def dataset_folders(path: Path) -> list[Path]:
    """The ``data`` folders of the Minari datasets at ``path``: a dataset's folder or its ``data``
    folder, a policy's folder of shards, or a folder of several of them; hidden (unfinished) shards
    are skipped."""
    if (path / METADATA).is_file():
        return [path]
    if (path / "data" / METADATA).is_file():
        return [path / "data"]
    return sorted(
        meta.parent
        for meta in path.rglob(METADATA)
        if meta.parent.name == "data" and not any(part.startswith(".") for part in meta.relative_to(path).parts)
    )


def owning_policy(path: Path, folder: Path) -> str | None:
    """The policy whose shard ``folder`` (one of ``dataset_folders(path)``) is: a run's output holds
    ``<policy>/part-<k>-v0/data``, under ``rank-<k>/`` with torchrun, so the policy's folder is the
    third part from the end; None for a lone dataset."""
    parts = folder.relative_to(path).parts
    return parts[-3] if len(parts) > 2 else None


@dataclass
class DatasetFile:
    """One Minari dataset's metadata, read and checked; ``episodes()`` streams its episodes."""

    folder: Path
    metadata: dict[str, Any]
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]

    @classmethod
    def open(cls, folder: Path) -> DatasetFile:
        meta_path = folder / METADATA
        try:
            metadata = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            raise DatasetError(f"dataset file '{meta_path}' cannot be read: {e}.") from None
        for key in ("observation_space", "action_space", "total_episodes", "total_steps", "data_format"):
            if key not in metadata:
                raise DatasetError(f"dataset file '{meta_path}' has no field '{key}', which every Minari dataset has.")
        obs = space_from_json(metadata["observation_space"], f"'{meta_path}' field 'observation_space'")
        act = space_from_json(metadata["action_space"], f"'{meta_path}' field 'action_space'")
        return cls(folder, metadata, obs, act)

    @property
    def total_steps(self) -> int:
        return int(self.metadata["total_steps"])

    @property
    def total_episodes(self) -> int:
        return int(self.metadata["total_episodes"])

    def episodes(self, order: Sequence[int] | None = None) -> Iterator[EpisodeArrays]:
        """The episodes in ``order`` (indices; None: all in order), read one at a time, so a dataset
        larger than memory streams."""
        if self.metadata["data_format"] != "hdf5":
            yield from self._episodes_through_minari(range(self.total_episodes) if order is None else order)
            return
        import h5py

        path = self.folder / MAIN_FILE
        try:
            handle = h5py.File(path, "r")
        except OSError as e:
            raise DatasetError(f"dataset file '{path}' cannot be read as HDF5 (truncated or not HDF5?): {e}.") from None
        with handle:
            for k in range(self.total_episodes) if order is None else order:
                name = f"episode_{k}"
                group = handle.get(name)
                if group is None:
                    raise DatasetError(
                        f"dataset file '{path}' lists {self.total_episodes} episodes but has no '{name}'."
                    )
                yield self._read_group(group, f"'{path}' {name}")

    def _read_group(self, group: Any, where: str) -> EpisodeArrays:
        """One episode's arrays (one lookup per field: an HDF5 lookup costs more than a short read)."""
        arrays = {}
        for key in ("observations", "actions", "rewards", "terminations", "truncations"):
            field = group.get(key)
            if field is None:
                raise DatasetError(f"dataset {where} has no field '{key}'.")
            space = self.observation_space if key == "observations" else None
            try:
                if space is not None and is_structured(space):  # per key in Minari's layout: flat rows here
                    arrays[key] = flatten_steps(space, read_node(field, space))
                elif hasattr(field, "shape"):
                    arrays[key] = field[()]
                else:
                    raise KeyError("a group (a Dict or Tuple space) where shoal reads an array")
            except KeyError as e:
                raise DatasetError(f"dataset {where} field '{key}' does not hold its space: {e.args[0]}.") from None
            except OSError as e:
                raise DatasetError(f"dataset {where} field '{key}' cannot be read (a truncated file?): {e}.") from None
        infos = group.get("infos")
        values = {} if infos is None else {key: value[()] for key, value in infos.items() if hasattr(value, "shape")}
        return EpisodeArrays(**arrays, infos=values)

    def _episodes_through_minari(self, order: Iterable[int]) -> Iterator[EpisodeArrays]:
        try:
            import minari
        except ImportError:
            raise DatasetError(
                f"dataset '{self.folder}' is stored as '{self.metadata['data_format']}', which shoal reads through "
                f"Minari: pip install 'shoal[offline]' (or store it as hdf5)."
            ) from None
        space, dataset = self.observation_space, minari.MinariDataset(self.folder)
        for episode in (e for k in order for e in dataset.iterate_episodes([k])):  # one at a time: streamed
            infos = {k: v for k, v in (episode.infos or {}).items() if isinstance(v, np.ndarray)}
            obs = episode.observations
            yield EpisodeArrays(
                flatten_steps(space, obs) if is_structured(space) else np.asarray(obs),
                np.asarray(episode.actions),
                np.asarray(episode.rewards),
                np.asarray(episode.terminations),
                np.asarray(episode.truncations),
                infos,
            )
