# The native sources and compiler flags of tf_bps, in one place: BUILD loads this file
# (Starlark) and setup.py executes it (these plain list assignments are also Python),
# so the Bazel and pip builds cannot drift apart.

# What both engines share: types, the wire format, sockets, shared memory, kernels.
SHARED_SOURCES = [
    "custom_ops/core/common.cc",
    "custom_ops/core/logging.cc",
    "custom_ops/core/protocol.cc",
    "custom_ops/core/reduce.cc",
    "custom_ops/core/transport/socket.cc",
    "custom_ops/core/transport/shared_memory.cc",
    "custom_ops/core/transport/transport.cc",
    "custom_ops/core/transport/shared_memory_channel.cc",
    "custom_ops/core/transport/auth.cc",
]

# The worker engine behind its C API (c_api.h).
CORE_SOURCES = SHARED_SOURCES + [
    "custom_ops/core/task.cc",
    "custom_ops/core/credits.cc",
    "custom_ops/core/timeline.cc",
    "custom_ops/core/local_merge.cc",
    "custom_ops/core/worker.cc",
    "custom_ops/core/c_api.cc",
]

# The server engine; no worker code.
SERVER_ENGINE_SOURCES = SHARED_SOURCES + ["custom_ops/server/server.cc"]

# The control plane in C++: the variables (tf_bps/settings.def), JSON, and a ZeroMQ
# DEALER that registers with the scheduler.
CONTROL_SOURCES = [
    "custom_ops/control/settings.cc",
    "custom_ops/control/json.cc",
    "custom_ops/control/zmq_dealer.cc",
    "custom_ops/control/scheduler_link.cc",
]

# bps-server, the native executable every server runs (tf_bps/bps_server).
SERVER_SOURCES = SERVER_ENGINE_SOURCES + CONTROL_SOURCES + ["custom_ops/server/main.cc"]

# The Python binding (pybind11) and the TensorFlow kernels.
WORKER_MODULE_SOURCES = ["custom_ops/python/worker_module.cc"]
TF_SOURCES = ["custom_ops/tf/collective_ops.cc"]

# Where a CUDA toolkit is found, the TensorFlow ops also get GPU kernels (pinned host
# staging on TensorFlow's streams; custom_ops/tf/collective_ops.cc).
TF_GPU_FLAGS = ["-DTF_BPS_GPU_KERNELS"]

# The core's CUDA kernels (built only where a CUDA toolkit is found), and nvcc's flags.
GPU_SOURCES = ["custom_ops/core/common.cc", "custom_ops/core/cuda/gpu_kernels.cu"]
# The CUDA runtime is linked statically, so the library needs only the driver, whatever
# CUDA runtime TensorFlow brings along. Ampere and Hopper machine code, and PTX that
# newer GPUs compile at load time.
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-shared",
    "-Xcompiler=-fPIC,-Wall",
    "-cudart=static",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# The C++ unit tests: the pieces they exercise, without the worker and the C API.
UNIT_TEST_SOURCES = SHARED_SOURCES + [
    "custom_ops/core/task.cc",
    "custom_ops/core/credits.cc",
    "custom_ops/core/timeline.cc",
    "custom_ops/server/server.cc",
    "custom_ops/control/settings.cc",
    "custom_ops/control/json.cc",
    "tests/cpp/core_unit_test.cc",
    "tests/cpp/shared_slots_test.cc",
]

CXXFLAGS = ["-std=c++17", "-O3", "-fPIC", "-pthread", "-fvisibility-inlines-hidden"]
WARNINGS = ["-Wall", "-Wextra"]
# The TensorFlow headers trip these; the kernels are ours either way.
TF_WARNINGS = ["-Wno-deprecated-declarations", "-Wno-interference-size"]
