// The DFlash2 block-diffusion drafter (docs/spec/dflash2.md), also DFlash v1 (no conv, no selector).
// It borrows the target's embedding and lm_head and reads the target's tap rows.
//
// v1 and v2 share everything except three steps, each one function here: the dynamic
// convolution around both sublayers (conv_prepare / conv_finish pass the rows through in v1),
// and how drafts are picked from the logits (the candidate selector walk in v2, a per-row
// argmax in v1). The loader reads the v2-only tensors in load_v2_weights.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "model/target_model.h"

namespace qf {

class GraphRunner;

// The grouped dynamic convolution around one sublayer (docs/spec/dflash2.md 2.5), v2 only.
// Kc = conv_kernel_size taps, G = H / conv_group_size channel groups.
struct DynConvWeights {
  WeightRef kernel_proj;  // kernel_projection [2*Kc*G, H]: per-row coefficients from the sublayer input
  DeviceBuffer base;      // base_kernel f32 [2, Kc, H]: side 0 feeds prepare, side 1 finish
};

struct DFlashLayer {
  NormVec in_norm, post_norm, q_norm, k_norm;  // plain (as stored)
  WeightRef q, k, v, o, gate, up, down;
  DynConvWeights attn_conv, mlp_conv;          // v2
  DeviceBuffer kctx, vctx;                     // context + block K/V [cap, n_kv*head_dim] of the drafter's kv_dtype()
};

class DFlash2Drafter {
 public:
  // Guards (config only) run first: check_drafter_pair against the target's config. The weights
  // load as the target's did (its WeightOptions: int4 at load or as stored).
  static std::unique_ptr<DFlash2Drafter> load(const std::string& dir, TargetModel& target);
  // The same from parts: the target's config, its embedding and lm_head on `be`.
  // kv_dtype: the element type of the context K/V cache (the TargetModel forms take the target's
  // kv_dtype(): bf16 unless set otherwise; the grouped attention kernel on CUDA needs bf16).
  static std::unique_ptr<DFlash2Drafter> load(const std::string& dir, const TargetConfig& target, Backend* be,
                                              const WeightRef& embed, const WeightRef& lm_head, int max_rows,
                                              uint64_t synthetic_seed = 0, const WeightOptions& w = {},
                                              DType kv_dtype = DType::BF16);
  // Full-size speed runs: the shapes of a drafter config.json with random weights (int4 when
  // the target's are).
  static std::unique_ptr<DFlash2Drafter> load_synthetic(const std::string& config_path, TargetModel& target,
                                                        uint64_t seed);
  ~DFlash2Drafter();

  const DrafterConfig& config() const { return cfg_; }
  int block_size() const { return cfg_.block_size; }
  int max_drafts() const { return cfg_.block_size - 1; }
  bool is_v2() const { return cfg_.is_v2; }
  DType kv_dtype() const { return kv_dtype_; }
  size_t weight_bytes() const { return ws_->imported_bytes(); }
  Backend& backend() const { return *be_; }

  void reset();  // empty context
  // Appends context rows: target tap rows (backend memory, [n, Nt*H], rows contiguous with
  // leading dimension Nt*H) at absolute positions pos..pos+n-1, which must follow the cache.
  // `direct`: run the ops without recording graphs (rows at one-off addresses, e.g. a prompt).
  void append_context(const float* tap_rows, int n, int pos, const DumpHook* dump = nullptr, bool direct = false);
  int context_rows() const { return n_ctx_; }
  int context_end() const { return ctx_pos0_ + n_ctx_; }  // next expected position
  // Prefix snapshots (runtime/prefix_cache.h): the K and V cache bytes of context rows [p0, p1)
  // (each inside the context), per layer; set_context(p0, p1) makes the context exactly those
  // rows (their bytes restored by the caller into context_regions(p0, p1) afterwards);
  // trim_context(p) drops the rows before p.
  std::vector<StateRegion> context_regions(int p0, int p1) const;
  void set_context(int p0, int p1);
  void trim_context(int p);

  // One drafting pass: block [anchor, mask x k] at positions start..start+k (start must equal
  // context_end()). Writes k drafts to `drafts` (host).
  void draft(int32_t anchor, int start, int k, int32_t* drafts, const DumpHook* dump = nullptr);

  // Last pass's outputs (backend memory), for tests and sampling: logits [k, V], final hidden
  // [k, H], candidate ids/values [k, K], selector scores [k, K].
  const float* logits() const { return s_.logits.f(); }
  const float* final_hidden() const { return s_.final_hidden.f(); }
  const int32_t* cand_ids() const { return s_.cand_ids.i(); }
  const float* cand_vals() const { return s_.cand_vals.f(); }
  const float* scores() const { return s_.scores.f(); }
  const float* selector_hidden() const { return s_.selector_hidden.f(); }  // [k, R] hidden_projection of final rows
  // Host copies of one codebook row (sampled selector walks at T > 0).
  std::vector<float> predecessor_row(int32_t token) const { return codebook_row(epre_, token); }
  std::vector<float> successor_row(int32_t token) const { return codebook_row(esuc_, token); }

