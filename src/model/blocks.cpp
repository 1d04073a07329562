#include "model/blocks.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace qf {

static DeviceBuffer fbuf(Backend* be, size_t n) { return DeviceBuffer(be, n * sizeof(float)); }

void BlockScratch::allocate(Backend* be, int r, int H, const AttnDims& ad, const GdnDims* gd, int I) {
  rows = r;
  const size_t R = static_cast<size_t>(r);
  a = fbuf(be, R * H);
  o = fbuf(be, R * H);
  qg = fbuf(be, R * ad.n_heads * 2 * ad.head_dim);
  q = fbuf(be, R * ad.n_heads * ad.head_dim);
  gate = fbuf(be, R * ad.n_heads * ad.head_dim);
  attn = fbuf(be, R * ad.n_heads * ad.head_dim);
  k = fbuf(be, R * ad.n_kv_heads * ad.head_dim);
  v = fbuf(be, R * ad.n_kv_heads * ad.head_dim);
  g = fbuf(be, R * I);
  u = fbuf(be, R * I);
  if (gd) {
    mixed = fbuf(be, R * gd->conv_dim());
    z = fbuf(be, R * gd->value_dim());
    y = fbuf(be, R * gd->value_dim());
    alpha = fbuf(be, R * gd->n_v_heads);
    beta = fbuf(be, R * gd->n_v_heads);
  }
}

LayerWeights load_layer(WeightSet& ws, const std::string& p, bool full, int H, int I, const AttnDims& ad,
                        const GdnDims& gd, NormForm nf) {
  LayerWeights w;
  w.full_attention = full;
  w.in_norm = ws.norm(p + "input_layernorm.weight", H, nf);
  w.post_norm = ws.norm(p + "post_attention_layernorm.weight", H, nf);
  if (full) {
    const int qd = ad.n_heads * ad.head_dim, kd = ad.n_kv_heads * ad.head_dim;
    w.attn.q = ws.matrix(p + "self_attn.q_proj.weight", 2 * qd, H);
    w.attn.k = ws.matrix(p + "self_attn.k_proj.weight", kd, H);
    w.attn.v = ws.matrix(p + "self_attn.v_proj.weight", kd, H);
    w.attn.o = ws.matrix(p + "self_attn.o_proj.weight", H, qd);
    w.attn.q_norm = ws.norm(p + "self_attn.q_norm.weight", ad.head_dim, nf);
    w.attn.k_norm = ws.norm(p + "self_attn.k_norm.weight", ad.head_dim, nf);
  } else {
    const std::string g = p + "linear_attn.";
    w.gdn.qkv = ws.matrix(g + "in_proj_qkv.weight", gd.conv_dim(), H);
    w.gdn.z = ws.matrix(g + "in_proj_z.weight", gd.value_dim(), H);
    w.gdn.a = ws.matrix(g + "in_proj_a.weight", gd.n_v_heads, H);
    w.gdn.b = ws.matrix(g + "in_proj_b.weight", gd.n_v_heads, H);
    w.gdn.out = ws.matrix(g + "out_proj.weight", H, gd.value_dim());
    // HF stores conv1d as [C, 1, K]; mlx as [C, K, 1]. Both are C*K floats with K fastest.
    const std::string cn = g + "conv1d.weight";
    const TensorInfo* ct = ws.synthetic() ? nullptr : ws.store().find(cn);
    std::vector<int64_t> cshape = {gd.conv_dim(), 1, gd.conv_kernel};
    if (ct && ct->shape.size() == 3 && ct->shape[2] == 1 && ct->shape[1] == gd.conv_kernel)
      cshape = {gd.conv_dim(), gd.conv_kernel, 1};
    w.gdn.conv_w = ws.f32_tensor(cn, cshape);
    w.gdn.A_log = ws.f32_tensor(g + "A_log", {gd.n_v_heads});
    w.gdn.dt_bias = ws.f32_tensor(g + "dt_bias", {gd.n_v_heads});
    w.gdn.norm = ws.norm(g + "norm.weight", gd.d_v, NormForm::Full);  // plain: never shifted
  }
  w.mlp.gate = ws.matrix(p + "mlp.gate_proj.weight", I, H);
  w.mlp.up = ws.matrix(p + "mlp.up_proj.weight", I, H);
  w.mlp.down = ws.matrix(p + "mlp.down_proj.weight", H, I);
  return w;
}

