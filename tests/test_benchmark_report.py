"""``shoal benchmark``'s report: the table's rows, scores and notes, its curves, and the runs kept
in the repository (``benchmarks/keep_runs.py``)."""

import json
from pathlib import Path

import pytest

from benchmarks.keep_runs import keep_finished
from shoal.benchmark import load_references
from shoal.benchmark.references import Reference, References
from shoal.benchmark.report import collect_rows, env_family, markdown_table, write_report
from shoal.benchmark.runner import PARTS, RESULT, SPEC, RunSpec, Suite

REFS = References(
    {
        ("ppo", "CartPole-v1"): Reference("ppo", "CartPole-v1", 500.0, 100_000, "zoo"),
        ("dqn", "Acrobot-v1"): Reference("dqn", "Acrobot-v1", -80.0, 100_000, "zoo"),
    },
    {"Acrobot-v1": -500.0},
)


def finish(out: Path, spec: RunSpec, ret: float, steps: int = 50_000, seconds: float = 10.0) -> None:
    """A finished run's files, as a benchmark leaves them (the budget asked for: ``steps`` rounded
    down to a thousand, the last iteration overrunning it)."""
    run_dir = spec.directory(out)
    run_dir.mkdir(parents=True)
    summary = {"timesteps_total": steps, "time_total_s": seconds, "evaluation": {"episode_reward_mean": ret}}
    (run_dir / RESULT).write_text(json.dumps(summary))
    (run_dir / "config.yaml").write_text(f"total_timesteps: {steps // 1000 * 1000}\n")


def test_score_is_a_share_of_the_reference_or_of_the_way_up_from_random():
    assert REFS.score("ppo", "CartPole-v1", 450.0) == pytest.approx(0.9)
    assert REFS.score("dqn", "Acrobot-v1", -122.0) == pytest.approx(378 / 420)  # (-122 + 500) / (-80 + 500)
    assert REFS.score("sac", "CartPole-v1", 1.0) is None


def test_table_rows_judge_each_algo_and_env_over_its_seeds(tmp_path):
    specs = [RunSpec("ppo", "CartPole-v1", s) for s in (1, 2, 3)] + [RunSpec("dqn", "Acrobot-v1", s) for s in (1, 2)]
    for spec, ret in zip(specs, (500.0, 480.0, 490.0, -90.0)):  # the last dqn seed has not finished
        finish(tmp_path, spec, ret, seconds=20.0)
    suite = Suite(specs, {"dqn/Acrobot-v1": "fewer seeds on purpose"})
    table, notes = markdown_table(collect_rows(suite, tmp_path), REFS, suite.notes)
    lines = table.splitlines()
    assert lines[0] == "| env | algo | steps | return | seeds | wall time | SPS | reference | vs reference |"
    assert lines[2] == "| **classic control** | | | | | | | | |"
    assert lines[3] == "| CartPole-v1 | ppo | 50k | 490.0 ± 8.2 | 3 | 20 s | 2,500 | 500 @ 100k (zoo) | 98%: meets |"
    assert lines[4].startswith("| Acrobot-v1 | dqn | 50k | -90.0 | 1 of 2 |")
    assert lines[4].endswith("| 97%: short (note 1) |")
    assert notes == ["dqn on Acrobot-v1: fewer seeds on purpose; 1 seed(s) unfinished."]

    finish(tmp_path, RunSpec("ppo", "CartPole-v1", 4), 500.0, steps=100_800)  # a last iteration past 100k
    table, notes = markdown_table(collect_rows(Suite([RunSpec("ppo", "CartPole-v1", 4)]), tmp_path), REFS, {})
    assert table.splitlines()[3].endswith("| 100%: meets |") and notes == []


def test_rows_over_the_reference_budget_or_below_it_cite_a_note_that_says_why(tmp_path):
    finish(tmp_path, RunSpec("ppo", "CartPole-v1", 1), 500.0, steps=200_000)
    finish(tmp_path, RunSpec("dqn", "Acrobot-v1", 1), -300.0)
    finish(tmp_path, RunSpec("td3", "Pendulum-v1", 1), -0.04)
    suite = Suite([RunSpec(a, e, 1) for a, e in (("ppo", "CartPole-v1"), ("dqn", "Acrobot-v1"), ("sac", "Foo-v0"))])
    suite.runs.append(RunSpec("td3", "Pendulum-v1", 1))
    table, notes = markdown_table(collect_rows(suite, tmp_path), REFS, {"td3/Pendulum-v1": "a note"})
    assert "| 100%: short (note 1) |" in table and "| 47%: short (note 2) |" in table  # 47.6%: 89.6% misses 90%
    assert "| Pendulum-v1 | td3 | 50k | 0.0 | 1 |" in table  # -0.04 shows as 0.0, not -0.0
    assert "| no reference (note 3) |" in table
    assert "| Foo-v0 | sac | - | - | 0 of 1 | - | - | - | not run |" in table
    unrun = collect_rows(Suite([RunSpec("sac", "Foo-v0", 1)]), tmp_path)
    unrun_table, unrun_notes = markdown_table(unrun, REFS, {"sac/Foo-v0": "later"})
    assert unrun_table.rstrip().endswith("| not run (note 1) |") and unrun_notes == ["sac on Foo-v0: later."]
    assert notes == [
        "ppo on CartPole-v1: a budget of 200k, more than the reference's 100k.",
        "dqn on Acrobot-v1: below 90% of the reference.",
        "td3 on Pendulum-v1: a note.",
    ]


