"""The elastic launcher's logic without ranks: setting failed hosts aside, reading the discovery
script, the sampler's split after a resize, finding a rank's host, rrun's link telling a late
rank of new hosts; and the one-process replay (tests/support/elastic_replay.py) the jobs are
compared with, which must tell sizes apart."""

import json
import socket
import time

import pytest
from elastic_replay import discovery_script, replay

from ringreduce.launcher import elastic, link, protocol
from ringreduce.launcher.errors import LaunchError


def test_the_replay_can_tell_sizes_apart():
    """The check below would catch a job that ran at another size than it says."""
    assert replay(2, {0: 2}) != replay(2, {0: 2, 9: 3})


class TestLogic:
    def test_a_failed_host_is_set_aside_for_the_cooldown_doubled_with_each_failure(self):
        now = [0.0]
        aside = elastic.SetAside((10, 25), clock=lambda: now[0])
        hosts = [elastic.hosts.Host("a", 2), elastic.hosts.Host("b", 2)]
        assert aside.add("b") == 10 and [h.name for h in aside.usable(hosts)] == ["a"]
        now[0] = 10
        assert [h.name for h in aside.usable(hosts)] == ["a", "b"]
        assert aside.add("b") == 20 and aside.add("b") == 25  # doubled, at most the range's top

    def test_without_a_cooldown_a_failed_host_stays_aside(self):
        aside = elastic.SetAside(None, clock=lambda: 1e9)
        aside.add("a")
        assert aside.usable([elastic.hosts.Host("a", 1)]) == [] and "a (for good)" in aside.describe()

    def test_a_host_that_answers_is_set_aside_only_when_its_ranks_keep_failing(self):
        aside = elastic.SetAside(None, tries=2, clock=lambda: 5.0)
        a = [elastic.hosts.Host("a", 2)]
        assert aside.failed("a", "rank 1 (on a) failed: killed") is None and aside.usable(a) == a
        aside.committed()  # progress since: the next failure is the first again
        assert aside.failed("a", "rank 1 (on a) failed: killed") is None
        assert aside.failed("a", "rank 0 (on a) failed: exited with status 3") == float("inf")
        assert aside.usable(a) == [] and aside.none_can_come_back(a)
        assert aside.describe(why=True) == ("a (for good: its ranks failed 2 times in a row without a commit; the "
                                            "last: rank 0 (on a) failed: exited with status 3)")

    def test_a_host_that_stops_answering_is_set_aside_at_once(self):
        aside = elastic.SetAside((10, 40), tries=3, clock=lambda: 0.0)
        assert aside.failed("b", "rank 2 (on b) sent no heartbeat", unreachable=True) == 10
        # A cool-down runs: the host comes back, so the job waits rather than ending.
        assert not aside.none_can_come_back([elastic.hosts.Host("b", 2)])
        assert aside.describe(why=True) == "b (back in 10 s: rank 2 (on b) sent no heartbeat)"

    def test_hosts_that_can_come_back_keep_the_job_waiting(self):
        aside = elastic.SetAside(None, clock=lambda: 0.0)
        assert not aside.none_can_come_back([])  # nothing listed yet, nothing set aside: hosts may come
        aside.add("a", "gone")
        assert not aside.none_can_come_back([elastic.hosts.Host("c", 1)])  # c is listed and not aside
        assert aside.none_can_come_back([]) and aside.none_can_come_back([elastic.hosts.Host("a", 1)])

    def test_the_discovery_script_s_lines(self, tmp_path):
        script, _ = discovery_script(tmp_path, ["# hosts", "a:2", "b", "a:1"])
        with pytest.raises(LaunchError, match="without slots"):
            elastic.discover(str(script), None)
        assert elastic.discover(str(script), 4) == [elastic.hosts.Host("a", 3), elastic.hosts.Host("b", 4)]
        failing = tmp_path / "fail.sh"
        failing.write_text("#!/bin/sh\necho broken >&2\nexit 2\n")
        failing.chmod(0o755)
        with pytest.raises(LaunchError, match="exited with status 2: broken"):
            elastic.discover(str(failing), None)

    def test_a_discovery_script_that_fails_once_is_tried_again(self, tmp_path, monkeypatch, capsys):
        """Its first failure ended the job, although the watcher tried later ones again."""
        counter = tmp_path / "runs"
        script = tmp_path / "flaky.sh"
        script.write_text(f"#!/bin/sh\necho x >> {counter}\n"
                          f"[ $(wc -l < {counter}) -ge 2 ] || {{ echo not yet >&2; exit 1; }}\necho localhost:2\n")
        script.chmod(0o755)
        monkeypatch.setattr(elastic, "DISCOVERY_INTERVAL", 0.01)
        run = elastic.ElasticRun(elastic.Settings(min_np=2, max_np=None, discovery_script=str(script),
                                                  elastic_timeout=5), 2, None, [], False, 0, None)
        assert run._placement(2) == [("localhost", 2)]
        assert "exited with status 1: not yet; trying again" in capsys.readouterr().err

    def test_a_discovery_script_that_cannot_start_ends_the_job_before_it_starts(self, tmp_path):
        """A script without its #! line was tried every second for --elastic-timeout (600 s)."""
        script = tmp_path / "hosts.sh"
        script.write_text("echo localhost:2\n")
        script.chmod(0o755)
        run = elastic.ElasticRun(elastic.Settings(min_np=2, max_np=None, discovery_script=str(script),
                                                  elastic_timeout=600), 2, None, [], False, 0, None)
        started = time.monotonic()
        with pytest.raises(LaunchError, match=r"hosts.sh cannot be run \(Exec format error\): it must be an "
                                              "executable file, a script with its #! line"):
            run._placement(2, first=True)
        assert time.monotonic() - started < 5

    def test_the_sampler_gives_the_rest_of_the_epoch_once_after_a_resize(self, monkeypatch):
        from ringreduce import runtime
        from ringreduce.torch.elastic import ElasticSampler

        dataset = list(range(50))
        taken = []

        def parts(size, batches):
            samplers = []
            for rank in range(size):
                monkeypatch.setattr(runtime, "size", lambda: size)
                monkeypatch.setattr(runtime, "rank", lambda rank=rank: rank)
                sampler = ElasticSampler(dataset, seed=3)
                sampler.load_state_dict(state)
                samplers.append(sampler)
            for sampler in samplers:
                taken.extend(list(sampler)[:batches * 2])
                sampler.record_batch(batches - 1, 2)
            return samplers[0].state_dict()

        state = {"epoch": 1, "processed": 0}
        state = parts(2, 5)  # 20 of 50 taken at 2 ranks
        assert state == {"epoch": 1, "processed": 20}
        state = parts(3, 5)  # 30 of the remaining 30 at 3 ranks
        assert sorted(taken) == list(range(50))

    def test_a_rank_s_host_name_is_found_among_the_discovery_script_s(self):
        import socket

        assert elastic.placement_host(socket.gethostname(), ["localhost"]) == "localhost"
        assert elastic.placement_host("hostb", ["hosta.example", "hostb.example"]) == "hostb.example"
        assert elastic.placement_host("elsewhere", ["localhost"]) == "elsewhere"
        assert elastic.placement_host(None, ["localhost"]) is None


