// Backends a test runs on: the registry's available ones (backend/registry.h): "cpu" always,
// "cuda" when built with CUDA and a GPU is present. Tests parameterized by backend instantiate
// over test_backends(), so a case exists only where it can run, and a new backend is covered by
// adding it to the registry. Test names end in the backend name ("..._cuda" or ".../cuda"), so
// --gtest_filter='*cuda' selects a backend's cases.
#pragma once
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"

namespace qf::test {

inline std::vector<std::string> test_backends() { return available_backends(); }

// A fresh backend; nullptr with the reason in *why (an available backend that fails to start).
inline std::unique_ptr<Backend> make_test_backend(const std::string& name, std::string* why = nullptr) {
  std::string w;
  const BackendEntry* e = find_backend(name);
  std::unique_ptr<Backend> b = e ? e->make(&w) : nullptr;
  if (!e) w = "no backend named '" + name + "'";
  if (why) *why = w;
  return b;
}

// One backend per name for the whole test process (a GPU context per test would only cost
// time); nullptr with the reason in *why.
inline Backend* shared_backend(const std::string& name, std::string* why = nullptr) {
  static std::map<std::string, std::unique_ptr<Backend>> made;
  static std::map<std::string, std::string> reasons;
  auto it = made.find(name);
  if (it == made.end()) it = made.emplace(name, make_test_backend(name, &reasons[name])).first;
  if (why) *why = reasons[name];
  return it->second.get();
}

// gtest parameter name of a plain backend parameter: the backend's name.
inline std::string backend_param_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

}  // namespace qf::test
