"""Process sets through a real 3-worker job: registration, every collective within a
set, outsiders refused, gradients reduced over the set only (Horovod's semantics)."""

from harness import marked_json


def test_process_sets(procs):
    status, output = procs.launch(3, "process_sets.py", num_servers=2, timeout=120)
    assert status == 0, output
    reports = marked_json(output)
    assert sorted(reports) == [0, 1, 2], output
    for rank, got in reports.items():
        assert got["ids"] == [1, 2] and got["sizes"] == [2, 1, 3]
        assert got["included"] == [rank != 1, rank == 1]
        assert "already exists" in got["duplicate"] and "distinct ranks" in got["out_of_range"]
        assert "root_rank=1 is not a rank of process set 1" in got["bad_root"]
        assert got["global"] == [6.0] * 3
        assert got["removed"] == [True, False, False] and got["reused_id"] == 1
        if rank != 2:  # Rank 2 arrives a second late; the others wait for it.
            assert got["barrier_wait"] > 0.8, got
    for rank in (0, 2):
        got = reports[rank]
        assert got["even_rank"] == rank // 2
        assert got["sum"] == [4.0] * 3 and got["unnamed"] == [4.0] * 3
        assert got["average"] == [2.0] * 3  # divided by the set's size, 2
        assert got["broadcast"] == [3.0] * 3  # root_rank is global: rank 2's value
        assert got["allgather"] == [0, 2, 2, 2]  # set order: rank 0's row, then rank 2's
        # Rank 0 sends row 0 to itself and rows 1-2 to rank 2; rank 2 likewise.
        want = {0: [[0, 20], [1, 1]], 2: [[1, 2, 21, 22], [2, 2]]}[rank]
        assert got["alltoall"] == want
        assert got["reducescatter"] == ([[4.0, 4.0], [4.0, 4.0]] if rank == 0 else [[4.0, 4.0]])
        assert got["objects"] == ["r0", "r2"]
        assert got["sparse"] == ["IndexedSlices", [[0.0, 0.0], [1.0, 1.0]], [0, 2]]
        assert got["tape"] == [5.0, 5.0]  # the average of (rank + 1)^2 over ranks 0 and 2
    outsider = reports[1]
    assert "rank 1 is not a member of process set 1" in outsider["outsider"], outsider
    assert outsider["alone"] == [2.0] * 3
    assert outsider["tape"] == [4.0, 4.0]  # its own gradient, (1 + 1)^2, not reduced
