# The native sources and compiler flags of tf_bps, in one place: BUILD loads this file
# (Starlark) and setup.py executes it (these plain list assignments are also Python),
# so the Bazel and pip builds cannot drift apart.

# One list per layer (custom_ops/<layer>/), as BUILD's libraries are cut:
#   common   types, Status, logging, the reduce kernels
#   wire     the frame format, job-token proofs, the transports (wire/tcp, wire/shm)
#   worker   the worker engine behind its C API (c_api.h): planning, the partition
#            pipeline, the local merge, the timeline
#   rounds   one partition key's rounds (who is in, whether it may end, why it
#            ended) and what each operation kind does with the data: shared by the
#            server's engines and the workers' local merge
#   server   accepting workers and the engine threads that run their keys' rounds
#   settings the table of variables (settings.def) read and checked as config.py does:
#            the server's from its environment, the worker's from what config.py read
#   control  the scheduler link in C++ (the server's), JSON
#   compression  gradient compressors (onebit, topk, randomk, dithering, fp16) with error
#            feedback and momentum: a worker's pushes and a server's sums
COMMON_SOURCES = [
    "custom_ops/common/common.cc",
    "custom_ops/common/logging.cc",
    "custom_ops/common/reduce.cc",
]
WIRE_SOURCES = [
    "custom_ops/wire/protocol.cc",
    "custom_ops/wire/crypto.cc",
    "custom_ops/wire/auth.cc",
    "custom_ops/wire/socket.cc",
    "custom_ops/wire/shared_memory.cc",
    "custom_ops/wire/stream_channel.cc",
    "custom_ops/wire/transport.cc",
    "custom_ops/wire/waiting_room.cc",
    # The transports (wire/<name>/), registered in transports.cc.
    "custom_ops/wire/transports.cc",
    "custom_ops/wire/tcp/tcp_transport.cc",
    "custom_ops/wire/shm/shared_memory_channel.cc",
    "custom_ops/wire/shm/shm_transport.cc",
]
ROUNDS_SOURCES = [
    "custom_ops/rounds/round.cc",
    "custom_ops/rounds/declarations.cc",
    "custom_ops/rounds/round_data.cc",
    "custom_ops/rounds/policy.cc",
    "custom_ops/rounds/reduce_policy.cc",
    "custom_ops/rounds/compressed_sum_policy.cc",
    "custom_ops/rounds/broadcast_policy.cc",
    "custom_ops/rounds/gather_policy.cc",
    "custom_ops/rounds/async_store.cc",
]
WORKER_SOURCES = [
    "custom_ops/worker/task.cc",
    "custom_ops/worker/op_policy.cc",
    "custom_ops/worker/reduce_op.cc",
    "custom_ops/worker/broadcast_op.cc",
    "custom_ops/worker/scatter_op.cc",
    "custom_ops/worker/gather_op.cc",
    "custom_ops/worker/credits.cc",
    "custom_ops/worker/timeline.cc",
    "custom_ops/worker/stats.cc",
    "custom_ops/worker/device.cc",
    "custom_ops/worker/device_host.cc",
    "custom_ops/worker/device_host_group.cc",
    "custom_ops/worker/device_staging.cc",
    "custom_ops/worker/device_merge.cc",
    "custom_ops/worker/pending.cc",
    "custom_ops/worker/local_peers.cc",
    "custom_ops/worker/local_merge.cc",
    "custom_ops/worker/local_merge_leader.cc",
    "custom_ops/worker/server_link.cc",
    "custom_ops/worker/server_routes.cc",
    "custom_ops/worker/worker.cc",
    "custom_ops/worker/worker_groups.cc",
    "custom_ops/worker/worker_server_loss.cc",
    "custom_ops/worker/c_api.cc",
    "custom_ops/worker/c_api_formats.cc",
]
SERVER_ENGINE_SOURCES = [
    "custom_ops/server/round_engine.cc",
    "custom_ops/server/server.cc",
    "custom_ops/server/acceptor.cc",
    "custom_ops/server/straggler_watch.cc",
    "custom_ops/server/server_metrics.cc",
    "custom_ops/server/metrics_endpoint.cc",
]
COMPRESSION_SOURCES = [
    "custom_ops/compression/compressor.cc",
    "custom_ops/compression/onebit.cc",
    "custom_ops/compression/sparse.cc",
    "custom_ops/compression/dithering.cc",
    "custom_ops/compression/fp16.cc",
    "custom_ops/compression/registry.cc",
]
SETTINGS_SOURCES = ["custom_ops/control/settings.cc"]
CONTROL_SOURCES = [
    "custom_ops/control/json.cc",
    "custom_ops/control/zmq_dealer.cc",
    "custom_ops/control/scheduler_link.cc",
]

