"""The flight recorder's records, what rrun makes of them (pure logic: no ranks), and the last
minute's straggler figures; and rrun --dump where no job runs."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from ringreduce.engine.agreement import Message
from ringreduce.engine.call_sites import user_call_site
from ringreduce.engine.flight_recorder import FlightRecorder
from ringreduce.engine.negotiation import Stragglers
from ringreduce.engine.requests import Handle
from ringreduce.errors import UnsafeFileError
from ringreduce.launcher import dump, flight

DUMP = [sys.executable, "-m", "ringreduce.launcher", "--dump"]  # starts no ranks: reaches for a job


def message(name, kind="allreduce", site="train.py:88"):
    return Message(name=name, kind=kind, dtype="float32", shape=(2, 3), site=site)


def test_the_recorder_keeps_the_last_n_and_their_handles_mark_them_done():
    recorder = FlightRecorder(3)
    handles = [Handle(f"g{i}") for i in range(5)]
    for i, handle in enumerate(handles):
        recorder.started_as(recorder.record(message(f"g{i}"), set_id=0), handle)
    handles[2].finish(np.ones(4))
    records = recorder.snapshot(missing_ranks=lambda set_id, name: [1, 3])
    assert [r["seq"] for r in records] == [2, 3, 4]
    assert records[0]["done"] >= records[0]["submitted"]
    assert records[1]["done"] is None and records[1]["waiting_for"] == [1, 3]
    assert records[0]["shape"] == [2, 3] and records[0]["site"] == "train.py:88" and "waiting_for" not in records[0]
    json.dumps(records)  # what the link sends


def test_a_record_keeps_no_result_alive():
    """A kept result would keep its block from the recycler: each 1 MiB result then new memory."""
    recorder, handle = FlightRecorder(3), Handle("g")
    recorder.started_as(recorder.record(message("g"), 0), handle)
    result = np.ones(1 << 18, np.float32)
    handle.finish(result)
    del handle
    assert sys.getrefcount(result) == 2  # this name and getrefcount's argument


def test_a_reused_message_is_recorded_at_its_caller_s_line():
    def users_code():
        return user_call_site(depth=1), sys._getframe()

    seen, frame = users_code()  # what the first call of a line does: looks its site up in full
    recorder = FlightRecorder(4)
    recorder.record(message("g", site="elsewhere.py:1"), 0, caller=(frame.f_code, 77))
    recorder.record(message("g", site="elsewhere.py:1"), 0, caller=(FlightRecorder.record.__code__, 9))
    assert seen.startswith("test_flight_recorder.py:")
    # The caller's line where its code is the user's; the message's where it is ringreduce's own.
    assert [r["site"] for r in recorder.snapshot()] == ["test_flight_recorder.py:77", "elsewhere.py:1"]


def test_a_recorder_of_none_keeps_nothing():
    recorder = FlightRecorder(0)
    recorder.record(message("g"), 0)
    assert recorder.snapshot() == []


def test_side_by_side_shows_each_rank_s_last_few_with_call_sites_and_waits():
    now = time.time()
    done = {"seq": 7, "kind": "allreduce", "name": "grad", "shape": [4], "dtype": "float32", "site": "t.py:3",
            "set": 0, "submitted": now - 1, "done": now - 0.9995}
    waiting = dict(done, seq=8, name="loss", shape=[], done=None, waiting_for=[1, 2], submitted=now - 12)
    in_set = dict(done, seq=9, kind="barrier", name="b", dtype=None, set=2, site="")
    text = flight.side_by_side({0: {"now": now, "records": [done, waiting]}, 1: {"now": now, "records": []},
                                2: {"now": now, "records": [in_set]}}, "why")
    lines = text.splitlines()
    assert lines[0] == "rrun: each rank's last collectives (why), oldest first:"
    assert lines[1] == ("  rank 0: #7 allreduce 'grad' float32[4] at t.py:3, 0.5 ms | "
                        "#8 allreduce 'loss' float32[scalar] at t.py:3, WAITING 12.0 s for ranks 1, 2")
    assert lines[2] == "  rank 1: no collective yet"
    assert lines[3] == "  rank 2: #9 barrier 'b' (set 2) None[4], 0.5 ms"


def test_the_records_file_is_new_and_private_each_time(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    reports = {0: {"now": 1.0, "records": [{"seq": 0}]}}
    first, second = flight.write_records(reports, "why"), flight.write_records(reports, "why")
    assert first != second and os.path.dirname(first) == str(tmp_path / f"ringreduce-{os.getuid()}")
    assert os.stat(first).st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(first)).st_mode & 0o777 == 0o700
    assert json.load(open(first)) == {"why": "why", "ranks": {"0": {"now": 1.0, "records": [{"seq": 0}]}}}
    assert flight.shown({0: {"now": 1.0, "records": []}}, "why") == ""  # nothing recorded: nothing said


def test_a_run_directory_another_user_could_plant_in_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    planted = tmp_path / f"ringreduce-{os.getuid()}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    with pytest.raises(UnsafeFileError, match="not private to this user"):
        dump.run_directory()


def test_the_last_minute_s_figures_name_the_rank_behind():
    stragglers = Stragglers(3)
    for _ in range(100):  # rank 1 comes 20 ms after the others, who wait for it
        stragglers.record([0.0201, 0.0001, 0.0202])
    span, rows = stragglers.recent()
    assert 1.0 <= span < 2.0
    rate, wait, behind = zip(*rows, strict=True)
    assert rate[0] == rate[1] == rate[2] == 100 / span
    assert wait[1] < wait[0] and wait[1] < wait[2]
    assert behind[1] == pytest.approx(0.0201) and behind[0] == pytest.approx(0.0001) and behind[2] == 0
    both = Stragglers.combined([stragglers, stragglers])
    assert both.recent()[1][1][0] == pytest.approx(2 * rate[1]) and both.recent()[1][1][2] == pytest.approx(0.0201)


def test_the_monitor_line_marks_the_slowest_rank():
    rows = [{"rank": r, "rounds_per_second": 50.0, "wait_share": w, "behind_seconds": b, "bytes_per_second": 2e5}
            for r, w, b in ((0, 0.9, 0.0002), (1, 0.0, 0.02))]
    assert flight.monitor_line(rows) == ("rrun monitor: rank 0: 50/s, waiting 90%, 0.2 ms behind, 0.2 MB/s | "
                                         "rank 1: 50/s, waiting 0%, 20.0 ms behind, 0.2 MB/s; slowest: rank 1")


@pytest.mark.parametrize("pid, says", [("1", "no job of rrun 1 to reach at "),
                                       (None, "no job of yours runs on this host")])
def test_dump_without_a_job_says_so_in_one_line(tmp_path, pid, says):
    shown = subprocess.run(DUMP + ([pid] if pid else []), capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path)))
    assert shown.returncode == 2 and "Traceback" not in shown.stderr
    assert shown.stderr.startswith(f"Error: rrun --dump: {says}"), shown.stderr
