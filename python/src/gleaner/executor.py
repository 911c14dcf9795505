"""Python functions as tasks: a `concurrent.futures.Executor` whose calls
run on scavenged slots.

The executor holds one open job. Each `submit` is a task of one call; a
`map` is tasks of `chunksize` calls each (one Python start-up for many
short calls). A task is `python -m gleaner._worker PAYLOAD` (see
`_worker`); its outcomes come back on its stdout, which the executor reads
from the job's results as tasks end, so that retries, preemption and lost
launchers are gleaner's as for any task: a call's future gets its value,
the exception it raised, or `TaskFailed` once its task ended without it.
"""

from __future__ import annotations

import atexit
import math
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
import weakref
from concurrent import futures
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from . import _worker
from .client import Client, Job, _index_lines, _readable_results
from .errors import GleanerError, RemoteTraceback, TaskFailed, Unsuccessful

#: A command line's argument is at most 128 KiB on Linux; calls bigger
#: than this travel in a file of the staging directory.
INLINE_PAYLOAD = 96 * 1024
#: Calls in one task of a `map`, at most.
MAX_CHUNK = 1000

Call = Tuple[int, futures.Future, Callable, tuple, dict]


def _python_path() -> str:
    """This interpreter's import path, for the tasks' own: the functions
    cloudpickle pickles by reference are imported there as here."""
    entries = []
    for entry in sys.path:
        entry = os.path.abspath(entry or os.getcwd())
        if os.path.isdir(entry) and entry not in entries:
            entries.append(entry)
    return os.pathsep.join(entries)


