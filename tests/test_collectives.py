"""Every collective (Horovod's semantics) through real jobs, checked against numpy:
each dtype and reduction, broadcast from a non-zero root, uneven allgather, scale
factors, gradients, eagerly and in tf.function, with 2 and 3 workers."""

import json
import re

import numpy as np
import pytest
from collective_cases import (
    NUMERIC,
    REDUCTIONS,
    SHAPE,
    alltoall_rows,
    alltoall_splits,
    gather_rows,
    reduced,
    scaled_sum,
    scatter_shape,
    scatter_slice,
    value,
)


def stored(dtype: str) -> str:
    return "float32" if dtype == "bfloat16" else dtype  # npz has no bfloat16


@pytest.mark.parametrize(
    "num_workers,num_servers,partition_bytes,tcp_workers",
    [(2, 1, 4096000, ""), (3, 2, 16, "1")],
    ids=["2w-1s", "3w-2s-16b-partition-mixed-tcp"])
def test_collectives_match_numpy(procs, tmp_path, num_workers, num_servers, partition_bytes,
                                 tcp_workers):
    status, output = procs.launch(num_workers, "collectives.py", num_servers=num_servers,
                                  BYTEPS_PARTITION_BYTES=partition_bytes, TEST_OUT=tmp_path,
                                  TEST_TCP_WORKERS=tcp_workers, timeout=240)
    assert status == 0, output
    check_collectives(tmp_path, num_workers)


