"""push_pull through real jobs, checked against numpy."""

import numpy as np
import pytest
from cases import cases, expected
from harness import marked_json


@pytest.mark.parametrize(
    "num_workers,num_servers,partition_bytes,tcp_workers",
    [(2, 1, 4096000, []), (2, 2, 4096, []), (3, 2, 1000, [0, 1, 2]), (3, 2, 65536, [1])],
    ids=["2w-1s-default-partition", "2w-2s-4k-partition", "3w-2s-1000b-partition-tcp",
         "3w-2s-64k-partition-mixed"])
def test_push_pull_matches_numpy(procs, tmp_path, num_workers, num_servers, partition_bytes,
                                 tcp_workers):
    status, output = procs.launch(num_workers, "correctness.py", num_servers=num_servers,
                                  BYTEPS_PARTITION_BYTES=partition_bytes, TEST_OUT=tmp_path,
                                  TEST_TCP_WORKERS=",".join(map(str, tcp_workers)),
                                  BYTEPS_LOG_LEVEL="DEBUG")
    assert status == 0, output
    # Same-host servers are reached over their Unix socket (and shared memory) unless
    # BYTEPS_ENABLE_IPC=0.
    local_links = output.count("is on this host: using its Unix socket")
    assert local_links == (num_workers - len(tcp_workers)) * num_servers, output
    for rank in range(num_workers):
        got = np.load(tmp_path / f"rank{rank}.npz")
        for case, dtype, shape in cases():
            for mode, average in (("sum", False), ("avg", True)):
                want = expected(case, dtype, shape, num_workers, average)
                result = got[f"{mode}/{case}"]
                assert result.shape == tuple(shape), (mode, case)
                tolerance = 1e-2 if dtype in ("float16", "bfloat16") else 1e-6
                np.testing.assert_allclose(result.astype(np.float64), want, rtol=tolerance,
                                           atol=tolerance, err_msg=f"{mode}/{case} rank {rank}")
                if not average or dtype.startswith("int"):
                    np.testing.assert_array_equal(result.astype(np.float64), want)
        ranks = np.arange(num_workers)
        for step in range(3):
            np.testing.assert_array_equal(got[f"graph/a{step}"], np.full(5, (ranks + step).sum()))
            np.testing.assert_array_equal(got[f"graph/b{step}"],
                                          np.full((2, 2), (ranks * 10 + step).sum()))
            np.testing.assert_array_equal(got[f"eager_unnamed/{step}"],
                                          np.full(4, (ranks + step).sum()))
        for i in range(40):
            np.testing.assert_array_equal(got[f"many/{i}"], np.full(1000 + i, (ranks + i).sum()))


def test_graph_ops_on_different_tensors_run_together_and_rounds_keep_program_order(procs):
    status, output = procs.launch(2, "graph_order.py", num_servers=1, BYTEPS_OP_TIMEOUT=20,
                                  timeout=60)
    assert status == 0, output
    for report in marked_json(output).values():
        assert report["crossed"] == [[3.0] * 3, [30.0] * 5]
        for step in range(3):  # ranks 0 and 1: (0 + step) + (1 + step)
            assert report[f"same{step}"] == [[1.0 + 2 * step] * 4, [100.0 + 200 * step] * 4]
