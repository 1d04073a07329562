#include "model/weights.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/quantize.h"

namespace qf {

WeightSet::WeightSet(Backend* be, const TensorStore* store, const WeightOptions& opt)
    : be_(be), store_(store), opt_(opt) {
  if (opt_.int4) cache_ = Int4Cache::open_or_build(*store_, opt_.spec, opt_.cache_root);
}

WeightSet::WeightSet(Backend* be, uint64_t seed, const WeightOptions& opt)
    : be_(be), store_(nullptr), opt_(opt), seed_(seed) {}

WeightSet::~WeightSet() {
  for (const void* p : imported_) be_->release_weight(p);
  for (void* p : owned_) be_->release(p);
}

uint64_t WeightSet::name_seed(const std::string& name) const {
  uint64_t h = seed_ ^ 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Synthetic values by tensor role: matrices ~ U(+-1/sqrt(cols)) keep activations O(1) through
// 64 layers; GDN gate parameters in their trained ranges so decays stay in (0, 1).
static float synthetic_scale(const std::string& name, int64_t cols) {
  if (name.find("embed_tokens") != std::string::npos) return 1.0f;
  return 1.0f / std::sqrt(static_cast<float>(cols));
}

const void* WeightSet::import(const TensorInfo& t) {
  const void* p = be_->import_weight(t.data, t.nbytes);
  imported_.push_back(p);
  imported_bytes_ += t.nbytes;
  return p;
}

void WeightSet::release_one(const void* p) {
  for (size_t i = owned_.size(); i-- > 0;)
    if (owned_[i] == p) {
      be_->release(owned_[i]);
      owned_.erase(owned_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  for (size_t i = imported_.size(); i-- > 0;)
    if (imported_[i] == p) {
      be_->release_weight(imported_[i]);
      imported_.erase(imported_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
}

// The backend's GEMV layout for a matrix only matmul reads: the new copy replaces the loaded one
// (for int4 the copy carries the scales and biases too).
void WeightSet::relayout(WeightRef& w, const std::string& name) {
  uint8_t layout = WeightRef::kRowMajor;
  const void* p = nullptr;
  try {
    p = be_->relayout_matrix(w, &layout);
  } catch (const Error& e) {
    fail(e.kind(), "tensor '%s': %s", name.c_str(), e.what());
  }
  if (!p) return;
  for (const void* old : {w.data, w.scales, w.biases})
    if (old) release_one(old);
  imported_.push_back(p);
  w.data = p;
  w.layout = layout;
  if (w.dtype == DType::U32) w.scales = w.biases = nullptr;
}

// Random bf16 values as synthetic_scale gives them, quantized on the backend: the int4 shapes
// and value ranges of a quantized checkpoint.
WeightRef WeightSet::synthetic_int4(const std::string& name, int64_t rows, int64_t cols) {
  const int g = opt_.spec.group;
  const size_t n = static_cast<size_t>(rows) * cols, ng = static_cast<size_t>(rows) * (cols / g);
  DeviceBuffer tmp(be_, n * 2);
  be_->fill_random(tmp.get(), n, DType::BF16, name_seed(name), synthetic_scale(name, cols));
  WeightRef w;
  w.rows = rows;
  w.cols = cols;
  w.dtype = DType::U32;
  w.group = g;
  void* q = be_->alloc(n / 2);
  void* sc = be_->alloc(ng * 2);
  void* bi = be_->alloc(ng * 2);
  owned_.insert(owned_.end(), {q, sc, bi});
  be_->quantize_int4(tmp.get(), rows, cols, g, q, sc, bi);
  w.data = q;
  w.scales = sc;
  w.biases = bi;
  imported_bytes_ += int4_matrix_bytes(rows, cols, g);
  return w;
}

WeightRef WeightSet::matrix(const std::string& name, int64_t rows, int64_t cols, bool matmul_only) {
  WeightRef w;
  w.rows = rows;
  w.cols = cols;
  if (synthetic() && opt_.int4 && int4_load_quantizes(name, DType::BF16, {rows, cols}, opt_.spec, false)) {
    w = synthetic_int4(name, rows, cols);
    if (matmul_only) relayout(w, name);
    return w;
  }
  if (synthetic()) {
    const size_t n = static_cast<size_t>(rows) * cols;
    void* p = be_->alloc(n * 2);
    be_->fill_random(p, n, DType::BF16, name_seed(name), synthetic_scale(name, cols));
    owned_.push_back(p);
    imported_bytes_ += n * 2;
    w.dtype = DType::BF16;
    w.data = p;
    if (matmul_only) relayout(w, name);
    return w;
  }
  const std::string base = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0
                               ? name.substr(0, name.size() - 7)
                               : name;
  if (const Int4Cache::Matrix* m = cache_ ? cache_->find(name) : nullptr) {
    // The int4 cache's copy of a float matrix (checked against the source when the cache was
    // opened; the shape asked for here must still be the source's).
    store_->require(name, {}, {rows, cols});
    w.dtype = DType::U32;
    w.group = opt_.spec.group;
    w.data = import(*m->q);
    w.scales = import(*m->scales);
    w.biases = import(*m->biases);
    if (matmul_only) relayout(w, name);
    return w;
  }
  const TensorInfo* scales = store_->find(base + ".scales");
  if (scales) {
    // mlx affine int4: weight u32 [rows, cols/8], scales/biases bf16 [rows, cols/group].
    const TensorInfo& q = store_->require(name, {DType::U32}, {rows, cols / 8});
    if (cols % 8 != 0) fail(ErrorKind::Tensor, "tensor '%s': int4 needs cols %% 8 == 0, got %lld", name.c_str(), (long long)cols);
    if (scales->shape.size() != 2 || scales->shape[0] != rows || scales->shape[1] <= 0 || cols % scales->shape[1] != 0)
      fail(ErrorKind::Tensor, "tensor '%s.scales' in %s: expected shape [%lld, cols/group], found %s",
           base.c_str(), scales->file.c_str(), (long long)rows, scales->shape_str().c_str());
    const int64_t ng = scales->shape[1];
    // The group comes from the scales' shape; an unsupported one would be dequantized with the
    // wrong scale per word on the CPU (8 columns per word) or per lane on the GPU (32).
    check_int4_group(ErrorKind::Tensor,
                     strf("tensor '%s' (scales %s in %s)", name.c_str(), scales->shape_str().c_str(),
                          scales->file.c_str()),
                     cols, cols / ng);
    const TensorInfo& s = store_->require(base + ".scales", {DType::BF16}, {rows, ng});
    const TensorInfo& b = store_->require(base + ".biases", {DType::BF16}, {rows, ng});
    w.dtype = DType::U32;
    w.group = static_cast<int>(cols / ng);
    w.data = import(q);
    w.scales = import(s);
    w.biases = import(b);
    if (matmul_only) relayout(w, name);
    return w;
  }
  const TensorInfo& t = store_->require(name, {DType::BF16, DType::F16, DType::F32}, {rows, cols});
  w.dtype = t.dtype;
  w.data = import(t);
  if (matmul_only) relayout(w, name);
  return w;
}

std::vector<float> WeightSet::host_f32(const std::string& name, const std::vector<int64_t>& shape) const {
  if (!store_) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    std::vector<float> v(n);
    const uint64_t seed = name_seed(name);
    for (size_t i = 0; i < n; i++) {
      const float u = random_uniform_pm1(seed, i);  // [-1, 1)
      if (name.find("A_log") != std::string::npos) v[i] = 1.25f + 1.25f * u;
      else if (name.find("dt_bias") != std::string::npos) v[i] = 0.5f * u;
      else if (name.find("conv1d") != std::string::npos) v[i] = 0.5f * u;
      else if (name.find("base_kernel") != std::string::npos) v[i] = 0.5f + 0.2f * u;
      else if (name.find("norm") != std::string::npos) v[i] = name.find("linear_attn") != std::string::npos ? 1.0f + 0.1f * u : 0.1f * u;
      else v[i] = 0.05f * u;
    }
    return v;
  }
  const TensorInfo& t = store_->require(name, {DType::BF16, DType::F16, DType::F32}, shape);
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  for (size_t i = 0; i < n; i++) {
    switch (t.dtype) {
      case DType::F32: {
        float f;
        std::memcpy(&f, t.data + 4 * i, 4);
        out[i] = f;
        break;
      }
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = bf16_to_f32(h);
        break;
      }
      default: {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
    }
  }
  return out;
}

DeviceBuffer WeightSet::f32_tensor(const std::string& name, const std::vector<int64_t>& shape) {
  std::vector<float> h = host_f32(name, shape);
  DeviceBuffer buf(be_, h.size() * sizeof(float));
  be_->upload(buf.get(), h.data(), h.size() * sizeof(float));
  return buf;
}

void norm_apply_plus_one(std::vector<float>& w, NormForm& form, const std::string& name) {
  if (form == NormForm::Full)
    fail(ErrorKind::Internal, "norm '%s' is already in full form (1+w applied); refusing to shift it again",
         name.c_str());
  for (float& x : w) x += 1.0f;
  form = NormForm::Full;
}

NormVec WeightSet::norm(const std::string& name, int64_t n, NormForm form) {
  std::vector<float> h = host_f32(name, {n});
  if (synthetic() && form == NormForm::Full && name.find("linear_attn") == std::string::npos)
    for (float& x : h) x += 1.0f;  // a synthetic full-form norm is a multiplier near 1
  NormVec v;
  v.n = static_cast<int>(n);
  if (form == NormForm::ZeroCentred) {
    norm_apply_plus_one(h, form, name);
    v.shifted = true;
  }
  v.w = DeviceBuffer(be_, h.size() * sizeof(float));
  be_->upload(v.w.get(), h.data(), h.size() * sizeof(float));
  return v;
}

}  // namespace qf
