"""The packages users install: `python -m build` makes an sdist and, from it, a wheel;
each installs into a fresh virtualenv and runs a 2-worker job from outside the source
tree; the wheel installed without TensorFlow gives a launcher, scheduler and server that
serve those workers, and says what to install for the operations.

It builds the native code twice and installs TensorFlow into fresh environments (about
10 minutes on 2 cores), so it runs only with TF_BPS_PACKAGING_TEST=1: `.ci/run` sets it
after the main suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from harness import base_env, free_port

ROOT = Path(__file__).resolve().parent.parent
TENSORFLOW = "tensorflow==2.21.0"

pytestmark = [pytest.mark.build,
              pytest.mark.skipif(os.environ.get("TF_BPS_PACKAGING_TEST") != "1",
                                 reason="builds and installs packages: TF_BPS_PACKAGING_TEST=1")]

# A worker that checks its sums, run by the installed package only.
WORKER = """
import sys
import numpy as np
import tensorflow as tf
import tf_bps as bps

assert "{root}" not in bps.__file__, bps.__file__
bps.init()
got = bps.push_pull(tf.fill([1000], float(bps.rank() + 1)), op=bps.Sum, name="t").numpy()
want = sum(range(1, bps.size() + 1))
if not np.all(got == want):
    sys.exit(f"rank {{bps.rank()}}: {{got[:3]}} where {{want}} was due")
print("INSTALLED SUM OK", bps.rank(), flush=True)
bps.shutdown()
"""


def _run(command: list, timeout: float, **kwargs) -> str:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                          timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _environment(where: Path, *packages) -> Path:
    """A fresh virtualenv at `where` with `packages` installed; its bin folder."""
    venv.create(where, with_pip=True)
    bin_dir = where / "bin"
    _run([bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
          *packages], timeout=1200)
    return bin_dir


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Without --sdist/--wheel, build makes the sdist and then the wheel from it: the
    # wheel proves the sdist holds everything the build needs.
    _run([sys.executable, "-m", "build", "--outdir", out, ROOT], timeout=1800)
    return out


def _two_workers(bin_dir: Path, workdir: Path) -> str:
    script = workdir / "installed_worker.py"
    script.write_text(WORKER.format(root=ROOT))
    output = _run([bin_dir / "bpslaunch", "-np", "2", bin_dir / "python", script],
                  timeout=300, cwd=workdir, env=base_env())
    assert output.count("INSTALLED SUM OK") == 2, output
    return output


def test_the_wheel_installs_and_runs_a_job(dist, tmp_path):
    wheel = next(dist.glob("tf_bps-*.whl"))
    bin_dir = _environment(tmp_path / "env", f"{wheel}[tensorflow]")
    _two_workers(bin_dir, tmp_path)


def test_the_sdist_installs_and_runs_a_job(dist, tmp_path):
    sdist = next(dist.glob("tf_bps-*.tar.gz"))
    bin_dir = _environment(tmp_path / "env", f"{sdist}[tensorflow]")
    _two_workers(bin_dir, tmp_path)


def test_without_tensorflow_the_launcher_and_server_serve_a_job(dist, tmp_path):
    wheel = next(dist.glob("tf_bps-*.whl"))
    server_side = _environment(tmp_path / "servers", wheel)
    check = _run([server_side / "bpslaunch", "--check-build"], timeout=60, cwd=tmp_path)
    assert "[ ] TensorFlow" in check and "[X] Summation server" in check, check
    missing = subprocess.run([server_side / "python", "-c", "import tf_bps; tf_bps.push_pull"],
                             capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert missing.returncode == 1 and "pip install 'tf_bps[tensorflow]'" in missing.stderr, \
        missing.stderr
    # The scheduler and the server from the environment without TensorFlow, the workers
    # from one with it: a CPU-only server machine's installation.
    worker_side = _environment(tmp_path / "workers", f"{wheel}[tensorflow]")
    job = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(),
               DMLC_NUM_WORKER=2, DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN="installed from a wheel")
    started = [subprocess.Popen([server_side / "bpslaunch"], cwd=tmp_path,
                                env=base_env(DMLC_ROLE=role, **job))
               for role in ("scheduler", "server")]
    try:
        script = tmp_path / "installed_worker.py"
        script.write_text(WORKER.format(root=ROOT))
        workers = [subprocess.Popen([worker_side / "bpslaunch", worker_side / "python", script],
                                    cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                                    env=base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=rank, **job))
                   for rank in range(2)]
        started += workers
        outputs = [worker.communicate(timeout=300)[0] for worker in workers]
        assert all("INSTALLED SUM OK" in output for output in outputs), outputs
        assert [process.wait(timeout=60) for process in started] == [0] * 4
    finally:
        for process in started:  # ours alone, by PID
            if process.poll() is None:
                process.kill()
                process.wait()
