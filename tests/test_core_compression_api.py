"""BytePS's compressors (run by the core) through DistributedGradientTape,
DistributedOptimizer and ParameterServerStrategy, and BytePS's compression_params: one
real job of two workers and two servers, and the refusals that need no job."""

import re

import pytest
from harness import marked_json as reports

import tf_bps as bps
from tf_bps.runtime.config import Config
from tf_bps.strategies.parameter_server_strategy import _check_compression


def test_training_api_compresses_like_the_core(procs):
    status, output = procs.launch(
        2, "core_compression_api.py", num_servers=2, BYTEPS_PARTITION_BYTES=65536,
        BYTEPS_MIN_COMPRESS_BYTES=16384, BYTEPS_LOG_LEVEL="DEBUG", timeout=90)
    assert status == 0, output
    # The strategy's optimizer told the core its schedule's rates (0.1, then a quarter
    # of it at the third step), traced and eager, on every worker: error feedback
    # rescales by them. DistributedOptimizer's constant 0.1 was told before.
    for rank in (0, 1):
        told = re.findall(rf"\[{rank}\]: .*learning rate ([\d.e-]+) \(was ([\d.e-]+)\)",
                          output)
        assert told.count(("0.025", "0.1")) >= 2 and ("0.1", "0") in told, told
    got = reports(output)
    assert sorted(got) == [0, 1], output
    for report in got.values():
        # The tape: the kernel as the model of both compressed legs computes it, the bias
        # (under BYTEPS_MIN_COMPRESS_BYTES) the exact mean; and the check can tell topk
        # from the mean.
        assert report["kernel"] < 1e-6 and report["bias"] < 1e-6, report
        assert report["kernel_from_mean"] > 0.1, report
        assert report["predivide"] == 0.0, report
        # A fused buffer of small gradients is compressed as one tensor.
        assert report["fused"] < 1e-5 and report["fused_from_mean"] > 0.1, report
        for case in ("optimizer", "strategy_traced", "strategy_eager"):
            assert report[case]["finite"], (case, report[case])
            # Compression changed the training: the weights are not those of plain SGD.
            assert report[case]["from_plain"] > 1e-4, (case, report[case])
        refusals = report["refusals"]
        for case in ("optimizer_process_set", "tape_process_set"):
            assert "compresses push_pulls of all workers only, not in process_set=" in \
                refusals[case], refusals
    # ... and every worker applied the same compressed sums.
    for case in ("optimizer", "strategy_traced", "strategy_eager"):
        assert got[0][case]["digest"] == got[1][case]["digest"], case


@pytest.mark.parametrize("params,builder", [
    ({"compressor": "topk", "k": 0.01, "ef": "vanilla", "momentum": "nesterov", "mu": 0.9},
     lambda: bps.Compression.topk(0.01, ef="vanilla", momentum="nesterov", mu=0.9)),
    ({"compressor": "onebit", "scaling": True, "ef": "vanilla", "fp16": False},
     lambda: bps.Compression.onebit(scaling=True, ef="vanilla")),
    ({"compressor": "randomk", "k": 100, "seed": 7, "ef": None},
     lambda: bps.Compression.randomk(100, seed=7)),
    ({"compressor": "dithering", "k": 4, "partition": "natural", "normalize": "l2", "seed": 1},
     lambda: bps.Compression.dithering(4, partition="natural", normalize="l2", seed=1)),
])
def test_compression_params_build_what_the_builders_build(params, builder):
    assert bps.Compression.from_params(params).spec == builder().spec


def test_compression_params_without_a_compressor():
    assert bps.Compression.from_params({}) is bps.Compression.none
    assert bps.Compression.from_params({"fp16": True}) is bps.Compression.fp16


@pytest.mark.parametrize("params,message", [
    ({"compressor": "topk", "k": 0.1, "ratio": 2},
     "compression_params: unknown key 'ratio' (value 2)"),
    ({"compressor": "powersgd"}, "compression_params: 'compressor': 'powersgd' is not one of"),
    ({"compressor": "topk", "k": 0.1, "ef": "fancy"}, "ef=fancy must be vanilla or none"),
    ({"compressor": "onebit", "k": 3}, "key 'k' does not apply to onebit"),
    ({"compressor": "topk"}, "key 'k' is required"),
    ({"k": 0.1}, "compression_params: 'k': 0.1 needs a 'compressor'"),
    ({"compressor": "topk", "k": "0.1 seed=3"}, "k='0.1 seed=3' is not a valid value"),
    ({"compressor": "topk", "k": 0.1, "fp16": True},
     "'fp16': True does not combine with 'compressor': 'topk'"),
    ({"fp16": "yes"}, "compression_params: 'fp16': 'yes' must be True or False"),
    ("topk", "compression_params='topk' must be a dict"),
])
def test_compression_params_refused(params, message):
    with pytest.raises(ValueError) as error:
        bps.Compression.from_params(params)
    assert message in str(error.value)
    # The wrappers pass the message on.
    with pytest.raises(ValueError) as error:
        bps.DistributedGradientTape(None, compression_params=params)
    assert message in str(error.value)


def _sgd():
    import keras
    return keras.optimizers.SGD(0.1)


def test_compression_and_compression_params_together_refused():
    with pytest.raises(ValueError) as error:
        bps.DistributedOptimizer(_sgd(), compression=bps.Compression.fp16,
                                 compression_params={"compressor": "onebit"})
    assert ("compression=Compression.fp16 and compression_params={'compressor': 'onebit'} "
            "both choose the compression") in str(error.value)


def test_other_reductions_refused():
    with pytest.raises(ValueError, match=r"op=.*is not supported: use bps.Average or bps.Sum"):
        bps.DistributedOptimizer(_sgd(), compression=bps.Compression.topk(0.1), op=bps.Max)


def test_asynchronous_training_refuses_core_compressors(monkeypatch):
    monkeypatch.setenv("BYTEPS_ENABLE_ASYNC", "1")
    onebit = bps.Compression.onebit(scaling=True)
    message = ("compression=Compression.onebit(scaling=true, ef=none, momentum=none) does "
               "not apply with BYTEPS_ENABLE_ASYNC=1")
    with pytest.raises(ValueError) as error:
        bps.DistributedOptimizer(_sgd(), compression=onebit)
    assert message in str(error.value)
    with pytest.raises(ValueError) as error:
        bps.DistributedOptimizer(_sgd(), compression_params={"compressor": "onebit",
                                                             "scaling": True})
    assert message in str(error.value)
    with pytest.raises(ValueError) as error:  # the strategy's own check
        _check_compression(onebit, Config.from_env({"BYTEPS_ENABLE_ASYNC": "1"}))
    assert message in str(error.value)
    _check_compression(onebit, Config.from_env({}))  # synchronous: accepted
