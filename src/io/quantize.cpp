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

// Tensors gathered into shards of at most `shard_bytes` (a tensor larger than that gets a shard of
// its own), then written as model.safetensors or model-NNNNN-of-NNNNN.safetensors + the index.
class ShardedWriter {
 public:
  explicit ShardedWriter(size_t shard_bytes) : shard_bytes_(shard_bytes) {}
  // `keep` owns the bytes `t.data` points to (null when they live in the source's mmap).
  void add(TensorToWrite t, size_t bytes, std::unique_ptr<Owned> keep = nullptr) {
    if (shard_size_ + bytes > shard_bytes_ && !shard_.empty()) flush();
    shard_.push_back(std::move(t));
    if (keep) owned_.push_back(std::move(keep));
    shard_size_ += bytes;
    total_ += bytes;
  }
  size_t write(const std::string& dst, const char* format) {
    flush();
    nlohmann::json index = {{"metadata", {{"total_size", total_}}}, {"weight_map", nlohmann::json::object()}};
    for (size_t i = 0; i < shards_.size(); i++) {
      const std::string file = shards_.size() == 1 ? "model.safetensors"
                                                   : strf("model-%05zu-of-%05zu.safetensors", i + 1, shards_.size());
      write_safetensors((fs::path(dst) / file).string(), shards_[i].first, {{"format", format}});
      for (const auto& t : shards_[i].first) index["weight_map"][t.name] = file;
    }
    if (shards_.size() > 1) write_file_atomic((fs::path(dst) / "model.safetensors.index.json").string(), index.dump(2));
    return total_;
  }

 private:
  void flush() {
    if (shard_.empty()) return;
    shards_.emplace_back(std::move(shard_), std::move(owned_));
    shard_.clear();
    owned_.clear();
    shard_size_ = 0;
  }
  size_t shard_bytes_, shard_size_ = 0, total_ = 0;
  std::vector<TensorToWrite> shard_;
  std::vector<std::unique_ptr<Owned>> owned_;
  std::vector<std::pair<std::vector<TensorToWrite>, std::vector<std::unique_ptr<Owned>>>> shards_;
};

// The new folder `dst` (refused when it exists and is not empty) and src's config.json, parsed.
nlohmann::json open_conversion(const std::string& src, const std::string& dst) {
  if (fs::exists(dst) && !fs::is_empty(dst))
    fail(ErrorKind::Usage, "output folder '%s' exists and is not empty; refusing to overwrite", dst.c_str());
  const std::string cfg_text = read_text_file((fs::path(src) / "config.json").string());
  auto cfg = nlohmann::json::parse(cfg_text, nullptr, false);
  if (cfg.is_discarded()) fail(ErrorKind::Format, "%s/config.json: not valid JSON", src.c_str());
  return cfg;
}

// config.json, the tokenizer and generation files and the drafter/ folder of a converted checkpoint.
void finish_conversion(const std::string& src, const std::string& dst, const nlohmann::json& cfg) {
  write_file_atomic((fs::path(dst) / "config.json").string(), cfg.dump(2));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"})
    if (fs::exists(fs::path(src) / f)) fs::copy_file(fs::path(src) / f, fs::path(dst) / f);
  if (fs::exists(fs::path(src) / "drafter"))
    fs::copy(fs::path(src) / "drafter", fs::path(dst) / "drafter", fs::copy_options::recursive);
}

}  // namespace

void validate_quantize_options(const QuantizeOptions& opt) {
  if (!int4_group_supported(opt.group))
    fail(ErrorKind::Usage, "group: expected 32, 64 or 128, found %lld", (long long)opt.group);
}