def test_rows_are_grouped_by_env_family_in_a_fixed_order(tmp_path):
    envs = ["MinAtar/Breakout-v1", "BipedalWalker-v3", "CartPole-v1", "LunarLander-v3", "Pendulum-v1", "Foo-v0"]
    suite = Suite([RunSpec("ppo", env, 1) for env in envs] + [RunSpec("dqn", "CartPole-v1", 1)])
    rows = collect_rows(suite, tmp_path)
    assert [(r.env, r.algo) for r in rows] == [
        ("CartPole-v1", "ppo"),
        ("CartPole-v1", "dqn"),
        ("Pendulum-v1", "ppo"),
        ("BipedalWalker-v3", "ppo"),
        ("LunarLander-v3", "ppo"),
        ("MinAtar/Breakout-v1", "ppo"),
        ("Foo-v0", "ppo"),
    ]
    headings = [line for line in markdown_table(rows, REFS, {})[0].splitlines() if line.startswith("| **")]
    assert [h.split("**")[1] for h in headings] == ["classic control", "Box2D", "MinAtar", "other"]
    families = [env_family(e) for e in ("HalfCheetah-v5", "ALE/Pong-v5", "ale_py:ALE/Pong-v5", "vmas:balance")]
    assert families == ["MuJoCo", "Atari", "Atari", "multi-agent"]


def test_report_files_carry_the_command_that_regenerates_them(tmp_path):
    spec = RunSpec("ppo", "CartPole-v1", 1)
    finish(tmp_path, spec, 500.0)
    md, _ = write_report(Suite([spec]), tmp_path, REFS, "shoal benchmark --algo ppo --env CartPole-v1")
    assert "```bash\nshoal benchmark --algo ppo --env CartPole-v1\n```" in md.read_text()
    finish(tmp_path, RunSpec("dqn", "Acrobot-v1", 1), -300.0)
    md, _ = write_report(Suite([spec, RunSpec("dqn", "Acrobot-v1", 1)]), tmp_path, REFS, "shoal benchmark")
    assert md.read_text().endswith(
        "| 47%: short (note 1) |\n\nNotes:\n\n1. dqn on Acrobot-v1: below 90% of the reference.\n"
    )


def test_shipped_references_load():
    refs = load_references()
    assert refs.published[("ppo", "LunarLander-v3")].steps == 1_000_000
    assert refs.random["Pendulum-v1"] < -1000


def test_the_curve_grid_draws_the_seeds_of_a_run_as_one_line_beside_its_reference(tmp_path, monkeypatch):
    import matplotlib.figure

    from shoal.benchmark.report import plot_grid

    specs = [RunSpec("ppo", "CartPole-v1", s) for s in (1, 2, 3)]
    for spec, extra in zip(specs, ("", "batch_mode: truncate_episodes\n", "info_keys: []\n")):  # older and newer
        run_dir = spec.directory(tmp_path)
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(f"algo: ppo\nenv: CartPole-v1\nseed: {spec.seed}\n{extra}")
        rows = [{"timesteps_total": t, "rollout/episode_reward_mean": t / 10 + spec.seed} for t in (1000, 2000)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, path, **options: figures.append(fig))
    plot_grid(Suite(specs), tmp_path, REFS)
    (ax, *_) = figures[0].axes
    assert [line.get_label() for line in ax.get_lines()] == ["ppo (3 seeds)", "ppo reference"]
    assert ax.get_lines()[1].get_ydata()[0] == 500.0


def test_kept_runs_are_the_finished_ones_without_checkpoints_and_make_the_same_table(tmp_path):
    out, kept = tmp_path / "out", tmp_path / "kept"
    done, running = RunSpec("sac", "Pendulum-v1", 1), RunSpec("sac", "Pendulum-v1", 2)
    finish(out, done, -150.0)
    for spec in (done, running):
        run_dir = spec.directory(out)
        (run_dir / "checkpoints" / "checkpoint_000010").mkdir(parents=True)
        for name in (SPEC, PARTS, "metrics.jsonl", "stderr.log"):
            (run_dir / name).write_text("{}\n")
    assert keep_finished(out, kept) == [done.directory(out).relative_to(out)]
    assert sorted(p.name for p in done.directory(kept).iterdir()) == sorted(
        [RESULT, SPEC, PARTS, "config.yaml", "metrics.jsonl"]
    )
    assert not running.directory(kept).exists()
    suite = Suite([done, running])
    assert markdown_table(collect_rows(suite, kept), REFS, {}) == markdown_table(collect_rows(suite, out), REFS, {})


def test_git_keeps_what_keep_runs_copies_and_leaves_out_the_rest():
    """The root .gitignore leaves out every runs/ folder; benchmarks/records takes its kept runs back."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    run = "benchmarks/records/readme/runs/sac/Pendulum-v1/seed_1"
    kept = [f"{run}/{name}" for name in ("benchmark.json", "benchmark_run.json", "metrics.jsonl", "config.yaml")]
    left_out = [
        f"{run}/checkpoints/checkpoint_000010/state.pt",
        f"{run}/stderr.log",
        "benchmarks/records/readme/benchmark.md",
    ]
    for path in kept + left_out:
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=root).returncode == 0
        assert ignored == (path in left_out), path
