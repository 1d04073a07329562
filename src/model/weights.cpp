#include "model/weights.h"

#include <cstring>

#include "core/error.h"

namespace qf {

WeightSet::~WeightSet() {
  for (const void* p : imported_) be_->release_weight(p);
}

const void* WeightSet::import(const TensorInfo& t) {
  const void* p = be_->import_weight(t.data, t.nbytes);
  imported_.push_back(p);
  imported_bytes_ += t.nbytes;
  return p;
}

WeightRef WeightSet::matrix(const std::string& name, int64_t rows, int64_t cols) {
  WeightRef w;
  w.rows = rows;
  w.cols = cols;
  const std::string base = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0
                               ? name.substr(0, name.size() - 7)
                               : name;
  const TensorInfo* scales = store_->find(base + ".scales");
  if (scales) {
    // mlx affine int4: weight u32 [rows, cols/8], scales/biases bf16 [rows, cols/group].
    const TensorInfo& q = store_->require(name, {DType::U32}, {rows, cols / 8});
    if (cols % 8 != 0) fail(ErrorKind::Tensor, "tensor '%s': int4 needs cols %% 8 == 0, got %lld", name.c_str(), (long long)cols);
    if (scales->shape.size() != 2 || scales->shape[0] != rows || scales->shape[1] <= 0 || cols % scales->shape[1] != 0)
      fail(ErrorKind::Tensor, "tensor '%s.scales' in %s: expected shape [%lld, cols/group], found %s",
           base.c_str(), scales->file.c_str(), (long long)rows, scales->shape_str().c_str());
    const int64_t ng = scales->shape[1];
    const TensorInfo& s = store_->require(base + ".scales", {DType::BF16}, {rows, ng});
    const TensorInfo& b = store_->require(base + ".biases", {DType::BF16}, {rows, ng});
    w.dtype = DType::U32;
    w.group = static_cast<int>(cols / ng);
    w.data = import(q);
    w.scales = import(s);
    w.biases = import(b);
    return w;
  }
  const TensorInfo& t = store_->require(name, {DType::BF16, DType::F16, DType::F32}, {rows, cols});
  w.dtype = t.dtype;
  w.data = import(t);
  return w;
}

std::vector<float> WeightSet::host_f32(const std::string& name, const std::vector<int64_t>& shape) const {
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
