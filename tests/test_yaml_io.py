"""Every file shoal reads and every ``key=value`` value go through one safe, bounded YAML reader
(``shoal.yaml_io``): an alias bomb, a huge or deeply nested document and a syntax error each end
in one ConfigError naming ``file:line:column``, and on the command line in exit code 2. The fuzz
tests (hypothesis) feed random YAML text and random key/value pairs to the config, experiments
and suite loaders and to ``parse_overrides``: each input is read or refused with a ConfigError."""

from __future__ import annotations

import itertools
import re
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.benchmark import load_suite
from shoal.cli import main
from shoal.config import DQNConfig, PPOConfig, SACConfig, load_yaml, parse_overrides
from shoal.config.tuned import TunedStart, start_from_tuned
from shoal.envs.registry import gym_make
from shoal.errors import ConfigError, EnvError
from shoal.experiments.spec import load_experiments
from shoal.train.setup import algorithm_settings

LEVELS = "abcdefghi"


def alias_bomb(indent: str) -> str:
    """Nine levels of nine aliases each (a "billion laughs"): 9**9 strings once expanded."""
    lines = [f'{indent}a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for below, level in itertools.pairwise(LEVELS):
        lines.append(f"{indent}{level}: &{level} [{', '.join([f'*{below}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_under_env_config_is_refused_at_once_and_anchors_still_work(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("algo: ppo\nenv: CartPole-v1\nenv_config:\n" + alias_bomb("  "))
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb\.yaml:\d+:\d+: aliases here expand to more than 10,000 nodes"):
        load_yaml(bomb)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 0.5 and peak < 5e6, (seconds, peak)

    flow = "{" + alias_bomb("").strip().replace("\n", ", ") + "}"
    with pytest.raises(ConfigError, match="^env_config=.*aliases here expand to more than 10,000 nodes"):
        parse_overrides([f"env_config={flow}"])

    reused = tmp_path / "anchors.yaml"
    reused.write_text(
        "shared: &shared {learning_rate: 0.001, model_config: {hiddens: [64, 64]}}\n"
        "policies:\n  a: *shared\n  b: {<<: *shared, learning_rate: 0.01}\n"
    )
    shared = {"learning_rate": 0.001, "model_config": {"hiddens": [64, 64]}}
    assert load_yaml(reused)["policies"] == {"a": shared, "b": shared | {"learning_rate": 0.01}}


def test_aliases_of_a_long_string_are_bounded_in_characters_too(tmp_path):
    """An alias of a scalar is as short as one of a list, and copies all its text when expanded: one
    400 KB anchored string and 150,000 aliases of it are 1 MB of YAML, and 60 GB once written out
    (a run's config.yaml, gymnasium's message that repeats an env's keyword arguments)."""
    bomb = tmp_path / "strings.yaml"
    bomb.write_text("a: &a " + "x" * 400_000 + "\nb: [" + ", ".join(["*a"] * 150_000) + "]\n")
    assert bomb.stat().st_size < 1 << 20
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"strings\.yaml:2:4: aliases here repeat more than 100,000 characters"):
        load_yaml(bomb)
    assert time.perf_counter() - start < 2
    value = "{a: &a " + "x" * 10_000 + ", b: [" + ", ".join(["*a"] * 20) + "]}"
    with pytest.raises(ConfigError, match=r"^env_config=.*aliases here repeat more than 100,000 characters"):
        parse_overrides([f"env_config={value}"])

    reused = tmp_path / "reused.yaml"
    reused.write_text("a: &a " + "x" * 30_000 + "\nb: [*a, *a, *a]\n")  # 90,000 characters more: accepted
    assert load_yaml(reused)["b"] == ["x" * 30_000] * 3


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "seed: 1\nmodel_config: {hiddens: [64, 64}\n",
            r":2:32: (did not find )?expected ',' or ']'",
        ),  # libyaml's words, or PyYAML's
        ("seed: !!int x\n", r":1:7: not a valid int \(invalid literal"),
        ("start: 2020-13-45\n", r":1:8: not a valid timestamp \(month must be in 1\.\.12\)"),
        ("a: [1, 2]\n---\nb: 2\n", r":2:1: but found another document"),
        ("a: &a [*a]\n", r":1:4: an alias inside this node refers to the node itself"),
        ("a: " + "[" * 150 + "]" * 150 + "\n", r":1:\d+: nested more than 100 levels deep"),
        ("a: 1\nb: \x01\n", r":2:4: YAML does not allow the character '\\x01'"),
        ("1: one\n", r": the key 1 must be a name"),
    ],
)
def test_a_document_not_read_is_one_config_error_naming_file_line_and_column(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}{message}"):
        load_yaml(path)


