"""gtest_alone_and_under_mpirun: one gtest program run alone and under mpirun.

Multi-rank engine tests are gtest programs that bootstrap their communicator
from mpirun's environment (world size 1 without a launcher). For a program
`<name>_test.cc` this declares:

  <name>_test          the program alone (cc_test, world size 1)
  <name>_mpi           the same program as a binary for mpirun
  <name>_np<N>_test    one sh_test per entry of `ranks`, launching N ranks
                       through //tests/comm:run_mpi.sh (--oversubscribe)

Tests tagged "gpu" run with GPU_SHARING_TEST_ENV: on a machine with fewer GPUs
than ranks (one H200) their ranks share a GPU, which CreateCommunicator
refuses unless ZE_ALLOW_GPU_SHARING=1 asks for it.
"""

# For gpu-tagged tests whose ranks may outnumber the GPUs: lets them share one
# (the mpi backend staging through host memory) instead of failing with
# CreateCommunicator's FailedPrecondition. tools/run_gpu_tests.sh, which runs
# the bundled tests without Bazel, exports the same.
GPU_SHARING_TEST_ENV = {"ZE_ALLOW_GPU_SHARING": "1"}

def gtest_alone_and_under_mpirun(name, deps, ranks, size = "small", mpi_size = "medium", tags = [], data = []):
    """Declares <name>_test, <name>_mpi and <name>_np<N>_test for N in ranks.

    Args:
      name: the prefix; the source is <name>_test.cc.
      deps: the program's dependencies (gtest and a main among them).
      ranks: world sizes to run under mpirun, e.g. [2, 3, 4].
      size: the size of the single-rank cc_test.
      mpi_size: the size of each mpirun sh_test.
      tags: tags for every test; "gpu" also sets GPU_SHARING_TEST_ENV.
      data: files the program reads (through $TEST_SRCDIR), for every test.
    """
    source = name + "_test.cc"
    env = GPU_SHARING_TEST_ENV if "gpu" in tags else {}
    native.cc_test(
        name = name + "_test",
        size = size,
        srcs = [source],
        deps = deps,
        data = data,
        env = env,
        tags = tags,
    )
    native.cc_binary(
        name = name + "_mpi",
        testonly = True,
        srcs = [source],
        deps = deps,
        data = data,
    )
    for np in ranks:
        native.sh_test(
            name = "%s_np%d_test" % (name, np),
            size = mpi_size,
            srcs = ["//tests/comm:run_mpi.sh"],
            args = [
                str(np),
                "$(rootpath :%s_mpi)" % name,
            ],
            data = [":%s_mpi" % name],
            env = env,
            tags = tags,
        )
