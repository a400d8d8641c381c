"""cuda_library: compiles .cu files with nvcc and exposes them as a cc_library.

Each .cu file becomes one position-independent object, built for sm_90 machine
code plus compute_90 PTX (so newer GPUs can JIT it), or, with
gencode = GENCODE_SM90A, for sm_90a only (Hopper-specific instructions). The objects are wrapped in
a cc_library, so plain C++ targets depend on CUDA code like any other library.
Kernels are declared in host-only headers (`hdrs`), which C++ files include;
.cu files see `hdrs` and the headers of `cuda_deps`.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

GENCODE_DEFAULT = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# Hopper-only features (wgmma, setmaxnreg): machine code for exactly
# compute capability 9.0, no PTX (sm_90a PTX cannot JIT elsewhere either).
# Callers check the device before launching such kernels.
GENCODE_SM90A = ["-gencode=arch=compute_90a,code=sm_90a"]

def cuda_library(name, srcs, hdrs = [], deps = [], cuda_hdrs = [], copts = [], gencode = GENCODE_DEFAULT, visibility = None, **kwargs):
    """Builds srcs (.cu) with nvcc into a cc_library named `name`.

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: host-visible headers, exported by the cc_library.
      deps: cc_library dependencies (their headers must be plain C++ for nvcc).
      cuda_hdrs: extra headers only the .cu files include (.cuh).
      copts: extra nvcc flags.
      gencode: nvcc -gencode flags (GENCODE_DEFAULT or GENCODE_SM90A).
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
            # nvcc names its temporaries after its PID, and every sandboxed
            # action is PID 2 in its own namespace with /tmp shared:
            # parallel nvcc runs would overwrite each other's files.
            cmd = "tmp=$$(mktemp -d) && TMPDIR=$$tmp " + " ".join([
                NVCC,
                "-std=c++17",
                "-O3",
                "--expt-relaxed-constexpr",
            ] + gencode + [
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
            ]) + "; status=$$?; rm -rf $$tmp; exit $$status",
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
