// The target model as the runtime sees it: what the round loop (Generator), the draft sources,
// the MTP head and the DFlash2 drafter need from it. Qwen38Model is the implementation; the
// runtime depends only on this header, so a test may stand in a target of its own.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/config.h"
#include "model/blocks.h"
#include "model/graph_runner.h"
#include "model/weights.h"

namespace qf {

// Per-sequence state of the target: KV caches at absolute positions, GDN state blobs, and the
// verify capture arena (slot i = every GDN layer's blob after verify row i).
struct TargetState {
  int max_pos = 0;
  int capture_slots = 0;
  DType kv_dtype = DType::BF16;              // of kcache / vcache (the target's kv_dtype() at new_state)
  std::vector<DeviceBuffer> kcache, vcache;  // per full-attention layer: kv_dtype [max_pos, n_kv*head_dim]
  std::vector<DeviceBuffer> gdn;             // per GDN layer: f32 [GdnDims::state_floats()]
  std::vector<DeviceBuffer> capture;         // per GDN layer: f32 [capture_slots][state_floats]
  int pos = 0;                               // committed tokens (next write position)
  // Names this state's buffers in recorded graphs; its destruction drops those recordings.
  // Declared last: destroyed first, while the buffers above still exist.
  GraphOwner graphs;
};

// A region of backend memory that one part of a sequence's state occupies (prefix snapshots,
// runtime/prefix_cache.h).
struct StateRegion {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// The regions that hold a sequence's state for positions [0, n): K/V rows [0, n) of every
// attention layer, then every GDN blob (recurrent state and conv tail).
inline std::vector<StateRegion> state_regions(const TargetState& st, int n) {
  std::vector<StateRegion> r;
  for (size_t i = 0; i < st.kcache.size(); i++) {
    const size_t row = st.kcache[i].bytes() / static_cast<size_t>(st.max_pos);
    r.push_back({st.kcache[i].get(), static_cast<size_t>(n) * row});
    r.push_back({st.vcache[i].get(), static_cast<size_t>(n) * row});
  }
  for (const DeviceBuffer& g : st.gdn) r.push_back({g.get(), g.bytes()});
  return r;
}

struct ForwardOpts {
  bool lm_head = true;          // compute logits + argmax (rows selected by `logits_last_only`)
  bool logits_last_only = false;
  bool capture = false;         // GDN per-row capture into the arena (verify)
  bool taps = false;            // copy tap-layer outputs into `taps`
  bool final_hidden = true;     // keep post-final-norm rows in `final_hidden`
  // Prompt rows through the prefill ops (Backend::gemm, gdn_chunked, attention_prefill; docs/DESIGN.md
  // "Prefill path"): up to prefill_rows() rows in buffers of their own, no capture, logits and
  // argmax of the last row only, never a recorded graph.
  bool prefill = false;
};

class TargetModel {
 public:
  virtual ~TargetModel() = default;

  // ---- shape and placement
  virtual const TargetConfig& config() const = 0;
  virtual Backend& backend() const = 0;
  virtual int max_rows() const = 0;                 // rows per forward
  // Rows per prefill forward (ForwardOpts::prefill), a multiple of Backend::kPrefillChunk; 0: the
  // target has no prefill path and the round loop runs the prompt through the decode forward.
  virtual int prefill_rows() const { return 0; }
  virtual const std::string& origin() const = 0;    // the checkpoint folder (for messages)

  // ---- sequences
  virtual std::unique_ptr<TargetState> new_state(int max_pos, int capture_slots) const = 0;
  // Element type of the target's KV caches (TargetState, the MTP head's): BF16 unless a target
  // says otherwise (Qwen38Model::set_kv_dtype).
  virtual DType kv_dtype() const { return DType::BF16; }
  virtual void reset(TargetState& st) const = 0;
  // Runs M <= max_rows() tokens (prefill_rows() with opts.prefill) at positions st.pos ..
  // st.pos+M-1 and advances st.pos by M. Results stay in backend memory until the next call:
  // argmax_ids() [M] (or [1] when logits_last_only or prefill), logits() [M or 1, V],
  // final_hidden() [M, H] (prefill without final_hidden: only row M-1), tap_rows() [M, taps*H].
  virtual void forward(TargetState& st, const int32_t* host_tokens, int M, const ForwardOpts& opts,
                       const DumpHook* dump = nullptr) = 0;
  // Restores the GDN state captured after verify row `slot` and sets st.pos = pos.
  virtual void rollback(TargetState& st, int slot, int pos) const = 0;

  // ---- the last forward's outputs (backend memory)
  virtual const int32_t* argmax_ids() const = 0;
  virtual const float* logits() const = 0;
  virtual const float* final_hidden() const = 0;
  virtual const float* tap_rows() const = 0;

  // ---- taps: layers whose outputs are copied into tap_rows() (concatenated in this order)
  virtual void set_taps(const std::vector<int>& layer_ids) = 0;
  virtual const std::vector<int>& taps() const = 0;

  // ---- weights the draft models share: the embedding and the lm_head
  virtual const WeightRef& embed_weight() const = 0;
  virtual const WeightRef& lm_head_weight() const = 0;

  // ---- what the MTP head loads with: its tensors live in the target's checkpoint and its
  // layer has the target's shapes and norm form
  virtual bool has_mtp() const = 0;
  virtual WeightSet& weights() = 0;
  virtual NormForm norm_form() const = 0;
  virtual const AttnDims& attn_dims() const = 0;
  virtual const GdnDims& gdn_dims() const = 0;
};

}  // namespace qf
