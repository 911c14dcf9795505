"""`Executor.map` of trivial Python calls beside Dask's and Parsl's local
executors on the same slots, Python start-up included: each contender's
clock runs from making its executor to having every value back (gleaner's
services run beforehand, as a deployment's do; Dask's and Parsl's local
workers start inside the clock, as they would for a user).

    python bench/python/executor.py --calls 10000 --slots 4 --rounds 3

`GLEANER_BIN` names the gleaner under test; the broker is the local one.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "src"))

import gleaner  # noqa: E402


def inc(x):
    return x + 1


def check(values, calls):
    assert values == [x + 1 for x in range(calls)], "wrong values"


def run_gleaner(client, calls, slots):
    started = time.perf_counter()
    with gleaner.Executor(client) as executor:
        values = list(executor.map(inc, range(calls)))
    elapsed = time.perf_counter() - started
    check(values, calls)
    return elapsed


def run_dask(calls, slots):
    from dask.distributed import Client, LocalCluster

    started = time.perf_counter()
    with LocalCluster(
        n_workers=slots, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        with Client(cluster) as client:
            values = client.gather(client.map(inc, range(calls), pure=False))
    elapsed = time.perf_counter() - started
    check(values, calls)
    return elapsed


def run_parsl(calls, slots):
    import parsl
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    started = time.perf_counter()
    run_dir = tempfile.mkdtemp(prefix="parsl-")
    config = Config(
        executors=[
            HighThroughputExecutor(
                label="local",
                max_workers_per_node=slots,
                provider=LocalProvider(init_blocks=1, max_blocks=1),
            )
        ],
        run_dir=run_dir,
    )
    with parsl.load(config):
        app = parsl.python_app(inc)
        values = [f.result() for f in [app(x) for x in range(calls)]]
    elapsed = time.perf_counter() - started
    check(values, calls)
    return elapsed


class Up:
    """`gleaner up` on a vhost of its own."""

    def __init__(self, slots):
        self.vhost = f"gleaner-bench-executor-{uuid.uuid4().hex[:8]}"
        self._api("PUT", f"/vhosts/{self.vhost}", {})
        self._api(
            "PUT",
            f"/permissions/{self.vhost}/guest",
            {"configure": ".*", "write": ".*", "read": ".*"},
        )
        url = f"amqp://guest:guest@127.0.0.1:5672/{self.vhost}?heartbeat=10"
        self.dir = tempfile.mkdtemp(prefix="gleaner-bench-")
        self.env = {
            "GLEANER_BROKER_URL": url,
            "GLEANER_BROKER_URLS": url,
            "GLEANER_USERS__SINGLE": "true",
        }
        binary = os.environ.get("GLEANER_BIN", "target/release/gleaner")
        env = {**os.environ, **self.env, "RUST_LOG": "warn"}
        env.pop("GLEANER_CONFIG", None)
        self.process = subprocess.Popen(
            [binary, "up", "--slots", str(slots)],
            cwd=self.dir,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "up.log"), "wb"),
        )
        self.client = gleaner.Client(env=self.env, binary=binary, cwd=self.dir)
        deadline = time.monotonic() + 60
        while not self._serving():
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit("gleaner up did not serve")
            time.sleep(0.2)

    def _serving(self):
        try:
            return bool(self.client.status().get("clusters"))
        except gleaner.GleanerError:
            return False

    @staticmethod
    def _api(method, path, body=None):
        request = urllib.request.Request(
            "http://127.0.0.1:15672/api" + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
        )
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        request.add_header("Content-Type", "application/json")
        urllib.request.urlopen(request, timeout=30).close()

    def close(self):
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=30)
        self._api("DELETE", f"/vhosts/{self.vhost}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.chdir(tempfile.mkdtemp(prefix="executor-bench-"))
    up = Up(args.slots)
    times = {"gleaner": [], "dask": [], "parsl": []}
    try:
        for round_ in range(args.rounds):
            # Each round in a rotated order: none always runs first.
            order = ["gleaner", "dask", "parsl"]
            order = order[round_ % 3 :] + order[: round_ % 3]
            for name in order:
                if name == "gleaner":
                    times[name].append(run_gleaner(up.client, args.calls, args.slots))
                elif name == "dask":
                    times[name].append(run_dask(args.calls, args.slots))
                else:
                    times[name].append(run_parsl(args.calls, args.slots))
    finally:
        up.close()
    medians = {name: statistics.median(t) for name, t in times.items()}
    faster = min(medians["dask"], medians["parsl"])
    for name in ("gleaner", "dask", "parsl"):
        rate = args.calls / medians[name]
        print(
            f"| {name} | {args.calls} | {args.slots} | {medians[name]:.2f} | {rate:.0f} | "
            f"{', '.join(f'{t:.2f}' for t in times[name])} |"
        )
    print(f"gleaner against the faster of Dask and Parsl: {faster / medians['gleaner']:.2f} x")


if __name__ == "__main__":
    main()
