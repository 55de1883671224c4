"""A summation server: `bps-server`, `DMLC_ROLE=server bpslaunch` or
`DMLC_ROLE=server python -m tf_bps.server`. Imports no TensorFlow."""

from __future__ import annotations

import logging
import sys

from tf_bps import core
from tf_bps.config import Config, ConfigError, configure_logging
from tf_bps.rendezvous import RendezvousError, SchedulerLink

log = logging.getLogger("tf_bps.server")


def serve(config: Config) -> int:
    """Runs one server until the scheduler ends the job; returns the exit status."""
    engine = core.server_start(config)
    link = SchedulerLink(config)
    stop_reason = ""  # What the workers hear when the server stops, if it fails.
    try:
        book = link.register("server", port=engine.port)
        engine.serve(book["merge_groups"])
        log.info("server %d serving %d worker(s) on port %d", book["server_id"],
                 book["num_workers"], engine.port)
        failure_fd = engine.failure_fd()
        reported = False
        while True:
            messages, ready = link.poll_once([] if reported else [failure_fd])
            for message in messages:
                if message["type"] == "exit":
                    return 0
                if message["type"] == "abort":
                    print(f"tf_bps server: job aborted: {message['reason']}", file=sys.stderr)
                    stop_reason = f"the job is failing: {message['reason']}"
                    return 1
            if ready and not reported:
                link.send({"type": "failure", "reason": engine.failure()})
                reported = True
    except RendezvousError as error:
        print(f"tf_bps server: {error}", file=sys.stderr)
        return 1
    finally:
        failure = engine.failure()
        engine.stop(stop_reason or failure)
        link.close(failure=failure or None, say_done=False)


def main() -> int:
    try:
        config = Config.from_env()
    except ConfigError as error:
        print(f"tf_bps server: {error}", file=sys.stderr)
        return 2
    if config.role not in (None, "server"):
        print(f"tf_bps server: DMLC_ROLE={config.role!r} but this is a server; "
              "set DMLC_ROLE=server", file=sys.stderr)
        return 2
    configure_logging(config, "tf_bps server")
    try:
        return serve(config)
    except ConfigError as error:
        print(f"tf_bps server: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