SECRET = protocol.new_secret()


def _kinds_heard(address, seconds=1.5):
    """The kinds of the notices a rank connecting to rrun's link at `address` (and saying its
    signed hello) hears in `seconds`."""
    host, port = address.rsplit(":", 1)
    heard, received = [], b""
    with socket.create_connection((host, int(port)), timeout=seconds) as connection:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                received += connection.recv(65536)
            except TimeoutError:
                break
            *lines, received = received.split(b"\n")
            for message in map(json.loads, lines):
                if message["kind"] == "challenge":
                    connection.sendall(protocol.signed_link_message(SECRET, message["nonce"], "hello", rank=0,
                                                                    host="localhost", pid=1))
                heard.append(message["kind"])
    return [kind for kind in heard if kind not in ("beat", "challenge")]


def test_a_rank_that_connects_after_the_hosts_changed_is_told_too():
    """Discovery may find the hosts changed before a generation's ranks have connected to rrun's link
    (still importing their framework): an announced notice reaches them when they connect; one for
    the ranks connected at the time does not; a new generation starts without the last one's."""
    server = link.LinkServer(timeout=30, secret=SECRET)
    try:
        address = server.env(["localhost"])[protocol.LINK_VARIABLE]
        server.watch(None)
        server.notify("rank-failed", why="only for the ranks connected")
        server.announce("hosts-updated")
        assert _kinds_heard(address) == ["hosts-updated"]
        server.watch(None)
        assert _kinds_heard(address) == []
    finally:
        server.close()