def check_collectives(out_dir, size: int, local_size: int | None = None) -> None:
    """What collectives.py saved in `out_dir` for each of `size` ranks (`local_size` a
    host, all on one by default), against numpy."""
    root, local_size = size - 1, local_size or size
    all_rows = np.concatenate
    for rank in range(size):
        got = np.load(out_dir / f"rank{rank}.npz")
        for mode in ("eager", "graph"):
            for dtype in NUMERIC:
                for reduction in REDUCTIONS:
                    result = got[f"{mode}/{reduction}/{dtype}"]
                    assert result.shape == SHAPE and result.dtype.name == stored(dtype)
                    # Only a float average is inexact (a multiply by 1/size).
                    inexact = reduction == "average" and dtype.startswith(("float", "bfloat"))
                    tolerance = (1e-2 if "16" in dtype else 1e-6) if inexact else 0
                    np.testing.assert_allclose(result.astype(np.float64),
                                               reduced(dtype, reduction, size), rtol=tolerance,
                                               err_msg=f"{mode} {reduction} {dtype}")
                np.testing.assert_array_equal(got[f"{mode}/scaled/{dtype}"].astype(np.float64),
                                              scaled_sum(dtype, size), err_msg=dtype)
            for dtype in [*NUMERIC, "bool"]:
                np.testing.assert_array_equal(got[f"{mode}/broadcast/{dtype}"],
                                              value(dtype, root), err_msg=dtype)
                want = all_rows([value(dtype, r, shape=(gather_rows(r), 2)) for r in range(size)])
                result = got[f"{mode}/allgather/{dtype}"]
                assert result.dtype.name == stored(dtype)
                np.testing.assert_array_equal(result, want, err_msg=dtype)
            for dtype in NUMERIC:
                values = [value(dtype, r, shape=scatter_shape(size)).astype(np.float64)
                          for r in range(size)]
                mine = scatter_slice(rank, size)
                np.testing.assert_array_equal(got[f"{mode}/reducescatter/{dtype}"],
                                              sum(values)[mine], err_msg=dtype)
                average = got[f"{mode}/reducescatter_average/{dtype}"].astype(np.float64)
                want = sum(values)[mine] / size
                if dtype.startswith(("int", "uint")):
                    want = np.floor(want)
                np.testing.assert_allclose(average, want, rtol=1e-2 if "16" in dtype else 1e-6,
                                           err_msg=dtype)
            # Alltoall: what every rank sent here, in rank order, and how many rows each.
            want = np.concatenate([
                alltoall_rows(r, size)[sum(alltoall_splits(r, size)[:rank]):][
                    :alltoall_splits(r, size)[rank]] for r in range(size)])
            np.testing.assert_array_equal(got[f"{mode}/alltoall"], want)
            np.testing.assert_array_equal(got[f"{mode}/alltoall_splits"],
                                          [alltoall_splits(r, size)[rank] for r in range(size)])
            want = np.concatenate([value("bool", r, shape=(2 * size, 3))[2 * rank:2 * rank + 2]
                                   for r in range(size)])
            np.testing.assert_array_equal(got[f"{mode}/alltoall_even_bool"], want)
            total = sum(range(1, size + 1))
            np.testing.assert_array_equal(got[f"{mode}/grouped"],
                                          [total] * 3 + [2 * sum(range(size))] * 4)
            np.testing.assert_array_equal(got[f"{mode}/grouped_reducescatter"],
                                          np.full((2, 2), total))
        root_object = {"from": root, "items": list(range(root + 3))}
        assert str(got["broadcast_object"]) == repr(root_object)
        assert str(got["allgather_object"]) == repr([("rank", r, "x" * r) for r in range(size)])
        np.testing.assert_array_equal(
            got["allgather_named"],
            all_rows([np.full((r % 2, 3), r, np.int32) for r in range(size)]))
        assert got["broadcast_scalar"] == root * 1.5

        np.testing.assert_array_equal(got["growing_allgather"], np.concatenate(
            [np.full(3 * sum(r + 1 + 5 * step for r in range(size)), step)
             for step in range(3)]))
        np.testing.assert_array_equal(got["grouped_allgather"], np.concatenate(
            [np.full(r + 1, r) for r in range(size)] + [np.full(2, r) for r in range(size)]))
        np.testing.assert_array_equal(got["broadcast_inplace"], np.full(6, root))
        np.testing.assert_array_equal(got["rank_ops"],
                                      [rank, size, rank % local_size, local_size, 1])
        assert got["indexed_slices_refusals"].tolist() == ["NotImplementedError"] * 3
        assert str(got["graph_allgather_object"]) == repr([{"r": r} for r in range(size)])
        assert str(got["graph_broadcast_object"]) == repr({"from": root})
        assert "does not support eager execution" in str(got["global_variables_eagerly"])
        np.testing.assert_array_equal(got["global_variables"], [root, root])
        np.testing.assert_array_equal(got["horovod_variables"],
                                      [rank, size, rank % local_size, local_size])

        offsets = np.cumsum([0] + [gather_rows(r) for r in range(size)])
        weights = np.arange(offsets[-1] * 2, dtype=np.float32).reshape(-1, 2) + 1
        for mode in ("eager", "graph"):
            # Allgather: the gradient averaged over workers, own rows only.
            np.testing.assert_array_equal(got[f"grad/{mode}/allgather"],
                                          weights[offsets[rank]:offsets[rank + 1]])
            # Broadcast: the root gets the average of every worker's gradient, others zeros.
            want = sum(r + 1.0 for r in range(size)) / size if rank == root else 0.0
            np.testing.assert_allclose(got[f"grad/{mode}/broadcast"], np.full(2, want))
            # Allreduce: the same reduction and factors applied to the gradients.
            np.testing.assert_array_equal(got[f"grad/{mode}/scaled"],
                                          np.full(3, 6.0 * sum(r + 1.0 for r in range(size))))
            # Alltoall: each row's gradient comes back from the rank it went to.
            want = np.concatenate([np.full((n, 2), j + 1.0) for j, n in
                                   enumerate(alltoall_splits(rank, size))])
            np.testing.assert_array_equal(got[f"grad/{mode}/alltoall"], want)
            # Reducescatter (a Sum): each row's gradient is its owner's (owner rank + 1),
            # times the number of workers.
            want = np.concatenate([np.full((scatter_slice(r, size).stop -
                                            scatter_slice(r, size).start, 3), (r + 1.0) * size)
                                   for r in range(size)])
            np.testing.assert_array_equal(got[f"grad/{mode}/reducescatter"], want)
        assert "Adasum" in str(got["adasum_error"])


def _reports(output: str) -> dict[tuple[int, str], dict]:
    found = {}
    for line in output.splitlines():
        if "REPORT " in line:
            entry = json.loads(line.split("REPORT ", 1)[1])
            found[entry["rank"], entry["case"]] = entry
    return found


