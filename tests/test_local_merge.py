"""The hierarchical local merge through real jobs: two hosts of two workers each
(BYTEPS_LOCAL_SIZE=2) and two servers, the hosts emulated by distinct DMLC_NODE_HOST
addresses or made of network namespaces (tests/netbed.py: TCP between hosts, links
limited by tc). The results must be numpy's and the servers must receive one copy per
host; on emulated hosts, the same job without the merge (BYTEPS_LOCAL_MERGE=0) must give
the same results with twice the bytes."""

import re

import numpy as np
import pytest
from harness import LAUNCH, base_env, finish, free_port, worker_command
from netbed import NetBed, NetBedUnavailable

HOSTS, LOCAL_SIZE = 2, 2
SIZE = HOSTS * LOCAL_SIZE


def _run_two_hosts(procs, out, merge: bool, bed: NetBed | None = None):
    """Runs local_merge.py on 2 hosts x 2 workers; returns each rank's results and the
    bytes the servers received per tensor. With `bed`, worker hosts are its hosts 0 and
    1, and the scheduler and servers run on its host 2."""
    out.mkdir()

    def on(host: int, command: list[str]) -> list[str]:
        return bed.command(host, command) if bed else command

    common = {"DMLC_PS_ROOT_URI": bed.address(HOSTS) if bed else "127.0.0.1",
              "DMLC_PS_ROOT_PORT": free_port(), "DMLC_NUM_WORKER": HOSTS, "DMLC_NUM_SERVER": 2,
              "BYTEPS_LOCAL_SIZE": LOCAL_SIZE, "BYTEPS_PARTITION_BYTES": 256 * 1024,
              "BYTEPS_LOCAL_MERGE": int(merge), "TEST_OUT": out}
    job = {"scheduler": procs.start(on(HOSTS, LAUNCH),
                                    base_env(DMLC_ROLE="scheduler", **common))}
    for server in range(2):  # Servers log each tensor's traffic at DEBUG when they stop.
        job[f"server{server}"] = procs.start(
            on(HOSTS, LAUNCH), base_env(DMLC_ROLE="server", BYTEPS_LOG_LEVEL="DEBUG", **common))
    for host in range(HOSTS):
        # Without namespaces, each emulated host advertises its own loopback address.
        where = {} if bed else {"DMLC_NODE_HOST": f"127.0.0.{host + 1}"}
        job[f"host{host}"] = procs.start(
            on(host, [*LAUNCH, *worker_command("local_merge.py")]),
            base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=host, **where, **common))
    received: dict[str, int] = {}
    for name, process in job.items():
        status, output = finish(process, timeout=180)
        assert status == 0, (name, output)
        for tensor, count in re.findall(r"tensor '([^']+)' moved (\d+) bytes in", output):
            received[tensor] = received.get(tensor, 0) + int(count)
    results = {rank: dict(np.load(out / f"rank{rank}.npz")) for rank in range(SIZE)}
    return results, received


def _assert_numpy_results(merged: dict) -> None:
    """Each rank's sums, average, grouped sums, broadcast and allgather are numpy's, and
    every rank ends with the same values (its Keras model's weights too)."""
    pattern = np.arange(300_000, dtype=np.float32) % 97
    for rank in range(SIZE):
        got = merged[rank]
        for step in range(3):
            want = SIZE * pattern + 1000 * sum(range(SIZE)) + SIZE * step
            np.testing.assert_array_equal(got[f"sum{step}"], want)
        np.testing.assert_array_equal(got["average"], np.full(1000, 4 * 1.5, np.float32))
        np.testing.assert_array_equal(got["grouped0"], np.full(7, 6.0, np.float32))
        np.testing.assert_array_equal(got["grouped1"], np.full((3, 3), 12.0, np.float32))
        np.testing.assert_array_equal(got["broadcast"], np.full(5, SIZE - 1.0, np.float32))
        want_rows = np.concatenate([np.full((r + 1, 2), float(r), np.float32)
                                    for r in range(SIZE)])
        np.testing.assert_array_equal(got["allgather"], want_rows)
        for name, value in got.items():
            np.testing.assert_array_equal(value, merged[0][name], err_msg=f"{rank} {name}")


def _assert_one_copy_per_host(merged_bytes: dict) -> None:
    """The servers received one copy of a merged tensor per host, not one per worker."""
    assert merged_bytes["big"] == 3 * HOSTS * 300_000 * 4, merged_bytes
    assert merged_bytes["avg"] == HOSTS * 1000 * 4, merged_bytes


def test_two_hosts_merge_locally_with_the_flat_results_and_half_the_bytes(procs, tmp_path):
    """Hosts told apart by DMLC_NODE_HOST, the same job with and without the merge."""
    merged, merged_bytes = _run_two_hosts(procs, tmp_path / "merged", merge=True)
    flat, flat_bytes = _run_two_hosts(procs, tmp_path / "flat", merge=False)
    _assert_numpy_results(merged)
    for rank in range(SIZE):
        for name, value in merged[rank].items():
            # The flat job trains the same model (up to the order in which float
            # gradients were summed).
            np.testing.assert_allclose(value, flat[rank][name], rtol=1e-5, atol=1e-7,
                                       err_msg=name)
    _assert_one_copy_per_host(merged_bytes)
    for tensor in ("big", "avg"):
        assert merged_bytes[tensor] * LOCAL_SIZE == flat_bytes[tensor], (merged_bytes, flat_bytes)
    # What does not merge (a broadcast, an allgather) moves as before.
    for tensor in ("bcast", "rows"):
        assert merged_bytes[tensor] == flat_bytes[tensor], (merged_bytes, flat_bytes)


def test_hosts_of_network_namespaces_merge_locally_across_tcp(procs, tmp_path):
    """The merged job on hosts of their own (a NetBed of 3 hosts at 200 Mbit/s: two of
    workers, one of the scheduler and servers), where only TCP joins the hosts."""
    try:
        with NetBed(hosts=HOSTS + 1, mbit=200) as bed:
            merged, merged_bytes = _run_two_hosts(procs, tmp_path / "merged", merge=True,
                                                  bed=bed)
    except NetBedUnavailable as why:
        pytest.skip(str(why))
    _assert_numpy_results(merged)
    _assert_one_copy_per_host(merged_bytes)
