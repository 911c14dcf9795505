"""A test's gleaner: a vhost of its own on the local RabbitMQ, `gleaner up`
in a directory of its own, and a `Client` for both; all removed after."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

import gleaner

REPO = Path(__file__).resolve().parents[2]
API = "http://127.0.0.1:15672/api"
AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def binary() -> str:
    """The gleaner under test: `$GLEANER_BIN`, else the checkout's build."""
    explicit = os.environ.get("GLEANER_BIN")
    if explicit:
        return explicit
    for profile in ("debug", "release"):
        built = REPO / "target" / profile / "gleaner"
        if built.is_file():
            return str(built)
    pytest.fail("no gleaner binary: build it (cargo build -p gleaner) or set GLEANER_BIN")


def api(method: str, path: str, body: object = None) -> None:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{API}{path}", data=data, method=method)
    request.add_header("Authorization", AUTH)
    request.add_header("Content-Type", "application/json")
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except urllib.error.HTTPError as e:
        if not (method == "DELETE" and e.code == 404):
            raise


def wait_for(what: str, condition, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def running(job, succeeded: int = 0) -> bool:
    """The job is known and has a task running (or `succeeded` ended)."""
    if job is None:
        return False
    try:
        tasks = job.status().tasks
    except gleaner.GleanerError:
        return False
    return tasks.succeeded >= succeeded if succeeded else tasks.running > 0


class Gleaner:
    """`gleaner up` on a vhost of its own, and a client of it."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.vhost = f"gleaner-test-py-{name}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        quoted = urllib.parse.quote(self.vhost, safe="")
        api("PUT", f"/vhosts/{quoted}", {})
        api("PUT", f"/permissions/{quoted}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
        url = f"amqp://guest:guest@127.0.0.1:5672/{quoted}?heartbeat=10"
        self.env = {
            "GLEANER_BROKER_URL": url,
            "GLEANER_BROKER_URLS": url,
            "GLEANER_LAUNCHER__IDLE_TIMEOUT": "2s",
            "GLEANER_LAUNCHER__HEARTBEAT": "1s",
            "GLEANER_RUNNER__HEARTBEAT": "1s",
            "GLEANER_USERS__SINGLE": "true",
        }
        self.binary = binary()
        self.client = gleaner.Client(env=self.env, binary=self.binary, cwd=directory)
        self.up_process = None

    def up(self, slots: int) -> None:
        env = dict(os.environ)
        env.pop("GLEANER_CONFIG", None)
        env.update(self.env)
        env["RUST_LOG"] = "info"
        log = open(self.directory / "up.log", "wb")
        self.up_process = subprocess.Popen(
            [self.binary, "up", "--slots", str(slots)],
            cwd=self.directory,
            env=env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for("gleaner up to serve", lambda: self._serving())

    def _serving(self) -> bool:
        try:
            return bool(self.client.status().get("clusters"))
        except gleaner.GleanerError:
            return False

    def launchers(self) -> list:
        """Pids of the launchers `gleaner up` started."""
        if self.up_process is None:
            return []
        found = subprocess.run(
            ["pgrep", "-f", "-s", str(self.up_process.pid), "gleaner launcher"],
            capture_output=True,
            text=True,
            check=False,
        )
        return [int(p) for p in found.stdout.split()]

    def close(self) -> None:
        if self.up_process is not None:
            try:
                os.killpg(self.up_process.pid, signal.SIGTERM)
                self.up_process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.up_process.pid, signal.SIGKILL)
                self.up_process.wait()
            except ProcessLookupError:
                pass
        api("DELETE", f"/vhosts/{urllib.parse.quote(self.vhost, safe='')}")


@pytest.fixture
def glean(tmp_path, request):
    """A gleaner with `gleaner up` on 4 slots (`@pytest.mark.slots(n)`)."""
    marker = request.node.get_closest_marker("slots")
    slots = marker.args[0] if marker else 4
    g = Gleaner(tmp_path, request.node.name.replace("[", "-").replace("]", "")[:40])
    try:
        g.up(slots)
        previous = os.getcwd()
        os.chdir(tmp_path)
        try:
            yield g
        finally:
            os.chdir(previous)
    finally:
        g.close()


def pytest_configure(config):
    config.addinivalue_line("markers", "slots(n): slots of the test's gleaner up")
