#include "backend/registry.h"

#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "core/log.h"

namespace qf {

namespace {

std::unique_ptr<Backend> make_cpu(std::string* /*why*/) { return make_cpu_backend(); }

struct Probe {
  bool ok = false;
  std::string why;
};

}  // namespace

const std::vector<BackendEntry>& backend_registry() {
  static const std::vector<BackendEntry> entries = {
      {"cuda", true, &make_cuda_backend},
      {"cpu", false, &make_cpu},
  };
  return entries;
}

const BackendEntry* find_backend(const std::string& name) {
  for (const BackendEntry& e : backend_registry())
    if (e.name == name) return &e;
  return nullptr;
}

bool backend_available(const std::string& name, std::string* why) {
  static std::mutex mu;
  static std::map<std::string, Probe> probes;
  std::lock_guard<std::mutex> lock(mu);
  auto it = probes.find(name);
  if (it == probes.end()) {
    Probe p;
    if (const BackendEntry* e = find_backend(name)) {
      try {
        p.ok = e->make(&p.why) != nullptr;
      } catch (const Error& err) {  // a factory should return nullptr, but a throw means the same
        p.why = err.what();
      }
    } else {
      p.why = "no backend named '" + name + "' (this build has: " + backend_names() + ")";
    }
    it = probes.emplace(name, std::move(p)).first;
  }
  if (why) *why = it->second.why;
  return it->second.ok;
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names;
  for (const BackendEntry& e : backend_registry())
    if (backend_available(e.name)) names.push_back(e.name);
  return names;
}

std::string backend_names() {
  std::string s;
  for (const BackendEntry& e : backend_registry()) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

std::unique_ptr<Backend> create_backend(const std::string& device) {
  std::string why;
  if (device == "auto") {
    for (const BackendEntry& e : backend_registry()) {
      if (auto b = e.make(&why)) return b;
      log_debug("--device auto: %s unavailable: %s", e.name.c_str(), why.c_str());
    }
    fail(ErrorKind::Backend, "--device auto: no backend could start");  // unreachable: cpu always starts
  }
  const BackendEntry* e = find_backend(device);
  if (!e) fail(ErrorKind::Usage, "--device must be auto or one of %s (got '%s')", backend_names().c_str(), device.c_str());
  auto b = e->make(&why);
  if (!b) fail(ErrorKind::Backend, "--device %s: %s", device.c_str(), why.c_str());
  return b;
}

}  // namespace qf
