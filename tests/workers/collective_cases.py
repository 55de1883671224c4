"""Inputs of the collective tests, shared by the worker script and the test that
checks its results against numpy: small integers, exact in every dtype, so sums,
products and scalings are exact too."""

import ml_dtypes
import numpy as np

NUMERIC = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16",
           "float32", "float64"]
REDUCTIONS = ["sum", "average", "min", "max", "product"]
SHAPE = (3, 4)
PRESCALE, POSTSCALE = 0.5, 3.0


def numpy_dtype(name: str):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def value(dtype: str, rank: int, shape=SHAPE, salt: int = 0) -> np.ndarray:
    """Integers in [-3, 3] ([0, 3] unsigned), different per rank; bool: parity."""
    draw = np.random.default_rng([rank, salt, sum(map(ord, dtype))]).integers(-3, 4, size=shape)
    if dtype == "bool":
        return draw % 2 == 0
    if dtype.startswith("uint"):
        draw = np.abs(draw)
    return draw.astype(numpy_dtype(dtype))


def gather_rows(rank: int) -> int:
    """Allgather inputs have rank + 1 rows: the first dimension differs by worker."""
    return rank + 1


def reduced(dtype: str, reduction: str, size: int) -> np.ndarray:
    values = np.stack([value(dtype, r).astype(np.float64) for r in range(size)])
    if reduction == "min":
        return values.min(axis=0)
    if reduction == "max":
        return values.max(axis=0)
    if reduction == "product":
        return values.prod(axis=0)
    total = values.sum(axis=0)
    if reduction == "sum":
        return total
    if dtype.startswith(("int", "uint")):
        return np.floor_divide(total, size)
    return total / size


def scaled_sum(dtype: str, size: int) -> np.ndarray:
    """Sum with prescale and postscale: integers are scaled in float64 and truncated."""
    if dtype.startswith(("int", "uint")):
        pre = [np.trunc(value(dtype, r).astype(np.float64) * PRESCALE) for r in range(size)]
        return np.trunc(sum(pre) * POSTSCALE)
    return sum(value(dtype, r).astype(np.float64) for r in range(size)) * PRESCALE * POSTSCALE


def alltoall_splits(rank: int, size: int) -> list[int]:
    """Rows rank `rank` sends to each rank: uneven, and different per pair."""
    return [rank + j + 1 for j in range(size)]


def alltoall_rows(rank: int, size: int) -> np.ndarray:
    """Row k bound for rank j holds 100 * rank + 10 * j + k (two equal columns)."""
    rows = [100 * rank + 10 * j + k for j in range(size)
            for k in range(alltoall_splits(rank, size)[j])]
    return np.repeat(np.array(rows, np.float32)[:, None], 2, axis=1)


def scatter_shape(size: int) -> tuple[int, int]:
    """An uneven first dimension: the first rank keeps one more row."""
    return (2 * size + 1, 3)


def scatter_slice(rank: int, size: int) -> slice:
    rows = scatter_shape(size)[0]
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    return slice(sum(counts[:rank]), sum(counts[:rank + 1]))
