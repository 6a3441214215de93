import os
import subprocess
import sys
import textwrap

import pytest

# A fresh interpreter: the setting holds for the rest of a process, so pytest's is left alone.
PROBE = textwrap.dedent("""
    import resource, torch
    from llmlab.train.device import keep_freed_memory
    def step():  # what a training step does with its activations: allocate, write, free
        xs = [torch.ones(n) for n in (1 << 18, 1 << 20, 4 << 20, 8 << 20, 16 << 20, 1 << 18)]  # 1 to 64 MiB, 118 in all
        del xs
    def faults_per_step():
        for _ in range(3):  # the heap settles into its layout
            step()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            step()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
    default = faults_per_step()
    took = keep_freed_memory()
    print(default, took, faults_per_step())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"),
                    reason="the setting is glibc's")
def test_kept_freed_memory_is_reused_without_page_faults():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout.split()
    default, took, kept = float(out[0]), out[1], float(out[2])
    assert took == "True"
    assert default > 10_000  # 118 MiB is 30,208 pages: by default most come fresh from the kernel each step
    assert kept * 10 < default  # kept: the same pages again (0 faults here once settled)
