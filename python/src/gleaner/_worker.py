"""A task of an `Executor`: runs its Python calls and prints their outcomes.

    python -m gleaner._worker PAYLOAD

PAYLOAD is the calls, pickled, compressed and base64-encoded (URL-safe, so
that the command needs no shell), or `@PATH` of a file holding them
(large calls). Each outcome goes, as it comes, on its own line of the
task's stdout: ``GLEANER-RESULT <index> <base64>``, or, for a large one,
``GLEANER-RESULT-FILE <index> <path>`` naming a file in the executor's
staging directory. The calls' own printing goes to stderr, so that stdout
carries outcomes alone. A call that raises is an outcome too (its
exception and traceback): the task fails only if the worker itself does.
"""

from __future__ import annotations

import base64
import os
import sys
import traceback
import zlib

#: Marks an outcome's line on the task's stdout.
RESULT = b"GLEANER-RESULT"
RESULT_FILE = b"GLEANER-RESULT-FILE"
#: Encoded outcomes longer than this go to a file in the staging directory
#: (when there is one): a task's stdout is kept up to its tail's bound
#: (`max_stream_bytes`, 1 MiB by default), and so is what all of its calls
#: print there together, at most `STDOUT_BUDGET`.
INLINE_BYTES = 192 * 1024
STDOUT_BUDGET = 512 * 1024
#: The environment variable naming the staging directory.
STAGING = "GLEANER_PY_STAGING"


def encode(obj: object) -> bytes:
    import cloudpickle

    return base64.urlsafe_b64encode(zlib.compress(cloudpickle.dumps(obj)))


def decode(data: bytes) -> object:
    import pickle

    return pickle.loads(zlib.decompress(base64.urlsafe_b64decode(data)))


def _load_calls(argument: str) -> list:
    if argument.startswith("@"):
        with open(argument[1:], "rb") as file:
            data = file.read()
    else:
        data = argument.encode()
    return decode(data)  # type: ignore[return-value]


def _outcome(fn, args, kwargs) -> tuple:
    try:
        return (True, fn(*args, **kwargs), None)
    except BaseException as e:  # a call's SystemExit is its outcome too
        return (False, e, traceback.format_exc())


def _encoded(outcome: tuple) -> bytes:
    try:
        return encode(outcome)
    except Exception as e:  # a value or exception that cannot be pickled
        text = outcome[2] or ""
        failure = RuntimeError(
            f"the call's {'value' if outcome[0] else 'exception'} cannot be pickled: {e!r}"
        )
        return encode((False, failure, text))


def main(argv: list) -> int:
    if len(argv) != 2:
        print("usage: python -m gleaner._worker PAYLOAD", file=sys.stderr)
        return 2
    calls = _load_calls(argv[1])
    # Outcomes get the real stdout; the calls' printing goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    staging = os.environ.get(STAGING)
    printed = 0
    for index, fn, args, kwargs in calls:
        encoded = _encoded(_outcome(fn, args, kwargs))
        if staging and (len(encoded) > INLINE_BYTES or printed + len(encoded) > STDOUT_BUDGET):
            path = os.path.join(staging, f"outcome-{index}-{os.uname().nodename}-{os.getpid()}")
            with open(path, "wb") as file:
                file.write(encoded)
            out.write(b"%s %d %s\n" % (RESULT_FILE, index, path.encode()))
        else:
            out.write(b"%s %d %s\n" % (RESULT, index, encoded))
            printed += len(encoded)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
