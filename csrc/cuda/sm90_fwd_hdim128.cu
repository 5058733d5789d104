/* sm90_fwd_hdim128.cu - the sm90a forward kernel for head dim 128 (one file per
 * head dim keeps parallel builds fast). */
#include "fat_sm90_fwd.cuh"

namespace fat {
template fat_status sm90_fwd<__half, 128>(const fat_params &p, cudaStream_t stream);
template fat_status sm90_fwd<__nv_bfloat16, 128>(const fat_params &p, cudaStream_t stream);
} /* namespace fat */
