"""@local_cuda: the CUDA compiler the pip build would use (setup.py's cuda_toolkit():
$CUDA_HOME/bin/nvcc, else nvcc on PATH; none with TF_BPS_WITHOUT_CUDA=1). Its defs.bzl
says where nvcc is, or None: BUILD then has no GPU target and the build is CPU only."""

def _local_cuda_impl(ctx):
    nvcc = None
    if ctx.os.environ.get("TF_BPS_WITHOUT_CUDA") != "1":
        home = ctx.os.environ.get("CUDA_HOME")
        if home and ctx.path(home + "/bin/nvcc").exists:
            nvcc = home + "/bin/nvcc"
        else:
            found = ctx.which("nvcc")
            nvcc = str(found) if found else None
    ctx.file("BUILD", "")
    ctx.file("defs.bzl", "NVCC = %s\n" % repr(nvcc))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_HOME", "PATH", "TF_BPS_WITHOUT_CUDA"],
    local = True,
)
