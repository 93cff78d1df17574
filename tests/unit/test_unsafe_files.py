"""What ringreduce unpickles must be this user's own: an elastic job's commits (a private
directory, an HMAC under the job's secret, checked before unpickling) and checkpoints (refused
from a directory or file another user can write). No MPI: the store's reads run without ranks."""

import os
import pickle

import pytest

from ringreduce import checkpoint
from ringreduce.errors import UnsafeFileError
from ringreduce.launcher import protocol
from ringreduce.resilience.commit_store import CommitStore


class Planted:
    """Unpickling it writes `marker`: the code a planted commit would run in every rank."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def store(directory):
    return CommitStore(str(directory), environ={protocol.SECRET_VARIABLE: protocol.new_secret()})


def test_a_planted_commit_with_a_valid_checksum_is_skipped_and_never_unpickled(tmp_path, capsys):
    directory, marker = tmp_path / "commits", tmp_path / "marker"
    commits = store(directory)
    checkpoint.private_directory(directory)
    planted = commits.path((999999, 999999999))
    checkpoint.write_pickled(pickle.dumps(Planted(marker)), planted)  # a whole file, with its SHA-256
    assert checkpoint.read(planted) is None and marker.exists()  # what it would have done: run code
    marker.unlink()
    assert commits._readable_newest() == (None, None)
    assert not marker.exists()
    assert "not signed with this job's secret" in capsys.readouterr().err


def test_the_job_s_own_commit_reads_back(tmp_path):
    commits = store(tmp_path / "commits")
    checkpoint.private_directory(commits.directory)
    checkpoint.write_pickled(pickle.dumps({"step": 3}), commits.path((0, 3)), commits._key)
    assert commits._readable_newest() == ((0, 3), {"step": 3})


@pytest.mark.parametrize("mode", [0o777, 0o750, 0o701])
def test_a_commit_directory_someone_could_write_or_enter_is_refused(tmp_path, mode):
    directory = tmp_path / "commits"
    directory.mkdir()
    os.chmod(directory, mode)
    with pytest.raises(UnsafeFileError, match=f"mode {mode:o}; needed: owner {os.getuid()}, mode 700"):
        store(directory).keys()


def test_a_commit_directory_that_is_a_link_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "commits").symlink_to(elsewhere)
    with pytest.raises(UnsafeFileError, match="is not a directory"):
        store(tmp_path / "commits").keys()


def test_a_new_commit_directory_is_private(tmp_path):
    checkpoint.private_directory(tmp_path / "a" / "commits")
    assert os.stat(tmp_path / "a" / "commits").st_mode & 0o777 == 0o700
    checkpoint.private_directory(tmp_path / "a" / "commits")  # this user's own: accepted again


def test_checkpoints_others_can_write_are_refused(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    checkpoint.write({"step": 1}, checkpoint.path_for(directory, 1))
    checkpoint.only_mine(directory)
    checkpoint.only_mine(checkpoint.path_for(directory, 1))
    os.chmod(directory, 0o777)
    with pytest.raises(UnsafeFileError, match="can be written by other users .* chmod go-w"):
        checkpoint.only_mine(directory)
    os.chmod(directory, 0o755)
    os.chmod(checkpoint.path_for(directory, 1), 0o666)
    with pytest.raises(UnsafeFileError, match="can be written by other users"):
        checkpoint.only_mine(checkpoint.path_for(directory, 1))
    link = tmp_path / "link.rr"
    link.symlink_to(checkpoint.path_for(directory, 1))
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        checkpoint.only_mine(link)


def test_the_timeline_does_not_follow_a_link_planted_at_its_name(tmp_path):
    from ringreduce.engine.timeline import Timeline

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "timeline.json").symlink_to(victim)
    with pytest.raises(OSError, match="it is a symbolic link"):
        Timeline(str(tmp_path / "timeline.json"), 0)
    assert victim.read_text() == "keep"


def test_a_profile_is_replaced_whole(tmp_path, monkeypatch):
    """A job starting during a calibration read half of the file it was writing in place."""
    from ringreduce.algorithms import cost
    from ringreduce.planning import profiles

    target = tmp_path / "profile.json"
    profiles.save(cost.DEFAULT, target)
    before = target.read_text()
    written = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (written.append(open(a).read()), real_replace(a, b)))
    profiles.save(cost.DEFAULT, target)
    assert written == [before] and target.read_text() == before  # the whole file existed before the rename
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]
