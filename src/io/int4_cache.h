// int4 weights made at load (`--weights int4`): the float matrices of a checkpoint quantized to
// the mlx group-affine layout (io/quantize.h) and kept in a cache file, so that only the first
// load pays for the quantization. Format and reasons: docs/DESIGN.md, "int4 at load".
//
// The cache is a safetensors file (`<base>.weight` u32 [rows, cols/8], `<base>.scales` and
// `<base>.biases` bf16 [rows, cols/group] per quantized matrix) whose __metadata__ carries
//   format   "qflash-int4-cache", version kInt4CacheVersion, group, lm_head (int4 | bf16);
//   source   a fingerprint of the checkpoint: per safetensors file its name, size, mtime, a hash
//            of its header and a hash of 64 evenly spaced 4 KB samples of its bytes;
//   checksum a hash of every tensor's name, dtype, shape and bytes (fixed order).
// A cache whose metadata, tensor set or checksum does not match is rebuilt, never used.
// It lives beside the checkpoint (`qflash-int4-g<group>-head-<int4|bf16>.cache`: not a
// .safetensors name, so a folder scan never mistakes it for a shard), or under
// `$XDG_CACHE_HOME/qflash` (default `~/.cache/qflash`) when the checkpoint folder is read-only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace qf {

inline constexpr int kInt4CacheVersion = 1;
inline constexpr int kInt4LoadGroup = 64;  // mlx's default; every matrix of Qwen 3.8 divides by it

struct Int4Spec {
  int group = kInt4LoadGroup;
  bool lm_head_int4 = true;  // quantize lm_head (and the embedding when the head is tied to it)
};

// Tensors no qflash model loads (vision tower, multimodal projector).
bool tensor_is_vision(const std::string& name);

// The load-time rule: a 2-D bf16/f16/f32 tensor named `*.weight` with cols divisible by the
// group, not a norm, a selector codebook (read by rows, small) or a vision tensor; lm_head, and
// the embedding when `head_tied`, only with spec.lm_head_int4. The same rule for checkpoints,
// synthetic weights and the memory-fit estimate.
bool int4_load_quantizes(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                         const Int4Spec& spec, bool head_tied);
// True when the checkpoint has no lm_head tensor, i.e. the head reads the embedding.
bool store_head_tied(const TensorStore& store);
// Bytes of an int4 matrix: nibbles + bf16 scales and biases.
size_t int4_matrix_bytes(int64_t rows, int64_t cols, int group);

// The fingerprint of `store`'s files and `spec` (a hex string); changes when any file's size,
// mtime, header or sampled bytes change.
std::string int4_source_fingerprint(const TensorStore& store, const Int4Spec& spec);

// Default root for caches of read-only checkpoints: $XDG_CACHE_HOME/qflash, else
// $HOME/.cache/qflash.
std::string int4_cache_root();
// Cache file name for a spec, and the two places a cache for checkpoint folder `dir` may live.
std::string int4_cache_file_name(const Int4Spec& spec);
std::string int4_cache_path_beside(const std::string& dir, const Int4Spec& spec);
std::string int4_cache_path_fallback(const std::string& dir, const Int4Spec& spec, const std::string& root);

struct Int4CacheStatus {
  std::string path;       // cache file in use; "" when none could be written (weights kept in memory)
  bool built = false;     // quantized by this process
  std::string rejected;   // why the caches found were not used ("" when none was found or one was used)
  size_t matrices = 0;    // quantized matrices
};

class Int4Cache {
 public:
  // A valid cache beside the checkpoint, else under the fallback root (`root`, "" =
  // int4_cache_root()), else quantizes every matrix the rule selects and writes the cache beside
  // the checkpoint, or under the root when the folder is read-only (in memory when neither can
  // be written: a warning). Nothing to quantize: an empty cache, no file.
  static std::unique_ptr<Int4Cache> open_or_build(const TensorStore& store, const Int4Spec& spec,
                                                  const std::string& root = "");
  ~Int4Cache();

  struct Matrix {
    const TensorInfo* q;       // u32 [rows, cols/8]
    const TensorInfo* scales;  // bf16 [rows, cols/group]
    const TensorInfo* biases;
  };
  // The quantized copy of source tensor `name` ("x.weight"), or nullptr.
  const Matrix* find(const std::string& name) const;
  const Int4CacheStatus& status() const { return status_; }

 private:
  Int4Cache() = default;
  std::unique_ptr<SafetensorsFile> file_;
  std::vector<TensorInfo> mem_;               // tensors held in memory (no file could be written)
  std::vector<std::vector<uint8_t>> mem_bytes_;
  std::map<std::string, Matrix> by_name_;
  Int4CacheStatus status_;
};

// Why the cache file at `path` cannot be used for `store` and `spec` ("" when it can). Reads
// the whole file (the checksum); never throws for a bad file, only describes it.
std::string int4_cache_problem(const std::string& path, const TensorStore& store, const Int4Spec& spec);

// Matrices quantized at load by this process (all caches): the tests count re-quantizations.
size_t int4_load_quantized_matrices();

}  // namespace qf
