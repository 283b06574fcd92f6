"""A user object without a list of groups (kubespawner's own tests build spawners for a
`unittest.mock.Mock` user, whose `groups` is another Mock) is in no group, so it gets the
catalog's default access rule, instead of a TypeError at every spawn
(hack/kubespawner_tests.py runs those tests with FracSpawner in KubeSpawner's place)."""

from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import Mock

from fracspawner.hub.spawner import FracSpawner


def test_a_user_without_a_list_of_groups_is_in_no_group():
    assert FracSpawner._groups(SimpleNamespace(user=Mock())) == []  # type: ignore[arg-type]


def test_a_user_s_groups_are_their_names():
    user = SimpleNamespace(groups=[SimpleNamespace(name="ml-research"), "staff"])
    assert FracSpawner._groups(SimpleNamespace(user=user)) == ["ml-research", "staff"]  # type: ignore[arg-type]
