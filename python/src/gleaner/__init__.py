"""gleaner from Python: submit parameter sweeps and run Python functions on
the idle slots of batch clusters.

    import gleaner

    client = gleaner.Client()
    job = client.submit({"name": "scan", "sweep": {"command": "./solve {n}",
                                                    "params": {"n": {"from": 1, "to": 100}}}})
    job.wait(progress=True)
    for result in job.results():
        print(result.task, result.params, result.stdout)

    with gleaner.Executor() as executor:
        squares = list(executor.map(lambda x: x * x, range(1000)))
"""

from concurrent.futures import as_completed, wait

from .client import Client, Job, JobReport, TaskCounts, TaskResult, load_manifest, wait_all
from .errors import (
    BadInput,
    Denied,
    GleanerError,
    JobFailed,
    RemoteTraceback,
    TaskFailed,
    Unreachable,
    Unsuccessful,
)
from .executor import Executor

__all__ = [
    "BadInput",
    "Client",
    "Denied",
    "Executor",
    "GleanerError",
    "Job",
    "JobFailed",
    "JobReport",
    "RemoteTraceback",
    "TaskCounts",
    "TaskFailed",
    "TaskResult",
    "Unreachable",
    "Unsuccessful",
    "as_completed",
    "load_manifest",
    "wait",
    "wait_all",
]
