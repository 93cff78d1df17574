"""The references the jobs are compared with (tests/support), checked against cases worked out by hand."""

import cases


def test_expected_topology_of_simulated_hosts():
    assert cases.expected_topology(3, 2) == [[0, 3, 0, 2, 0, 2], [1, 3, 1, 2, 0, 1], [2, 3, 0, 1, 1, 2]]
