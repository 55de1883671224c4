"""The gradient compressors (custom_ops/compression) against numpy models of their wire
formats, written here from the definitions: every byte of the compressed forms and every
decompressed element. One process, no job: the binding's compress/decompress call the
C++ compressors directly.

The random compressors are modelled exactly too: the model draws splitmix64's numbers
as the C++ does (Random in custom_ops/compression/internal.h), randomk by Floyd's
sampling and dithering by one number per element, so their bytes are compared whole."""

import math

import numpy as np
import pytest

from tf_bps.runtime import core

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


@pytest.fixture(scope="module")
def engine():
    return core.worker_engine()


def floats(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")


def normal(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


# ---------------------------------------------------------------------------
# Models


def sparse_count(k: float, n: int) -> int:
    if n == 0:
        return 0
    return max(1, math.floor(k * n)) if k < 1 else min(n, math.floor(k))


def lane_sum(values: np.ndarray) -> float:
    """The C++ sum: element i into lane i % 8, each lane in order, then the lanes in
    pairs. np.cumsum adds in order, as one lane does."""
    lanes = [float(np.cumsum(values[j::8])[-1]) if len(values[j::8]) else 0.0
             for j in range(8)]
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + \
        ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))


def splitmix(z: int) -> int:
    z = (z + GAMMA) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def random_state(seed: int, stream: int, round_: int) -> int:
    return splitmix(splitmix(splitmix(seed) ^ stream) ^ round_)


class Random:
    def __init__(self, seed: int, stream: int, round_: int):
        self.state = random_state(seed, stream, round_)

    def next(self) -> int:
        out = splitmix(self.state)
        self.state = (self.state + GAMMA) & MASK
        return out

    def below(self, bound: int) -> int:
        """Lemire's multiply and reject."""
        product = self.next() * bound
        if product & MASK < bound:
            floor = (MASK + 1 - bound) % bound
            while product & MASK < floor:
                product = self.next() * bound
        return product >> 64


def splitmix_array(state: int, n: int) -> np.ndarray:
    """The first n numbers drawn from `state`, at once (uint64 wraps as C++'s does)."""
    with np.errstate(over="ignore"):
        z = np.uint64(state) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def magnitude_bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32) & np.uint32(0x7FFFFFFF)


def onebit_model(x: np.ndarray, scaling: bool) -> tuple[bytes, np.ndarray]:
    n = len(x)
    words = (n + 31) // 32
    bits = np.zeros(32 * words, dtype=np.uint64)
    bits[:n] = x.view(np.uint32) >> np.uint32(31)
    packed = (bits.reshape(words, 32) << np.arange(32, dtype=np.uint64)).sum(axis=1)
    scale = np.float32(1.0)
    if scaling:
        scale = np.float32(lane_sum(np.abs(x.astype(np.float64))) / n) if n else np.float32(0)
    data = packed.astype("<u4").tobytes() + np.array([scale], "<f4").tobytes()
    signs = bits[:n].astype(bool)
    return data, np.where(signs, -scale, scale).astype(np.float32)


def sparse_bytes(x: np.ndarray, indices: np.ndarray) -> tuple[bytes, np.ndarray]:
    indices = np.sort(indices).astype("<u4")
    out = np.zeros(len(x), dtype=np.float32)
    out[indices] = x[indices]
    return indices.tobytes() + x[indices].astype("<f4").tobytes(), out


def topk_model(x: np.ndarray, k: float) -> tuple[bytes, np.ndarray]:
    count = sparse_count(k, len(x))
    order = np.lexsort((np.arange(len(x)), -magnitude_bits(x).astype(np.int64)))
    return sparse_bytes(x, order[:count])


def randomk_model(x: np.ndarray, k: float, seed: int, stream: int,
                  round_: int) -> tuple[bytes, np.ndarray]:
    n, count = len(x), sparse_count(k, len(x))
    random, taken = Random(seed, stream, round_), set()
    for j in range(n - count, n):  # Floyd's sampling.
        drawn = random.below(j + 1)
        taken.add(j if drawn in taken else drawn)
    return sparse_bytes(x, np.array(sorted(taken), dtype=np.int64))


