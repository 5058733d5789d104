"""Builds flash_attn_t._C: the plain-C core (compiled as C11 with OpenMP) and the
one C++ file that registers torch.ops.flash_attn_t.*.

    pip install --no-build-isolation -e .      # uses the torch already installed

Environment: MAX_JOBS (parallel compile jobs, honoured by ninja), CC (the C
compiler for the core, default cc).
"""
import glob
import os
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")
C_CORE = ["csrc/fat_common.c", "csrc/cpu/fat_cpu.c"]
C_FLAGS = ["-O3", "-std=c11", "-fopenmp", "-fPIC", "-Wall", "-Wextra", "-I" + CSRC]


class BuildWithCCore(BuildExtension):
    """BuildExtension compiles every source with the C++ compiler; the core is C,
    so compile it with the C compiler first and link its objects in."""

    def build_extensions(self):
        os.makedirs(self.build_temp, exist_ok=True)
        headers = glob.glob(os.path.join(CSRC, "**", "*.h"), recursive=True)
        for ext in self.extensions:
            for src in C_CORE:
                obj = os.path.join(self.build_temp, os.path.basename(src)[:-2] + ".o")
                newest_input = max(os.path.getmtime(f) for f in [src, *headers])
                if not os.path.exists(obj) or os.path.getmtime(obj) < newest_input:
                    cmd = [os.environ.get("CC", "cc"), *C_FLAGS, "-c", src, "-o", obj]
                    print(" ".join(cmd))
                    subprocess.check_call(cmd)
                ext.extra_objects.append(obj)
        super().build_extensions()


setup(
    ext_modules=[
        CppExtension(
            "flash_attn_t._C",
            ["csrc/torch_binding.cpp"],
            include_dirs=[CSRC],
            extra_compile_args={"cxx": ["-O3"]},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildWithCCore.with_options(use_ninja=True)},
)
