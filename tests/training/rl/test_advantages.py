"""Group advantages: the reference's z-score (population std), equal-reward groups dropped and counted."""

from __future__ import annotations

import math

import pytest

from training.rl.advantages import group_advantages, z_scores


def reference_z(lst: list[float]) -> list[float]:
    """DICE's ``z_score_normalize`` (training/RL/reward/rl_code_reward_kernel.py), restated for comparison."""
    mean = sum(lst) / len(lst)
    std = (sum((x - mean) ** 2 for x in lst) / len(lst)) ** 0.5
    if std == 0:
        return [0 for _ in lst]
    return [(x - mean) / std for x in lst]


def test_z_scores_match_the_reference_with_population_std():
    group = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    got = z_scores(group)
    assert got == pytest.approx(reference_z(group), abs=1e-4)
    assert sum(got) == pytest.approx(0.0, abs=1e-9)
    # population std: mean 3/8, std sqrt(15/64) -> a 1 scores 5/sqrt(15)
    assert got[0] == pytest.approx(5 / math.sqrt(15), rel=1e-5)


def test_equal_groups_dropped_and_counted():
    rewards = [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.5], [2.0, 2.0 + 1e-9]]
    stats = group_advantages(rewards)
    assert [a is None for a in stats.advantages] == [False, True, True, True, True]
    assert (stats.dropped, stats.kept) == (4, 1)
    assert stats.advantages[0] == pytest.approx(reference_z(rewards[0]), abs=1e-4)
    flat = [r for g in rewards for r in g]
    assert stats.reward_mean == pytest.approx(sum(flat) / len(flat))  # dropped groups count in the mean
    assert stats.pass_rate == pytest.approx(sum(r > 0 for r in flat) / len(flat))


def test_pass_rate_from_passed_flags():
    # a speedup term can make a correct sample's reward negative: passed says what was solved
    rewards = [[-0.7, 0.0, 1.3, 0.0]]
    stats = group_advantages(rewards, passed=[[True, False, True, False]])
    assert stats.pass_rate == 0.5 and stats.kept == 1
    assert stats.advantages[0][2] > stats.advantages[0][1] > stats.advantages[0][0]
    with pytest.raises(ValueError, match="shape"):
        group_advantages(rewards, passed=[[True]])


def test_every_group_dropped_and_empty():
    stats = group_advantages([[0.0, 0.0], [1.0, 1.0]])
    assert (stats.dropped, stats.kept, stats.advantages) == (2, 0, [None, None])
    empty = group_advantages([])
    assert (empty.dropped, empty.kept) == (0, 0) and math.isnan(empty.reward_mean)
    assert stats.to_json()["dropped_groups"] == 2
