"""Hosts from -H, hostfiles and Slurm, and how ranks are placed on them."""

import pytest

from ringreduce.launcher import slurm
from ringreduce.launcher.errors import LaunchError


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


@pytest.mark.parametrize("expand, text", [
    (slurm.expand_nodelist, "node[0-999999999]"), (slurm.expand_nodelist, "a[0-99999],b[0-1]"),
    (slurm.expand_nodelist, "a[0-9][0-99999]"), (slurm.expand_tasks_per_node, "1(x1000000000)"),
])
def test_slurm_lists_beyond_any_cluster_are_refused_before_they_are_expanded(expand, text):
    with pytest.raises(LaunchError, match=f"more than {slurm.MAX_EXPANDED} nodes"):
        expand(text)
    assert len(slurm.expand_nodelist("a[0-99999]")) == slurm.MAX_EXPANDED

