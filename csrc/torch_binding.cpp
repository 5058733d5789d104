// torch_binding.cpp - the only file that sees torch: registers
// torch.ops.flash_attn_t.fwd / bwd and forwards them to the C core.
//
// fwd(q, k, v, cu_seqlens_q?, cu_seqlens_k?, max_seqlen_q, max_seqlen_k,
//     softmax_scale, causal, window_left, window_right, softcap,
//     deterministic) -> (out, lse)
//   dense : q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv)
//           -> out (B, Sq, Hq, Dv) in q's dtype, lse (B, Hq, Sq) fp32
//   varlen: q (total_q, Hq, D), k/v (total_k, Hkv, D/Dv), cu_seqlens (B+1)
//           int32 -> out (total_q, Hq, Dv), lse (Hq, total_q)
// bwd(dout, q, k, v, out, lse, <the same options>) -> (dq, dk, dv)
//
// Tensor-level checks (dtype, device, rank, contiguity of the last dim)
// live here because only here are there tensors; every numeric limit lives
// in fat_validate, whose message is raised as a ValueError.
#include <torch/extension.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#ifdef FLASH_ATTN_T_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "flash_attn_t.h"

namespace {

// Name of the CUDA kernel family that ran last on this thread ("" if none).
thread_local std::string last_cuda_backend_name;

fat_dtype to_fat_dtype(const at::Tensor &t, const char *name) {
    switch (t.scalar_type()) {
    case at::kFloat:
        TORCH_CHECK_TYPE(!t.device().is_cuda(), name,
                         ": the CUDA kernels take float16 or bfloat16, got float32");
        return FAT_FLOAT32;
    case at::kHalf: return FAT_FLOAT16;
    case at::kBFloat16: return FAT_BFLOAT16;
    case at::kDouble:
        TORCH_CHECK_TYPE(t.device().is_cpu(), name,
                         ": float64 is supported on the CPU only");
        return FAT_FLOAT64;
    default:
        TORCH_CHECK_TYPE(false, name,
                         " must be float16, bfloat16 or float32, got ",
                         t.scalar_type());
    }
    return FAT_FLOAT32; // not reached
}

void check_like(const at::Tensor &t, const char *name, const at::Tensor &q,
                int64_t rank) {
    TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), name,
                     " must have the same dtype as q (", q.scalar_type(),
                     "), got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.device() == q.device(), name,
                      " must be on the same device as q (", q.device(),
                      "), got ", t.device());
    TORCH_CHECK_VALUE(t.dim() == rank, name, " must have ", rank,
                      " dimensions, got shape ", t.sizes());
    TORCH_CHECK_VALUE(t.numel() == 0 || t.stride(-1) == 1, name,
                      " must be contiguous in its last dimension, got stride ",
                      t.stride(-1));
}

void check_cu_seqlens(const std::optional<at::Tensor> &cu, const char *name,
                      const at::Tensor &q) {
    if (!cu) return;
    TORCH_CHECK_TYPE(cu->scalar_type() == at::kInt, name,
                     " must be int32, got ", cu->scalar_type());
    TORCH_CHECK_VALUE(cu->device() == q.device(), name,
                      " must be on the same device as q (", q.device(),
                      "), got ", cu->device());
    TORCH_CHECK_VALUE(cu->dim() == 1 && cu->is_contiguous(), name,
                      " must be a contiguous 1-D tensor, got shape ",
                      cu->sizes());
}

