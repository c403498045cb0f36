"""The suite's shared builds rely on pytest-xdist's ``--dist loadgroup``: a module marked
``xdist_group`` runs in one worker, so its module-scoped compiles are made once. On pytest 9.2
that grouping stops without any error (pyproject.toml pins pytest below it); this test notices."""

import pytest

pytestmark = pytest.mark.xdist_group("grouping_check")


def test_tests_of_a_group_carry_the_group(request):
    if not hasattr(request.config, "workerinput"):
        pytest.skip("not run under pytest-xdist")
    if not request.config.getvalue("loadgroup"):  # set by xdist in its workers
        pytest.skip("not run with --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping_check"), request.node.nodeid
