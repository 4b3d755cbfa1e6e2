"""The run's timeline: each source's failures as events, and the one rule that picks the first."""

from __future__ import annotations

from asrlab.doctor.timeline import JobClock, failure
from asrlab.doctor.verdict import culprit, first_failure


def test_the_first_failure_is_the_earliest_that_is_not_a_consequence_and_ended_the_run():
    crash = failure("crashed", "error", 30.0, "rank 1: ValueError", source="errors", rank=1, step=8)
    survivor = failure("crashed", "error", 20.0, "rank 0: Connection reset", source="errors", rank=0, consequence=True)
    blip = failure("nonfinite", "job output", 10.0, "loss nan", source="job output", transient=True)
    hang = failure("stalled", "stall", 40.0, "rank 0 waits", source="stall report", rank=0)
    assert first_failure([hang, crash, survivor, blip]) is crash  # earliest that ended the run, not a consequence
    assert first_failure([survivor, blip]) is blip  # a transient one where nothing else ended it
    assert first_failure([survivor]) is survivor  # a consequence where it is all there is
    assert first_failure([]) is None
    assert culprit(crash) == {"rank": 1, "step": 8, "epoch": None, "batch": None}
    assert culprit(None) == {"rank": None, "step": None, "epoch": None, "batch": None}


def test_an_event_without_a_clock_comes_after_the_timed_ones_and_a_root_cause_first_in_its_instant():
    timed = failure("crashed", "error", 50.0, "x", source="errors")
    untimed = failure("killed", "job output", None, "y", source="job output")
    assert first_failure([untimed, timed]) is timed
    a = failure("crashed", "exit", 5.0, "rank 3 exit 1", source="torchrun", order=1)
    root = failure("killed", "exit", 5.0, "rank 1 SIGKILL", source="torchrun", order=9, root=True)
    assert first_failure([a, root]) is root
    nf = failure("nonfinite", "job output", 1.0, "z", source="job output", step={"step": None, "epoch": 2, "batch": 10})
    assert culprit(nf) == {"rank": None, "step": 10, "epoch": 2, "batch": 10}


def test_the_watchs_clock_places_each_byte_of_the_jobs_output(tmp_path):
    times = tmp_path / "job.times"
    times.write_text("0 100.0\n500 101.5\n1200 103.0\n9")  # the last line cut by a watch killed mid-write
    clock = JobClock(times)
    assert clock.at(0) == 100.0 and clock.at(499) == 100.0 and clock.at(500) == 101.5 and clock.at(10**6) == 103.0
    times.write_text("0 100.0\n500 1.0e\n1200 103.0\n")  # a time cut where its offset is whole: neither kept
    clock = JobClock(times)
    assert clock.at(600) == 100.0 and clock.at(1200) == 103.0
    assert not JobClock(tmp_path / "absent") and JobClock(tmp_path / "absent").at(3) is None


def test_a_launcher_stopped_by_a_signal_is_the_stop_not_a_vanished_rank(tmp_path):
    """The folder saw rank 1's heartbeats end without a word (a guess: vanished); the job's output says torchrun
    was told to stop. One failure seen twice: the stop, by the job's words."""
    from asrlab.doctor.sources import Reading, job_output
    from asrlab.doctor.verdict import decide

    (tmp_path / "job.log").write_text(
        "step 11 loss 2.1\nstep 12 loss 2.0\n"
        "W1126 10:00:20.000000 99 torch/distributed/elastic/agent/server/api.py:739] Received 15 death signal, "
        "shutting down workers\n"
    )
    (tmp_path / "job.times").write_text("0 100.0\n34 120.0\n")
    vanished = failure("crashed", "vanished", 118.0, "rank 1 ended without recording an error", source="heartbeats",
                       rank=1, guess=True)  # fmt: skip
    folder = Reading("run folder", [str(tmp_path)], events=[vanished])
    d = decide([folder, job_output.read(tmp_path)])
    assert d["verdict"] == "stopped" and d["basis"] == "job output" and "vanished" not in d["summary"], d
