"""Jobs from Python: submit a manifest (a dict, a TOML text or file), wait
for it, look at it, cancel it, read its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from ._cli import Cli, PathLike, error_of, parse_json
from .errors import GleanerError, JobFailed, Unsuccessful

Manifest = Union[Mapping[str, Any], str, "os.PathLike[str]"]

#: The final states a task ends in, as `gleaner results --status` names them.
STATUSES = ("succeeded", "failed", "timed-out", "lost", "cancelled")


def _toml_loads(text: str) -> Dict[str, Any]:
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[import-not-found,no-redef]
    return tomllib.loads(text)


def _names_a_file(manifest: Manifest) -> bool:
    """A path, or a one-line string naming an existing file (any other
    string is TOML text)."""
    return isinstance(manifest, os.PathLike) or (
        isinstance(manifest, str) and "\n" not in manifest and Path(manifest).is_file()
    )


def load_manifest(manifest: Manifest) -> Dict[str, Any]:
    """A manifest as a dict: a mapping as it is, a path to a `.toml` or
    `.json` file read, any other string read as TOML text."""
    if isinstance(manifest, Mapping):
        return dict(manifest)
    if _names_a_file(manifest):
        path = Path(manifest)
        text = path.read_text()
        return json.loads(text) if path.suffix == ".json" else _toml_loads(text)
    if isinstance(manifest, str):
        return _toml_loads(manifest)
    raise TypeError(f"a manifest is a dict, a TOML text or a path, not {type(manifest).__name__}")


@dataclass(frozen=True)
class TaskCounts:
    total: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    lost: int = 0
    cancelled: int = 0

    @classmethod
    def of(cls, raw: Optional[Mapping[str, Any]]) -> "TaskCounts":
        raw = raw or {}
        return cls(**{k: int(raw.get(k, 0) or 0) for k in cls.__dataclass_fields__})

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.timed_out + self.lost + self.cancelled


@dataclass(frozen=True)
class JobReport:
    """A job as the scheduler or its runner reports it (`raw` has every
    field of the CLI's JSON)."""

    job: str
    state: str
    tasks: TaskCounts
    results: str
    owner: str = ""
    throughput: float = 0.0
    problem: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> "JobReport":
        return cls(
            job=str(raw.get("job", "")),
            state=str(raw.get("state", "")).lower(),
            tasks=TaskCounts.of(raw.get("tasks")),
            results=str(raw.get("results", "")),
            owner=str(raw.get("owner", "")),
            throughput=float(raw.get("throughput", 0.0) or 0.0),
            problem=raw.get("problem"),
            raw=dict(raw),
        )

    @property
    def ended(self) -> bool:
        return self.state in ("done", "cancelled")

    @property
    def ok(self) -> bool:
        """Every task succeeded (what `gleaner wait`'s exit 0 says)."""
        return self.ended and self.tasks.total == self.tasks.succeeded and self.problem is None

    def summary(self) -> str:
        t = self.tasks
        others = [
            f"{n} {name}"
            for n, name in (
                (t.failed, "failed"),
                (t.timed_out, "timed out"),
                (t.lost, "lost"),
                (t.cancelled, "cancelled"),
            )
            if n
        ]
        text = f"{self.state}: {t.succeeded} of {t.total} tasks succeeded"
        if others:
            text += f" ({', '.join(others)})"
        if self.problem:
            text += f"; {self.problem}"
        return text


@dataclass
class TaskResult:
    """One line of a job's results index, its output read when asked for."""

    task: int
    status: str
    exit_code: Optional[int]
    command: str
    params: Dict[str, Any]
    attempts: int
    preemptions: int
    runtime_s: float
    cluster: Optional[str]
    host: Optional[str]
    error: Optional[str]
    raw: Dict[str, Any] = field(repr=False)
    _reader: "_OutputReader" = field(repr=False, compare=False)

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def stdout(self) -> bytes:
        return self._reader.read(self, "stdout")

    @property
    def stderr(self) -> bytes:
        return self._reader.read(self, "stderr")

    @classmethod
    def of(cls, raw: Mapping[str, Any], reader: "_OutputReader") -> "TaskResult":
        return cls(
            task=int(raw.get("task", 0)),
            status=str(raw.get("status", "")).replace("_", "-"),
            exit_code=raw.get("exit_code"),
            command=str(raw.get("command", "")),
            params=dict(raw.get("params") or {}),
            attempts=int(raw.get("attempts", 0) or 0),
            preemptions=int(raw.get("preemptions", 0) or 0),
            runtime_s=float(raw.get("runtime_s", 0.0) or 0.0),
            cluster=raw.get("cluster"),
            host=raw.get("host"),
            error=raw.get("error"),
            raw=dict(raw),
            _reader=reader,
        )


class _OutputReader:
    """Reads tasks' output from the job's `output.log`, at the spans its
    index gives (a file opened for each read: results may be read long
    after the iteration that found them)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def read(self, result: TaskResult, stream: str) -> bytes:
        span = result.raw.get(stream)
        if not span:
            return b""
        with open(self.directory / "output.log", "rb") as log:
            log.seek(int(span["offset"]))
            return log.read(int(span["bytes"]))


def _readable_results(path: str) -> Optional[Path]:
    directory = Path(path) if path else None
    if directory is not None and os.access(directory / "index.jsonl", os.R_OK):
        return directory
    return None


def _index_lines(directory: Path, start: int = 0) -> Iterator[tuple]:
    """Whole lines of `index.jsonl` from byte `start`: (entry, next start).
    A line still being written is left for the next read."""
    with open(directory / "index.jsonl", "rb") as index:
        index.seek(start)
        for line in index:
            if not line.endswith(b"\n"):
                return
            start += len(line)
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            yield entry, start


class Job:
    """A submitted job, by its id."""

    def __init__(self, client: "Client", job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> JobReport:
        """The job as the scheduler sees it now (or its last report, once
        it ended)."""
        reply = self.client.cli.json(["status", self.id]) or {}
        for report in reply.get("jobs", []):
            if report.get("job") == self.id:
                return JobReport.of(report)
        for ended in reply.get("ended", []):
            if ended.get("job") != self.id:
                continue
            ending = ended.get("ending") or {}
            if ending.get("type") == "refused":
                raise Unsuccessful(f"{self.id}: refused: {ending.get('reason', '')}", code=1)
            return JobReport.of(ending)
        raise Unsuccessful(f"{self.id}: the scheduler does not know this job (yet)", code=1)

    def wait(
        self,
        progress: bool = False,
        *,
        check: bool = True,
        timeout: Optional[float] = None,
    ) -> JobReport:
        """Waits for the job to end, as `gleaner wait` does; with `check`,
        an end that is not every task's success raises `JobFailed` (the
        CLI's exit 1). `progress` prints one line as it goes, on stderr."""
        process = self.client.cli.popen(["wait", self.id, "--output", "json"])
        stop = threading.Event()
        shower = None
        if progress:
            shower = threading.Thread(target=self._show_progress, args=(stop,), daemon=True)
            shower.start()
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise TimeoutError(f"{self.id} did not end within {timeout} s") from None
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            stop.set()
            if shower is not None:
                shower.join()
        report = None
        for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
            if line.strip().startswith("{"):
                report = JobReport.of(parse_json(line.encode(), ["wait"]))
                break
        if progress and report is not None:
            print(f"\r{self.id}: {report.summary()}", file=sys.stderr, flush=True)
        if report is None:
            if process.returncode != 0:
                raise error_of(process.returncode, stderr, ["wait"])
            raise GleanerError(f"gleaner wait {self.id} reported nothing")
        if check and not report.ok:
            raise JobFailed(report)
        return report

    def _show_progress(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            try:
                t = self.status().tasks
            except GleanerError:
                continue
            print(
                f"\r{self.id}: {t.finished}/{t.total} ended, {t.running} running, "
                f"{t.succeeded} succeeded",
                end="",
                file=sys.stderr,
                flush=True,
            )

    def cancel(self) -> None:
        """Stops the job: running tasks are killed, results so far kept."""
        self.client.cli.run(["cancel", self.id])

    def close(self) -> None:
        """An open job takes no more tasks; it ends once those it has end."""
        self.client.cli.run(["close", self.id])

    def add(self, manifest: Manifest) -> int:
        """Adds `[[task]]` entries and a `[sweep]` to this open job; returns
        how many tasks were added (numbered after the job's own)."""
        reply = self.client._with_manifest_file(
            manifest, lambda path: self.client.cli.json(["submit", "--job", self.id, path])
        )
        return int((reply or {}).get("added", 0))

    def results_dir(self) -> Path:
        return Path(self.status().results)

    def results(self, status: Union[str, Sequence[str], None] = None) -> Iterator[TaskResult]:
        """The job's ended tasks, one `TaskResult` each (in the order they
        ended), optionally only those that ended so (`"failed"`, ...), read
        from its results directory, which must be visible here."""
        wanted = self._statuses(status)
        path = self.status().results
        directory = _readable_results(path)
        if directory is None:
            raise GleanerError(
                f"{self.id}'s results directory {path} is not readable here "
                "(its index and output are read where the results are)"
            )
        reader = _OutputReader(directory)
        for entry, _ in _index_lines(directory):
            result = TaskResult.of(entry, reader)
            if not wanted or result.status in wanted:
                yield result

    @staticmethod
    def _statuses(status: Union[str, Sequence[str], None]) -> List[str]:
        if status is None:
            return []
        names = [status] if isinstance(status, str) else list(status)
        names = [n.replace("_", "-") for n in names]
        for name in names:
            if name not in STATUSES:
                raise ValueError(f"{name!r} is not a final state; one of {', '.join(STATUSES)}")
        return names

    def to_pandas(self, status: Union[str, Sequence[str], None] = None, output: bool = False):
        """The results as a pandas DataFrame: one row per task, its
        parameters as columns; `output` adds its stdout as text."""
        try:
            import pandas as pd
        except ModuleNotFoundError as e:
            raise GleanerError("to_pandas needs pandas: pip install pandas") from e
        rows = []
        for r in self.results(status):
            row = {
                "task": r.task,
                "status": r.status,
                "exit_code": r.exit_code,
                "runtime_s": r.runtime_s,
                "attempts": r.attempts,
                "host": r.host,
            }
            row.update(r.params)
            if output:
                row["stdout"] = r.stdout.decode("utf-8", "replace")
            rows.append(row)
        return pd.DataFrame(rows).sort_values("task", ignore_index=True) if rows else pd.DataFrame()

    def logs(self, task: int, stderr: bool = False) -> bytes:
        """A task's captured output (its last run's)."""
        args = ["logs", self.id, str(int(task))]
        if stderr:
            args.append("--stderr")
        return self.client.cli.run(args).stdout

    def resubmit(
        self,
        *,
        failed: bool = False,
        timed_out: bool = False,
        lost: bool = False,
        cancelled: bool = False,
        tasks: Optional[Iterable[int]] = None,
    ) -> "Job":
        """Runs some of this job's tasks again as a new job (same params,
        same task numbers); with no state named, every task given."""
        args = ["resubmit", self.id]
        for flag, on in (
            ("--failed", failed),
            ("--timed-out", timed_out),
            ("--lost", lost),
            ("--cancelled", cancelled),
        ):
            if on:
                args.append(flag)
        if tasks is not None:
            args += ["--tasks", ",".join(str(int(t)) for t in tasks)]
        reply = self.client.cli.json(args)
        return Job(self.client, str(reply["job"]))


class Client:
    """gleaner's commands from Python. `config` is a gleaner.toml (default:
    as the CLI finds it); `env` adds environment variables (a broker URL,
    say) to the CLI's; `binary` is the gleaner executable (default: the
    wheel's, `$GLEANER_BIN`, or `PATH`'s)."""

    def __init__(
        self,
        config: Optional[PathLike] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        binary: Optional[PathLike] = None,
        cwd: Optional[PathLike] = None,
    ) -> None:
        self.cli = Cli(binary=binary, config=config, env=env, cwd=cwd)

    def submit(self, manifest: Manifest, *, open: bool = False) -> Job:
        """Submits a job: a manifest as a dict (the TOML's keys), a TOML
        text, or a `.toml`/`.json` file. Data files named in it are read
        relative to the file, or to the working directory for a dict."""
        args = ["submit"] + (["--open"] if open else [])
        reply = self._with_manifest_file(manifest, lambda path: self.cli.json(args + [path]))
        return Job(self, str(reply["job"]))

    def job(self, job_id: str) -> Job:
        return Job(self, job_id)

    def jobs(self, all: bool = False) -> List[JobReport]:
        """Your jobs, running (and with `all`, lately ended)."""
        reply = self.cli.json(["jobs"] + (["--all"] if all else [])) or []
        return [JobReport.of(r) for r in reply]

    def status(self) -> Dict[str, Any]:
        """Clusters, their hosts and jobs as the scheduler sees them."""
        return self.cli.json(["status"]) or {}

    def _with_manifest_file(self, manifest: Manifest, use):
        if _names_a_file(manifest):
            return use(os.fspath(manifest))
        data = load_manifest(manifest)
        # Beside the working directory's files, so that data files named
        # relative to it are found; else in the temporary directory.
        where = self.cli.cwd or os.getcwd()
        if not os.access(where, os.W_OK):
            where = None
        handle, path = tempfile.mkstemp(prefix=".gleaner-manifest-", suffix=".json", dir=where)
        try:
            with os.fdopen(handle, "w") as file:
                json.dump(data, file)
            try:
                return use(path)
            except GleanerError as e:
                # The file is this call's own: the user gave a manifest.
                e.args = (str(e).replace(f"{path}: ", "").replace(path, "the manifest"),)
                raise
        finally:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def wait_all(jobs: Iterable[Job], progress: bool = False, check: bool = True) -> List[JobReport]:
    """Waits for every job; with `check`, raises `JobFailed` for the first
    that did not fully succeed, once all have ended."""
    reports = [job.wait(progress, check=False) for job in jobs]
    if check:
        for report in reports:
            if not report.ok:
                raise JobFailed(report)
    return reports
