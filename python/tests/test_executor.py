"""Python functions as tasks, against the real broker and `gleaner up`."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from conftest import running, wait_for

import gleaner


def square(x):
    return x * x


def fails_on_seven(x):
    if x == 7:
        raise ValueError(f"seven is not welcome ({x})")
    return x


def slow_square(x):
    time.sleep(0.05)
    return x * x


def test_map_over_a_thousand_inputs_returns_their_values_in_order(glean):
    with gleaner.Executor(glean.client) as executor:
        assert list(executor.map(square, range(1000))) == [x * x for x in range(1000)]
        job = executor.job
    report = job.wait()
    # Bundled: far fewer tasks than calls.
    assert 1 <= report.tasks.total < 1000


def test_an_input_that_raises_comes_back_as_that_exception_with_its_traceback(glean):
    with gleaner.Executor(glean.client, chunksize=4) as executor:
        futures = [executor.submit(fails_on_seven, x) for x in range(10)]
        values = executor.map(fails_on_seven, range(10))
        assert [f.result() for f in futures if f.exception() is None] == [
            x for x in range(10) if x != 7
        ]
        error = futures[7].exception()
        assert isinstance(error, ValueError) and "seven is not welcome (7)" in str(error)
        assert isinstance(error.__cause__, gleaner.RemoteTraceback)
        assert "fails_on_seven" in error.__cause__.text
        with pytest.raises(ValueError, match="seven"):
            list(values)


def test_submitted_calls_complete_as_they_end_and_lambdas_and_closures_travel(glean):
    offset = 100
    with gleaner.Executor(glean.client) as executor:
        futures = {executor.submit(lambda x: x + offset, x): x for x in range(8)}
        done = {futures[f]: f.result() for f in gleaner.as_completed(futures, timeout=120)}
    assert done == {x: x + offset for x in range(8)}


def test_large_calls_and_values_travel_through_the_staging_directory(glean):
    big = os.urandom(600_000)
    with gleaner.Executor(glean.client) as executor:
        echoed = executor.submit(bytes, big)
        made = executor.submit(lambda n: b"x" * n, 2_000_000)
        assert echoed.result(timeout=120) == big
        assert made.result(timeout=120) == b"x" * 2_000_000
        staging = [p for p in glean.directory.iterdir() if p.name.startswith(".gleaner-executor-")]
        assert staging
    assert not any(p.exists() for p in staging), "the staging directory outlived the executor"


@pytest.mark.slots(4)
def test_a_launcher_killed_mid_map_loses_nothing(glean):
    with gleaner.Executor(glean.client, chunksize=5) as executor:
        values = executor.map(slow_square, range(400))
        wait_for("launchers to run the map", glean.launchers)
        wait_for("some calls to end", lambda: running(executor.job, succeeded=5))
        os.kill(glean.launchers()[0], signal.SIGKILL)
        assert list(values) == [x * x for x in range(400)]
        job = executor.job
    report = job.wait(check=False)
    assert report.tasks.succeeded == report.tasks.total


def test_a_call_that_kills_its_worker_fails_its_future_with_task_failed(glean):
    with gleaner.Executor(glean.client, max_attempts=1) as executor:
        doomed = executor.submit(os._exit, 3)
        fine = executor.submit(square, 3)
        error = doomed.exception(timeout=120)
        assert isinstance(error, gleaner.TaskFailed) and error.status == "failed"
        assert fine.result() == 9


def test_shutdown_with_cancel_futures_cancels_the_job(glean):
    executor = gleaner.Executor(glean.client)
    sleeping = executor.submit(time.sleep, 600)
    wait_for("the call's task to run", lambda: running(executor.job))
    executor.shutdown(wait=True, cancel_futures=True)
    assert isinstance(sleeping.exception(), gleaner.TaskFailed)
    assert executor.job.wait(check=False).state == "cancelled"
    with pytest.raises(RuntimeError):
        executor.submit(square, 1)


def test_calls_submitted_after_the_first_have_ended_join_the_same_job(glean):
    with gleaner.Executor(glean.client) as executor:
        assert executor.submit(square, 2).result(timeout=120) == 4
        job = executor.job
        assert executor.submit(square, 3).result(timeout=120) == 9
        assert list(executor.map(square, range(5), chunksize=2)) == [0, 1, 4, 9, 16]
        assert executor.job is job
    assert job.wait().tasks.total == 1 + 1 + 3


def test_a_call_that_exits_does_not_end_the_caller(glean):
    with gleaner.Executor(glean.client) as executor:
        error = executor.submit(sys.exit, 3).exception(timeout=120)
    assert isinstance(error, gleaner.TaskFailed) and "SystemExit" in str(error)


def test_the_executors_own_manifest_keys_are_refused():
    with pytest.raises(ValueError, match="sweep"):
        gleaner.Executor(gleaner.Client(binary="/bin/true"), manifest={"sweep": {}})
