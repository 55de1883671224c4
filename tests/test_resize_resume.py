"""A job that saved with BackupAndRestore under the strategy resumes at another size: at
2 workers, then 1, then 2 again, from one backup folder. Each resumes at the epoch the
last one finished, from its weights, with the learning rate its script sets for its own
size (0.01 x workers), not the one the backup holds."""

import json

import pytest


def _lines(output: str, marker: str) -> list[dict]:
    """The JSON objects rank 0 printed after `marker `, in order."""
    return [json.loads(line.split(f"{marker} ", 1)[1]) for line in output.splitlines()
            if f"{marker} {{" in line]


@pytest.mark.job
def test_a_backup_resumes_at_half_and_then_at_twice_the_size(procs, tmp_path):
    backup = str(tmp_path / "backup")
    seen = []
    for workers, stop_after in ((2, 1), (1, 2), (2, 0)):  # 0: to the end
        status, output = procs.launch(workers, "resize_resume.py", backup, "4", str(stop_after),
                                      num_servers=1, timeout=240)
        assert status == 0, output
        seen.append({marker: _lines(output, marker)
                     for marker in ("RESUMED", "EPOCH", "LEFT", "DONE")})
    first, second, third = seen
    assert [r["epoch"] for r in (first["RESUMED"][0], second["RESUMED"][0],
                                 third["RESUMED"][0])] == [0, 1, 2]
    for run, workers, epochs in ((first, 2, [0]), (second, 1, [1]), (third, 2, [2, 3])):
        assert [e["epoch"] for e in run["EPOCH"]] == epochs, run
        assert {e["size"] for e in run["EPOCH"]} == {workers}
        # The script's learning rate for this size, at resuming and at every epoch.
        assert run["RESUMED"][0]["lr"] == pytest.approx(0.01 * workers)
        assert {round(e["lr"], 6) for e in run["EPOCH"]} == {round(0.01 * workers, 6)}
    # Each resumed from the weights the previous one left with.
    assert second["RESUMED"][0]["checksum"] == pytest.approx(first["LEFT"][0]["checksum"])
    assert third["RESUMED"][0]["checksum"] == pytest.approx(second["LEFT"][0]["checksum"])
    assert third["DONE"]
