"""ParameterServerStrategy beyond fit: initial values, input, evaluate, predict."""

from harness import base_env, marked_json, module_job, worker_command


@module_job
def got(processes, _):
    return processes.reports(2, "strategy_features.py")[0]


def test_replicas_span_workers_and_local_devices(got):
    for report in got.values():
        assert report["replicas"] == 4  # 2 workers x 2 logical CPUs
        assert report["isinstance_mwms"]  # Keras averages metrics only for this class.
        assert report["reduce_sum"] == 4.0


def test_initial_values_come_from_rank_0(got):
    assert got[0]["initial"] == got[1]["initial"] == got[1]["rank0_seed_initial"]


def test_datasets_are_sharded_by_worker(got):
    seen = [set(got[r]["seen"]) for r in (0, 1)]
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(32))
    for rank in (0, 1):
        # InputContext: 2 pipelines, this worker's id, 4 replicas, 8 / 4 per replica.
        assert got[rank]["contexts"] == [[2, rank, 4, 2]]


def test_evaluate_and_predict_cover_all_workers(got):
    assert got[0]["evaluate"] == got[1]["evaluate"]
    assert got[0]["predict_rows"] == got[1]["predict_rows"] == 16


def test_distributed_optimizer_under_the_strategy_is_refused(got):
    for report in got.values():
        assert "average the gradients twice" in report["double_sync"]


def test_one_cpu_replica_reads_its_input_without_a_multi_device_iterator(procs):
    """Such an iterator reads through a GeneratorDataset, whose kernel sets glibc's
    M_TRIM_THRESHOLD for the whole process and so makes every step map its larger
    tensors afresh: with one replica on the CPU, the batches are already where it runs."""
    status, output = procs.run(worker_command("strategy_input.py"), base_env())
    assert status == 0, output
    report = marked_json(output)[0]
    assert report["readers"] == ["OwnedIterator"], report
    assert report["steps"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], report
    assert "M_TRIM_THRESHOLD" not in output, output
