// Shared building blocks of the Qwen 3.8 family (target layers and the MTP head): gated full
// attention, gated DeltaNet, SwiGLU MLP. Each block reads its input rows and writes its output
// rows through the backend only; intermediates are named for dumps.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"

namespace qf {

// Called with a named intermediate (backend memory, `n` floats) when set; used by parity tests
// and `--dump` to compare tensor by tensor with a reference.
using DumpHook = std::function<void(const std::string& name, const float* data, size_t n)>;

struct AttnWeights {
  WeightRef q, k, v, o;  // q: [n_heads*2*head_dim, H] (query|gate per head), o: [H, n_heads*head_dim]
  NormVec q_norm, k_norm;  // [head_dim], full form
};

struct GdnWeights {
  WeightRef qkv, z, a, b, out;  // [conv_dim,H], [value_dim,H], [Hv,H], [Hv,H], [H,value_dim]
  DeviceBuffer conv_w;          // f32 [conv_dim, K]
  DeviceBuffer A_log, dt_bias;  // f32 [Hv]
  NormVec norm;                 // f32 [d_v], plain (never shifted)
};

struct MlpWeights {
  WeightRef gate, up, down;  // [I,H], [I,H], [H,I]
};

struct LayerWeights {
  bool full_attention = false;
  NormVec in_norm, post_norm;  // [H], full form
  AttnWeights attn;
  GdnWeights gdn;
  MlpWeights mlp;
};

struct AttnDims {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, rot_dim = 0;
  float theta = 0;
};

// Scratch for up to `rows` rows; sized once per model.
struct BlockScratch {
  int rows = 0;
  DeviceBuffer a, qg, q, gate, k, v, attn, o, mixed, z, alpha, beta, y, g, u;
  void allocate(Backend* be, int rows, int H, const AttnDims& ad, const GdnDims* gd, int I);
};

// Loads a layer's weights. `prefix` ends with '.', e.g. "model.layers.3.". `norm_form` is how
// the checkpoint stores its zero-centred norms (ZeroCentred for HF, Full for mlx).
LayerWeights load_layer(WeightSet& ws, const std::string& prefix, bool full_attention, int H, int I,
                        const AttnDims& ad, const GdnDims& gd, NormForm norm_form);

// One decoder layer in place on h [M, H]: h += mixer(norm(h)); h += mlp(norm(h)).
// Attention layers write K/V into kcache/vcache (rows at absolute positions per `meta`).
// GDN layers advance `gdn_state` row by row and capture per-row states when `capture` is set.
struct LayerIO {
  const StepMeta* meta = nullptr;  // backend memory
  void* kcache = nullptr;          // [max_pos, n_kv_heads*head_dim] of kv_dtype
  void* vcache = nullptr;
  DType kv_dtype = DType::F32;
  float* gdn_state = nullptr;
  float* capture = nullptr;
  int window = 0;
  // Residual fusion: `pending` (nullable) is the previous layer's MLP output, still to be added
  // to h (this layer adds it together with its input norm); with `defer_add` this layer leaves
  // its own MLP output in the scratch's `o` rows instead of adding it (no ".out" dump then).
  const float* pending = nullptr;
  bool defer_add = false;
  // Prompt rows: projections through Backend::gemm (one call per weight), gdn_chunked (no
  // capture) and attention_prefill instead of matmul(_group), gdn_rows and attention.
  bool prefill = false;
};
void decoder_layer(Backend& be, const LayerWeights& w, BlockScratch& s, float* h, int M, int H, int I,
                   const AttnDims& ad, const GdnDims& gd, float eps, const LayerIO& io,
                   const DumpHook* dump, const std::string& name);

}  // namespace qf
