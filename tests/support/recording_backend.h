// A backend with "graphs" on the CPU, for tests of the graph path without a GPU: it forwards
// every op to an inner backend, and between capture_begin and capture_end it records the ops
// (pointers and scalars baked in, as a CUDA graph does) instead of running them; graph_launch
// runs the recording. It counts graphs made and destroyed, and enforces the recording contract:
// no allocation, upload, download or sync while capturing.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace qf::test {

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> inner) : in_(std::move(inner)) {}
  ~RecordingBackend() override = default;

  int graphs_made = 0, graphs_destroyed = 0, launches = 0;
  int live_graphs() const { return graphs_made - graphs_destroyed; }

  std::string name() const override { return "recording(" + in_->name() + ")"; }
  bool is_gpu() const override { return false; }

  // ---- memory: never recorded
  void* alloc(size_t bytes) override {
    no_capture("alloc");
    return in_->alloc(bytes);
  }
  void release(void* p) override { in_->release(p); }
  void upload(void* dst, const void* src, size_t bytes) override {
    no_capture("upload");
    in_->upload(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    no_capture("download");
    in_->download(dst, src, bytes);
  }
  void sync() override {
    no_capture("sync");
    in_->sync();
  }
  const void* import_weight(const void* host, size_t bytes) override { return in_->import_weight(host, bytes); }
  void release_weight(const void* p) override { in_->release_weight(p); }
  void fill_random(void* dst, size_t n, DType dt, uint64_t seed, float scale) override {
    no_capture("fill_random");
    in_->fill_random(dst, n, dt, seed, scale);
  }
  const void* relayout_matrix(const WeightRef& w, uint8_t* layout) override { return in_->relayout_matrix(w, layout); }
  void quantize_int4(const void* bf16, int64_t rows, int64_t cols, int group, void* q, void* scales,
                     void* biases) override {
    no_capture("quantize_int4");
    in_->quantize_int4(bf16, rows, cols, group, q, scales, biases);
  }
  size_t memory_used() const override { return in_->memory_used(); }
  size_t memory_free(size_t* total) const override { return in_->memory_free(total); }
  size_t memory_peak() const override { return in_->memory_peak(); }
  void memory_peak_reset() override { in_->memory_peak_reset(); }

  // ---- graphs
  bool graphs_enabled() const override { return true; }
  uint64_t graph_epoch() const override { return 0; }
  void capture_begin() override {
    if (rec_) fail(ErrorKind::Internal, "capture_begin inside a capture");
    rec_ = std::make_unique<Recording>();
  }
  void* capture_end() override {
    if (!rec_) fail(ErrorKind::Internal, "capture_end without capture_begin");
    graphs_made++;
    return rec_.release();
  }
  void capture_abort() override { rec_.reset(); }
  void graph_launch(void* g) override {
    launches++;
    for (auto& op : *static_cast<Recording*>(g)) op();
  }
  void graph_destroy(void* g) override {
    if (!g) return;
    graphs_destroyed++;
    delete static_cast<Recording*>(g);
  }

  // ---- ops: recorded while capturing. Arguments are copied (WeightRef and parameter structs by
  // value, pointer arrays into vectors); the pointers themselves are baked in.
  void copy(void* dst, const void* src, size_t bytes) override {
    op([=, this] { in_->copy(dst, src, bytes); });
  }
  void fill_zero(void* dst, size_t bytes) override {
    op([=, this] { in_->fill_zero(dst, bytes); });
  }
  void matmul(const WeightRef& W, const float* x, float* y, int M) override {
    op([=, this] { in_->matmul(W, x, y, M); });
  }
  void matmul_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M) override {
    std::vector<WeightRef> w;
    std::vector<float*> y(ys, ys + n);
    for (int i = 0; i < n; i++) w.push_back(*Ws[i]);
    op([=, this] {
      std::vector<const WeightRef*> wp;
      for (const WeightRef& r : w) wp.push_back(&r);
      in_->matmul_group(wp.data(), y.data(), n, x, M);
    });
  }
  void embed(const WeightRef& E, const int32_t* ids, float* out, int M) override {
    op([=, this] { in_->embed(E, ids, out, M); });
  }
  void rmsnorm(const float* x, const float* w, float* y, int rows, int n, float eps) override {
    op([=, this] { in_->rmsnorm(x, w, y, rows, n, eps); });
  }
  void rmsnorm_gated(const float* x, const float* gate, const float* w, float* y, int rows, int n,
                     float eps) override {
    op([=, this] { in_->rmsnorm_gated(x, gate, w, y, rows, n, eps); });
  }
  void add(float* y, const float* x, size_t n) override {
    op([=, this] { in_->add(y, x, n); });
  }
  void add_rmsnorm(float* h, const float* r, const float* w, float* y, int rows, int n, float eps) override {
    op([=, this] { in_->add_rmsnorm(h, r, w, y, rows, n, eps); });
  }
  void scale(float* y, float s, size_t n) override {
    op([=, this] { in_->scale(y, s, n); });
  }
  void swiglu(const float* g, const float* u, float* out, size_t n) override {
    op([=, this] { in_->swiglu(g, u, out, n); });
  }
  void sigmoid_mul(float* y, const float* g, size_t n) override {
    op([=, this] { in_->sigmoid_mul(y, g, n); });
  }
  void softcap(float* y, float cap, size_t n) override {
    op([=, this] { in_->softcap(y, cap, n); });
  }
  void copy_2d(float* dst, int dst_ld, const float* src, int src_ld, int rows, int cols) override {
    op([=, this] { in_->copy_2d(dst, dst_ld, src, src_ld, rows, cols); });
  }
  void split_qgate(const float* qg, float* q, float* gate, int M, int nh, int hd) override {
    op([=, this] { in_->split_qgate(qg, q, gate, M, nh, hd); });
  }
  void rope(float* x, int M, int nh, int hd, int rot, float theta, const StepMeta* meta) override {
    op([=, this] { in_->rope(x, M, nh, hd, rot, theta, meta); });
  }
  void kv_write(void* cache, const float* rows, int M, int width, const StepMeta* meta, DType dt) override {
    op([=, this] { in_->kv_write(cache, rows, M, width, meta, dt); });
  }
  void attention(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                 const StepMeta* meta) override {
    op([=, this] { in_->attention(q, K, V, out, M, p, meta); });
  }
  void gdn_rows(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w,
                const float* A_log, const float* dt_bias, const GdnDims& d, float* state, float* y, int M,
                float* capture) override {
    op([=, this] { in_->gdn_rows(mixed, alpha, beta_in, conv_w, A_log, dt_bias, d, state, y, M, capture); });
  }
  void gemm(const WeightRef& W, const float* x, float* y, int M) override {
    op([=, this] { in_->gemm(W, x, y, M); });
  }
  void gdn_chunked(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w,
                   const float* A_log, const float* dt_bias, const GdnDims& d, float* state, float* y,
                   int M) override {
    op([=, this] { in_->gdn_chunked(mixed, alpha, beta_in, conv_w, A_log, dt_bias, d, state, y, M); });
  }
  void attention_prefill(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                         const StepMeta* meta) override {
    op([=, this] { in_->attention_prefill(q, K, V, out, M, p, meta); });
  }
  void argmax_rows(const float* x, int M, int n, int32_t* out) override {
    op([=, this] { in_->argmax_rows(x, M, n, out); });
  }
  void topk_rows(const float* x, int M, int n, int k, float* vals, int32_t* ids) override {
    op([=, this] { in_->topk_rows(x, M, n, k, vals, ids); });
  }
  void dyn_conv(const float* x, const float* base, const float* D, float* out, int L, int H, int Kc, int gs,
                int side) override {
    op([=, this] { in_->dyn_conv(x, base, D, out, L, H, Kc, gs, side); });
  }
  void selector_walk(const float* cand_vals, const int32_t* cand_ids, const float* P, const WeightRef& Epre,
                     const WeightRef& Esuc, const int32_t* anchor, int k, int K, int R, int32_t* drafts,
                     float* scores) override {
    op([=, this] { in_->selector_walk(cand_vals, cand_ids, P, Epre, Esuc, anchor, k, K, R, drafts, scores); });
  }

 private:
  using Recording = std::vector<std::function<void()>>;
  template <class F>
  void op(F&& f) {
    if (rec_)
      rec_->emplace_back(std::forward<F>(f));
    else
      f();
  }
  void no_capture(const char* what) const {
    if (rec_) fail(ErrorKind::Internal, "%s while recording a graph", what);
  }
  std::unique_ptr<Backend> in_;
  std::unique_ptr<Recording> rec_;
};

}  // namespace qf::test
