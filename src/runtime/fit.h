// "Does the model fit?" before any weight is uploaded: bytes needed (from the safetensors
// headers and the config) against the device's free memory, with a clear error when it does not.
#pragma once
#include <cstddef>
#include <string>

#include "io/config.h"
#include "io/int4_cache.h"
#include "io/safetensors.h"

namespace qf {

struct MemoryEstimate {
  size_t target_weights = 0;   // language-model tensors of the target (vision tower excluded), MTP included
  size_t drafter_weights = 0;  // DFlash2 drafter tensors (0 without one)
  size_t cache = 0;            // bf16 KV cache rows for max_context + f32 GDN states and capture slots
  size_t work = 0;             // activations, logits and kernel scratch for max_rows (+ prefill) rows
  size_t total() const { return target_weights + drafter_weights + cache + work; }
};

// True for tensors the target loader never uploads (vision tower, multimodal projector).
bool tensor_not_loaded(const std::string& name);

// `drafter` may be null. capture_slots: the verify width (k + 1) the round loop keeps states for.
// prefill_rows: rows per prefill forward (0: no prefill buffers counted).
// `int4` (--weights int4): the matrices the int4 rule selects count at their int4 size.
MemoryEstimate estimate_memory(const TargetConfig& c, const TensorStore& target, const TensorStore* drafter,
                               int max_context, int max_rows, int capture_slots, int prefill_rows = 0,
                               const Int4Spec* int4 = nullptr);

// Throws qf::Error(Backend) naming the device, the bytes needed (with the parts) and the bytes
// free when est.total() + a 3% / 256 MiB margin exceeds free_bytes. free_bytes 0 = unknown: no check.
void check_fits(const MemoryEstimate& est, size_t free_bytes, size_t total_bytes, const std::string& device,
                const std::string& model_dir);

}  // namespace qf
