#include "runtime/fit.h"

#include <algorithm>

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
  size_t n_full = 0;
  for (bool f : c.full_attention) n_full += f ? 1 : 0;
  const size_t n_gdn = c.full_attention.size() - n_full;
  const size_t kvw = static_cast<size_t>(c.num_key_value_heads) * c.head_dim;
  e.cache = n_full * 2 * static_cast<size_t>(max_context) * kvw * 2;  // bf16 K and V (Qwen38Model::kv_dtype)
  const size_t key_dim = static_cast<size_t>(c.linear_num_key_heads) * c.linear_key_head_dim;
  const size_t value_dim = static_cast<size_t>(c.linear_num_value_heads) * c.linear_value_head_dim;
  const size_t conv_dim = 2 * key_dim + value_dim;
  const size_t state = static_cast<size_t>(c.linear_num_value_heads) * c.linear_value_head_dim * c.linear_key_head_dim +
                       static_cast<size_t>(c.linear_conv_kernel_dim - 1) * conv_dim;
  e.cache += n_gdn * state * 4 * (1 + static_cast<size_t>(std::max(capture_slots, 0)));
  // MTP keeps its own bf16 attention cache of the same width.
  if (c.mtp_num_hidden_layers > 0) e.cache += 2 * static_cast<size_t>(max_context) * kvw * 2;
  // Per row: logits, a dozen hidden-size buffers, the MLP's three intermediate rows, the
  // attention projections (q|gate, k, v), the GDN mixed row and the CUDA attention partials
  // (per head, 64 key splits of max, sum and head_dim accumulators: 1.6 MB a row at 27B).
  const size_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const size_t attn = 2 * static_cast<size_t>(c.num_attention_heads) * c.head_dim + 2 * kvw;
  const size_t attn_part = static_cast<size_t>(c.num_attention_heads) * 64 * (c.head_dim + 2);
  const size_t per_row = V + 12 * H + 3 * I + attn + attn_part + conv_dim + value_dim;
  e.work = static_cast<size_t>(std::max(max_rows, 1)) * per_row * 4;
  // Prefill forwards keep their own rows of the same buffers (logits: the last row only) plus tap
  // rows and the GEMM's bf16 copy of its input; the GEMM copies one tiled matrix back to row-major.
  if (prefill_rows > 0) {
    e.work += static_cast<size_t>(prefill_rows) * (per_row - V + 6 * H + I / 2) * 4 + 2 * I * H * 2;
    // The MTP head runs the prompt pairs in chunks of its own (MtpHead::kPrefillRows).
    if (c.mtp_num_hidden_layers > 0)
      e.work += static_cast<size_t>(std::min(prefill_rows, MtpHead::kPrefillRows)) * (per_row - V) * 4;
  }
  return e;
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
