"""Jobs from Python against the real broker and `gleaner up`."""

from __future__ import annotations

import json

import pytest
from conftest import running, wait_for

import gleaner


def sweep(command: str, to: int, **keys) -> dict:
    return {
        "name": "py",
        "sweep": {"command": command, "params": {"n": {"from": 1, "to": to}}},
        **keys,
    }


def test_a_sweep_from_a_dict_completes_and_its_results_iterate_with_params_and_stdout(glean):
    job = glean.client.submit(sweep("echo n={n}", 20))
    report = job.wait()
    assert report.ok and report.state == "done"
    assert report.tasks.total == 20 and report.tasks.succeeded == 20
    results = sorted(job.results(), key=lambda r: r.task)
    assert [r.params["n"] for r in results] == list(range(1, 21))
    for r in results:
        assert r.succeeded and r.exit_code == 0
        assert r.stdout == f"n={r.params['n']}\n".encode()
        assert r.stderr == b""
        assert job.logs(r.task) == r.stdout


def test_a_toml_text_with_data_and_a_failing_task_raises_job_failed_as_the_cli_exits_1(glean):
    (glean.directory / "sizes.csv").write_text("size\n16\n32\n")
    job = glean.client.submit(
        """
name = "toml"
max_attempts = 1

[sweep]
command = "test {size} -ne 32"
csv = "sizes.csv"
"""
    )
    with pytest.raises(gleaner.JobFailed) as failed:
        job.wait()
    report = failed.value.report
    assert report.tasks.failed == 1 and report.tasks.succeeded == 1
    assert job.wait(check=False).tasks == report.tasks
    failures = list(job.results(status="failed"))
    assert [str(r.params["size"]) for r in failures] == ["32"]
    assert failures[0].exit_code == 1

    again = job.resubmit(failed=True)
    assert again.id != job.id
    with pytest.raises(gleaner.JobFailed):
        again.wait()
    assert [str(r.params["size"]) for r in again.results()] == ["32"]


def test_a_bad_manifest_is_bad_input_with_what_is_wrong(glean):
    with pytest.raises(gleaner.BadInput) as bad:
        glean.client.submit(
            {"name": "bad", "sweep": {"command": "echo {missing}", "params": {"n": [1]}}}
        )
    assert "missing" in str(bad.value) and ".gleaner-manifest-" not in str(bad.value)
    with pytest.raises(TypeError):
        glean.client.submit(42)


def test_a_cancelled_job_ends_cancelled_and_status_says_so(glean):
    job = glean.client.submit(sweep("sleep 600", 4))
    wait_for("a task to run", lambda: running(job))
    job.cancel()
    report = job.wait(check=False)
    assert report.state == "cancelled"
    assert not report.ok
    assert job.status().state == "cancelled"
    assert any(j.job == job.id for j in glean.client.jobs(all=True))


def test_results_go_to_pandas_with_params_as_columns(glean):
    pd = pytest.importorskip("pandas")
    job = glean.client.submit(sweep("echo {n}", 5))
    job.wait()
    frame = job.to_pandas(output=True)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame["n"]) == [1, 2, 3, 4, 5]
    assert list(frame["stdout"]) == [f"{n}\n" for n in range(1, 6)]


def test_an_unknown_job_is_unsuccessful(glean):
    with pytest.raises(gleaner.Unsuccessful):
        glean.client.job("nothing-0123456789abcdef").status()


def test_a_manifest_file_is_submitted_as_it_is(glean):
    path = glean.directory / "m.json"
    path.write_text(json.dumps(sweep("echo {n}", 3)))
    job = glean.client.submit(path)
    assert job.wait().tasks.succeeded == 3
