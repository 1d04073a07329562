// Importing checkpoint tensors onto a backend: matrices by canonical name with expected shape
// and dtype, norm vectors converted to f32 with their +1 applied exactly once.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/int4_cache.h"
#include "io/safetensors.h"

namespace qf {

// How a norm weight is stored in a checkpoint and how it is applied.
//  ZeroCentred: stored w, applied as (1 + w) — HF qwen3_5 layer/final/q/k/MTP norms.
//  Full:        stored and applied as w — mlx-community (already shifted), GDN gated norm,
//               every DFlash drafter norm.
enum class NormForm { ZeroCentred, Full };

// A loaded norm vector, always in Full form (the multiplier itself), f32 on the backend.
struct NormVec {
  DeviceBuffer w;     // f32 [n]
  int n = 0;
  bool shifted = false;  // true when the loader added the +1 (for inspection and tests)
  const float* ptr() const { return w.f(); }
};

// How a model's weights are loaded (EngineOptions::weights, --weights).
struct WeightOptions {
  // Quantize the float matrices the int4 rule selects (io/int4_cache.h) at load, through the
  // cache file; matrices already int4 in the checkpoint stay as they are.
  bool int4 = false;
  Int4Spec spec;           // group and the lm_head switch
  std::string cache_root;  // fallback cache folder; "" = int4_cache_root() ($XDG_CACHE_HOME/qflash)
};

// Owns everything imported onto a backend for one model.
class WeightSet {
 public:
  // int4 mode finds or builds the int4 cache of `store` here, before any weight is imported.
  WeightSet(Backend* be, const TensorStore* store, const WeightOptions& opt = {});
  // Synthetic mode (no checkpoint): every requested tensor exists, with random values made on
  // the backend (Backend::fill_random; int4 mode: quantized there, Backend::quantize_int4), for
  // full-size speed measurements.
  WeightSet(Backend* be, uint64_t seed, const WeightOptions& opt = {});
  bool synthetic() const { return store_ == nullptr; }
  // The int4 cache in use (nullptr unless int4 mode on a checkpoint).
  const Int4CacheStatus* int4_cache() const { return cache_ ? &cache_->status() : nullptr; }
  const WeightOptions& options() const { return opt_; }
  ~WeightSet();
  WeightSet(const WeightSet&) = delete;
  WeightSet& operator=(const WeightSet&) = delete;

  bool has(const std::string& name) const { return !store_ || store_->find(name) != nullptr; }
  // A matrix [rows, cols]: bf16/f16/f32 under `name`, or mlx int4 (`name` u32 [rows, cols/8] +
  // `<base>.scales` / `<base>.biases`) when `name` ends with ".weight" and scales exist, or (int4
  // mode) the int4 cache's copy of `name`.
  // matmul_only: the matrix is only ever passed to Backend::matmul / matmul_group, so the backend
  // may keep it in its own GEMV layout (Backend::relayout_matrix); false for the embedding and
  // codebooks, whose rows are read directly.
  WeightRef matrix(const std::string& name, int64_t rows, int64_t cols, bool matmul_only = true);
  // A vector [n] (any float dtype) converted to f32; `form` says how it is stored.
  NormVec norm(const std::string& name, int64_t n, NormForm form);
  // Any float tensor with the given shape, converted to f32 on the backend.
  DeviceBuffer f32_tensor(const std::string& name, const std::vector<int64_t>& shape);
  // Host f32 copy of any float tensor of the given shape.
  std::vector<float> host_f32(const std::string& name, const std::vector<int64_t>& shape) const;
  size_t imported_bytes() const { return imported_bytes_; }
  const TensorStore& store() const { return *store_; }
  Backend* backend() const { return be_; }

 private:
  Backend* be_;
  const TensorStore* store_;
  WeightOptions opt_;
  std::unique_ptr<Int4Cache> cache_;
  std::vector<const void*> imported_;
  std::vector<void*> owned_;  // synthetic weights
  uint64_t seed_ = 0;
  uint64_t name_seed(const std::string& name) const;
  size_t imported_bytes_ = 0;
  const void* import(const TensorInfo& t);
  void relayout(WeightRef& w, const std::string& name);
  void release_one(const void* p);
  WeightRef synthetic_int4(const std::string& name, int64_t rows, int64_t cols);
};

// Converts a full NormVec's host values: adds 1 to a ZeroCentred source exactly once.
// Throws Internal if asked to shift something already in Full form.
void norm_apply_plus_one(std::vector<float>& w, NormForm& form, const std::string& name);

}  // namespace qf
