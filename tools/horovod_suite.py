"""Runs Horovod's own TensorFlow test files against tf_bps, with their import switched.

    pip install parameterized cloudpickle mock     # Horovod's test helpers use them
    git clone https://github.com/horovod/horovod /tmp/horovod
    python tools/horovod_suite.py /tmp/horovod test_tensorflow.py test_tensorflow2_keras.py

Each file runs as Horovod runs it (`horovodrun -np 2 pytest FILE`), here under
`bpslaunch -np 2`, in a scratch folder holding the file, the helpers it imports from
Horovod's test folder, and a package named `horovod` whose modules are tf_bps's:
`horovod.tensorflow` is `tf_bps`, `horovod.tensorflow.keras` and `horovod.keras` are
`tf_bps.keras`. The two version helpers the suites import from Horovod's utilities are
written here, and the one thread helper its test utilities import. Nothing of Horovod's
library is used.

Prints, per file and rank, pytest's tally (tests and subtests passed, failed, skipped)
and each failure with its first line of error. Exits 1 if any test failed on any rank.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Modules of the shim package: Horovod's module names as aliases of tf_bps's, and the
# three small utilities Horovod's test helpers import, in our words.
SHIM = {
    "horovod/__init__.py": "",
    # A package of its own (its `util` and `keras` live in the shim, and the suite calls
    # the helper it imports from `util` through it), passing every other name to tf_bps.
    "horovod/tensorflow/__init__.py":
        "import tf_bps\nfrom horovod.tensorflow.util import _executing_eagerly  # noqa\n\n\n"
        "def __getattr__(name):\n    return getattr(tf_bps, name)\n",
    "horovod/tensorflow/keras/__init__.py":
        "import sys\nimport tf_bps.keras\nsys.modules[__name__] = tf_bps.keras\n",
    "horovod/keras/__init__.py":
        "import sys\nimport tf_bps.keras\nsys.modules[__name__] = tf_bps.keras\n",
    "horovod/tensorflow/util.py":
        "import tensorflow as tf\n\n\ndef _executing_eagerly():\n"
        "    return tf.executing_eagerly()\n",
    "horovod/runner/__init__.py": "",
    "horovod/runner/util/__init__.py": "",
    "horovod/runner/util/threads.py":
        "import threading\n\n\ndef in_thread(target, args=(), name=None, daemon=True, "
        "silent=False):\n    thread = threading.Thread(target=target, args=args, name=name, "
        "daemon=daemon)\n    thread.start()\n    return thread\n",
    "horovod/common/__init__.py": "",
    "horovod/common/util.py":
        "from packaging import version\n\n\ndef is_version_greater_equal_than(ver, target):\n"
        "    return version.parse(ver) >= version.parse(target)\n",
}
# Horovod's test helpers that the TensorFlow files import by module name (in test/).
HELPERS = ("utils/common.py", "parallel/base_test_tensorflow.py")
# pytest's last line per rank ("12 failed, 143 passed, 112 skipped, ... in 69.38s") and
# its short summary of each failure (-rfE), subtests (graph and eager mode) included.
TALLY = re.compile(r"^\[(\d+)\]: =+ (.*\d+ \w+.*) in [\d.]+s")
FAILURE = re.compile(r"^\[(\d+)\]: (?:SUB)?(?:FAILED|ERROR)(\[\S+\])? (\S+)(?: - (.*))?$")


def write_scratch(horovod: Path, test_file: str) -> Path:
    parallel = horovod / "test" / "parallel"
    if not (parallel / test_file).is_file():
        raise SystemExit(f"{parallel / test_file} does not exist: give a checkout of "
                         "Horovod's repository and a file of its test/parallel folder")
    scratch = Path(tempfile.mkdtemp(prefix="horovod_suite_"))
    for source in (parallel / test_file, *(horovod / "test" / h for h in HELPERS)):
        if source.exists():
            shutil.copy(source, scratch / source.name)
    for relative, text in SHIM.items():
        path = scratch / "shim" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return scratch


def run_file(horovod: Path, test_file: str, workers: int, timeout: float,
             selection: str | None) -> tuple[dict, dict, str]:
    scratch = write_scratch(horovod, test_file)
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(scratch / "shim"), str(scratch), str(repo)]), BYTEPS_OP_TIMEOUT="60",
        COLUMNS="400")  # pytest shortens failure reasons to the terminal width
    command = [sys.executable, "-m", "tf_bps.launch", "-np", str(workers), sys.executable,
               "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider", test_file]
    if selection:
        command += ["-k", selection]
    try:
        done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True,
                              timeout=timeout)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode() + f"\n(timed out after {timeout} s)"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tallies, failures = {}, collections.defaultdict(dict)
    for line in output.splitlines():
        if match := TALLY.match(line):
            tallies[int(match[1])] = match[2]
        elif match := FAILURE.match(line):
            failures[int(match[1])][match[3]] = (match[4] or "")[:200]
    return tallies, failures, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("horovod", type=Path, help="a checkout of Horovod's repository")
    parser.add_argument("files", nargs="*", default=["test_tensorflow.py",
                                                     "test_tensorflow2_keras.py",
                                                     "test_tensorflow_keras.py"])
    parser.add_argument("-np", "--num-proc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per file")
    parser.add_argument("-k", dest="selection", help="pytest's -k, to run some tests only")
    parser.add_argument("--log", type=Path, help="write each file's whole output here")
    args = parser.parse_args()
    any_failed = False
    for test_file in args.files:
        tallies, failures, output = run_file(args.horovod, test_file, args.num_proc,
                                             args.timeout, args.selection)
        if args.log:
            args.log.mkdir(parents=True, exist_ok=True)
            (args.log / f"{test_file}.log").write_text(output)
        print(f"== {test_file}")
        if len(tallies) < args.num_proc:
            print("   not every rank finished; the output ends with:\n" + output[-3000:])
            any_failed = True
        for rank in sorted(tallies):
            print(f"   rank {rank}: {tallies[rank]}")
        any_failed |= bool(failures)
        for name in sorted({n for per_rank in failures.values() for n in per_rank}):
            ranks = [r for r in sorted(failures) if name in failures[r]]
            reason = failures[ranks[0]][name]
            print(f"   FAILED {name.split('::')[-1]} (rank {', '.join(map(str, ranks))}): "
                  f"{reason}")
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
