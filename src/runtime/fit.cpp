#include "runtime/fit.h"

#include <algorithm>
#include <iterator>

#include "core/error.h"
#include "model/mtp.h"

namespace qf {

bool tensor_not_loaded(const std::string& n) { return tensor_is_vision(n); }

MemoryEstimate estimate_memory(const TargetConfig& c, const TensorStore& target, const TensorStore* drafter,
                               int max_context, int max_rows, int capture_slots, int prefill_rows,
                               const Int4Spec* int4) {
  MemoryEstimate e;
  // 1-D tensors (norms, biases, A_log) are converted to f32 on the device; with int4 at load the
  // selected matrices take their int4 size.
  auto bytes = [&](const TensorStore& st, const std::string& n, bool tied) {
    const TensorInfo* t = st.find(n);
    if (t->shape.size() == 1) return static_cast<size_t>(t->numel()) * 4;
    if (int4 && int4_load_quantizes(n, t->dtype, t->shape, *int4, tied))
      return int4_matrix_bytes(t->shape[0], t->shape[1], int4->group);
    return t->nbytes;
  };
  const bool tied = store_head_tied(target);
  for (const std::string& n : target.names())
    if (!tensor_not_loaded(n)) e.target_weights += bytes(target, n, tied);
  if (drafter)
    for (const std::string& n : drafter->names()) e.drafter_weights += bytes(*drafter, n, false);
  e.cache = cache_bytes(c, max_context, capture_slots);
  e.work = static_cast<size_t>(std::max(max_rows, 1)) * work_row_bytes(c) + prefill_work_bytes(c, prefill_rows);
  return e;
}

size_t cache_bytes(const TargetConfig& c, int max_context, int capture_slots) {
  size_t n_full = 0;
  for (bool f : c.full_attention) n_full += f ? 1 : 0;
  const size_t n_gdn = c.full_attention.size() - n_full;
  const size_t kvw = static_cast<size_t>(c.num_key_value_heads) * c.head_dim;
  size_t b = n_full * 2 * static_cast<size_t>(max_context) * kvw * 2;  // bf16 K and V (Qwen38Model::kv_dtype)
  const size_t key_dim = static_cast<size_t>(c.linear_num_key_heads) * c.linear_key_head_dim;
  const size_t value_dim = static_cast<size_t>(c.linear_num_value_heads) * c.linear_value_head_dim;
  const size_t conv_dim = 2 * key_dim + value_dim;
  const size_t state = static_cast<size_t>(c.linear_num_value_heads) * c.linear_value_head_dim * c.linear_key_head_dim +
                       static_cast<size_t>(c.linear_conv_kernel_dim - 1) * conv_dim;
  b += n_gdn * state * 4 * (1 + static_cast<size_t>(std::max(capture_slots, 0)));
  // MTP keeps its own bf16 attention cache of the same width.
  if (c.mtp_num_hidden_layers > 0) b += 2 * static_cast<size_t>(max_context) * kvw * 2;
  return b;
}

// The CUDA decode attention's split partials of one row, in floats: per head, 64 key splits of
// max, sum and head_dim accumulators (1.6 MB a row at 27B).
static size_t attn_partial_floats(const TargetConfig& c) {
  return static_cast<size_t>(c.num_attention_heads) * 64 * (c.head_dim + 2);
}

// Per row: logits, a dozen hidden-size buffers, the MLP's three intermediate rows, the attention
// projections (q|gate, k, v), the GDN mixed row and the CUDA attention partials (per head, 64 key
// splits of max, sum and head_dim accumulators: 1.6 MB a row at 27B).
size_t work_row_bytes(const TargetConfig& c) {
  const size_t kvw = static_cast<size_t>(c.num_key_value_heads) * c.head_dim;
  const size_t key_dim = static_cast<size_t>(c.linear_num_key_heads) * c.linear_key_head_dim;
  const size_t value_dim = static_cast<size_t>(c.linear_num_value_heads) * c.linear_value_head_dim;
  const size_t conv_dim = 2 * key_dim + value_dim;
  const size_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const size_t attn = 2 * static_cast<size_t>(c.num_attention_heads) * c.head_dim + 2 * kvw;
  return (V + 12 * H + 3 * I + attn + attn_partial_floats(c) + conv_dim + value_dim) * 4;
}

// Prefill forwards keep their own rows of the same buffers (logits: the last row only) plus tap
// rows and the GEMM's bf16 copy of its input; the GEMM copies one tiled matrix back to row-major.
size_t prefill_work_bytes(const TargetConfig& c, int prefill_rows) {
  if (prefill_rows <= 0) return 0;
  const size_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const size_t per_row = work_row_bytes(c) / 4;
  // The split-attention partials only where the prompt's attention falls back to the decode
  // kernel: head dims the prefill attention kernels do not cover (every engine path keeps K/V in
  // bf16, which they need; an fp32 cache exists only in tests, which do not size from this).
  const bool prefill_attention = c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256;
  const size_t attn_part = prefill_attention ? attn_partial_floats(c) : 0;
  size_t b = static_cast<size_t>(prefill_rows) * (per_row - V - attn_part + 6 * H + I / 2) * 4 + 2 * I * H * 2;
  // The MTP head runs the prompt pairs in chunks of its own (MtpHead::kPrefillRows).
  if (c.mtp_num_hidden_layers > 0)
    b += static_cast<size_t>(std::min(prefill_rows, MtpHead::kPrefillRows)) * (per_row - V) * 4;
  return b;
}

int auto_prefill_rows(bool gpu, bool int4, size_t free_bytes, size_t total_bytes, size_t other_bytes,
                      const TargetConfig& c) {
  if (!gpu || free_bytes == 0) return kAutoPrefillRowsCpu;
  static constexpr int kBf16[] = {8192, 4096, 2048, 1024};
  static constexpr int kInt4[] = {4096, 2048, 1024};
  const int* first = int4 ? std::begin(kInt4) : std::begin(kBf16);
  const int* last = int4 ? std::end(kInt4) : std::end(kBf16);
  // What the estimate does not see (cuBLASLt workspaces, CUDA graphs, allocator slack) gets the
  // larger of 5% of the device and 2 GiB.
  const size_t margin = std::max(total_bytes / 20, size_t(2) << 30);
  for (const int* r = first; r != last; ++r)
    if (other_bytes + prefill_work_bytes(c, *r) + margin <= free_bytes) return *r;
  return *(last - 1);
}

size_t prefill_copy_budget(size_t free_bytes, size_t total_bytes, size_t pending_bytes) {
  const size_t margin = std::max(total_bytes / 20, size_t(2) << 30);
  const size_t need = pending_bytes + margin;
  return free_bytes > need ? free_bytes - need : 0;
}

void check_fits(const MemoryEstimate& est, size_t free_bytes, size_t total_bytes, const std::string& device,
                const std::string& model_dir) {
  if (free_bytes == 0) return;
  const size_t need = est.total();
  const size_t margin = std::max(need / 33, size_t(256) << 20);
  if (need + margin <= free_bytes) return;
  const double G = 1e9;
  fail(ErrorKind::Backend,
       "model '%s' does not fit on %s: it needs %.2f GB (target weights %.2f, drafter %.2f, KV cache and states "
       "%.2f, work buffers %.2f; plus a %.2f GB margin) but %.2f GB of %.2f GB are free. Use 4-bit weights "
       "(--weights int4), a shorter --max-context, --draft none, or free the GPU",
       model_dir.c_str(), device.c_str(), need / G, est.target_weights / G, est.drafter_weights / G, est.cache / G,
       est.work / G, margin / G, free_bytes / G, total_bytes / G);
}

}  // namespace qf
