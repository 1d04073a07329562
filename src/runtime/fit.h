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

// estimate_memory's cache: K/V rows for max_context, GDN states (+ capture_slots copies), MTP cache.
size_t cache_bytes(const TargetConfig& c, int max_context, int capture_slots);
// Device bytes per row of a forward's work buffers (estimate_memory's work = max_rows of these
// plus prefill_work_bytes).
size_t work_row_bytes(const TargetConfig& c);
// The buffers that prefill forwards of `prefill_rows` rows add (0 rows: none). An upper bound
// (~1.3 MB a row at 27B; measured: ~0.6 MB a row, docs/BENCHMARKS.md run 38). The split-attention
// partials (1.6 MB a row at 27B) count only for head dims the prefill attention kernels do not
// cover, where a prefill forward falls back to the decode kernel (before 2026-12-07 they always
// counted, ~2.9 MB a row, which kept 80 GB cards at 4096-row chunks).
size_t prefill_work_bytes(const TargetConfig& c, int prefill_rows);

// --prefill-chunk auto (EngineOptions::kPrefillRowsAuto): rows per prefill forward. On the CPU
// kAutoPrefillRowsCpu. On a GPU the largest of 8192, 4096, 2048, 1024 (4096 at most with int4
// weights, whose prefill GEMM was not measured at 8192) for which other_bytes (everything else the
// load will still allocate: weights not yet uploaded, caches, the prefix cache's budget) plus
// prefill_work_bytes plus a margin (5% of the device, at least 2 GiB) fits in free_bytes; 1024 when
// none does (the load's own fit check then reports what is missing). 8192 rows were 4.7% faster
// than 4096 for an 8k prompt at 27B and 4.6% for a 32k one; 16384 gave nothing more
// (docs/BENCHMARKS.md, runs 39 and 41). With the bound above, a bf16 27B target with its drafter
// gets 8192 rows on a 141 GB H200 and on an 80 GB card.
inline constexpr int kAutoPrefillRowsCpu = 4096;
int auto_prefill_rows(bool gpu, bool int4, size_t free_bytes, size_t total_bytes, size_t other_bytes,
                      const TargetConfig& c);

// Backend::set_prefill_copy_budget: the bytes the prefill GEMM may keep in row-major weight copies,
// given what is free now and what the engine will still allocate (pending_bytes: prefill buffers
// not yet grown, the prefix cache's budget, ...): free - pending - the larger of 5% of the device
// and 2 GiB (as auto_prefill_rows), 0 when that is not positive. On a 141 GB H200 a bf16 27B target
// with 8,192-row prefill buffers gets room for all of its ~51 GB of projection copies; on an 80 GB
// card a part of them (copies are made in the order the prefill first uses the matrices).
size_t prefill_copy_budget(size_t free_bytes, size_t total_bytes, size_t pending_bytes);

// Throws qf::Error(Backend) naming the device, the bytes needed (with the parts) and the bytes
// free when est.total() + a 3% / 256 MiB margin exceeds free_bytes. free_bytes 0 = unknown: no check.
void check_fits(const MemoryEstimate& est, size_t free_bytes, size_t total_bytes, const std::string& device,
                const std::string& model_dir);

}  // namespace qf
