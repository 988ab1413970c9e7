"""A worker's own running jobs during a lane move (tailguard/worker/lane_follower.py): the drain,
then the hand-back of what is left, never of a job that cannot be resumed elsewhere."""

import threading
import time

from tailguard.worker.lane_follower import RunningJobs


def _job(jobs, job_id, lane, reclaimable, runs_s, handed):
    """A job that runs `runs_s` unless handed back first (as the runner does on `reclaimed`)."""
    def run():
        with jobs.track(job_id, lane, reclaimable) as hand_back:
            if hand_back.wait(runs_s):
                time.sleep(0.05)  # queued again with its text so far
                handed.append(job_id)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_jobs_that_end_within_the_drain_are_not_handed_back():
    jobs, handed = RunningJobs(), []
    _job(jobs, "a", "long", True, 0.1, handed)
    time.sleep(0.02)
    spent, n = jobs.hand_back({"long"}, drain_s=2.0)
    assert n == 0 and handed == [] and spent < 1.5


def test_what_outlives_the_drain_is_handed_back_and_other_lanes_are_untouched():
    jobs, handed = RunningJobs(), []
    threads = [_job(jobs, "a", "long", True, 30, handed), _job(jobs, "b", "long", True, 30, handed),
               _job(jobs, "c", "short", True, 30, handed)]
    time.sleep(0.05)
    assert jobs.by_lane() == {"long": 2, "short": 1}
    spent, n = jobs.hand_back({"long"}, drain_s=0.1)
    assert n == 2 and sorted(handed) == ["a", "b"] and spent < 5
    assert jobs.by_lane() == {"short": 1}
    threads[0].join(1)


def test_a_job_that_cannot_be_resumed_elsewhere_runs_on():
    jobs, handed = RunningJobs(), []
    _job(jobs, "streamed", "long", False, 0.5, handed)
    time.sleep(0.02)
    _, n = jobs.hand_back({"long"}, drain_s=0.05)
    assert n == 0 and handed == [] and jobs.by_lane() == {"long": 1}
