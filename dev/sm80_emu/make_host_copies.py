"""make_host_copies.py OUT_DIR - host-compilable copies of
csrc/cuda/fat_sm80_primitives.cuh, fat_sm80_bwd.cuh and fat_sm80_fwd.cuh for
the emulator: drops the asm / intrinsic definitions that emu_shim.h provides,
turns the few inline-asm statements of the forward into the shim's calls, drops
the backward's launcher and runs the forward's own launcher with its kernel
launch replaced by emu::run_grid, routes the plain shared-memory loads of lse /
dot through the race checker, and adds a stub fat_cuda_internal.h.  Everything
else (index math, pipelines, fragment loaders) is the real source, unchanged."""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'csrc', 'cuda') + '/'
OUT = sys.argv[1].rstrip('/') + '/'

def remove_function(src, signature_start):
    i = src.find(signature_start)
    if i < 0:
        sys.exit('not found: ' + signature_start)
    j = src.index('{', i)
    depth = 0
    k = j
    while True:
        if src[k] == '{': depth += 1
        elif src[k] == '}':
            depth -= 1
            if depth == 0: break
        k += 1
    end = k + 1
    if src[end:end+1] == ';': end += 1
    return src[:i] + src[end:]

def remove_all(src, signature_start):
    while signature_start in src:
        src = remove_function(src, signature_start)
    return src

p = open(SRC + 'fat_sm80_primitives.cuh').read()
p = p.replace('#include <cuda_bf16.h>', '').replace('#include <cuda_fp16.h>', '').replace('#include <cuda_runtime.h>', '')
a = p.index('/* ---- element types'); b = p.index('/* ---- cp.async')
p = p[:a] + p[b:]
for sig in ['__device__ __forceinline__ void cp_async_16(',
            '__device__ __forceinline__ void cp_async_commit()',
            'template <int Pending> __device__ __forceinline__ void cp_async_wait()',
            '__device__ __forceinline__ uint32_t smem_u32(',
            '__device__ __forceinline__ void ldmatrix_x4(',
            '__device__ __forceinline__ void ldmatrix_x4_trans(']:
    p = remove_function(p, sig)
old = 'asm volatile("mov.u32 %0, %%tid.x;\\n" : "=r"(tid));'
if p.count(old) != 1:
    sys.exit('expected once in fat_sm80_primitives.cuh: ' + old)
p = p.replace(old, 'tid = threadIdx.x;')
p = re.sub(r'template <typename T> __device__ __forceinline__ void mma_16816\(float c\[4\], const uint32_t a\[4\], const uint32_t b\[2\]\);', '', p)
p = remove_all(p, 'template <> __device__ __forceinline__ void mma_16816<')
open(OUT + 'fat_sm80_primitives.cuh', 'w').write(p)

s = open(SRC + 'fat_sm80_bwd.cuh').read()
for sig in ['__device__ __forceinline__ float exp2_approx(',
            '__device__ __forceinline__ float tanh_approx(',
            '__device__ __forceinline__ void cp_async_4(',
            '__device__ __forceinline__ void st_shared_u32(']:
    s = remove_function(s, sig)
old = '*reinterpret_cast<const float2 *>(lse_log2 + col)'
assert old in s
s = s.replace(old, 'emu::read_shared_f2(lse_log2 + col)')
old = '*reinterpret_cast<const float2 *>(dot + col)'
assert old in s
s = s.replace(old, 'emu::read_shared_f2(dot + col)')
old = 'asm volatile("mov.u32 %0, %%ctaid.x;\\n" : "=r"(bid));'
assert s.count(old) == 1
s = s.replace(old, 'bid = blockIdx.x;')
a = s.index('/* ---- launcher')
s = s[:a] + '} /* namespace bwd80 */\n} /* namespace fat */\n'
open(OUT + 'fat_sm80_bwd.cuh', 'w').write(s)
open(OUT + 'fat_cuda_internal.h', 'w').write('#pragma once\n#include "flash_attn_t.h"\ntypedef void *cudaStream_t;\n')

def replace_once(src, old, new):
    if src.count(old) != 1:
        sys.exit('expected once in fat_sm80_fwd.cuh: ' + old)
    return src.replace(old, new)

f = open(SRC + 'fat_sm80_fwd.cuh').read()
f = remove_function(f, '__device__ __forceinline__ float fast_exp2(')
f = replace_once(f, 'asm volatile("mov.u32 %0, %%ctaid.x;\\n" : "=r"(bid));', 'bid = blockIdx.x;')
f = replace_once(f, 'asm volatile("st.shared.b32 [%0], %1;\\n" ::"r"(addr), "r"(packed));',
                 'emu::st_shared_u32(addr, packed);')
f, n = re.subn(r'asm volatile\("ld\.shared\.v4\.b32 \{%0,%1,%2,%3\}, \[%4\];\\n"\s*'
               r': "=r"\(chunk\.x\), "=r"\(chunk\.y\), "=r"\(chunk\.z\), "=r"\(chunk\.w\)\s*'
               r': "r"\(([^;]*)\)\);', r'emu::ld_shared_v4(chunk, \1);', f)
if n != 1:
    sys.exit('expected one ld.shared.v4 in fat_sm80_fwd.cuh')
f = replace_once(f, 'extern __shared__ __align__(1024) uint8_t smem[];', 'uint8_t *const smem = emu::fwd_smem;')
f = replace_once(f, 'kernel<<<(unsigned)blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);',
                 'emu::shared_base = emu::fwd_smem; emu::last_fwd_smem = Cfg::kSmemBytes; (void)stream;\n'
                 '    emu::run_grid((unsigned)blocks, Cfg::kThreads, Cfg::kSmemBytes, [&] { kernel(args); });')
f = replace_once(f, 'return cudaGetLastError() == cudaSuccess ? FAT_OK : FAT_ERR_CUDA;', 'return FAT_OK;')
open(OUT + 'fat_sm80_fwd.cuh', 'w').write(f)
