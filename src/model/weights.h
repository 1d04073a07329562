// Importing checkpoint tensors onto a backend: matrices by canonical name with expected shape
// and dtype, norm vectors converted to f32 with their +1 applied exactly once.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
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

// Owns everything imported onto a backend for one model.
class WeightSet {
 public:
  WeightSet(Backend* be, const TensorStore* store) : be_(be), store_(store) {}
  // Synthetic mode (no checkpoint): every requested tensor exists, with random values made on
  // the backend (Backend::fill_random), for full-size speed measurements.
  WeightSet(Backend* be, uint64_t seed) : be_(be), store_(nullptr), seed_(seed) {}
  bool synthetic() const { return store_ == nullptr; }
  ~WeightSet();
  WeightSet(const WeightSet&) = delete;
  WeightSet& operator=(const WeightSet&) = delete;

  bool has(const std::string& name) const { return !store_ || store_->find(name) != nullptr; }
  // A matrix [rows, cols]: bf16/f16/f32 under `name`, or mlx int4 (`name` u32 [rows, cols/8] +
  // `<base>.scales` / `<base>.biases`) when `name` ends with ".weight" and scales exist.
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
  std::vector<const void*> imported_;
  std::vector<void*> owned_;  // synthetic weights
  uint64_t seed_ = 0;
  uint64_t name_seed(const std::string& name) const;
  size_t imported_bytes_ = 0;
  const void* import(const TensorInfo& t);
  void relayout(WeightRef& w, const std::string& name);
};

// Converts a full NormVec's host values: adds 1 to a ZeroCentred source exactly once.
// Throws Internal if asked to shift something already in Full form.
void norm_apply_plus_one(std::vector<float>& w, NormForm& form, const std::string& name);

}  // namespace qf