// Shapes, strides and options shared by forward and backward.
fat_params make_params(const at::Tensor &q, const at::Tensor &k,
                       const at::Tensor &v,
                       const std::optional<at::Tensor> &cu_seqlens_q,
                       const std::optional<at::Tensor> &cu_seqlens_k,
                       int64_t max_seqlen_q, int64_t max_seqlen_k,
                       double softmax_scale, bool causal, int64_t window_left,
                       int64_t window_right, double softcap,
                       bool deterministic) {
    TORCH_CHECK_VALUE(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
                      "cu_seqlens_q and cu_seqlens_k must be given together");
    const bool varlen = cu_seqlens_q.has_value();
    const int64_t rank = varlen ? 3 : 4;
    to_fat_dtype(q, "q");
    check_like(q, "q", q, rank);
    check_like(k, "k", q, rank);
    check_like(v, "v", q, rank);
    check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q);
    check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", q);

    fat_params p = {};
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.dtype = to_fat_dtype(q, "q");
    p.softmax_scale = softmax_scale;
    p.causal = causal;
    p.window_left = (int)window_left;
    p.window_right = (int)window_right;
    p.softcap = softcap;
    p.deterministic = deterministic;
    const int64_t head_dim_axis = rank - 1;
    p.d = (int)q.size(head_dim_axis);
    p.d_v = (int)v.size(head_dim_axis);
    p.hq = (int)q.size(rank - 2);
    p.hkv = (int)k.size(rank - 2);
    TORCH_CHECK_VALUE(k.size(head_dim_axis) == p.d, "k must have head_dim ",
                      p.d, " as q, got ", k.size(head_dim_axis));
    TORCH_CHECK_VALUE(v.size(rank - 2) == p.hkv, "v must have ", p.hkv,
                      " heads as k, got ", v.size(rank - 2));
    if (varlen) {
        TORCH_CHECK_VALUE(cu_seqlens_q->numel() >= 1 &&
                              cu_seqlens_k->numel() == cu_seqlens_q->numel(),
                          "cu_seqlens_q and cu_seqlens_k must both have "
                          "batch + 1 entries, got ", cu_seqlens_q->numel(),
                          " and ", cu_seqlens_k->numel());
        TORCH_CHECK_VALUE(v.size(0) == k.size(0), "v must have ", k.size(0),
                          " tokens as k, got ", v.size(0));
        p.b = (int)cu_seqlens_q->numel() - 1;
        p.sq = (int)max_seqlen_q;
        p.sk = (int)max_seqlen_k;
        p.total_q = q.size(0);
        p.total_k = k.size(0);
        p.cu_seqlens_q = cu_seqlens_q->data_ptr<int32_t>();
        p.cu_seqlens_k = cu_seqlens_k->data_ptr<int32_t>();
        p.q_row_stride = q.stride(0), p.q_head_stride = q.stride(1);
        p.k_row_stride = k.stride(0), p.k_head_stride = k.stride(1);
        p.v_row_stride = v.stride(0), p.v_head_stride = v.stride(1);
    } else {
        TORCH_CHECK_VALUE(k.size(0) == q.size(0) && v.size(0) == q.size(0),
                          "q, k and v must have the same batch size, got ",
                          q.size(0), ", ", k.size(0), ", ", v.size(0));
        TORCH_CHECK_VALUE(v.size(1) == k.size(1), "v must have seqlen ",
                          k.size(1), " as k, got ", v.size(1));
        p.b = (int)q.size(0);
        p.sq = (int)q.size(1);
        p.sk = (int)k.size(1);
        p.total_q = (int64_t)p.b * p.sq;
        p.total_k = (int64_t)p.b * p.sk;
        p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1),
        p.q_head_stride = q.stride(2);
        p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1),
        p.k_head_stride = k.stride(2);
        p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1),
        p.v_head_stride = v.stride(2);
    }
    return p;
}

void set_out_strides(fat_params &p, const at::Tensor &o, const at::Tensor &lse,
                     bool varlen) {
    p.o = o.data_ptr();
    p.lse = lse.data_ptr<float>();
    if (varlen) {
        p.o_row_stride = o.stride(0), p.o_head_stride = o.stride(1);
        p.lse_head_stride = lse.stride(0);
    } else {
        p.o_batch_stride = o.stride(0), p.o_row_stride = o.stride(1),
        p.o_head_stride = o.stride(2);
        p.lse_batch_stride = lse.stride(0), p.lse_head_stride = lse.stride(1);
    }
}

// Strides of a (B, S, H, D) or (total, H, D) tensor into three fields.
void strides_of(const at::Tensor &t, bool varlen, int64_t *batch,
                int64_t *row, int64_t *head) {
    *batch = varlen ? 0 : t.stride(0);
    *row = t.stride(varlen ? 0 : 1);
    *head = t.stride(varlen ? 1 : 2);
}

void raise_status(fat_status st, const char *detail) {
    const char *what = detail && detail[0] ? detail : fat_status_string(st);
    TORCH_CHECK_VALUE(st != FAT_ERR_INVALID_ARGUMENT, "flash_attn_t: ", what);
    TORCH_CHECK_NOT_IMPLEMENTED(st != FAT_ERR_UNSUPPORTED, "flash_attn_t: ", what);
    TORCH_CHECK(st == FAT_OK, "flash_attn_t: ", what);
}

// FLASH_ATTN_T_BACKEND = auto (default) | sm80 | sm90a
fat_backend requested_backend() {
    const char *env = std::getenv("FLASH_ATTN_T_BACKEND");
    if (env == nullptr || env[0] == '\0' || std::strcmp(env, "auto") == 0)
        return FAT_BACKEND_AUTO;
    if (std::strcmp(env, "sm80") == 0) return FAT_BACKEND_SM80;
    if (std::strcmp(env, "sm90a") == 0) return FAT_BACKEND_SM90A;
    TORCH_CHECK_VALUE(false, "FLASH_ATTN_T_BACKEND must be auto, sm80 or sm90a, got '",
                      env, "'");
    return FAT_BACKEND_AUTO;
}

