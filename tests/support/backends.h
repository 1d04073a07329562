// Backends a test can run on: "cpu" always; "cuda" when built with CUDA and a GPU is present.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace qf::test {

inline std::unique_ptr<Backend> make_test_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  std::string why;
  return make_cuda_backend(&why);  // nullptr: the test skips
}

}  // namespace qf::test