def test_sizes_are_bounded_and_user_values_are_quoted_short(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than 1,048,576 bytes"):
        load_yaml(big)
    with pytest.raises(ConfigError, match=r"the value is larger than 16,384 bytes") as refused:
        parse_overrides(["seed=" + "1" * 20_000])
    assert len(str(refused.value)) < 400
    # a file not UTF-8, and argv bytes that are not UTF-8 (they reach Python as lone surrogates)
    (tmp_path / "latin1.yaml").write_bytes("a: 1\nb: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml:2:7: not UTF-8 text"):
        load_yaml(tmp_path / "latin1.yaml")
    with pytest.raises(ConfigError, match="^seed=1\udcff: the value is not UTF-8 text"):
        parse_overrides(["seed=1\udcff"])

    # every message that quotes what the user gave stays readable, however large that was (a
    # message may list keys too: they are shoal's, a known length)
    long = "x" * 100_000
    tag = tmp_path / "tag.yaml"
    tag.write_text(f"a: !!python/object:{long} 1\n")
    spec = {"algo": "ppo", "env": "CartPole-v1", "stop": {"timesteps_total": 1}}
    refusals: list[tuple[type[Exception], Any]] = [
        (ConfigError, lambda: load_yaml(tag)),
        (ConfigError, lambda: parse_overrides([f"{long}.="])),
        (ConfigError, lambda: parse_overrides([f"seed=[{long}"])),
        (ConfigError, lambda: PPOConfig.build(learning_rate=long)),
        (ConfigError, lambda: PPOConfig.build(**{long: 1})),
        (ConfigError, lambda: load_experiments({"e": spec | {"seeds": [long]}})),
        (ConfigError, lambda: load_experiments({"e": spec | {long: 1}})),
        (ConfigError, lambda: load_experiments({"e": spec | {"config": {"ent_coef": {"uniform": [long]}}}})),
        (EnvError, lambda: gym_make(gym.make, "CartPole-v1", {"bogus": long})),  # gymnasium repeats the kwargs
    ]
    for error, refuse in refusals:
        with pytest.raises(error) as refused:
            refuse()
        assert "more characters)" in str(refused.value) and len(str(refused.value)) < 2000, str(refused.value)[:300]


LONG = "x" * 100_000
QUOTED_SHORT = {  # each check of a config that quotes a value, given a 100,000-character one
    "algo": lambda: algorithm_settings(None, "Trainer", {"algo": LONG}),
    "algo not a name": lambda: algorithm_settings(None, "Trainer", {"algo": [LONG]}),
    "model": lambda: PPOConfig.build(model=LONG),
    "model not a name": lambda: PPOConfig.build(model=[LONG]),
    "model_config key": lambda: PPOConfig.build(model_config={LONG: 1}),
    "device": lambda: PPOConfig.build(device=LONG),
    "tuned": lambda: start_from_tuned({"tuned": LONG}, "ppo", PPOConfig),
    "ray_address": lambda: PPOConfig.build(ray_address=LONG, backend="local"),
    "advantage_estimator": lambda: PPOConfig.build(advantage_estimator=LONG),
    "advantage_estimator spec": lambda: PPOConfig.build(advantage_estimator=f"{LONG}:f"),
    "env, complete episodes": lambda: PPOConfig.build(env=LONG, batch_mode="complete_episodes"),
    "Atari env, horizon": lambda: PPOConfig.build(env=f"ALE/{LONG}", horizon=10),
    "policy id": lambda: PPOConfig.build(policies={LONG: {"bogus": 1}}),
    "policy id, bad override": lambda: PPOConfig.build(policies={LONG: {"learning_rate": -1.0}}),
    "policy override key": lambda: PPOConfig.build(policies={"a": {LONG: 1}}),
    "policy model_config": lambda: PPOConfig.build(policies={"a": {"model_config": LONG}}),
    "policy to train": lambda: PPOConfig.build(policies=["a"], policies_to_train=[LONG]),
    "many policies": lambda: PPOConfig.build(policies=[f"p{i}" for i in range(20_000)], policies_to_train=["q"]),
}


@pytest.mark.parametrize("refuse", QUOTED_SHORT.values(), ids=QUOTED_SHORT.keys())
def test_config_checks_quote_what_the_user_gave_short(refuse):
    with pytest.raises(ConfigError) as refused:
        refuse()
    assert "more characters)" in str(refused.value) and len(str(refused.value)) < 2000, str(refused.value)[:300]


def test_an_env_id_too_long_for_a_file_name_has_no_tuned_config():
    assert start_from_tuned({"env": LONG}, "ppo", PPOConfig) == ({"env": LONG}, TunedStart())


def test_algo_given_twice_on_the_command_line_is_quoted_short(tmp_path, capsys):
    (tmp_path / "long.yaml").write_text(f"algo: y{LONG}\n")
    assert main(["train", "CartPole-v1", "--algo", LONG, "--config", str(tmp_path / "long.yaml")]) == 2
    err = capsys.readouterr().err
    assert "disagree" in err and err.count("more characters)") == 2 and len(err) < 2000, err[:300]


@pytest.mark.parametrize(
    "command",
    [["train", "--config", "{file}"], ["tune", "{file}", "--out", "{out}"], ["benchmark", "{file}", "--out", "{out}"]],
)
def test_a_syntax_error_on_the_command_line_exits_2_naming_file_line_and_column(tmp_path, capsys, command):
    path = tmp_path / "bad.yaml"
    path.write_text("algo: ppo\nenv: CartPole-v1\nmodel_config: {hiddens: [64, 64}\n")
    assert main([word.format(file=path, out=tmp_path / "out") for word in command]) == 2
    err = capsys.readouterr().err
    assert re.search(f"^shoal: error: {re.escape(str(path))}:3:32: (did not find )?expected ',' or ']'", err)
    assert "Traceback" not in err and len(err.splitlines()) == 1


# ----- fuzz: random YAML text, random key/value pairs ------------------------------------------
# pieces of YAML syntax, tags, odd scalars and shoal's keys: random text alone rarely makes a
# document that parses, and these reach the constructor and the loaders' checks
PIECES = [
    *("a", "b", "algo", "ppo", "env", "CartPole-v1", "env_config", "config", "stop", "seeds"),
    *("timesteps_total", "learning_rate", "model_config", "hiddens", "runs", "overrides", "grid_search"),
    *(":", ": ", " ", "\n", "\n  ", "- ", ",", "[", "]", "{", "}", "'", '"', "#", "? ", "|", ">", "\t"),
    *("&x ", "*x", "&y ", "*y", "<<: ", "---\n", "...\n", "%YAML 1.1\n", "!foo ", "!!python/object:os.system "),
    *("!!int ", "!!float ", "!!bool ", "!!str ", "!!timestamp ", "!!binary ", "!!set ", "!!omap ", "!!null "),
    *("0x", "0o", "1e999", "-.inf", ".nan", "2020-13-45", "2020-01-01", "12:30:00", "null", "~", "true"),
    *("1", "-1", "0", "1_0", "[1, 2]", "{uniform: [0, 1]}", "\x00", "\udcff", "\ufeff", "é"),
]
yaml_text = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=3)), max_size=40).map("".join)
# shoal's keys, so that values reach the config's checks and not only the unknown-key one
CONFIG_KEYS = sorted({*PPOConfig.keys(), *DQNConfig.keys(), *SACConfig.keys()})
keys = st.one_of(st.sampled_from(["algo", "env", "tuned", *CONFIG_KEYS]), st.text(), st.integers())
# values the checks compare with (so that others get past them), and each made 100,000 characters long
WORDS = ["ppo", "dqn", "sac", "local", "ray", "complete_episodes", "cpu", "cuda:0", "gae", "ALE/Pong-v5", "a.b:c", "x"]
words = st.sampled_from(WORDS)
long_words = words.map(lambda word: word + "x" * 100_000)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), st.dates(), st.binary(max_size=8)
) | st.one_of(words, long_words)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=4)
    ),
    max_leaves=12,
)
# a loader that hangs or blows up shows as a missed deadline; the first example imports the algorithms
# floats are drawn: a Trainer built earlier in the process may have turned on flush-to-zero
pytestmark = pytest.mark.usefixtures("no_flush_denormal")