#ifdef FLASH_ATTN_T_WITH_CUDA
void run_cuda(fat_params &p, const at::Tensor &q, bool backward) {
    const c10::cuda::CUDAGuard guard(q.device());
    p.backend = requested_backend();
    at::Tensor workspace;
    if (backward) {
        p.workspace_bytes = fat_bwd_cuda_workspace_bytes(&p);
        workspace = at::empty({(int64_t)p.workspace_bytes}, q.options().dtype(at::kByte));
        p.workspace = workspace.data_ptr();
    }
    fat_cuda_info info = {};
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    fat_status st = backward ? fat_bwd_cuda(&p, stream, &info) : fat_fwd_cuda(&p, stream, &info);
    last_cuda_backend_name = info.ran == FAT_BACKEND_SM90A ? "sm90a"
                             : info.ran == FAT_BACKEND_SM80 ? "sm80" : "";
    raise_status(st, info.message);
}
#endif

void run_core(fat_params &p, const at::Tensor &q, bool backward) {
    char msg[256] = "";
    const bool on_cpu = q.device().is_cpu();
    fat_status st = fat_validate(&p, backward, on_cpu, msg, sizeof msg);
    TORCH_CHECK_VALUE(st == FAT_OK, "flash_attn_t: ", msg);
    if (on_cpu) {
        raise_status(backward ? fat_bwd_cpu(&p) : fat_fwd_cpu(&p), nullptr);
        return;
    }
#ifdef FLASH_ATTN_T_WITH_CUDA
    if (q.device().is_cuda()) {
        run_cuda(p, q, backward);
        return;
    }
#endif
    TORCH_CHECK_NOT_IMPLEMENTED(false, "flash_attn_t: this build has no kernel for device ",
                                q.device());
}

// The CUDA kernels read 16-byte chunks: a head dim that is not a multiple of
// 8 is zero-padded (exact: padded columns add 0 to every dot product and are
// sliced off), and a tensor whose strides or start are not 16-byte aligned
// is copied.  Identity on the CPU.
at::Tensor kernel_ready(const at::Tensor &t) {
    if (!t.device().is_cuda() || t.numel() == 0) return t;
    at::Tensor r = t;
    const int64_t d = t.size(-1);
    if (d % 8 != 0) {
        std::vector<int64_t> shape = t.sizes().vec();
        shape.back() = (d + 7) / 8 * 8;
        r = at::zeros(shape, t.options());
        r.narrow(-1, 0, d).copy_(t);
    }
    bool aligned = (reinterpret_cast<uintptr_t>(r.data_ptr()) & 15u) == 0;
    for (int64_t i = 0; i + 1 < r.dim(); ++i)
        aligned = aligned && (r.size(i) == 1 || r.stride(i) % 8 == 0);
    return aligned ? r : r.contiguous();
}

at::Tensor unpad_last(const at::Tensor &t, int64_t d) {
    return t.size(-1) == d ? t : t.narrow(-1, 0, d);
}

