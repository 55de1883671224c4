"""Horovod's stall inspector, run by the servers, which know who pushed to each round:
rank 1 is late with a tensor, and every worker logs a warning naming the tensor, the
round and rank 1; HOROVOD_STALL_SHUTDOWN_TIME_SECONDS fails the round with that message;
HOROVOD_STALL_CHECK_DISABLE=1 keeps quiet."""

import re

import pytest
from harness import marked_json

STALLED = (r"\[{rank}\]: .* worker rank {rank}: stalled: server \d .*: tensor 'laggard' "
           r"\(round 1\) waits for worker rank\(s\) 1, [1-9]\d* s after the first worker "
           r"pushed it")


@pytest.mark.parametrize("disable", ["0", "1"])
def test_every_worker_hears_which_rank_a_tensor_waits_for(procs, disable):
    status, output = procs.launch(
        2, "stall.py", num_servers=2, timeout=60, STALL_DELAY=2.5,
        HOROVOD_STALL_CHECK_TIME_SECONDS=1, HOROVOD_STALL_CHECK_DISABLE=disable)
    assert status == 0, output
    reports = marked_json(output)
    assert reports[0]["laggard"] == reports[1]["laggard"] == 20.0, reports
    for rank in (0, 1):
        found = re.search(STALLED.format(rank=rank), output)
        assert bool(found) == (disable == "0"), output
    assert ("stalled" in output) == (disable == "0"), output


def test_a_stalled_round_fails_after_the_shutdown_time(procs):
    status, output = procs.launch(
        2, "stall.py", num_servers=1, timeout=60, STALL_DELAY=4,
        HOROVOD_STALL_CHECK_TIME_SECONDS=0.5, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=1.5)
    assert status == 0, output
    reports = marked_json(output)
    why = ("tensor 'laggard' (round 1) waits for worker rank(s) 1, 1 s after the first "
           "worker pushed it")
    assert why in reports[0]["laggard"], reports
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=1.5" in reports[0]["laggard"], reports
    assert reports[0]["seconds"] < 3.5, reports
    # The late worker's push meets the round's end, and the reason.
    assert why in reports[1]["laggard"], reports
