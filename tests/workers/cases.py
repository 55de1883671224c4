"""Deterministic push_pull inputs, shared by the worker script and the test that
checks its results against numpy."""

import ml_dtypes
import numpy as np

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64"]
SHAPES = [(), (0,), (1,), (7,), (3, 5), (1031,), (64, 129), (3, 0, 2)]
LARGE_SHAPE = (300_000,)


def numpy_dtype(name: str):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def cases():
    """(case name, dtype name, shape) for every checked combination."""
    for dtype in DTYPES:
        for shape in SHAPES:
            yield f"{dtype}_{'x'.join(map(str, shape)) or 'scalar'}", dtype, shape
    yield "float32_large", "float32", LARGE_SHAPE
    yield "float16_large", "float16", LARGE_SHAPE


def value(case: str, dtype: str, shape, rank: int) -> np.ndarray:
    """Multiples of 1/4 in [-8, 8]: exact in every dtype, so sums are exact too."""
    seed = [rank, sum(map(ord, case))]
    quarters = np.random.default_rng(seed).integers(-32, 33, size=shape)
    if dtype.startswith("int"):
        return quarters.astype(dtype)
    return (quarters / 4.0).astype(numpy_dtype(dtype))


def expected(case: str, dtype: str, shape, size: int, average: bool) -> np.ndarray:
    total = sum(value(case, dtype, shape, r).astype(np.float64) for r in range(size))
    if not average:
        return np.asarray(total)
    if dtype.startswith("int"):
        return np.floor_divide(np.asarray(total).astype(np.int64), size)
    return np.asarray(total / size)
