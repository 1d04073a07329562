// The backends this build knows, by name: the one list that --device and the tests read.
// "cpu" is always there and always available; "cuda" is listed in every build (so `--device
// cuda` in a CPU-only build says why it cannot run) and is available when the build has the
// CUDA backend and a usable GPU is present. A new backend is one more row in registry.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace qf {

struct BackendEntry {
  std::string name;   // the --device spelling
  bool accelerator;   // a GPU: --device auto prefers it, and the full-size op tests run on it
  // A new backend, or nullptr with the reason in *why (not built in, no device, ...).
  std::unique_ptr<Backend> (*make)(std::string* why);
};

// Every backend of this build, in --device auto preference order (accelerators first, "cpu" last).
const std::vector<BackendEntry>& backend_registry();
// The entry named `name`, nullptr when there is none.
const BackendEntry* find_backend(const std::string& name);
// Whether `name` can be created in this process: probed once (by creating and dropping one) and
// remembered; *why says why not.
bool backend_available(const std::string& name, std::string* why = nullptr);
// Names of the available backends, in registry order ("cpu" always among them).
std::vector<std::string> available_backends();
// "cuda, cpu": the registry's names for messages.
std::string backend_names();
// The backend a --device value selects: "auto" = the first available in registry order (the CPU
// when no accelerator can start; the reason is logged at debug level); a registered name = that
// backend, or an ErrorKind::Backend error saying why it cannot start; anything else an
// ErrorKind::Usage error listing the names.
std::unique_ptr<Backend> create_backend(const std::string& device);

}  // namespace qf
