// The checkpoint's one-layer MTP head (docs/spec/qwen38.md section 4): input pair j = (token t_{j+1},
// target post-final-norm hidden H_j) at pair position j; output Hm (next pair's hidden) and
// draft logits through the target's shared lm_head.
#pragma once
#include <memory>
#include <vector>

#include "model/target_model.h"

namespace qf {

class GraphRunner;

class MtpHead {
 public:
  // Loads mtp.* from the target's checkpoint. Throws Tensor errors when a tensor is missing.
  static std::unique_ptr<MtpHead> load(TargetModel& target, int max_pos);
  ~MtpHead();

  // Runs M pairs at positions pos..pos+M-1: tokens (host) and hidden rows (backend memory,
  // [M, H]). Writes the head's KV at those positions; attention covers positions <= each row.
  // direct: the ops without a recorded graph (hidden rows at one-off addresses).
  void forward(const int32_t* host_tokens, const float* hidden, int M, int pos,
               const DumpHook* dump = nullptr, bool direct = false);
  // Prompt pairs, any count: the layer through the prefill ops (LayerIO::prefill) in chunks of
  // kPrefillRows pairs, never a graph; the head runs on the last pair only: afterwards
  // argmax_ids() [1] and logits() [1, V] are that pair's, and prefill_hidden() its Hm [H].
  void forward_prefill(const int32_t* host_tokens, const float* hidden, int M, int pos);
  static constexpr int kPrefillRows = 1024;  // a multiple of Backend::kPrefillChunk
  const int32_t* argmax_ids() const { return argmax_.i(); }  // [M]
  const float* logits() const { return logits_.f(); }        // [M, V]
  const float* out_hidden() const { return hm_.f(); }        // Hm [M, H]
  const float* prefill_hidden() const { return prefill_hm_; }
  int max_rows() const { return max_rows_; }
  int max_pos() const { return max_pos_; }
  // Its K/V cache rows of pair positions [0, n) (prefix snapshots, runtime/prefix_cache.h).
  void* kv_rows(bool v) const { return v ? vcache_.get() : kcache_.get(); }
  size_t kv_row_bytes() const { return kcache_.bytes() / static_cast<size_t>(max_pos_); }

 private:
  MtpHead();
  // pre: the prefill buffers and ops; the head (norm, lm_head, argmax) over rows [head0, M).
  void forward_ops(bool pre, const float* hidden, int M, int head0, const DumpHook* dump);
  TargetModel* t_ = nullptr;
  int max_rows_ = 0, max_pos_ = 0;
  WeightRef fc_;
  NormVec pre_e_, pre_h_, norm_;
  LayerWeights layer_;
  BlockScratch scratch_;
  DType kv_dtype_ = DType::BF16;  // the target's kv_dtype() at load
  DeviceBuffer kcache_, vcache_, ids_, meta_, e_, cat_, h_, hm_, logits_, argmax_;
  struct PrefillBuffers {  // [kPrefillRows, ...], allocated at the first forward_prefill
    BlockScratch scratch;
    DeviceBuffer ids, e, cat, h, hm;
  };
  PrefillBuffers pre_;
  const float* prefill_hm_ = nullptr;  // the last forward_prefill's last Hm row
  std::unique_ptr<GraphRunner> graphs_;  // after the buffers: destroyed first
  std::vector<const float*> hidden_seen_;  // recorded graphs bake in the `hidden` pointer
};

}  // namespace qf
