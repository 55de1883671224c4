"""Synchronises a set of float32 tensors across the job and reports throughput.

    bpslaunch -np 2 --num-servers 2 python examples/push_pull_throughput.py
"""

import argparse
import time

import tensorflow as tf

import tf_bps as bps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=64, help="total size of the tensors")
    parser.add_argument("--tensors", type=int, default=16, help="how many tensors")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    bps.init()
    elements = int(args.megabytes * 2**20 / 4 / args.tensors)
    tensors = [tf.fill([elements], float(bps.rank() + i)) for i in range(args.tensors)]

    @tf.function
    def step(values):
        return [bps.push_pull(t, op=bps.Sum, name=f"tensor{i}") for i, t in enumerate(values)]

    result = step(tensors)  # Warm-up: traces the function and declares the tensors.
    expected = [sum(r + i for r in range(bps.size())) for i in range(args.tensors)]
    for got, want in zip(result, expected, strict=True):
        tf.debugging.assert_equal(got[0], float(want), message="wrong sum")
    start = time.perf_counter()
    for _ in range(args.steps):
        step(tensors)
    elapsed = time.perf_counter() - start
    nbytes = elements * 4 * args.tensors
    if bps.rank() == 0:
        print(f"{bps.size()} workers, {args.tensors} tensors of {elements * 4 / 2**20:.2f} MiB: "
              f"{elapsed / args.steps * 1000:.1f} ms per step, "
              f"{nbytes * args.steps / elapsed / 1e9:.2f} GB/s algorithm bandwidth (sums checked)")
    bps.shutdown()


if __name__ == "__main__":
    main()