size_t quantize_checkpoint(const std::string& src, const std::string& dst, const QuantizeOptions& opt) {
  validate_quantize_options(opt);
  nlohmann::json cfg = open_conversion(src, dst);
  if (cfg.contains("quantization")) fail(ErrorKind::Usage, "%s is already quantized", src.c_str());
  TensorStore store = TensorStore::open_dir(src);
  fs::create_directories(dst);

  std::vector<std::string> names = store.names();
  std::sort(names.begin(), names.end());
  ShardedWriter out(opt.shard_bytes);
  Progress progress("quantizing", store.total_bytes());
  int n_quant = 0;
  for (const std::string& name : names) {
    const TensorInfo& t = *store.find(name);
    progress.add(t.nbytes);
    const bool head = name.find("embed_tokens") != std::string::npos || name.find("lm_head") != std::string::npos;
    if (!is_matrix_weight(t) || t.shape[1] % opt.group != 0 || (head && opt.keep_embed_and_head)) {
      out.add({name, t.dtype, t.shape, t.data}, t.nbytes);
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
    const size_t qn = q->bytes.size(), sn = s->bytes.size(), bn = b->bytes.size();
    const uint8_t *qp = q->bytes.data(), *sp = s->bytes.data(), *bp = b->bytes.data();
    out.add({name, DType::U32, {rows, cols / 8}, qp}, qn, std::move(q));
    out.add({base + ".scales", DType::BF16, {rows, ng}, sp}, sn, std::move(s));
    out.add({base + ".biases", DType::BF16, {rows, ng}, bp}, bn, std::move(b));
    n_quant++;
  }
  const size_t total = out.write(dst, "mlx");
  progress.done();
  cfg["quantization"] = {{"group_size", opt.group}, {"bits", 4}, {"mode", "affine"}};
  finish_conversion(src, dst, cfg);
  log_info("quantized %d matrices to int4 (group %lld): %s -> %s, %.1f MB", n_quant, (long long)opt.group, src.c_str(), dst.c_str(),
           total / 1e6);
  return total;
}

size_t dequantize_checkpoint(const std::string& src, const std::string& dst) {
  nlohmann::json cfg = open_conversion(src, dst);
  if (!cfg.contains("quantization") || !cfg["quantization"].is_object())
    fail(ErrorKind::Usage, "%s/config.json: no \"quantization\" block; the checkpoint is not int4", src.c_str());
  const auto& qc = cfg["quantization"];
  if (!qc.contains("bits") || !qc["bits"].is_number_integer() || qc["bits"].get<int64_t>() != 4)
    fail(ErrorKind::Usage, "%s/config.json: quantization.bits: expected 4, found %s", src.c_str(),
         qc.contains("bits") ? qc["bits"].dump().c_str() : "nothing");
  if (!qc.contains("group_size") || !qc["group_size"].is_number_integer())
    fail(ErrorKind::Format, "%s/config.json: quantization.group_size: expected an integer, found %s", src.c_str(),
         qc.contains("group_size") ? qc["group_size"].dump().c_str() : "nothing");
  const int64_t group = qc["group_size"].get<int64_t>();
  if (!int4_group_supported(group))
    fail(ErrorKind::Format, "%s/config.json: quantization.group_size: expected 32, 64 or 128, found %lld", src.c_str(),
         (long long)group);
  TensorStore store = TensorStore::open_dir(src);
  fs::create_directories(dst);

  std::vector<std::string> names = store.names();
  std::sort(names.begin(), names.end());
  ShardedWriter out(size_t(4) << 30);
  int n_matrices = 0;
  for (const std::string& name : names) {
    const TensorInfo& t = *store.find(name);
    const bool side = name.size() > 7 && (name.compare(name.size() - 7, 7, ".scales") == 0 ||
                                          name.compare(name.size() - 7, 7, ".biases") == 0);
    const std::string base = name.size() > 7 ? name.substr(0, name.size() - 7) : name;
    if (side) {
      if (!store.find(base + ".weight"))
        fail(ErrorKind::Format, "%s: tensor '%s' has no matrix '%s.weight'", t.file.c_str(), name.c_str(), base.c_str());
      continue;
    }
    const TensorInfo* ts = store.find(base + ".scales");
    const bool matrix = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 && ts;
    if (!matrix) {
      out.add({name, t.dtype, t.shape, t.data}, t.nbytes);
      continue;
    }
    const TensorInfo* tb = store.find(base + ".biases");
    if (t.dtype != DType::U32 || t.shape.size() != 2)
      fail(ErrorKind::Format, "%s: tensor '%s': expected U32 [rows, cols/8] int4 words, found %s %s", t.file.c_str(),
           name.c_str(), dtype_name(t.dtype), t.shape_str().c_str());
    const int64_t rows = t.shape[0], cols = t.shape[1] * 8;
    if (cols % group != 0)
      fail(ErrorKind::Format, "%s: tensor '%s': %lld columns do not divide into groups of %lld", t.file.c_str(), name.c_str(),
           (long long)cols, (long long)group);
    const std::vector<int64_t> side_shape = {rows, cols / group};
    for (const TensorInfo* x : {ts, tb}) {
      const std::string what = base + (x == ts ? ".scales" : ".biases");
      if (!x) fail(ErrorKind::Format, "%s: tensor '%s' is missing (int4 matrix '%s')", t.file.c_str(), what.c_str(), name.c_str());
      if (x->dtype != DType::BF16 || x->shape != side_shape)
        fail(ErrorKind::Format, "%s: tensor '%s': expected BF16 [%lld, %lld], found %s %s", x->file.c_str(), what.c_str(),
             (long long)rows, (long long)(cols / group), dtype_name(x->dtype), x->shape_str().c_str());
    }
    auto w = std::make_unique<Owned>();
    w->bytes.resize(static_cast<size_t>(rows) * cols * 2);
    uint16_t* wp = reinterpret_cast<uint16_t*>(w->bytes.data());
    const int64_t ng = cols / group;
    parallel_for(static_cast<size_t>(rows), 16, [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; r++) {
        for (int64_t c = 0; c < cols; c++) {
          uint32_t word;
          std::memcpy(&word, t.data + (r * (cols / 8) + c / 8) * 4, 4);
          uint16_t sh, bh;
          std::memcpy(&sh, ts->data + (r * ng + c / group) * 2, 2);
          std::memcpy(&bh, tb->data + (r * ng + c / group) * 2, 2);
          const float q = static_cast<float>((word >> (4 * (c % 8))) & 0xF);
          wp[r * cols + c] = f32_to_bf16(q * bf16_to_f32(sh) + bf16_to_f32(bh));
        }
      }
    });
    const size_t n = w->bytes.size();
    const uint8_t* p = w->bytes.data();
    out.add({name, DType::BF16, {rows, cols}, p}, n, std::move(w));
    n_matrices++;
  }
  const size_t total = out.write(dst, "pt");
  cfg.erase("quantization");
  cfg.erase("quantization_config");
  finish_conversion(src, dst, cfg);
  log_info("expanded %d int4 matrices to bf16: %s -> %s, %.1f MB", n_matrices, src.c_str(), dst.c_str(), total / 1e6);
  return total;
}

}  // namespace qf
