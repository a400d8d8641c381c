"""cuda_library: compiles .cu files with nvcc and exposes them as a cc_library.

Each .cu file becomes one position-independent object, built for sm_90 machine
code plus compute_90 PTX (so newer GPUs can JIT it). The objects are wrapped in
a cc_library, so plain C++ targets depend on CUDA code like any other library.
Kernels are declared in host-only headers (`hdrs`), which C++ files include;
.cu files see `hdrs` and the headers of `cuda_deps`.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

def cuda_library(name, srcs, hdrs = [], deps = [], cuda_hdrs = [], copts = [], visibility = None, **kwargs):
    """Builds srcs (.cu) with nvcc into a cc_library named `name`.

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: host-visible headers, exported by the cc_library.
      deps: cc_library dependencies (their headers must be plain C++ for nvcc).
      cuda_hdrs: extra headers only the .cu files include (.cuh).
      copts: extra nvcc flags.
      visibility: as for cc_library.
      **kwargs: passed to the cc_library.
    """
    objects = []
    for src in srcs:
        stem = src.replace("/", "_").replace(".cu", "")
        obj = "_cuda_objs/%s/%s.pic.o" % (name, stem)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + cuda_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-std=c++17",
                "-O3",
                "--expt-relaxed-constexpr",
                "-gencode=arch=compute_90,code=sm_90",
                "-gencode=arch=compute_90,code=compute_90",
                "-Xcompiler=-fPIC",
                "-Xcompiler=-Wall",
                "-lineinfo",
                "-I.",
                "-I$(GENDIR)",
            ] + copts + [
                "-c",
                "$(location %s)" % src,
                "-o",
                "$@",
            ]),
            message = "nvcc %s" % src,
            tags = ["no-remote"],
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        visibility = visibility,
        alwayslink = 1,
        **kwargs
    )