class Executor(futures.Executor):
    """Runs Python callables as gleaner tasks.

    `client` says how to reach gleaner (default: `Client()`); `python` is
    the interpreter tasks run (default: this one, which the nodes must see
    at the same path); `chunksize` the calls per task of a `map` (default:
    enough tasks for four per slot of the clusters); `max_attempts`,
    `walltime` and any other manifest key (`manifest={...}`: `memory`,
    `slots`, `priority`...) are the job's; `staging` a directory the tasks
    share with this process for large calls and values (default: one made
    in the working directory, removed at shutdown).
    """

    def __init__(
        self,
        client: Optional[Client] = None,
        *,
        name: str = "python",
        python: Optional[str] = None,
        chunksize: Optional[int] = None,
        max_attempts: Optional[int] = None,
        walltime: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        manifest: Optional[Mapping[str, Any]] = None,
        staging: Optional[os.PathLike] = None,
        poll: float = 0.2,
    ) -> None:
        for key in ("task", "sweep", "final", "open"):
            if key in (manifest or {}):
                raise ValueError(f"the manifest key {key!r} is the executor's own")
        self.client = client or Client()
        self._python = python or sys.executable
        self._chunksize = chunksize
        self._poll = poll
        self._manifest: Dict[str, Any] = {"name": name}
        if max_attempts is not None:
            self._manifest["max_attempts"] = max_attempts
        if walltime is not None:
            self._manifest["walltime"] = walltime
        self._manifest.update(manifest or {})
        self._env = {"PYTHONPATH": _python_path(), **(env or {})}
        self._own_staging = staging is None
        self._staging_given = Path(staging) if staging is not None else None
        self._staging: Optional[Path] = None

        self._lock = threading.Condition()
        self._queued: List[List[Call]] = []
        self._sending = 0
        self._calls: Dict[int, List[Call]] = {}
        self._next_task = 0
        self._next_index = 0
        self._job: Optional[Job] = None
        self._closing = False
        self._closed = False
        # The collector's last failed reading (tried again at its next poll).
        self._last_error: Optional[Exception] = None
        self._sender = threading.Thread(
            target=self._send, name="gleaner-executor-send", daemon=True
        )
        self._collector = threading.Thread(
            target=self._collect, name="gleaner-executor-collect", daemon=True
        )
        self._sender.start()
        self._collector.start()
        # As the standard executors do: at exit, sent calls are waited for
        # and the job is closed rather than left open.
        atexit.register(_shut_down, weakref.ref(self))

    @property
    def job(self) -> Optional[Job]:
        """The executor's job, once its first calls were submitted."""
        return self._job

    # -- the Executor interface -------------------------------------------------

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> futures.Future:
        with self._lock:
            if self._closing:
                raise RuntimeError("cannot schedule new calls after shutdown")
            future: futures.Future = futures.Future()
            self._queued.append([(self._index(), future, fn, args, kwargs)])
            self._lock.notify_all()
        return future

    def map(
        self,
        fn: Callable,
        *iterables: Iterable,
        timeout: Optional[float] = None,
        chunksize: Optional[int] = None,
    ) -> Iterator:
        """As `Executor.map`; the calls go in tasks of `chunksize` calls
        (default: the executor's, else enough tasks for four per slot)."""
        inputs = list(zip(*iterables))
        size = chunksize or self._chunksize or self._auto_chunksize(len(inputs))
        size = max(1, min(int(size), MAX_CHUNK))
        calls: List[Call] = []
        with self._lock:
            if self._closing:
                raise RuntimeError("cannot schedule new calls after shutdown")
            for args in inputs:
                calls.append((self._index(), futures.Future(), fn, args, {}))
            for start in range(0, len(calls), size):
                self._queued.append(calls[start : start + size])
            self._lock.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._in_order([c[1] for c in calls], deadline)

    @staticmethod
    def _in_order(fs: List[futures.Future], deadline: Optional[float]) -> Iterator:
        try:
            for future in fs:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                yield future.result(left)
        finally:
            for future in fs:
                future.cancel()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls. With `cancel_futures`, calls not yet sent are
        cancelled and so is the job (its running tasks killed); with
        `wait`, returns once every call's future is done."""
        with self._lock:
            self._closing = True
            if cancel_futures:
                for chunk in self._queued:
                    for call in chunk:
                        call[1].cancel()
                self._queued.clear()
            self._lock.notify_all()
        if cancel_futures and self._job is not None:
            try:
                self._job.cancel()
            except GleanerError:
                pass
        if wait:
            self._sender.join()
            self._collector.join()

    # -- sending ------------------------------------------------------------------

    def _index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index

    def _auto_chunksize(self, calls: int) -> int:
        try:
            clusters = self.client.status().get("clusters", [])
            slots = sum(int((c.get("report") or {}).get("total_slots", 0) or 0) for c in clusters)
        except GleanerError:
            slots = 0
        return max(1, math.ceil(calls / (4 * max(slots, 4))))

    def _send(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._closing:
                    self._lock.wait()
                if not self._queued:
                    break
                # Calls submitted together go together.
                self._lock.wait(0.01)
                taken, self._queued = self._queued, []
                self._sending += 1
            try:
                self._send_chunks(taken)
            except Exception as e:  # whatever it was, no call waits forever for it
                for chunk in taken:
                    for call in chunk:
                        if not call[1].done():
                            call[1].set_exception(e)
            finally:
                with self._lock:
                    self._sending -= 1
                    self._lock.notify_all()
        if self._job is not None and not self._closed:
            self._closed = True
            _retrying(self._job.close)

    def _send_chunks(self, chunks: List[List[Call]]) -> None:
        live = []
        for chunk in chunks:
            chunk = [c for c in chunk if c[1].set_running_or_notify_cancel()]
            if chunk:
                live.append(chunk)
        commands = []
        for chunk in list(live):
            try:
                commands.append(self._command(chunk))
            except Exception as e:  # a call that cannot be pickled fails its own task only
                live.remove(chunk)
                for call in chunk:
                    call[1].set_exception(e)
        if not live:
            return
        # The runner numbers a job's tasks in the order they come, an
        # addition's after the job's own: this is the only sender.
        with self._lock:
            first = self._next_task
            for offset, chunk in enumerate(live):
                self._calls[first + offset] = chunk
            self._next_task += len(live)
        tasks = [{"command": command} for command in commands]
        try:
            if self._job is None:
                manifest = dict(self._manifest)
                manifest["env"] = {**self._env, **dict(manifest.get("env") or {})}
                manifest["task"] = tasks
                self._job = self.client.submit(manifest, open=True)
            else:
                job = self._job
                # An addition reaches the job through the scheduler, which
                # knows it once its runner has reported it.
                _retrying(lambda: job.add({"task": tasks}), on=Unsuccessful)
        except BaseException as e:
            with self._lock:
                for offset in range(len(live)):
                    self._calls.pop(first + offset, None)
                self._next_task = first
            for chunk in live:
                for call in chunk:
                    call[1].set_exception(e)
            if not isinstance(e, Exception):
                raise

    def _staging_dir(self) -> Path:
        if self._staging is None:
            if self._staging_given is not None:
                self._staging_given.mkdir(parents=True, exist_ok=True)
                self._staging = self._staging_given
            else:
                base = os.getcwd() if os.access(os.getcwd(), os.W_OK) else None
                self._staging = Path(tempfile.mkdtemp(prefix=".gleaner-executor-", dir=base))
            self._env[_worker.STAGING] = str(self._staging)
        return self._staging

    def _command(self, chunk: List[Call]) -> str:
        if self._job is None:
            # The job's environment names it: outcomes too large for a
            # task's stdout are written there.
            self._staging_dir()
        payload = _worker.encode(
            [(index, fn, args, kwargs) for index, _, fn, args, kwargs in chunk]
        )
        if len(payload) > INLINE_PAYLOAD:
            path = self._staging_dir() / f"calls-{chunk[0][0]}"
            path.write_bytes(payload)
            argument = "@" + str(path)
        else:
            argument = payload.decode()
        return f"{shlex.quote(self._python)} -m gleaner._worker {shlex.quote(argument)}"

    # -- collecting ---------------------------------------------------------------

    def _collect(self) -> None:
        offset = 0
        directory: Optional[Path] = None
        last_look = 0.0
        while True:
            with self._lock:
                if self._closing and not self._queued and not self._sending and not self._calls:
                    break
                job = self._job
            if job is not None:
                try:
                    if directory is None:
                        directory = self._results_dir(job)
                    if directory is not None:
                        for entry, next_offset in _index_lines(directory, offset):
                            self._ended(job, directory, entry)
                            offset = next_offset
                    # Calls whose tasks never came (the job was cancelled,
                    # refused, or ended otherwise) are answered once it ended.
                    if time.monotonic() - last_look > 5.0:
                        last_look = time.monotonic()
                        self._give_up_if_ended(job, directory, offset)
                except Exception as e:  # a reading that failed is tried again
                    self._last_error = e
            with self._lock:
                self._lock.wait(self._poll)
        self._remove_staging()

    def _results_dir(self, job: Job) -> Optional[Path]:
        """The job's results directory, once the scheduler knows the job;
        calls then fail at once if this process cannot read it."""
        try:
            path = job.status().results
        except GleanerError:
            return None
        directory = _readable_results(path)
        if directory is None:
            self._fail_all(
                job,
                GleanerError(
                    f"the executor reads its calls' outcomes from {path}, which is not "
                    "readable here: run it where the job's results directory is"
                ),
            )
        return directory

    def _ended(self, job: Job, directory: Path, entry: Mapping[str, Any]) -> None:
        task = int(entry.get("task", -1))
        with self._lock:
            chunk = self._calls.pop(task, None)
        if chunk is None:
            return
        status = str(entry.get("status", "")).replace("_", "-")
        why = entry.get("error") or f"exit code {entry.get('exit_code')}"
        try:
            outcomes = self._outcomes(directory, entry)
        except (GleanerError, OSError) as e:
            outcomes, why = {}, f"its output cannot be read: {e}"
        for index, future, *_ in chunk:
            if future.done():
                continue
            if index in outcomes:
                ok, value, text = outcomes[index]
                if ok:
                    future.set_result(value)
                else:
                    # A call's SystemExit or KeyboardInterrupt is its
                    # outcome, not the caller's: it does not end this program.
                    if not isinstance(value, Exception):
                        value = TaskFailed(f"the call raised {value!r}", task=task, status=status)
                    if text:
                        value.__cause__ = RemoteTraceback(text)
                    future.set_exception(value)
                continue
            future.set_exception(
                TaskFailed(
                    f"task {task} ended {status} ({why}) without this call's outcome",
                    task=task,
                    status=status,
                )
            )

    def _outcomes(self, directory: Path, entry: Mapping[str, Any]) -> Dict[int, tuple]:
        span = entry.get("stdout")
        if not span:
            return {}
        with open(directory / "output.log", "rb") as log:
            log.seek(int(span["offset"]))
            stdout = log.read(int(span["bytes"]))
        outcomes: Dict[int, tuple] = {}
        for line in stdout.splitlines():
            words = line.split(b" ", 2)
            if len(words) != 3 or words[0] not in (_worker.RESULT, _worker.RESULT_FILE):
                continue
            try:
                index = int(words[1])
            except ValueError:
                continue
            try:
                data = words[2] if words[0] == _worker.RESULT else self._staged(words[2])
                outcomes[index] = _worker.decode(data)  # type: ignore[assignment]
            except Exception as e:  # a line cut short, a file gone
                failure = GleanerError(f"cannot read the call's outcome: {e!r}")
                outcomes.setdefault(index, (False, failure, None))
        return outcomes

    def _staged(self, name: bytes) -> bytes:
        """An outcome written to the staging directory (and only there)."""
        staging = self._staging
        path = Path(os.fsdecode(name)).resolve()
        if staging is None or path.parent != staging.resolve():
            raise GleanerError(f"{path}: not in the executor's staging directory")
        data = path.read_bytes()
        path.unlink(missing_ok=True)
        return data

    def _give_up_if_ended(self, job: Job, directory: Optional[Path], offset: int) -> None:
        """Once the job ended (or was refused) and its whole index was read,
        calls still unanswered get `TaskFailed`."""
        try:
            report = job.status()
        except Unsuccessful as e:
            if "refused" in str(e):
                self._fail_all(job, TaskFailed(str(e), task=-1, status="refused"))
            return
        except GleanerError:
            return
        if not report.ended:
            return
        if directory is not None:
            for entry, _ in _index_lines(directory, offset):
                self._ended(job, directory, entry)
        self._fail_all(
            job,
            TaskFailed(
                f"job {job.id} ended ({report.state}) without this call's outcome",
                task=-1,
                status=report.state,
            ),
        )

    def _fail_all(self, job: Job, error: Exception) -> None:
        with self._lock:
            left, self._calls = self._calls, {}
        for chunk in left.values():
            for _, future, *_ in chunk:
                if not future.done():
                    future.set_exception(error)

    def _remove_staging(self) -> None:
        if self._own_staging and self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)


def _retrying(step: Callable[[], Any], on: type = GleanerError, for_s: float = 30.0) -> Any:
    """`step`, again with backoff while it fails with `on`, for `for_s`."""
    deadline = time.monotonic() + for_s
    pause = 0.2
    while True:
        try:
            return step()
        except on:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 3.0)


def _shut_down(ref: "weakref.ref[Executor]") -> None:
    executor = ref()
    if executor is not None:
        executor.shutdown(wait=True)
