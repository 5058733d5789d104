"""Builds flash_attn_t._C: the plain-C core (compiled as C11 with OpenMP), the CUDA
kernels when torch has CUDA and nvcc is found, and the one C++ file that registers
torch.ops.flash_attn_t.*.

    pip install --no-build-isolation -e .      # uses the torch already installed

Environment:
  MAX_JOBS                  parallel compile jobs (ninja)
  CC                        C compiler for the core (default cc)
  FLASH_ATTN_T_CUDA         auto (default: CUDA kernels if torch has CUDA and nvcc
                            exists), 1 (require them), 0 (CPU only)
  FLASH_ATTN_T_CUDA_ARCHS   semicolon list from 80, 90a (default "80;90a"); 80 builds
                            the mma.sync kernels (run on every GPU from Ampere on),
                            90a adds the Hopper kernels and Hopper code for the rest
  FLASH_ATTN_T_HEADDIMS     comma list from 32,64,96,128,192,256 (default all):
                            compiled head dims; others run padded to the next one
"""
import glob
import os
import subprocess

from setuptools import setup
import torch
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")
C_CORE = ["csrc/fat_common.c", "csrc/cpu/fat_cpu.c"]
C_FLAGS = ["-O3", "-std=c11", "-fopenmp", "-fPIC", "-Wall", "-Wextra", "-I" + CSRC]
ALL_HEADDIMS = [32, 64, 96, 128, 192, 256]
ALL_ARCHS = ["80", "90a"]


def env_list(name, default, sep):
    raw = os.environ.get(name, "").strip()
    return [x.strip() for x in raw.split(sep) if x.strip()] if raw else default


def want_cuda():
    mode = os.environ.get("FLASH_ATTN_T_CUDA", "auto")
    if mode not in ("auto", "0", "1"):
        raise SystemExit(f"FLASH_ATTN_T_CUDA must be auto, 0 or 1, got {mode!r}")
    have = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if mode == "1" and not have:
        raise SystemExit("FLASH_ATTN_T_CUDA=1 but torch has no CUDA or nvcc was not found")
    return have and mode != "0"


def cuda_sources_and_flags():
    headdims = [int(d) for d in env_list("FLASH_ATTN_T_HEADDIMS", ALL_HEADDIMS, ",")]
    archs = env_list("FLASH_ATTN_T_CUDA_ARCHS", ALL_ARCHS, ";")
    bad = [d for d in headdims if d not in ALL_HEADDIMS] + [a for a in archs if a not in ALL_ARCHS]
    if bad or not headdims or "80" not in archs:
        raise SystemExit(f"FLASH_ATTN_T_HEADDIMS must be from {ALL_HEADDIMS} and "
                         f"FLASH_ATTN_T_CUDA_ARCHS must include 80, from {ALL_ARCHS}; got "
                         f"{headdims}, {archs}")
    sources = ["csrc/cuda/fat_cuda.cu", "csrc/cuda/fat_sm80_bwd_workspace.cu"]
    defines = ["-DFLASH_ATTN_T_WITH_CUDA", "-DFLASH_ATTN_T_WITH_SM80"]
    for d in sorted(headdims):
        sources += [f"csrc/cuda/sm80_fwd_hdim{d}.cu", f"csrc/cuda/sm80_bwd_hdim{d}.cu"]
        defines.append(f"-DFAT_HDIM_{d}")
    gencode = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_80,code=compute_80"]
    if "90a" in archs:
        gencode.append("-gencode=arch=compute_90a,code=sm_90a")
        sm90 = [f"csrc/cuda/sm90_fwd_hdim{d}.cu" for d in sorted(headdims)]
        sm90 = [s for s in sm90 if os.path.exists(os.path.join(HERE, s))]
        if sm90:
            sources += sm90
            defines += ["-DFLASH_ATTN_T_WITH_SM90A", "-DFAT_WITH_SM90A"]
    nvcc = ["-O3", "-std=c++17", "-lineinfo", *gencode, *defines]
    return sources, defines, nvcc


def links_libstdcxx_statically(linker, tmpdir):
    """True when `linker -shared` copies libstdc++ into a C++ shared object (a gcc
    without a shared libstdc++, or with -static-libstdc++ in its specs): checked by
    linking a one-function library that formats a number and asking whether it
    defines std::ostream's number inserter itself."""
    src, lib = os.path.join(tmpdir, "probe_stdcxx.cpp"), os.path.join(tmpdir, "probe_stdcxx.so")
    with open(src, "w") as f:
        f.write("#include <sstream>\nstd::string probe(long x) { std::ostringstream s; s << x; "
                "return s.str(); }\n")
    try:
        subprocess.run([linker, "-shared", "-fPIC", src, "-o", lib], check=True,
                       capture_output=True)
        defined = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                                 capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return False  # cannot tell: link as the toolchain does
    return "_ZNSo9_M_insertIlEERSoT_" in defined  # std::ostream::_M_insert<long>


def loaded_libstdcxx():
    """Path of the libstdc++.so.6 this process (Python with torch) has loaded, or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libstdc++.so" in line}
    except OSError:
        return None
    return sorted(paths)[0] if paths else None


class BuildWithCCore(BuildExtension):
    """BuildExtension compiles every source with the C++ compiler; the core is C,
    so compile it with the C compiler first and link its objects in.

    A second copy of libstdc++ linked statically into _C beside the libstdc++.so.6
    that torch runs with crashes the first time a number is formatted into an error
    message (the two copies' locale facet ids disagree; seen with a gcc under /opt/gcc
    on the H200 machine): such a toolchain links _C against the loaded libstdc++.so.6."""

    def build_extensions(self):
        os.makedirs(self.build_temp, exist_ok=True)
        # distutils links C++ extensions with the C++ compiler's driver
        linker = (getattr(self.compiler, "compiler_cxx", None) or self.compiler.linker_so)[0]
        shared = loaded_libstdcxx()
        if shared and links_libstdcxx_statically(linker, self.build_temp):
            print(f"{linker} links libstdc++ statically; linking _C against {shared}")
            for ext in self.extensions:
                ext.extra_link_args.insert(0, shared)
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


def extension():
    common = dict(include_dirs=[CSRC], extra_link_args=["-fopenmp"])
    if not want_cuda():
        return CppExtension("flash_attn_t._C", ["csrc/torch_binding.cpp"],
                            extra_compile_args={"cxx": ["-O3"]}, **common)
    sources, defines, nvcc = cuda_sources_and_flags()
    return CUDAExtension("flash_attn_t._C", ["csrc/torch_binding.cpp", *sources],
                         extra_compile_args={"cxx": ["-O3", *defines], "nvcc": nvcc}, **common)


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildWithCCore.with_options(use_ninja=True)},
)
