"""One rank of a Spark job: `python -m tf_bps.spark.worker RESULT_FILE`, started by its
barrier task (task.py) with the job's variables already in its environment.

The function runs in a process of its own, not in Spark's Python worker, so that
TensorFlow and tf_bps's core start fresh for every job, and ending the process ends
everything the rank started. It reads the cloudpickled (fn, args, kwargs) from standard
input and writes ("ok", result) or ("error", traceback) to RESULT_FILE.
"""

from __future__ import annotations

import sys
import traceback


def _cloudpickle():
    try:
        import cloudpickle
    except ImportError:
        from pyspark import cloudpickle
    return cloudpickle


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tf_bps.spark.worker RESULT_FILE", file=sys.stderr)
        return 2
    cloudpickle = _cloudpickle()
    try:
        fn, args, kwargs = cloudpickle.loads(sys.stdin.buffer.read())
        outcome = ("ok", cloudpickle.dumps(fn(*args, **kwargs)))
        status = 0
    except BaseException:  # noqa: B036 - SystemExit too: the driver says what fn did.
        text = traceback.format_exc()
        print(text, file=sys.stderr, end="", flush=True)
        outcome, status = ("error", text), 1
    with open(argv[0], "wb") as result:
        result.write(cloudpickle.dumps(outcome))
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
