// The checkpoint's one-layer MTP head (spec/qwen38.md section 4): input pair j = (token t_{j+1},
// target post-final-norm hidden H_j) at pair position j; output Hm (next pair's hidden) and
// draft logits through the target's shared lm_head.
#pragma once
#include <vector>
#include <memory>

#include "model/qwen38.h"

namespace qf {

class GraphRunner;

class MtpHead {
 public:
  // Loads mtp.* from the target's checkpoint. Throws Tensor errors when a tensor is missing.
  static std::unique_ptr<MtpHead> load(Qwen38Model& target, int max_pos);
  ~MtpHead();

  // Runs M pairs at positions pos..pos+M-1: tokens (host) and hidden rows (backend memory,
  // [M, H]). Writes the head's KV at those positions; attention covers positions <= each row.
  void forward(const int32_t* host_tokens, const float* hidden, int M, int pos,
               const DumpHook* dump = nullptr);
  const int32_t* argmax_ids() const { return argmax_.i(); }  // [M]
  const float* logits() const { return logits_.f(); }        // [M, V]
  const float* out_hidden() const { return hm_.f(); }        // Hm [M, H]
  int max_rows() const { return max_rows_; }
  int max_pos() const { return max_pos_; }

 private:
  MtpHead();
  void forward_ops(const float* hidden, int M, const DumpHook* dump);
  Qwen38Model* t_ = nullptr;
  int max_rows_ = 0, max_pos_ = 0;
  WeightRef fc_;
  NormVec pre_e_, pre_h_, norm_;
  LayerWeights layer_;
  BlockScratch scratch_;
  DeviceBuffer kcache_, vcache_, ids_, meta_, e_, cat_, h_, hm_, logits_, argmax_;
  std::unique_ptr<GraphRunner> graphs_;  // after the buffers: destroyed first
  std::vector<const float*> hidden_seen_;  // recorded graphs bake in the `hidden` pointer
};

}  // namespace qf