FUZZ = settings(deadline=timedelta(seconds=5), max_examples=150, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "fuzz.yaml"


def dump(data: Any, **style: Any) -> str:
    """``yaml.safe_dump``, in libyaml's emitter: PyYAML's own takes a third of a second for 100,000 characters."""
    return yaml.dump(data, Dumper=yaml.CSafeDumper, **style)


def refused_or_read(read: Any, *args: Any) -> None:
    """``read(*args)``: any result, or a ConfigError of a readable length (it may list shoal's keys);
    any other exception fails the test."""
    try:
        read(*args)
    except ConfigError as e:
        assert len(str(e)) < 4000, str(e)[:300]


def read_and_build(path: Path) -> None:
    """What ``shoal train --config path`` does before training: read the file, then build the run's
    config (its algorithm's class, over the tuned config for its env)."""
    algo, merged, tuned = algorithm_settings(None, "Trainer", load_yaml(path))
    with tuned.named_in_errors():
        algo.config_class.build(**merged)


@FUZZ
@given(text=yaml_text)
def test_random_yaml_text_is_read_or_refused_with_a_config_error(fuzz_file: Path, text: str):
    fuzz_file.write_bytes(text.encode("utf-8", "surrogatepass"))
    for read in (load_yaml, read_and_build, load_experiments, load_suite):
        refused_or_read(read, fuzz_file)
    refused_or_read(parse_overrides, [f"env_config={text}"])
    refused_or_read(parse_overrides, [text])


@FUZZ
@given(pairs=st.dictionaries(keys, values, max_size=6), experiment=st.dictionaries(keys, values, max_size=3))
def test_random_key_value_pairs_are_read_or_refused_with_a_config_error(
    fuzz_file: Path, pairs: dict[Any, Any], experiment: dict[Any, Any]
):
    for key, value in pairs.items():
        refused_or_read(parse_overrides, [f"{key}={dump(value, default_flow_style=True)}"])
        refused_or_read(parse_overrides, [f"{key}={value}"])
    spec = {"algo": "ppo", "env": "CartPole-v1", "stop": {"timesteps_total": 1000}, "config": pairs}
    fuzz_file.write_text(dump(pairs))
    refused_or_read(read_and_build, fuzz_file)
    for document in (pairs, {"sweep": spec}, {"sweep": spec | experiment}):
        fuzz_file.write_text(dump(document))
        refused_or_read(load_yaml, fuzz_file)
        refused_or_read(load_experiments, fuzz_file)


@FUZZ
@given(
    mapping=st.dictionaries(
        st.sampled_from(["algo", "env", "tuned", *CONFIG_KEYS]), st.one_of(words, long_words, values), max_size=4
    )
)
def test_random_settings_build_a_config_or_are_refused_briefly(fuzz_file: Path, mapping: dict[str, Any]):
    """Each of shoal's keys, given a value of 100,000 characters among others: the message that
    refuses it stays short."""
    fuzz_file.write_text(dump(mapping))
    refused_or_read(read_and_build, fuzz_file)