 private:
  // Per-pass buffers. B = block size, C = rows per context pass (the target's max_rows),
  // Kc/G as in DynConvWeights, K = selector_top_k, R = selector_rank (1 when absent).
  struct Scratch {
    DeviceBuffer block_ids;        // i32 [B]: the anchor, then mask ids
    DeviceBuffer block_meta;       // StepMeta of the draft pass
    DeviceBuffer ctx_meta;         // StepMeta of the context pass
    DeviceBuffer anchor_id;        // i32 [1]: where the selector walk starts
    DeviceBuffer ctx_hidden;       // f32 [max(C,B), H]: hidden_norm(fc(tap rows)) of the appended rows
    DeviceBuffer hidden;           // f32 [B, H]: the block's residual stream
    DeviceBuffer normed;           // f32 [B, H]: a sublayer's input (input / post-attention norm)
    DeviceBuffer conv_in;          // f32 [B, H]: `normed` through the conv's prepare side (v2)
    DeviceBuffer conv_coef;        // f32 [B, 2*Kc*G]: per-row conv coefficients of the sublayer (v2)
    DeviceBuffer q;                // f32 [B, n_heads*head_dim]
    DeviceBuffer k, v;             // f32 [max(C,B), n_kv*head_dim]: block rows, or context rows
    DeviceBuffer attn_out;         // f32 [B, n_heads*head_dim]
    DeviceBuffer branch;           // f32 [B, H]: a sublayer's output (o_proj, down_proj)
    DeviceBuffer conv_out;         // f32 [B, H]: `branch` through the conv's finish side (v2)
    DeviceBuffer mlp_gate, mlp_up;  // f32 [B, I]; swiglu writes into mlp_gate
    DeviceBuffer final_hidden;     // f32 [B, H]: final norm of block rows 1..k (the draft rows)
    DeviceBuffer logits;           // f32 [B, V]: rows 0..k-1 = drafts 1..k
    DeviceBuffer cand_vals;        // f32 [B, K]: top-K logits per draft row (v2)
    DeviceBuffer cand_ids;         // i32 [B, K]: their token ids (v2)
    DeviceBuffer selector_hidden;  // f32 [B, R]: hidden_projection of final_hidden (v2)
    DeviceBuffer scores;           // f32 [B, K]: selector scores of the chosen path (v2)
    DeviceBuffer drafts;           // i32 [B]: the pass's drafts
  };

  DFlash2Drafter();
  void load_v2_weights(int H, int V);
  void allocate_scratch(int max_rows);
  void compact(int incoming);
  void context_ops(const float* taps, int m, const DumpHook* dump);  // a context pass's ops
  void draft_ops(int k, const DumpHook* dump);  // the draft pass's ops (a graph records them)
  // pending: the previous layer's last residual branch, added to h inside this layer's input norm
  // (Backend::add_rmsnorm); with defer the layer leaves its own last add to the caller and
  // returns that branch (nullptr otherwise).
  const float* layer_forward(DFlashLayer& L, float* h, int rows, const DumpHook* dump, int l, const float* pending,
                             bool defer);
  // v1/v2: the conv around a sublayer (v1: the rows pass through), and the draft pick.
  const float* conv_prepare(const DynConvWeights& c, const float* x, int rows);
  const float* conv_finish(const DynConvWeights& c, const float* y, int rows);
  void pick_drafts(int k);
  std::vector<float> codebook_row(const WeightRef& w, int32_t row) const;

  Backend* be_ = nullptr;
  WeightRef embed_, lm_head_;  // borrowed from the target
  DrafterConfig cfg_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<WeightSet> ws_;
  WeightRef fc_;                    // [H, Nt*H]: concatenated tap rows -> context hidden
  WeightRef hidden_proj_;           // [R, H] selector hidden projection (v2)
  WeightRef epre_, esuc_;           // [V, R] selector predecessor / successor codebooks (v2)
  NormVec hidden_norm_, norm_;
  std::vector<DFlashLayer> layers_;
  // Context cache: rows ctx_pos0_ .. ctx_pos0_+n_ctx_-1 of `cap_`; compaction keeps the last keep_.
  int cap_ = 0, keep_ = 0, n_ctx_ = 0, ctx_pos0_ = 0;
  DType kv_dtype_ = DType::BF16;  // of kctx / vctx
  int chunk_ = 0;  // rows per context pass
  Scratch s_;
  std::unique_ptr<GraphRunner> graphs_;  // after the buffers: destroyed first
  uint64_t graph_id_ = 0;
  std::vector<const float*> taps_seen_;  // recorded context passes bake in the tap-row pointer
};

}  // namespace qf