std::tuple<at::Tensor, at::Tensor>
attention_fwd(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
              const std::optional<at::Tensor> &cu_seqlens_q,
              const std::optional<at::Tensor> &cu_seqlens_k,
              int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
              bool causal, int64_t window_left, int64_t window_right,
              double softcap, bool deterministic) {
    fat_params p = make_params(q, k, v, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k, softmax_scale,
                               causal, window_left, window_right, softcap,
                               deterministic);
    const int64_t d_v = p.d_v;
    const at::Tensor qr = kernel_ready(q), kr = kernel_ready(k), vr = kernel_ready(v);
    if (!qr.is_same(q) || !kr.is_same(k) || !vr.is_same(v))
        p = make_params(qr, kr, vr, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, softmax_scale, causal, window_left,
                        window_right, softcap, deterministic);
    const bool varlen = cu_seqlens_q.has_value();
    std::vector<int64_t> out_shape = qr.sizes().vec();
    out_shape.back() = p.d_v;
    at::Tensor out = at::empty(out_shape, q.options());
    at::Tensor lse = varlen
        ? at::empty({p.hq, p.total_q}, q.options().dtype(at::kFloat))
        : at::empty({p.b, p.hq, p.sq}, q.options().dtype(at::kFloat));
    set_out_strides(p, out, lse, varlen);
    run_core(p, qr, false);
    return {unpad_last(out, d_v), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
attention_bwd(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &k,
              const at::Tensor &v, const at::Tensor &out, const at::Tensor &lse,
              const std::optional<at::Tensor> &cu_seqlens_q,
              const std::optional<at::Tensor> &cu_seqlens_k,
              int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
              bool causal, int64_t window_left, int64_t window_right,
              double softcap, bool deterministic) {
    fat_params p = make_params(q, k, v, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k, softmax_scale,
                               causal, window_left, window_right, softcap,
                               deterministic);
    const bool varlen = cu_seqlens_q.has_value();
    const int64_t rank = varlen ? 3 : 4;
    check_like(out, "out", q, rank);
    check_like(dout, "dout", q, rank);
    TORCH_CHECK_VALUE(out.sizes() == dout.sizes(), "dout must have out's shape ",
                      out.sizes(), ", got ", dout.sizes());
    std::vector<int64_t> want_out = q.sizes().vec();
    want_out.back() = p.d_v;
    TORCH_CHECK_VALUE(out.sizes().vec() == want_out, "out must have shape ",
                      at::IntArrayRef(want_out), ", got ", out.sizes());
    TORCH_CHECK_TYPE(lse.scalar_type() == at::kFloat, "lse must be float32");
    std::vector<int64_t> want_lse = varlen
        ? std::vector<int64_t>{p.hq, p.total_q}
        : std::vector<int64_t>{p.b, p.hq, p.sq};
    TORCH_CHECK_VALUE(lse.sizes().vec() == want_lse && lse.stride(-1) == 1 &&
                          lse.device() == q.device(),
                      "lse must be a row-contiguous tensor of shape ",
                      at::IntArrayRef(want_lse), " on q's device, got ",
                      lse.sizes());
    const int64_t d = p.d, d_v = p.d_v;
    const at::Tensor qr = kernel_ready(q), kr = kernel_ready(k), vr = kernel_ready(v);
    const at::Tensor outr = kernel_ready(out), doutr = kernel_ready(dout);
    p = make_params(qr, kr, vr, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, causal, window_left,
                    window_right, softcap, deterministic);
    set_out_strides(p, outr, lse, varlen);
    p.dout = doutr.data_ptr();
    strides_of(doutr, varlen, &p.do_batch_stride, &p.do_row_stride,
               &p.do_head_stride);
    at::Tensor dq = at::empty(qr.sizes(), q.options());
    at::Tensor dk = at::empty(kr.sizes(), k.options());
    at::Tensor dv = at::empty(vr.sizes(), v.options());
    p.dq = dq.data_ptr(), p.dk = dk.data_ptr(), p.dv = dv.data_ptr();
    strides_of(dq, varlen, &p.dq_batch_stride, &p.dq_row_stride,
               &p.dq_head_stride);
    strides_of(dk, varlen, &p.dk_batch_stride, &p.dk_row_stride,
               &p.dk_head_stride);
    strides_of(dv, varlen, &p.dv_batch_stride, &p.dv_row_stride,
               &p.dv_head_stride);
    run_core(p, qr, true);
    return {unpad_last(dq, d), unpad_last(dk, d), unpad_last(dv, d_v)};
}

std::vector<std::string> built_backends() {
    std::vector<std::string> names = {"cpu"};
#ifdef FLASH_ATTN_T_WITH_SM80
    names.push_back("sm80");
#endif
#ifdef FLASH_ATTN_T_WITH_SM90A
    names.push_back("sm90a");
#endif
    return names;
}

std::string last_cuda_backend() { return last_cuda_backend_name; }

} // namespace

TORCH_LIBRARY(flash_attn_t, m) {
    m.def("fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, "
          "Tensor? cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
          "float softmax_scale, bool causal, int window_left, "
          "int window_right, float softcap, bool deterministic=False) "
          "-> (Tensor out, Tensor lse)");
    m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
          "Tensor lse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
          "SymInt max_seqlen_q, SymInt max_seqlen_k, float softmax_scale, "
          "bool causal, int window_left, int window_right, float softcap, "
          "bool deterministic=False) -> (Tensor dq, Tensor dk, Tensor dv)");
}

TORCH_LIBRARY_IMPL(flash_attn_t, CPU, m) {
    m.impl("fwd", &attention_fwd);
    m.impl("bwd", &attention_bwd);
}

// Also on CUDA, so mixed-device arguments get the ValueError naming the
// argument and a build without CUDA kernels says so plainly (run_core).
TORCH_LIBRARY_IMPL(flash_attn_t, CUDA, m) {
    m.impl("fwd", &attention_fwd);
    m.impl("bwd", &attention_bwd);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("built_backends", &built_backends,
          "Kernel paths compiled into this build");
    m.def("last_cuda_backend", &last_cuda_backend,
          "CUDA kernel family of this thread's last CUDA call ('' if none)");
}
