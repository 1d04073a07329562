// The DFlash2 block-diffusion drafter (spec/dflash2.md), also DFlash v1 (no conv, no selector).
// It borrows the target's embedding and lm_head and reads the target's tap rows.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "model/qwen38.h"

namespace qf {

class GraphRunner;

struct DFlashLayer {
  NormVec in_norm, post_norm, q_norm, k_norm;  // plain (as stored)
  WeightRef q, k, v, o, gate, up, down;
  WeightRef attn_kp, mlp_kp;                   // kernel_projection [2*Kc*G, H] (v2)
  DeviceBuffer attn_base, mlp_base;            // base_kernel f32 [2, Kc, H] (v2)
  DeviceBuffer kctx, vctx;                     // context + block K/V f32 [cap, n_kv*head_dim]
};

class DFlash2Drafter {
 public:
  // Guards (config only) run first: check_drafter_pair against the target's config.
  static std::unique_ptr<DFlash2Drafter> load(const std::string& dir, Qwen38Model& target);
  // The same from parts: the target's config, its embedding and lm_head on `be`.
  static std::unique_ptr<DFlash2Drafter> load(const std::string& dir, const TargetConfig& target, Backend* be,
                                              const WeightRef& embed, const WeightRef& lm_head, int max_rows,
                                              uint64_t synthetic_seed = 0);
  // Full-size speed runs: the shapes of a drafter config.json with random weights.
  static std::unique_ptr<DFlash2Drafter> load_synthetic(const std::string& config_path, Qwen38Model& target,
                                                        uint64_t seed);
  ~DFlash2Drafter();

  const DrafterConfig& config() const { return cfg_; }
  int block_size() const { return cfg_.block_size; }
  int max_drafts() const { return cfg_.block_size - 1; }
  bool is_v2() const { return cfg_.is_v2; }
  size_t weight_bytes() const { return ws_->imported_bytes(); }
  Backend& backend() const { return *be_; }

  void reset();  // empty context
  // Appends context rows: target tap rows (backend memory, [n, Nt*H], rows contiguous with
  // leading dimension Nt*H) at absolute positions pos..pos+n-1, which must follow the cache.
  void append_context(const float* tap_rows, int n, int pos, const DumpHook* dump = nullptr);
  int context_rows() const { return n_ctx_; }
  int context_end() const { return ctx_pos0_ + n_ctx_; }  // next expected position

  // One drafting pass: block [anchor, mask x k] at positions start..start+k (start must equal
  // context_end()). Writes k drafts to `drafts` (host).
  void draft(int32_t anchor, int start, int k, int32_t* drafts, const DumpHook* dump = nullptr);

  // Last pass's outputs (backend memory), for tests: logits [k, V], final hidden [k, H],
  // candidate ids/values [k, K], selector scores [k, K].
  const float* logits() const { return logits_.f(); }
  const float* final_hidden() const { return hf_.f(); }
  const int32_t* cand_ids() const { return cand_ids_.i(); }
  const float* cand_vals() const { return cand_vals_.f(); }
  const float* scores() const { return scores_.f(); }
  const float* selector_hidden() const { return P_.f(); }  // [k, R] hidden_projection of final rows
  // Host copies of one codebook row (sampled selector walks at T > 0).
  std::vector<float> predecessor_row(int32_t token) const { return codebook_row(epre_, token); }
  std::vector<float> successor_row(int32_t token) const { return codebook_row(esuc_, token); }

 private:
  DFlash2Drafter();
  void compact(int incoming);
  void draft_ops(int k, const DumpHook* dump);  // the draft pass's ops (a graph records them)
  std::vector<float> codebook_row(const WeightRef& w, int32_t row) const;
  // pending: the previous layer's last residual branch, added to h inside this layer's input norm
  // (Backend::add_rmsnorm); with defer the layer leaves its own last add to the caller and
  // returns that branch (nullptr otherwise).
  const float* layer_forward(DFlashLayer& L, float* h, int rows, const DumpHook* dump, int l, const float* pending,
                             bool defer);
  Backend* be_ = nullptr;
  WeightRef embed_, lm_head_;  // borrowed from the target
  DrafterConfig cfg_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<WeightSet> ws_;
  WeightRef fc_, hidden_proj_, epre_, esuc_;
  NormVec hidden_norm_, norm_;
  std::vector<DFlashLayer> layers_;
  int cap_ = 0, keep_ = 0, n_ctx_ = 0, ctx_pos0_ = 0, chunk_ = 0;
  // scratch
  DeviceBuffer ids_, meta_, anchor_, ctx_, h_, u_, u2_, D_, q_, k_, v_, attn_, o_, o2_, g_, up_, hf_, logits_,
      cand_vals_, cand_ids_, P_, scores_, drafts_;
  DeviceBuffer ctx_meta_;  // the context pass's positions (the draft pass keeps meta_)
  std::unique_ptr<GraphRunner> graphs_;  // after the buffers: destroyed first
  uint64_t graph_id_ = 0;
  std::vector<const float*> taps_seen_;  // recorded context passes bake in the tap-row pointer
};

}  // namespace qf
