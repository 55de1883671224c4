"""@local_tensorflow: the installed TensorFlow's headers and framework library, found
the way TensorFlow's custom-op template finds them (tf.sysconfig), with the Python
interpreter named by PYTHON_BIN_PATH (default: python3). Nothing is downloaded."""

_QUERY = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
print(tf.sysconfig.get_include())
print(tf.sysconfig.get_lib())
print(" ".join(tf.sysconfig.get_compile_flags()))
print(" ".join(tf.sysconfig.get_link_flags()))
"""

def _local_tensorflow_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH", "python3")
    found = ctx.execute([python, "-c", _QUERY], quiet = True)
    if found.return_code != 0:
        fail("@local_tensorflow: '%s' cannot import tensorflow (set PYTHON_BIN_PATH to an " %
             python + "interpreter that can):\n" + found.stderr)
    include, lib, compile_flags, link_flags = found.stdout.strip().split("\n")
    library = [f for f in link_flags.split(" ") if f.startswith("-l:")][0][3:]
    ctx.symlink(lib + "/" + library, library)
    # The headers, linked in entry by entry: one bundled CUDA package (nvtx) carries
    # BUILD files of its own, which would cut it out of the glob below.
    for entry in ctx.path(include).readdir():
        if entry.basename != "external":
            ctx.symlink(entry, "include/" + entry.basename)
    for entry in ctx.path(include + "/external").readdir():
        if entry.basename != "nvtx_archive":
            ctx.symlink(entry, "include/external/" + entry.basename)
    defines = [f[2:] for f in compile_flags.split(" ") if f.startswith("-D")]
    ctx.file("BUILD", """
cc_library(
    name = "framework",
    srcs = ["{library}"],
    hdrs = glob(["include/**"]),
    includes = ["include"],
    defines = {defines},
    visibility = ["//visibility:public"],
)
""".format(library = library, defines = repr(defines)))

local_tensorflow = repository_rule(
    implementation = _local_tensorflow_impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)
