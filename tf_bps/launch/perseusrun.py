"""perseusrun: AIACC-Training's launcher syntax, starting a tf_bps job.

    perseusrun [--gloo|--mpi] -np NP [-H host1:N,host2:N] -- COMMAND [ARG ...]

Everything after the backend choice means what it means to bpslaunch (whose other
options are accepted too). The communication is always tf_bps's own.
"""

from __future__ import annotations

import argparse
import sys

from tf_bps.launch import bpslaunch

_BACKENDS = ("AIACC-Training's backends (Gloo, or MPI) are replaced here by tf_bps's own "
             "communication: push_pull through summation servers, TCP between hosts and "
             "shared memory inside one. The flag is accepted so that existing commands run "
             "unchanged, and changes nothing.")


def _plain_dashes(argv: list[str]) -> list[str]:
    """Options written with typographic dashes, as copied from formatted documents
    (`–np 16`, `–-mpi`), read as the ASCII ones; the worker's command is left alone."""
    fixed = []
    for index, arg in enumerate(argv):
        if arg == "--":
            return fixed + argv[index:]
        if arg[:1] in ("\u2013", "\u2014"):
            body = arg.lstrip("\u2013\u2014-")
            arg = ("-" if len(body) <= 2 and arg[1:2] not in ("-", "\u2013", "\u2014")
                   else "--") + body
        fixed.append(arg)
    return fixed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="perseusrun",
        description="Start a tf_bps job with AIACC-Training's launcher syntax: a scheduler, "
                    "servers and -np workers on this machine, or over ssh on the hosts of "
                    "-H (N processes per host, usually its GPU count).")
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument("--gloo", action="store_true", help=_BACKENDS)
    backend.add_argument("--mpi", action="store_true", help="See --gloo.")
    args = bpslaunch.job_arguments(parser).parse_args(
        _plain_dashes(sys.argv[1:] if argv is None else argv))
    return bpslaunch.run(args, whole_job=True)


if __name__ == "__main__":
    sys.exit(main())
