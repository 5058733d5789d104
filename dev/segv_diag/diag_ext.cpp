// Throw-path probe: each op fails the way flash_attn_t's check_like does,
// varying only the exception type and whether the message formats sizes().
#include <torch/extension.h>

namespace {
at::Tensor value_sizes(const at::Tensor &q) {
    TORCH_CHECK_VALUE(q.dim() == 4, "q must have 4 dimensions, got shape ", q.sizes());
    return q.clone();
}
at::Tensor value_plain(const at::Tensor &q) {
    TORCH_CHECK_VALUE(q.dim() == 4, "q must have 4 dimensions, got ", q.dim());
    return q.clone();
}
at::Tensor type_sizes(const at::Tensor &q) {
    TORCH_CHECK_TYPE(q.dim() == 4, "q must have 4 dimensions, got shape ", q.sizes());
    return q.clone();
}
at::Tensor runtime_sizes(const at::Tensor &q) {
    TORCH_CHECK(q.dim() == 4, "q must have 4 dimensions, got shape ", q.sizes());
    return q.clone();
}
at::Tensor notimpl_plain(const at::Tensor &q) {
    TORCH_CHECK_NOT_IMPLEMENTED(q.dim() == 4, "q must have 4 dimensions, got ", q.dim());
    return q.clone();
}
} // namespace

TORCH_LIBRARY(segv_diag, m) {
    for (const char *n : {"value_sizes", "value_plain", "type_sizes", "runtime_sizes",
                          "notimpl_plain"})
        m.def((std::string(n) + "(Tensor q) -> Tensor").c_str());
}
TORCH_LIBRARY_IMPL(segv_diag, CPU, m) {
    m.impl("value_sizes", &value_sizes);
    m.impl("value_plain", &value_plain);
    m.impl("type_sizes", &type_sizes);
    m.impl("runtime_sizes", &runtime_sizes);
    m.impl("notimpl_plain", &notimpl_plain);
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