static void dump_rows(const DumpHook* dump, const std::string& name, const float* p, size_t n) {
  if (dump && *dump) (*dump)(name, p, n);
}

// The layer's projections: matmul_group / matmul for decode and verify, gemm_group / gemm in prefill.
static void project(Backend& be, bool prefill, const WeightRef* const* ws, float* const* ys, int n, const float* x,
                    int M) {
  if (!prefill) {
    if (n == 1)
      be.matmul(*ws[0], x, ys[0], M);
    else
      be.matmul_group(ws, ys, n, x, M);
    return;
  }
  if (n == 1)
    be.gemm(*ws[0], x, ys[0], M);
  else
    be.gemm_group(ws, ys, n, x, M);
}
static void project1(Backend& be, bool prefill, const WeightRef& w, const float* x, float* y, int M) {
  const WeightRef* ws[1] = {&w};
  float* ys[1] = {y};
  project(be, prefill, ws, ys, 1, x, M);
}

// Prefill fusions of the producers of projection inputs (the layer norms, the attention gate):
// on unless QFLASH_PREFILL_FUSE=0 (an A/B switch; the bits are the same either way). A dump hook
// turns them off, since it reads the fp32 rows the fused forms never write.
static bool prefill_fuse() {
  static const bool on = [] {
    const char* e = std::getenv("QFLASH_PREFILL_FUSE");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

// The mixer's input projections (weights and outputs), in the order its group runs them.
static int mixer_inputs(const LayerWeights& w, BlockScratch& s, const WeightRef** ws, float** ys) {
  if (w.full_attention) {
    ws[0] = &w.attn.q, ws[1] = &w.attn.k, ws[2] = &w.attn.v;
    ys[0] = s.qg.f(), ys[1] = s.k.f(), ys[2] = s.v.f();
    return 3;
  }
  ws[0] = &w.gdn.qkv, ws[1] = &w.gdn.z, ws[2] = &w.gdn.a, ws[3] = &w.gdn.b;
  ys[0] = s.mixed.f(), ys[1] = s.z.f(), ys[2] = s.alpha.f(), ys[3] = s.beta.f();
  return 4;
}

// The input projections already ran (decoder_layer). fuse: the gate writes the o projection's bf16
// input directly (prefill, Backend::sigmoid_mul_gemm).
static void gated_attention(Backend& be, const AttnWeights& w, BlockScratch& s, int M, const AttnDims& ad,
                            float eps, const LayerIO& io, const DumpHook* dump, const std::string& name, bool fuse) {
  const int nh = ad.n_heads, nkv = ad.n_kv_heads, hd = ad.head_dim;
  be.split_qgate(s.qg.f(), s.q.f(), s.gate.f(), M, nh, hd);
  be.rmsnorm(s.q.f(), w.q_norm.ptr(), s.q.f(), M * nh, hd, eps);
  be.rmsnorm(s.k.f(), w.k_norm.ptr(), s.k.f(), M * nkv, hd, eps);
  be.rope(s.q.f(), M, nh, hd, ad.rot_dim, ad.theta, io.meta);
  be.rope(s.k.f(), M, nkv, hd, ad.rot_dim, ad.theta, io.meta);
  be.kv_write(io.kcache, s.k.f(), M, nkv * hd, io.meta, io.kv_dtype);
  be.kv_write(io.vcache, s.v.f(), M, nkv * hd, io.meta, io.kv_dtype);
  AttnParams p;
  p.n_heads = nh;
  p.n_kv_heads = nkv;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  p.causal = true;
  p.window = io.window;
  p.kv_dtype = io.kv_dtype;
  if (io.prefill)
    be.attention_prefill(s.q.f(), io.kcache, io.vcache, s.attn.f(), M, p, io.meta);
  else
    be.attention(s.q.f(), io.kcache, io.vcache, s.attn.f(), M, p, io.meta);
  if (fuse) {  // the gate writes the o projection's bf16 input directly (the same bits)
    be.sigmoid_mul_gemm(w.o, s.attn.f(), s.gate.f(), s.o.f(), M);
    return;
  }
  be.sigmoid_mul(s.attn.f(), s.gate.f(), static_cast<size_t>(M) * nh * hd);
  dump_rows(dump, name + ".attn.gated", s.attn.f(), static_cast<size_t>(M) * nh * hd);
  project1(be, io.prefill, w.o, s.attn.f(), s.o.f(), M);
}

// The input projections already ran (decoder_layer).
static void gated_deltanet(Backend& be, const GdnWeights& w, BlockScratch& s, int M, const GdnDims& gd,
                           float eps, const LayerIO& io, const DumpHook* dump, const std::string& name) {
  dump_rows(dump, name + ".gdn.mixed", s.mixed.f(), static_cast<size_t>(M) * gd.conv_dim());
  dump_rows(dump, name + ".gdn.z", s.z.f(), static_cast<size_t>(M) * gd.value_dim());
  if (io.prefill)
    be.gdn_chunked(s.mixed.f(), s.alpha.f(), s.beta.f(), w.conv_w.f(), w.A_log.f(), w.dt_bias.f(), gd, io.gdn_state,
                   s.y.f(), M);
  else
    be.gdn_rows(s.mixed.f(), s.alpha.f(), s.beta.f(), w.conv_w.f(), w.A_log.f(), w.dt_bias.f(), gd, io.gdn_state,
                s.y.f(), M, io.capture);
  dump_rows(dump, name + ".gdn.y", s.y.f(), static_cast<size_t>(M) * gd.value_dim());
  if (io.prefill) {  // the norm writes the out projection's bf16 input directly (the same bits)
    be.rmsnorm_gated_gemm(w.out, s.y.f(), s.z.f(), w.norm.ptr(), s.o.f(), M, gd.d_v, eps);
    return;
  }
  be.rmsnorm_gated(s.y.f(), s.z.f(), w.norm.ptr(), s.y.f(), M * gd.n_v_heads, gd.d_v, eps);
  project1(be, io.prefill, w.out, s.y.f(), s.o.f(), M);
}

void decoder_layer(Backend& be, const LayerWeights& w, BlockScratch& s, float* h, int M, int H, int I,
                   const AttnDims& ad, const GdnDims& gd, float eps, const LayerIO& io,
                   const DumpHook* dump, const std::string& name) {
  const size_t MH = static_cast<size_t>(M) * H;
  // Prefill without a dump hook: each norm hands its output to the projections that read it as
  // their bf16 input (Backend::add_rmsnorm_gemm_group), the same bits as the steps below.
  const bool fuse = io.prefill && !(dump && *dump) && prefill_fuse();
  {
    const WeightRef* ws[4];
    float* ys[4];
    const int n = mixer_inputs(w, s, ws, ys);
    if (fuse) {
      be.add_rmsnorm_gemm_group(h, io.pending, w.in_norm.ptr(), s.a.f(), M, H, eps, ws, ys, n);
    } else {
      if (io.pending)  // the previous layer's MLP output, added here together with this layer's norm
        be.add_rmsnorm(h, io.pending, w.in_norm.ptr(), s.a.f(), M, H, eps);
      else
        be.rmsnorm(h, w.in_norm.ptr(), s.a.f(), M, H, eps);
      dump_rows(dump, name + ".mixer_in", s.a.f(), MH);
      project(be, io.prefill, ws, ys, n, s.a.f(), M);
    }
  }
  if (w.full_attention)
    gated_attention(be, w.attn, s, M, ad, eps, io, dump, name, fuse);
  else
    gated_deltanet(be, w.gdn, s, M, gd, eps, io, dump, name);
  dump_rows(dump, name + ".mixer_out", s.o.f(), MH);
  {
    const WeightRef* ws[2] = {&w.mlp.gate, &w.mlp.up};
    float* ys[2] = {s.g.f(), s.u.f()};
    if (fuse) {
      be.add_rmsnorm_gemm_group(h, s.o.f(), w.post_norm.ptr(), s.a.f(), M, H, eps, ws, ys, 2);
    } else {
      be.add_rmsnorm(h, s.o.f(), w.post_norm.ptr(), s.a.f(), M, H, eps);
      project(be, io.prefill, ws, ys, 2, s.a.f(), M);
    }
  }
  if (io.prefill) {
    be.swiglu_gemm(w.mlp.down, s.g.f(), s.u.f(), s.o.f(), M);
  } else {
    be.swiglu(s.g.f(), s.u.f(), s.g.f(), static_cast<size_t>(M) * I);
    project1(be, io.prefill, w.mlp.down, s.g.f(), s.o.f(), M);
  }
  if (io.defer_add) return;  // h += s.o is left to the caller (the next layer's add_rmsnorm)
  be.add(h, s.o.f(), MH);
  dump_rows(dump, name + ".out", h, MH);
}

}  // namespace qf