def dithering_levels(levels: int, natural: bool) -> np.ndarray:
    if natural:
        powers = [2.0 ** (level - levels) for level in range(1, levels + 1)]
        return np.array([0.0, *powers], np.float32)
    return np.arange(levels + 1, dtype=np.float32) / np.float32(levels)


def dithering_model(x: np.ndarray, levels: int, natural: bool, l2: bool, seed: int,
                    stream: int, round_: int) -> tuple[bytes, np.ndarray]:
    n = len(x)
    if l2:
        norm = np.float32(math.sqrt(lane_sum(x.astype(np.float64) ** 2)))
    else:
        norm = magnitude_bits(x).max(initial=0).view(np.float32)
    index = np.zeros(n, dtype=np.int64)
    if norm > 0 and np.isfinite(norm):
        uniform = (splitmix_array(random_state(seed, stream, round_), n) >> np.uint64(40))
        a = np.abs(x) / norm  # float32
        if natural:
            bits = a.view(np.uint32)
            level = levels + (bits >> np.uint32(23)).astype(np.int64) - 127
            mantissa = ((bits & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)).view(np.float32)
            mantissa = mantissa - np.float32(1)
            fraction = np.where(level >= 1, mantissa, a * np.float32(2.0 ** (levels - 1)))
            lower = np.where(level >= 1, level, 0)
            up = uniform.astype(np.float32) * np.float32(2.0**-24) < fraction
        else:
            position = a.astype(np.float64) * levels
            lower = np.floor(position).astype(np.int64)
            up = uniform.astype(np.float64) * 2.0**-24 < position - lower
        index = np.minimum(lower + up, levels)
        index = np.where(np.signbit(x), -index, index)
    data = np.array([norm], "<f4").tobytes() + index.astype(np.int8).tobytes()
    table = dithering_levels(levels, natural)
    values = np.where(index < 0, -table[np.abs(index)], table[np.abs(index)]) * norm
    return data, values.astype(np.float32)


# ---------------------------------------------------------------------------
# The compressors against the models

SIZES = [0, 1, 5, 31, 32, 33, 1000, 4099]


def check(engine, spec: str, x: np.ndarray, model, stream: int = 0, round_: int = 0):
    data, values = model
    got = engine.compress(spec, x, stream, round_)
    assert got == data, spec
    np.testing.assert_array_equal(floats(engine.decompress(spec, got, len(x))), values)


@pytest.mark.parametrize("n", SIZES)
def test_onebit(engine, n):
    x = normal(n, n)
    if n > 3:
        x[3] = -0.0  # Negative by its sign bit.
    for scaling in (True, False):
        check(engine, f"onebit scaling={'true' if scaling else 'false'}", x,
              onebit_model(x, scaling))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", [0.01, 0.3, 1, 7, 5000])
def test_topk(engine, n, k):
    x = normal(n, n + 1)
    check(engine, f"topk k={k}", x, topk_model(x, k))
    ties = np.round(x * 2).astype(np.float32)  # Few magnitudes: ties by index.
    check(engine, f"topk k={k} ef=vanilla", ties, topk_model(ties, k))


@pytest.mark.parametrize("k", [0.0005, 0.002, 0.01, 0.3])
def test_topk_large(engine, k):
    """A heap below n / 256 elements, radix selection above: the same definition."""
    x = normal(200_000, 11)
    check(engine, f"topk k={k}", x, topk_model(x, k))
    ties = (np.arange(200_000) * 7919 % 13 - 6).astype(np.float32)
    check(engine, f"topk k={k}", ties, topk_model(ties, k))
    x[[5, 77_777]] = [np.inf, np.nan]  # A NaN is the largest; it travels.
    data, _ = topk_model(x, k)
    assert engine.compress(f"topk k={k}", x) == data


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", [0.05, 0.5, 3])
def test_randomk(engine, n, k):
    x = normal(n, n + 2)
    for seed, stream, round_ in [(0, 0, 0), (7, 3, 9), (2**64 - 1, 2**40 + 5, 2**32 - 1)]:
        spec = f"randomk k={k} seed={seed}"
        check(engine, spec, x, randomk_model(x, k, seed, stream, round_), stream, round_)


