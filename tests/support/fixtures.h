// Reading reference fixtures (safetensors written by tools/reference/) and comparing arrays.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace qf::test {

inline std::string source_path(const std::string& rel) { return std::string(QFLASH_SOURCE_DIR) + "/" + rel; }

class Fixture {
 public:
  explicit Fixture(const std::string& path) : f_(SafetensorsFile::open(path)) {}
  const TensorInfo& get(const std::string& name) const {
    for (const auto& t : f_->tensors())
      if (t.name == name) return t;
    throw std::runtime_error("fixture tensor '" + name + "' missing in " + f_->path());
  }
  bool has(const std::string& name) const {
    for (const auto& t : f_->tensors())
      if (t.name == name) return true;
    return false;
  }
  std::vector<float> f32(const std::string& name) const {
    const TensorInfo& t = get(name);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::F32) {
      std::memcpy(v.data(), t.data, v.size() * 4);
    } else if (t.dtype == DType::BF16) {
      for (size_t i = 0; i < v.size(); i++) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        v[i] = bf16_to_f32(h);
      }
    } else {
      throw std::runtime_error("fixture tensor '" + name + "' is not float");
    }
    return v;
  }
  std::vector<int32_t> i32(const std::string& name) const {
    const TensorInfo& t = get(name);
    std::vector<int32_t> v(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::I32) {
      std::memcpy(v.data(), t.data, v.size() * 4);
    } else if (t.dtype == DType::I64) {
      for (size_t i = 0; i < v.size(); i++) {
        int64_t x;
        std::memcpy(&x, t.data + 8 * i, 8);
        v[i] = static_cast<int32_t>(x);
      }
    } else {
      throw std::runtime_error("fixture tensor '" + name + "' is not an integer tensor");
    }
    return v;
  }

 private:
  std::unique_ptr<SafetensorsFile> f_;
};

// max|a-b| <= rel * max|ref|: the tolerance is relative to the tensor's scale, so a large
// logit does not hide an error in a small one and tiny values do not demand absurd precision.
inline ::testing::AssertionResult close_rel(const std::vector<float>& got, const std::vector<float>& ref, double rel,
                                            const std::string& what) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs reference " << ref.size();
  double mx = 0, err = 0;
  size_t at = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    mx = std::max(mx, std::fabs(static_cast<double>(ref[i])));
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(e <= err)) {  // catches NaN
      err = std::isnan(e) ? INFINITY : e;
      at = i;
    }
  }
  if (err <= rel * mx) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max error " << err << " at " << at << " (got " << got[at]
                                       << ", ref " << ref[at] << ") exceeds " << rel << " x max|ref| " << mx;
}

}  // namespace qf::test
