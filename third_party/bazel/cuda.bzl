"""@local_cuda: the CUDA compiler and NCCL, where this machine has them; nothing is
downloaded.

nvcc: what setup.py's cuda_toolkit() uses ($CUDA_HOME/bin/nvcc, else nvcc on PATH;
none with TF_BPS_WITHOUT_CUDA=1). NCCL: include/nccl.h and lib/libnccl.so* under
BYTEPS_NCCL_HOME (BytePS's variable), CUDA_HOME, NVIDIA's nvidia-nccl-cu12 wheel (in
the environment of PYTHON_BIN_PATH), or /usr. defs.bzl says what was found (NVCC: a
path or None; NCCL_FOUND), and `@local_cuda//:nccl` is the library where it was."""

_NCCL_WHEEL_QUERY = """
import os
try:
    import nvidia.nccl
    print(list(nvidia.nccl.__path__)[0])
except ImportError:
    pass
"""

def _find_nvcc(ctx):
    if ctx.os.environ.get("TF_BPS_WITHOUT_CUDA") == "1":
        return None
    home = ctx.os.environ.get("CUDA_HOME")
    if home and ctx.path(home + "/bin/nvcc").exists:
        return home + "/bin/nvcc"
    found = ctx.which("nvcc")
    return str(found) if found else None

def _nccl_library(ctx, home):
    """The NCCL library file under `home`, or None."""
    for folder in ["lib", "lib64", "lib/x86_64-linux-gnu"]:
        path = ctx.path(home + "/" + folder)
        if path.exists:
            for entry in path.readdir():
                if entry.basename.startswith("libnccl.so"):
                    return entry
    return None

def _find_nccl(ctx):
    """(include folder, library file) of the first NCCL found, or None."""
    homes = [ctx.os.environ.get(name) for name in ["BYTEPS_NCCL_HOME", "CUDA_HOME"]]
    python = ctx.os.environ.get("PYTHON_BIN_PATH", "python3")
    wheel = ctx.execute([python, "-c", _NCCL_WHEEL_QUERY], quiet = True)
    if wheel.return_code == 0 and wheel.stdout.strip():
        homes.append(wheel.stdout.strip())
    homes.append("/usr")
    for home in [h for h in homes if h]:
        library = _nccl_library(ctx, home)
        if ctx.path(home + "/include/nccl.h").exists and library:
            return home + "/include", library
    return None

def _local_cuda_impl(ctx):
    nvcc = _find_nvcc(ctx)
    nccl = _find_nccl(ctx)
    build = ""
    if nccl:
        include, library = nccl
        ctx.symlink(include + "/nccl.h", "include/nccl.h")
        ctx.symlink(library, "lib/" + library.basename)
        build = """
cc_library(
    name = "nccl",
    srcs = ["lib/{library}"],
    hdrs = ["include/nccl.h"],
    includes = ["include"],
    visibility = ["//visibility:public"],
)
""".format(library = library.basename)
    ctx.file("BUILD", build)
    ctx.file("defs.bzl", "NVCC = %s\nNCCL_FOUND = %s\n" % (repr(nvcc), repr(nccl != None)))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["BYTEPS_NCCL_HOME", "CUDA_HOME", "PATH", "PYTHON_BIN_PATH", "TF_BPS_WITHOUT_CUDA"],
    local = True,
)
