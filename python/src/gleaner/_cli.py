"""Running the `gleaner` binary: where it is, and what its exit codes mean.

The Python API is a typed face on the CLI's `--output json`: one contract
(the CLI's, documented and tested), whatever the broker, TLS or account
setup the user's configuration holds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from .errors import BadInput, Denied, GleanerError, Unreachable, Unsuccessful

PathLike = Union[str, "os.PathLike[str]"]


def find_binary(explicit: Optional[PathLike] = None) -> str:
    """The `gleaner` executable: the one given, `$GLEANER_BIN`, the one this
    package's wheel installed beside this Python, or the first on `$PATH`."""
    for candidate in (explicit, os.environ.get("GLEANER_BIN")):
        if candidate:
            return os.fspath(candidate)
    scripts = sysconfig.get_path("scripts")
    if scripts:
        beside = Path(scripts) / "gleaner"
        if beside.is_file() and os.access(beside, os.X_OK):
            return str(beside)
    beside_python = Path(sys.executable).parent / "gleaner"
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    found = shutil.which("gleaner")
    if found:
        return found
    raise GleanerError(
        "cannot find the gleaner executable: install the gleaner wheel, "
        "put gleaner on PATH, or set GLEANER_BIN"
    )


class Cli:
    """One way of running gleaner: the binary, a configuration file, and
    environment variables added to this process's."""

    def __init__(
        self,
        binary: Optional[PathLike] = None,
        config: Optional[PathLike] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[PathLike] = None,
    ) -> None:
        self.binary = find_binary(binary)
        self.config = os.fspath(config) if config is not None else None
        self.env = dict(env or {})
        self.cwd = os.fspath(cwd) if cwd is not None else None

    def environment(self) -> dict:
        env = dict(os.environ)
        env.update(self.env)
        # Logs are for services; a client's terminal gets errors only.
        env.setdefault("RUST_LOG", "warn")
        return env

    def argv(self, args: Sequence[str]) -> list:
        argv = [self.binary]
        argv.extend(args)
        if self.config is not None:
            argv.extend(["--config", self.config])
        return argv

    def run(
        self,
        args: Sequence[str],
        *,
        check: bool = True,
        timeout: Optional[float] = None,
        stderr_to_terminal: bool = False,
    ) -> subprocess.CompletedProcess:
        """Runs a command to its end; a non-zero exit becomes the error its
        code stands for (1 unsuccessful, 2 bad input, 3 unreachable, 4
        denied), carrying what gleaner said on stderr."""
        try:
            done = subprocess.run(
                self.argv(args),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=None if stderr_to_terminal else subprocess.PIPE,
                env=self.environment(),
                cwd=self.cwd,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError as e:
            raise GleanerError(f"cannot run {self.binary}: {e}") from e
        if check and done.returncode != 0:
            raise error_of(done.returncode, done.stderr, args)
        return done

    def json(self, args: Sequence[str], **kwargs: Any) -> Any:
        """Runs a command with `--output json` and parses what it printed."""
        done = self.run([*args, "--output", "json"], **kwargs)
        return parse_json(done.stdout, args)

    def popen(self, args: Sequence[str]) -> subprocess.Popen:
        return subprocess.Popen(
            self.argv(args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.environment(),
            cwd=self.cwd,
        )


def parse_json(stdout: bytes, args: Sequence[str]) -> Any:
    text = stdout.decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise GleanerError(f"gleaner {' '.join(args)} printed what is not JSON: {e}") from e


def error_of(code: int, stderr: Optional[bytes], args: Sequence[str]) -> GleanerError:
    said = (stderr or b"").decode("utf-8", "replace").strip()
    message = said.removeprefix("error: ") or f"gleaner {' '.join(args[:1])} exited {code}"
    kind = {1: Unsuccessful, 2: BadInput, 3: Unreachable, 4: Denied}.get(code, GleanerError)
    return kind(message, code=code, stderr=said)