# pip's programs and libraries, each whole.
# The worker engine behind its C API: tf_bps/_bps_core.
CORE_SOURCES = (COMMON_SOURCES + WIRE_SOURCES + COMPRESSION_SOURCES + ROUNDS_SOURCES +
                SETTINGS_SOURCES + WORKER_SOURCES)

# bps-server, the native executable every server runs (tf_bps/bps_server).
SERVER_SOURCES = (COMMON_SOURCES + WIRE_SOURCES + COMPRESSION_SOURCES + ROUNDS_SOURCES +
                  SETTINGS_SOURCES + SERVER_ENGINE_SOURCES + CONTROL_SOURCES +
                  ["custom_ops/server/main.cc"])

# The Python binding (pybind11) and the TensorFlow kernels.
WORKER_MODULE_SOURCES = ["custom_ops/python/worker_module.cc"]
TF_SOURCES = ["custom_ops/tf/collective_ops.cc"]

# Where a CUDA toolkit is found, the TensorFlow ops also get GPU kernels, which hand the
# core device pointers and TensorFlow's stream (custom_ops/tf/collective_ops.cc).
TF_GPU_FLAGS = ["-DTF_BPS_GPU_KERNELS"]

# The core's CUDA kernels (built only where a CUDA toolkit is found), and nvcc's flags.
GPU_SOURCES = [
    "custom_ops/common/common.cc",
    "custom_ops/worker/cuda/gpu_kernels.cu",
    "custom_ops/worker/cuda/gpu_device.cu",
    "custom_ops/worker/cuda/gpu_group.cu",
]
# The CUDA runtime is linked statically, so the library needs only the driver, whatever
# CUDA runtime TensorFlow brings along. Ampere and Hopper machine code, and PTX that
# newer GPUs compile at load time.
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-shared",
    "-Xcompiler=-fPIC,-Wall",
    "-cudart=static",
    "-ldl",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# The C++ unit tests (tests/cpp): the pieces they exercise, without the worker engine
# and its C API. pip's test (tests/test_core_units.py) compiles these with them.
UNIT_TEST_SOURCES = [
    "tests/cpp/core_unit_test.cc",
    "tests/cpp/round_test.cc",
    "tests/cpp/shared_slots_test.cc",
    "tests/cpp/waiting_room_test.cc",
    "tests/cpp/sealed_frames_test.cc",
    "tests/cpp/timeline_test.cc",
    "tests/cpp/compression_test.cc",
    "tests/cpp/device_test.cc",
]
UNIT_TEST_PIECES = (COMMON_SOURCES + WIRE_SOURCES + COMPRESSION_SOURCES + ROUNDS_SOURCES +
                    SERVER_ENGINE_SOURCES + [
    "custom_ops/worker/task.cc",
    "custom_ops/worker/op_policy.cc",
    "custom_ops/worker/reduce_op.cc",
    "custom_ops/worker/broadcast_op.cc",
    "custom_ops/worker/scatter_op.cc",
    "custom_ops/worker/gather_op.cc",
    "custom_ops/worker/credits.cc",
    "custom_ops/worker/timeline.cc",
    "custom_ops/worker/device.cc",
    "custom_ops/worker/device_host.cc",
    "custom_ops/worker/device_host_group.cc",
    "custom_ops/worker/device_staging.cc",
    "custom_ops/worker/server_routes.cc",
    "custom_ops/worker/local_peers.cc",
    "custom_ops/control/json.cc",
] + SETTINGS_SOURCES)

# What links the wire's cryptography (custom_ops/wire/crypto.h): OpenSSL's libcrypto,
# statically, so that a server machine needs no OpenSSL of its own; its symbols stay
# hidden, out of the way of the TLS library TensorFlow brings into the same process.
CRYPTO_LINKOPTS = ["-Wl,--exclude-libs,libcrypto.a", "-l:libcrypto.a"]

# bps_server links everything statically, the C library too: an operator copies the one
# file to any x86-64 Linux machine, whatever its glibc (tests/test_job.py runs it in an
# empty root). Names resolve through /etc/hosts and DNS, which static glibc has built in.
SERVER_LINKOPTS = ["-static"]

CXXFLAGS = ["-std=c++17", "-O3", "-fPIC", "-pthread", "-fvisibility-inlines-hidden"]
WARNINGS = ["-Wall", "-Wextra"]
# The TensorFlow headers trip these; the kernels are ours either way.
TF_WARNINGS = ["-Wno-deprecated-declarations", "-Wno-interference-size"]