# What each disagreement must quote: what the agreeing ranks and rank 1 sent.
MISMATCH_QUOTES = {
    "shape": ("push_pull(average) of float32[2,3]", "push_pull(average) of float32[3,2]"),
    "dtype": ("float32[4]", "float64[4]"),
    "root": ("broadcast from rank 0", "broadcast from rank 1"),
    "op": ("push_pull(sum)", "push_pull(max)"),
    "scale": ("push_pull(average) of float32[3]", "prescaled by 2"),
    "kind": ("push_pull(average)", "broadcast from rank 0"),
    "gather": ("allgather of float32[1,2]", "allgather of float32[1,3]"),
    "unnamed": ("float32[2]", "float32[3]"),
    "graph": ("float32[4]", "float32[5]"),
}


@pytest.mark.parametrize("num_workers,num_servers", [(2, 1), (3, 2)])
def test_mismatches_fail_at_once_naming_tensor_ranks_and_both_sides(procs, num_workers,
                                                                    num_servers):
    # The default BYTEPS_OP_TIMEOUT (300 s): a mismatch must not wait for it.
    status, output = procs.launch(num_workers, "collective_errors.py", "mismatch",
                                  num_servers=num_servers, timeout=120)
    assert status == 0, output
    reports = _reports(output)
    for case, (first, second) in MISMATCH_QUOTES.items():
        for rank in range(num_workers):
            entry = reports[rank, case]
            assert entry.get("error") == "FailedPreconditionError", (case, entry)
            message = entry["message"]
            # The odd rank 1 and whichever agreeing rank the server heard from first.
            assert "rank 1 sent" in message and re.search(r"rank [02] sent", message), message
            assert first in message and second in message, (case, message)
            assert entry["seconds"] < 1.0, (case, entry)
            after = reports[rank, f"{case if case != 'unnamed' else 'PushPull.eager'}.after"]
            assert after.get("value") == [num_workers] * 2, (case, after)
        named = "PushPull.eager" if case == "unnamed" else case
        assert f"'{named}'" in reports[0, case]["message"], reports[0, case]


def test_a_round_that_timed_out_never_mixes_with_the_next(procs):
    # (and a save under the strategy that one worker makes alone times out, saying why)
    # The short BYTEPS_OP_TIMEOUT would bound the rendezvous too, and importing
    # TensorFlow on two busy cores can take longer: HOROVOD_START_TIMEOUT bounds it apart.
    status, output = procs.launch(2, "collective_errors.py", "stale", num_servers=1,
                                  BYTEPS_OP_TIMEOUT=4, HOROVOD_START_TIMEOUT=60, timeout=60)
    assert status == 0, output
    reports = _reports(output)
    timed_out, late = reports[0, "timed_out"], reports[1, "late"]
    assert timed_out.get("error") == "DeadlineExceededError", timed_out
    assert "'stale'" in timed_out["message"], timed_out
    # Rank 1's first push_pull belongs to the round rank 0 gave up: refused, not summed.
    assert late.get("error") == "AbortedError", late
    assert "'stale'" in late["message"] and "round 1" in late["message"], late
    assert "worker rank 0 gave up round 1" in late["message"], late
    for rank in range(2):
        assert reports[rank, "next"].get("value") == [2.0] * 4, reports[rank, "next"]
    # A save under the strategy that rank 0 makes alone ends in a timeout saying why.
    alone = reports[0, "save_alone"]
    assert alone.get("error") == "DeadlineExceededError", alone
    assert "every worker must call it" in alone["message"], alone
    assert "tf_bps.save.plan" in alone["message"], alone
    for rank in range(2):
        assert reports[rank, "after_save"].get("value") == [2.0] * 4


def test_back_to_back_rounds_each_get_their_own_data(procs):
    # Shared memory is reused round after round and passed between workers; 3 workers
    # on 2 servers, one of them over TCP, run as fast as they can.
    status, output = procs.launch(3, "back_to_back.py", num_servers=2,
                                  BYTEPS_PARTITION_BYTES=262144, TEST_TCP_WORKERS="2",
                                  TEST_ROUNDS=40, timeout=180)
    assert status == 0, output
    assert "WRONG" not in output and output.count("DONE") == 3, output
