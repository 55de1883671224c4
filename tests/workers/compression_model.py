"""A numpy model of a compressed push_pull on both legs, partition by partition, for the
worker scripts that check the core against it (core_compression.py,
core_compression_api.py): each sender's momentum, error feedback (rescaled when the
learning rate changes) and compressed push; the server's sum, its own error feedback
and compressed reply. Compress and decompress are the core's own, checked against their
definitions in test_compression_units.py."""

import numpy as np

from tf_bps.runtime import core

native = core.worker_engine()


def tensor_id(name: str) -> int:
    """The core's id of a tensor name (FNV-1a, 64 bits)."""
    h = 1469598103934665603
    for byte in name.encode():
        h = ((h ^ byte) * 1099511628211) % 2**64
    return h


def partitions(n: int, partition_bytes: int, num_servers: int) -> list[tuple[int, int]]:
    """The core's even cut of n float32 elements (EvenPartitionBytes): whole elements, a
    multiple of the servers' cycle while pieces keep 64 KiB."""
    limit = max(1, partition_bytes // 4)
    pieces = -(-n // limit)
    even = -(-pieces // num_servers) * num_servers
    count = min(even, max(pieces, 4 * n // 65536))
    step = -(-n // count)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def both_legs(spec: str, name: str, rounds, parts, workers: int, average=True, rates=None):
    """What every worker receives, round by round. rounds[r][s] is sender s's flat
    float32 tensor in round r + 1 (a worker's, or a merged host's sum); `workers` divides
    an average; rates[r]: the learning rate told before round r + 1 (None: never)."""
    nesterov, ef = "momentum=nesterov" in spec, "ef=vanilla" in spec
    mu = np.float32(float(spec.split("mu=")[1].split()[0])) if nesterov else None
    senders = len(rounds[0])
    momentum = {(s, p): np.zeros(hi - lo, "float32") for s in range(senders)
                for p, (lo, hi) in enumerate(parts)}
    residual = dict.fromkeys(momentum, None)
    server_residual = dict.fromkeys(range(len(parts)), None)

    def squeeze(values, stream, round_, residual_of, scale=1.0):
        e = values if residual_of is None else values + residual_of * np.float32(scale)
        packed = native.compress(spec, e, stream=stream, round=round_)
        restored = np.frombuffer(native.decompress(spec, packed, len(e)), "float32")
        return restored, (e - restored if ef else None)

    results = []
    for round_, tensors in enumerate(rounds, start=1):
        out = np.zeros(parts[-1][1], "float32")
        scale = rates[round_ - 2] / rates[round_ - 1] if rates and round_ > 1 else 1.0
        for p, (lo, hi) in enumerate(parts):
            stream = tensor_id(name) ^ ((p * 0x9E3779B97F4A7C15) % 2**64)
            total = np.zeros(hi - lo, "float32")
            for s in range(senders):
                g = tensors[s][lo:hi]
                if nesterov:
                    m = momentum[s, p] = mu * momentum[s, p] + g
                    g = g + mu * m
                sent, residual[s, p] = squeeze(g, stream, round_, residual[s, p], scale)
                total = total + sent
            back, server_residual[p] = squeeze(total, stream, round_, server_residual[p])
            out[lo:hi] = back / np.float32(workers) if average else back
        results.append(out)
    return results
