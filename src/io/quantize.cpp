#include "io/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "io/safetensors.h"

namespace qf {

namespace fs = std::filesystem;

void int4_quantize_row(const float* w, int64_t cols, int group, uint32_t* q, uint16_t* scales, uint16_t* biases) {
  check_int4_group(ErrorKind::Usage, "int4_quantize_row", cols, group);
  std::memset(q, 0, static_cast<size_t>(cols / 8) * sizeof(uint32_t));
  for (int64_t g = 0; g < cols / group; g++) {
    const float* x = w + g * group;
    float lo = x[0], hi = x[0];
    for (int i = 1; i < group; i++) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const uint16_t sb = f32_to_bf16((hi - lo) / 15.0f), bb = f32_to_bf16(lo);
    scales[g] = sb;
    biases[g] = bb;
    const float s = bf16_to_f32(sb), b = bf16_to_f32(bb);
    for (int i = 0; i < group; i++) {
      int v = s > 0 ? static_cast<int>(std::lround((x[i] - b) / s)) : 0;
      v = std::clamp(v, 0, 15);
      const int64_t c = g * group + i;
      q[c / 8] |= static_cast<uint32_t>(v) << (4 * (c % 8));
    }
  }
}

void int4_quantize_matrix(const void* src, DType dtype, int64_t rows, int64_t cols, int group, uint32_t* q,
                          uint16_t* scales, uint16_t* biases) {
  check_int4_group(ErrorKind::Usage, "int4_quantize_matrix", cols, group);
  if (dtype != DType::BF16 && dtype != DType::F16 && dtype != DType::F32)
    fail(ErrorKind::Internal, "int4_quantize_matrix: dtype %s is not a float type", dtype_name(dtype));
  const size_t esz = dtype_size(dtype), ng = static_cast<size_t>(cols / group);
  parallel_for(static_cast<size_t>(rows), 16, [&](size_t r0, size_t r1) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (size_t r = r0; r < r1; r++) {
      const uint8_t* p = static_cast<const uint8_t*>(src) + r * static_cast<size_t>(cols) * esz;
      for (int64_t c = 0; c < cols; c++) {
        if (dtype == DType::F32) {
          std::memcpy(&row[c], p + 4 * c, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, p + 2 * c, 2);
          row[c] = dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
      }
      int4_quantize_row(row.data(), cols, group, q + r * static_cast<size_t>(cols / 8), scales + r * ng, biases + r * ng);
    }
  });
}

bool int4_group_supported(int64_t group) { return group == 32 || group == 64 || group == 128; }

void check_int4_group(ErrorKind kind, const std::string& what, int64_t cols, int64_t group) {
  if (int4_group_supported(group) && cols > 0 && cols % group == 0) return;
  fail(kind, "%s: int4 group size expected 32, 64 or 128 dividing %lld, found %lld", what.c_str(), (long long)cols,
       (long long)group);
}

namespace {

bool is_matrix_weight(const TensorInfo& t) {
  const std::string& n = t.name;
  if (t.shape.size() != 2) return false;
  if (t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F32) return false;
  if (n.size() < 7 || n.compare(n.size() - 7, 7, ".weight") != 0) return false;
  return n.find("norm") == std::string::npos;
}

struct Owned {
  std::vector<uint8_t> bytes;
};

}  // namespace

void validate_quantize_options(const QuantizeOptions& opt) {
  if (!int4_group_supported(opt.group))
    fail(ErrorKind::Usage, "group: expected 32, 64 or 128, found %lld", (long long)opt.group);
}

size_t quantize_checkpoint(const std::string& src, const std::string& dst, const QuantizeOptions& opt) {
  validate_quantize_options(opt);
  if (fs::exists(dst) && !fs::is_empty(dst))
    fail(ErrorKind::Usage, "output folder '%s' exists and is not empty; refusing to overwrite", dst.c_str());
  const std::string cfg_text = read_text_file((fs::path(src) / "config.json").string());
  auto cfg = nlohmann::json::parse(cfg_text, nullptr, false);
  if (cfg.is_discarded()) fail(ErrorKind::Format, "%s/config.json: not valid JSON", src.c_str());
  if (cfg.contains("quantization")) fail(ErrorKind::Usage, "%s is already quantized", src.c_str());
  TensorStore store = TensorStore::open_dir(src);
  fs::create_directories(dst);

  std::vector<std::string> names = store.names();
  std::sort(names.begin(), names.end());
  std::vector<std::unique_ptr<Owned>> owned;
  std::vector<TensorToWrite> shard;
  std::vector<std::pair<std::vector<TensorToWrite>, std::vector<std::unique_ptr<Owned>>>> shards;
  size_t shard_size = 0, total = 0;
  auto flush = [&] {
    if (shard.empty()) return;
    shards.emplace_back(std::move(shard), std::move(owned));
    shard.clear();
    owned.clear();
    shard_size = 0;
  };
  auto add = [&](TensorToWrite t, size_t bytes) {
    if (shard_size + bytes > opt.shard_bytes && !shard.empty()) flush();
    shard.push_back(std::move(t));
    shard_size += bytes;
    total += bytes;
  };
  Progress progress("quantizing", store.total_bytes());
  int n_quant = 0;
  for (const std::string& name : names) {
    const TensorInfo& t = *store.find(name);
    progress.add(t.nbytes);
    const bool head = name.find("embed_tokens") != std::string::npos || name.find("lm_head") != std::string::npos;
    if (!is_matrix_weight(t) || t.shape[1] % opt.group != 0 || (head && opt.keep_embed_and_head)) {
      add({name, t.dtype, t.shape, t.data}, t.nbytes);
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1], ng = cols / opt.group;
    auto q = std::make_unique<Owned>(), s = std::make_unique<Owned>(), b = std::make_unique<Owned>();
    q->bytes.resize(static_cast<size_t>(rows) * (cols / 8) * 4);
    s->bytes.resize(static_cast<size_t>(rows) * ng * 2);
    b->bytes.resize(static_cast<size_t>(rows) * ng * 2);
    int4_quantize_matrix(t.data, t.dtype, rows, cols, static_cast<int>(opt.group), reinterpret_cast<uint32_t*>(q->bytes.data()),
                         reinterpret_cast<uint16_t*>(s->bytes.data()), reinterpret_cast<uint16_t*>(b->bytes.data()));
    const std::string base = name.substr(0, name.size() - 7);
    add({name, DType::U32, {rows, cols / 8}, q->bytes.data()}, q->bytes.size());
    add({base + ".scales", DType::BF16, {rows, ng}, s->bytes.data()}, s->bytes.size());
    add({base + ".biases", DType::BF16, {rows, ng}, b->bytes.data()}, b->bytes.size());
    owned.push_back(std::move(q));
    owned.push_back(std::move(s));
    owned.push_back(std::move(b));
    n_quant++;
  }
  flush();
  progress.done();

  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
  for (size_t i = 0; i < shards.size(); i++) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : strf("model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors((fs::path(dst) / file).string(), shards[i].first, {{"format", "mlx"}});
    for (const auto& t : shards[i].first) index["weight_map"][t.name] = file;
  }
  if (shards.size() > 1) write_file_atomic((fs::path(dst) / "model.safetensors.index.json").string(), index.dump(2));
  cfg["quantization"] = {{"group_size", opt.group}, {"bits", 4}, {"mode", "affine"}};
  write_file_atomic((fs::path(dst) / "config.json").string(), cfg.dump(2));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"})
    if (fs::exists(fs::path(src) / f)) fs::copy_file(fs::path(src) / f, fs::path(dst) / f);
  if (fs::exists(fs::path(src) / "drafter"))
    fs::copy(fs::path(src) / "drafter", fs::path(dst) / "drafter", fs::copy_options::recursive);
  log_info("quantized %d matrices to int4 (group %lld): %s -> %s, %.1f MB", n_quant, (long long)opt.group, src.c_str(), dst.c_str(),
           total / 1e6);
  return total;
}

}  // namespace qf
