"""Stragglers, named by the servers from the arrival times they see: a worker that comes
last in most rounds of a window, later than the threshold, is named with its address
and how late it was; the others are not."""

import re


def test_a_worker_that_pushes_late_every_round_is_named_by_the_server(procs):
    # Rank 1 pushes 150 ms after rank 0 in each of 40 rounds: about 7 s, three windows.
    status, output = procs.launch(2, "steady_sums.py", num_servers=1, TEST_ROUNDS=40,
                                  TEST_SLOW_RANK=1, TEST_SLOW_MS=150,
                                  BYTEPS_STRAGGLER_WINDOW_SECONDS=2,
                                  BYTEPS_STRAGGLER_THRESHOLD_MS=60, timeout=90)
    assert status == 0, output
    named = re.findall(r"straggler: worker rank (\d+) \((.+?)\) arrived last in (\d+) of the "
                       r"(\d+) rounds of the last \d+ s, on average (\d+) ms after", output)
    assert named, output
    for rank, address, last, rounds, late_ms in named:
        # Its address as the server knows it: this host's Unix socket here, else host:port.
        assert rank == "1" and address == "a worker on this host", output
        assert 2 * int(last) > int(rounds) and int(late_ms) >= 100, output


def test_no_worker_is_named_when_none_is_late(procs):
    status, output = procs.launch(2, "steady_sums.py", num_servers=1, TEST_ROUNDS=40,
                                  BYTEPS_STRAGGLER_WINDOW_SECONDS=0.5,
                                  BYTEPS_STRAGGLER_THRESHOLD_MS=60, timeout=90)
    assert status == 0, output
    assert "straggler:" not in output, output


