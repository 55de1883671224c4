"""Horovod's join through a real job: a worker that ran out of data stops holding
the others up, and everyone is in step again afterwards."""

from harness import marked_json


def test_join_with_uneven_data(procs):
    status, output = procs.launch(2, "join.py", num_servers=2, timeout=120)
    assert status == 0, output
    reports = marked_json(output)
    early, late = reports[0], reports[1]
    for step in range(2):  # Both workers: sums and rows of both.
        want = [[1 + 2 + 20.0 * step] * 2, [4.0, 4.0], [0, 1, 1]]
        assert early["steps"][step] == want and late["steps"][step] == want, reports
    for step in (2, 3):  # Rank 0 joined: rank 1 alone (the average still divides by 2).
        assert late["steps"][step] == [[2 + 10.0 * step] * 2, [2.0, 2.0], [1, 1]], late
    assert "has joined" in late["broadcast"], late
    assert early["last"] == late["last"] == 1
    for got in reports.values():
        assert got["after"] == [3.0, 3.0] and got["after_rows"] == [0, 1, 1], got
