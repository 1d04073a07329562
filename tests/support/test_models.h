// Random checkpoints with the real schema, written by the tests themselves (no fixtures needed):
// tiny qwen3_5 targets (text layout, optional MTP head) and DFlash2 / DFlash v1 drafters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qf::test {

struct TinyTarget {
  int hidden = 256, layers = 8, heads = 4, kv_heads = 2, head_dim = 64;
  int gdn_k_heads = 2, gdn_v_heads = 6, gdn_dk = 64, gdn_dv = 64, conv = 4;
  int intermediate = 768, vocab = 8192;
  bool mtp = true;
  uint64_t seed = 1;
  float weight_std = 0.05f;
};

struct TinyDrafter {
  int layers = 2, heads = 4, kv_heads = 2, head_dim = 64, intermediate = 768;
  std::vector<int> taps = {1, 3, 5};
  int block = 8, window = 64, conv_kernel = 2, conv_group = 16, rank = 32, top_k = 16, mask_id = 8191;
  bool v2 = true;
  uint64_t seed = 2;
};

// Writes config.json + model.safetensors into `dir` (created). Returns dir.
std::string write_tiny_target(const std::string& dir, const TinyTarget& t);
std::string write_tiny_drafter(const std::string& dir, const TinyDrafter& d, const TinyTarget& t);

// A fresh empty folder under the test temp dir.
std::string temp_dir(const std::string& name);

}  // namespace qf::test