def test_randomk_large(engine):
    """Few of many take a hash set, many a bitmap: the same draws, the same indices."""
    x = normal(100_000, 12)
    for k in (0.001, 0.02, 0.04, 0.3):
        check(engine, f"randomk k={k} seed=3", x, randomk_model(x, k, 3, 1, 2), 1, 2)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("levels", [1, 2, 5, 127])
def test_dithering(engine, n, levels):
    x = normal(n, n + 3)
    if n > 10:
        x[1], x[2], x[3] = 0.0, -0.0, 1e-42  # Zeros and a subnormal.
    for natural in (False, True):
        for l2 in (False, True):
            spec = (f"dithering k={levels} partition={'natural' if natural else 'linear'} "
                    f"normalize={'l2' if l2 else 'max'} seed=5")
            for round_ in (0, 1):
                check(engine, spec, x, dithering_model(x, levels, natural, l2, 5, 2, round_),
                      2, round_)


def test_dithering_refuses_what_is_not_finite(engine):
    for spec in ("dithering k=3", "dithering k=3 normalize=l2"):
        for bad in (np.inf, np.nan):
            data = engine.compress(spec, np.array([1, bad, 2], np.float32))
            with pytest.raises(ValueError, match="malformed"):
                engine.decompress(spec, data, 3)


@pytest.mark.parametrize("n", SIZES)
def test_fp16(engine, n):
    x = normal(n, n + 4) * np.float32(1000)
    if n > 8:
        x[:8] = [65504, 65520, -1e9, 6e-8, 2.0**-25, 3 * 2.0**-25, -0.0, 1e-30]
    with np.errstate(over="ignore"):  # To infinity, as it should.
        halves = x.astype("<f2")
    check(engine, "fp16", x, (halves.tobytes(), halves.astype(np.float32)))
    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    finite = every[np.isfinite(every)]
    back = floats(engine.decompress("fp16", finite.astype("<f2").tobytes(), len(finite)))
    np.testing.assert_array_equal(back, finite.astype(np.float32))
    nan = engine.compress("fp16", np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(floats(engine.decompress("fp16", nan, 2))).all()


def test_values_as_bytes(engine):
    x = normal(100, 13)
    assert engine.compress("topk k=0.1", x.tobytes()) == engine.compress("topk k=0.1", x)
    assert engine.compress("fp16", x.reshape(10, 10)) == engine.compress("fp16", x)


# ---------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("spec, message", [
    ("foo", "compression: unknown compressor 'foo'"),
    ("topk kk=1", "compression: unknown key 'kk'"),
    ("topk k=0.1 scaling=true", "compression: key 'scaling' does not apply to topk"),
    ("topk k=0", "compression: k=0 must be > 0 (topk)"),
    ("dithering k=200", "compression: k=200 must be an integer from 1 to 127 (dithering)"),
    ("topk", "compression: key 'k' is required (topk)"),
    ("none", "compression: 'none' does not compress"),
])
def test_bad_specs(engine, spec, message):
    with pytest.raises(ValueError) as error:
        engine.compress(spec, np.zeros(4, np.float32))
    assert str(error.value) == message
    with pytest.raises(ValueError):
        engine.decompress(spec, b"", 0)


def test_malformed_data(engine):
    def words(*values: int) -> bytes:
        return np.array(values, "<u4").tobytes()

    one = 0x3F800000
    engine.decompress("topk k=2", words(0, 4, one, one), 5)
    for bad in (words(0, 5, one, one), words(3, 1, one, one), words(2, 2, one, one)):
        with pytest.raises(ValueError, match="malformed data for 'topk k=2'"):
            engine.decompress("topk k=2", bad, 5)
    for scale in (0x7FC00000, 0x7F800000, 0xBF800000):
        with pytest.raises(ValueError, match="malformed"):
            engine.decompress("onebit", words(5, scale), 3)
    with pytest.raises(ValueError, match="malformed"):
        engine.decompress("dithering k=3", words(one) + bytes([4, 0, 0]), 3)
    with pytest.raises(ValueError, match="7 bytes for 3 elements, not 6"):
        engine.decompress("fp16", bytes(7), 3)
    with pytest.raises(ValueError, match="float32"):
        engine.compress("fp16", np.zeros(3, np.float64))
    with pytest.raises(ValueError, match="float32 elements"):
        engine.compress("fp16", b"12345")
