"""Settings a careless user might give: each is refused before anything starts, with
a message naming the variable (in-process: the configuration needs no TensorFlow)."""

import re
from pathlib import Path

import pytest

import tf_bps.runtime.config
from tf_bps.runtime.config import Config, ConfigError

JOB = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
       "DMLC_PS_ROOT_PORT": "9000"}


@pytest.mark.parametrize("env,message", [
    ({"BYTEPS_OP_TIMEOUT": "nan"}, "BYTEPS_OP_TIMEOUT='nan'"),
    ({"BYTEPS_OP_TIMEOUT": "inf"}, "BYTEPS_OP_TIMEOUT='inf'"),
    ({"BYTEPS_OP_TIMEOUT": "-1"}, "BYTEPS_OP_TIMEOUT='-1'"),
    # Would overflow the core's waits (milliseconds in an int).
    ({"BYTEPS_OP_TIMEOUT": "3000000"}, "at most 1e+06"),
    ({"PS_HEARTBEAT_TIMEOUT": "NaN"}, "PS_HEARTBEAT_TIMEOUT='NaN'"),
    ({"PS_HEARTBEAT_INTERVAL": "20"}, "shorter than PS_HEARTBEAT_TIMEOUT=10"),
    ({"BYTEPS_SERVER_ENGINE_THREAD": "1000000"}, "BYTEPS_SERVER_ENGINE_THREAD='1000000'"),
    ({"DMLC_NUM_WORKER": "100000"}, "DMLC_NUM_WORKER='100000'"),
    ({"DMLC_NUM_WORKER": "100", "BYTEPS_LOCAL_SIZE": "100"}, "more than 4096 worker processes"),
    ({"BYTEPS_PARTITION_BYTES": str(2**40)}, "BYTEPS_PARTITION_BYTES="),
    ({"DMLC_WORKER_ID": "2"}, "DMLC_WORKER_ID=2 is not valid"),
    ({"BYTEPS_MAX_TENSOR_BYTES": "1000"}, "BYTEPS_MAX_TENSOR_BYTES='1000'"),
    ({"BYTEPS_LISTEN_ANY": "yes"}, "BYTEPS_LISTEN_ANY='yes'"),
    ({"BYTEPS_LOCAL_MERGE": "on"}, "BYTEPS_LOCAL_MERGE='on'"),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, "NVIDIA_VISIBLE_DEVICES=all does not say"),
])
def test_bad_settings_are_refused_naming_the_variable(env, message):
    with pytest.raises(ConfigError) as refused:
        Config.from_env({**JOB, **env})
    assert message in str(refused.value)


def test_a_scheduler_address_that_does_not_resolve_names_its_variable():
    config = Config.from_env({**JOB, "DMLC_PS_ROOT_URI": "no-such-host.invalid"})
    with pytest.raises(ConfigError) as refused:
        config.require_rendezvous()
    assert "DMLC_PS_ROOT_URI='no-such-host.invalid'" in str(refused.value)


def test_good_settings_pass():
    config = Config.from_env({**JOB, "BYTEPS_OP_TIMEOUT": "1000000", "PS_HEARTBEAT_INTERVAL": "2",
                              "PS_HEARTBEAT_TIMEOUT": "3", "BYTEPS_SERVER_ENGINE_THREAD": "256"})
    assert config.op_timeout == 1e6 and config.require_rendezvous() == ("127.0.0.1", 9000)
    # Servers listen on the address they advertise, or everywhere when told so.
    assert config.listen_host() == "127.0.0.1"
    assert Config.from_env({**JOB, "BYTEPS_LISTEN_ANY": "1"}).listen_host() == ""


@pytest.mark.parametrize("env,local_size", [
    ({}, 1),
    ({"NVIDIA_VISIBLE_DEVICES": "0,1,2,3"}, 4),
    ({"CUDA_VISIBLE_DEVICES": "1,3"}, 2),
    ({"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": "0,1"}, 1),
    ({"NVIDIA_VISIBLE_DEVICES": "0,1,2,3", "BYTEPS_LOCAL_SIZE": "2"}, 2),
])
def test_one_worker_per_visible_gpu_unless_local_size_says_otherwise(env, local_size):
    assert Config.from_env({**JOB, **env}).local_size == local_size


def test_the_readme_table_lists_exactly_the_variables_the_configuration_reads():
    variable = r"(?:DMLC|BYTEPS|PS|NVIDIA|CUDA|PERSEUS|GLOO|HOROVOD)_[A-Z_]+"
    config_py = Path(tf_bps.runtime.config.__file__).read_text()
    read = set(re.findall(rf'"({variable})"', config_py)) | set(tf_bps.runtime.config.SETTINGS)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(rf"`({variable})`", table))
    assert read == documented, (read - documented, documented - read)
