"""Hosts from -H, hostfiles and Slurm, and how ranks are placed on them."""

import pytest

from ringreduce.launcher import slurm


@pytest.mark.parametrize("text, names", [
    ("node1", ["node1"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("gpu[1-2],cpu7,big[9-10]", ["gpu1", "gpu2", "cpu7", "big9", "big10"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
])
def test_slurm_nodelist_expansion(text, names):
    assert slurm.expand_nodelist(text) == names


def test_slurm_tasks_per_node():
    assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]

