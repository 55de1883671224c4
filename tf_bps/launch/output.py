"""Where the output of a job's processes goes.

On bpslaunch's console every line of a worker carries its tag (`[3]: `, the rank), as
horovodrun's do. With --prefix-output-with-timestamp each line also starts with the
time it arrived; with --output-filename DIR each process's lines are kept as well, in
horovodrun's layout: DIR/rank.3/stdout and DIR/rank.3/stderr, untagged, and next to
them the scheduler's, each server's (DIR/server.0/...) and those of a remote host's
processes that carry no tag (DIR/host.node2/...). Lines from other hosts arrive tagged
through their ssh sessions, so the tag, not the process they came through, names their
folder.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import BinaryIO

_TAG = re.compile(rb"\[([^\]\s/]{1,64})\]: ")

# What TensorFlow prints whenever it loads, on every worker (some of it twice: it loads
# two libraries that log on their own): notices, not warnings about the job. A worker's
# output goes without them unless --verbose, or the user's own TF_CPP_MIN_LOG_LEVEL,
# asks for them.
_TF_START_UP_NOTICE = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    rb"STDERR$"
    rb"|[IWE]\d{4} [\d:.]+ +\d+ (port\.cc:\d+\] oneDNN custom operations are on"
    rb"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"
    rb"|cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"
    rb"|cuda_platform\.cc:\d+\] failed call to cuInit"
    rb"|cuda_diagnostics\.cc:\d+\] "
    rb"|\w+\.cc:\d+\] Unable to register cu(DNN|FFT|BLAS) factory"
    rb"|\w+\.cc:\d+\] TF-TRT Warning: Could not find TensorRT)"
    rb"|To enable the following instructions: .* rebuild TensorFlow with the appropriate "
    rb"compiler flags\.$")


def is_tf_start_up_notice(line: bytes) -> bool:
    return _TF_START_UP_NOTICE.match(line.rstrip(b"\r\n")) is not None


def folder_for(label: str) -> str:
    """The folder of a process's untagged lines: "server 0" -> "server.0"."""
    return label.replace(" ", ".").replace("/", "_")


class JobOutput:
    """Writes each line once to the console (and its file): safe from every pump."""

    def __init__(self, directory: str | None = None, timestamps: bool = False,
                 hide_tf_notices: bool = False):
        self.directory = directory
        self.timestamps = timestamps
        self.hide_tf_notices = hide_tf_notices  # in the workers' output (ProcessPlan)
        self._files: dict[tuple[str, str], BinaryIO] = {}
        self._lock = threading.Lock()
        if directory:
            os.makedirs(directory, exist_ok=True)

    @property
    def keeps_every_line(self) -> bool:
        """Whether helpers' and hosts' output must pass through here as well (it
        otherwise goes straight to the console)."""
        return bool(self.directory or self.timestamps)

    def write(self, line: bytes, tag: bytes, stream: str, origin: str) -> None:
        """`line` as read, printed after `tag`; `stream` is "stdout" or "stderr";
        `origin` is the folder for lines that carry no tag (folder_for)."""
        tagged = tag + line
        if self.timestamps:
            now = time.time()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            tagged = f"{stamp}.{int(now % 1 * 1000):03d} ".encode() + tagged
        with self._lock:
            sink = sys.stdout if stream == "stdout" else sys.stderr
            sink.buffer.write(tagged)
            sink.flush()
            if self.directory:
                self._keep(tag + line, stream, origin)  # untimed: files are per process

    def _keep(self, tagged: bytes, stream: str, origin: str) -> None:
        match = _TAG.match(tagged)
        if match:
            name = match.group(1).decode(errors="replace")
            folder = f"rank.{name}" if name.isdigit() else f"worker.{name}"
            tagged = tagged[match.end():]
        else:
            folder = origin
        key = (folder, stream)
        if key not in self._files:
            path = os.path.join(self.directory, folder)
            os.makedirs(path, exist_ok=True)
            self._files[key] = open(os.path.join(path, stream), "ab")
        self._files[key].write(tagged)
        self._files[key].flush()

    def close(self) -> None:
        with self._lock:
            for file in self._files.values():
                file.close()
            self._files.clear()
