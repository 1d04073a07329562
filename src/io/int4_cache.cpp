#include "io/int4_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "io/atomic_file.h"
#include "io/quantize.h"

namespace qf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "qflash-int4-cache";
constexpr const char* kMissing = "missing";  // int4_cache_problem's answer when there is no file
std::atomic<size_t> g_quantized{0};

// ---- hashing ------------------------------------------------------------------------------
// Not cryptographic: it detects accidents (a torn write, a flipped bit, a replaced checkpoint),
// at memory speed. Four lanes of 8-byte words; each step h = rotl(h ^ (v * kM1), 27) * kM2 is a
// bijection of h for a given word and of the word for a given h (odd multipliers), so changing
// any one word changes its lane's final state. Lanes, tail and length are folded at the end.
constexpr uint64_t kM1 = 0xBF58476D1CE4E5B9ull, kM2 = 0x94D049BB133111EBull;

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * kM1;
  x = (x ^ (x >> 27)) * kM2;
  return x ^ (x >> 31);
}
inline uint64_t lane_step(uint64_t h, uint64_t v) {
  h ^= v * kM1;
  h = (h << 27) | (h >> 37);
  return h * kM2;
}

uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t h[4] = {mix64(seed), mix64(seed + 1), mix64(seed + 2), mix64(seed + 3)};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t v[4];
    std::memcpy(v, p + i, 32);
    for (int l = 0; l < 4; l++) h[l] = lane_step(h[l], v[l]);
  }
  int l = 0;
  for (; i + 8 <= n; i += 8, l++) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    h[l] = lane_step(h[l], v);
  }
  if (i < n) {
    uint64_t v = 0;
    std::memcpy(&v, p + i, n - i);
    h[l] = lane_step(h[l], v);
  }
  uint64_t r = mix64(seed ^ n);
  for (uint64_t x : h) r = mix64(r ^ x);
  return r;
}

uint64_t hash_words(const std::vector<uint64_t>& w, uint64_t seed) { return hash_bytes(w.data(), w.size() * 8, seed); }

std::string hex64(uint64_t v) { return strf("%016llx", static_cast<unsigned long long>(v)); }

// Digest of each byte range: 64 MiB blocks hashed in parallel (each seeded with its offset), then
// the blocks of a range folded in order. Independent of the thread count.
struct Span {
  const uint8_t* p;
  size_t n;
};
std::vector<uint64_t> span_digests(const std::vector<Span>& spans) {
  constexpr size_t kBlock = size_t(64) << 20;
  struct Item {
    size_t span, off, n;
  };
  std::vector<Item> items;
  for (size_t s = 0; s < spans.size(); s++) {
    size_t off = 0;
    do {
      const size_t n = std::min(kBlock, spans[s].n - off);
      items.push_back({s, off, n});
      off += n;
    } while (off < spans[s].n);
  }
  std::vector<uint64_t> d(items.size());
  parallel_for(items.size(), 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; i++) d[i] = hash_bytes(spans[items[i].span].p + items[i].off, items[i].n, items[i].off);
  });
  std::vector<uint64_t> out(spans.size());
  std::vector<uint64_t> blocks;
  for (size_t i = 0; i < items.size();) {
    const size_t s = items[i].span;
    blocks.clear();
    for (; i < items.size() && items[i].span == s; i++) blocks.push_back(d[i]);
    out[s] = hash_words(blocks, spans[s].n);
  }
  return out;
}

// A tensor's digest: its name, dtype, shape and byte count, then its bytes' digest.
uint64_t tensor_digest(const std::string& name, DType dt, const std::vector<int64_t>& shape, uint64_t data_digest) {
  std::string d = name;
  d.push_back('\0');
  d += dtype_name(dt);
  for (int64_t x : shape) d += strf(",%lld", static_cast<long long>(x));
  return hash_words({hash_bytes(d.data(), d.size(), 0x7134), data_digest}, 0x7135);
}

// ---- what gets quantized -------------------------------------------------------------------
struct Planned {
  std::string name;  // source tensor "x.weight"
  std::string base;  // "x"
  const TensorInfo* src;
  int64_t rows, cols, ng;
};

std::vector<Planned> make_plan(const TensorStore& store, const Int4Spec& spec) {
  const bool tied = store_head_tied(store);
  std::vector<Planned> plan;
  for (const std::string& n : store.names()) {  // sorted: the cache's fixed order
    const TensorInfo* t = store.find(n);
    if (!int4_load_quantizes(n, t->dtype, t->shape, spec, tied)) continue;
    plan.push_back({n, n.substr(0, n.size() - 7), t, t->shape[0], t->shape[1], t->shape[1] / spec.group});
  }
  return plan;
}

std::string source_dir(const TensorStore& store) {
  std::error_code ec;
  const fs::path d(store.dir());
  return fs::is_regular_file(d, ec) ? (d.has_parent_path() ? d.parent_path().string() : ".") : d.string();
}

// The three cache tensors of a planned matrix, in file and checksum order.
struct CacheTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t bytes;
};
std::vector<CacheTensor> cache_tensors(const Planned& p) {
  const size_t sb = static_cast<size_t>(p.rows * p.ng) * 2;
  return {{p.base + ".weight", DType::U32, {p.rows, p.cols / 8}, static_cast<size_t>(p.rows * p.cols / 2)},
          {p.base + ".scales", DType::BF16, {p.rows, p.ng}, sb},
          {p.base + ".biases", DType::BF16, {p.rows, p.ng}, sb}};
}

// Checks a cache file against the plan; on success *out holds it, mapped.
std::string check_file(const std::string& path, const std::vector<Planned>& plan, const Int4Spec& spec,
                       const std::string& fingerprint, std::unique_ptr<SafetensorsFile>* out) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return kMissing;
  std::unique_ptr<SafetensorsFile> f;
  try {
    f = SafetensorsFile::open(path);
  } catch (const Error& e) {
    return std::string("unreadable (") + e.what() + ")";
  }
  const auto& meta = f->metadata();
  auto field = [&](const char* k) {
    auto it = meta.find(k);
    return it == meta.end() ? std::string("(none)") : it->second;
  };
  const std::pair<const char*, std::string> want[] = {
      {"format", kFormat},
      {"version", std::to_string(kInt4CacheVersion)},
      {"group", std::to_string(spec.group)},
      {"lm_head", spec.lm_head_int4 ? "int4" : "bf16"},
      {"source", fingerprint}};
  for (const auto& [k, v] : want)
    if (field(k) != v) {
      if (std::strcmp(k, "source") == 0) return "stale (the checkpoint's files changed since it was written)";
      return strf("stale (%s: expected %s, found %s)", k, v.c_str(), field(k).c_str());
    }
  std::map<std::string, const TensorInfo*> by;
  for (const TensorInfo& t : f->tensors()) by[t.name] = &t;
  if (by.size() != 3 * plan.size())
    return strf("wrong tensor set (expected %zu tensors, found %zu)", 3 * plan.size(), by.size());
  std::vector<Span> spans;
  std::vector<const CacheTensor*> order;
  std::vector<std::vector<CacheTensor>> all;
  all.reserve(plan.size());
  for (const Planned& p : plan) all.push_back(cache_tensors(p));
  for (const auto& ts : all)
    for (const CacheTensor& c : ts) {
      auto it = by.find(c.name);
      if (it == by.end()) return "wrong tensor set (no '" + c.name + "')";
      if (it->second->dtype != c.dtype || it->second->shape != c.shape)
        return strf("tensor '%s' is %s %s, expected %s %s", c.name.c_str(), dtype_name(it->second->dtype),
                    it->second->shape_str().c_str(), dtype_name(c.dtype),
                    TensorInfo{"", c.dtype, c.shape, nullptr, 0, ""}.shape_str().c_str());
      spans.push_back({it->second->data, it->second->nbytes});
      order.push_back(&c);
    }
  const std::vector<uint64_t> dd = span_digests(spans);
  std::vector<uint64_t> digests;
  for (size_t i = 0; i < order.size(); i++) digests.push_back(tensor_digest(order[i]->name, order[i]->dtype, order[i]->shape, dd[i]));
  if (field("checksum") != hex64(hash_words(digests, kInt4CacheVersion))) return "corrupted (checksum mismatch)";
  *out = std::move(f);
  return "";
}

// Quantizes the plan into a new cache file at `path` (temp file + rename): the header with a
// zero checksum first, then each matrix as it is quantized, then the checksum patched in.
void write_cache(const std::string& path, const std::vector<Planned>& plan, const Int4Spec& spec,
                 const std::string& fingerprint, Progress& progress) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  const std::string zeros(16, '0');
  h["__metadata__"] = {{"format", kFormat},
                       {"version", std::to_string(kInt4CacheVersion)},
                       {"group", std::to_string(spec.group)},
                       {"lm_head", spec.lm_head_int4 ? "int4" : "bf16"},
                       {"source", fingerprint},
                       {"checksum", zeros}};
  uint64_t off = 0;
  for (const Planned& p : plan)
    for (const CacheTensor& c : cache_tensors(p)) {
      h[c.name] = {{"dtype", dtype_name(c.dtype)}, {"shape", c.shape}, {"data_offsets", {off, off + c.bytes}}};
      off += c.bytes;
    }
  std::string text = h.dump();
  const std::string key = "\"checksum\":\"" + zeros + "\"";
  const size_t at = text.find(key);
  QF_CHECK(at != std::string::npos, "int4 cache header lost its checksum field");
  const size_t sum_at = 8 + at + key.find(zeros);  // file offset of the 16 placeholder digits
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  AtomicFile out(path);
  out.write(len, 8);
  out.write(text.data(), text.size());
  std::vector<uint64_t> digests;
  std::vector<uint32_t> q;
  std::vector<uint16_t> s, b;
  for (const Planned& p : plan) {
    q.resize(static_cast<size_t>(p.rows * p.cols / 8));
    s.resize(static_cast<size_t>(p.rows * p.ng));
    b.resize(s.size());
    int4_quantize_matrix(p.src->data, p.src->dtype, p.rows, p.cols, spec.group, q.data(), s.data(), b.data());
    g_quantized++;
    const std::vector<CacheTensor> ts = cache_tensors(p);
    const void* data[3] = {q.data(), s.data(), b.data()};
    const std::vector<uint64_t> dd =
        span_digests({{static_cast<const uint8_t*>(data[0]), ts[0].bytes},
                      {static_cast<const uint8_t*>(data[1]), ts[1].bytes},
                      {static_cast<const uint8_t*>(data[2]), ts[2].bytes}});
    for (int i = 0; i < 3; i++) {
      out.write(data[i], ts[i].bytes);
      digests.push_back(tensor_digest(ts[i].name, ts[i].dtype, ts[i].shape, dd[i]));
    }
    progress.add(p.src->nbytes);
  }
  const std::string sum = hex64(hash_words(digests, kInt4CacheVersion));
  out.write_at(sum_at, sum.data(), sum.size());
  out.commit();
}

}  // namespace

// ---- the rule ---------------------------------------------------------------------------------

bool tensor_is_vision(const std::string& n) {
  for (const char* p : {"model.visual.", "visual.", "vision_tower.", "model.vision_tower.", "multi_modal_projector.",
                        "model.multi_modal_projector."})
    if (n.rfind(p, 0) == 0) return true;
  return false;
}

bool int4_load_quantizes(const std::string& n, DType dt, const std::vector<int64_t>& shape, const Int4Spec& spec,
                         bool head_tied) {
  if (shape.size() != 2 || shape[0] <= 0 || shape[1] <= 0) return false;
  if (dt != DType::BF16 && dt != DType::F16 && dt != DType::F32) return false;
  if (!n.ends_with(".weight") || n.find("norm") != std::string::npos) return false;
  if (n.find("codebook") != std::string::npos || tensor_is_vision(n)) return false;
  if (!int4_group_supported(spec.group) || shape[1] % spec.group != 0) return false;
  const bool head = n.ends_with("lm_head.weight") || (head_tied && n.ends_with("embed_tokens.weight"));
  return !head || spec.lm_head_int4;
}

bool store_head_tied(const TensorStore& store) {
  for (const std::string& n : store.names())
    if (n.ends_with("lm_head.weight")) return false;
  return true;
}

size_t int4_matrix_bytes(int64_t rows, int64_t cols, int group) {
  return static_cast<size_t>(rows) * (static_cast<size_t>(cols) / 2 + static_cast<size_t>(cols / group) * 4);
}

// ---- fingerprint and places -------------------------------------------------------------------

std::string int4_source_fingerprint(const TensorStore& store, const Int4Spec& spec) {
  std::set<std::string> files;
  for (const std::string& n : store.names()) files.insert(store.find(n)->file);
  std::vector<uint64_t> parts = {static_cast<uint64_t>(kInt4CacheVersion), static_cast<uint64_t>(spec.group),
                                 spec.lm_head_int4 ? 1u : 0u};
  for (const std::string& path : files) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      const int e = errno;
      if (fd >= 0) ::close(fd);
      fail(ErrorKind::Io, "cannot read %s for the int4 cache fingerprint: %s", path.c_str(), std::strerror(e));
    }
    const size_t size = static_cast<size_t>(st.st_size);
    const std::string base = fs::path(path).filename().string();
    parts.push_back(hash_bytes(base.data(), base.size(), 1));
    parts.push_back(size);
    parts.push_back(static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec));
    // The header names every tensor with its dtype, shape and offsets.
    uint64_t hlen = 0;
    std::vector<uint8_t> buf(8);
    if (size >= 8 && ::pread(fd, buf.data(), 8, 0) == 8)
      for (int i = 0; i < 8; i++) hlen |= static_cast<uint64_t>(buf[i]) << (8 * i);
    hlen = std::min<uint64_t>(hlen, size >= 8 ? size - 8 : 0);
    buf.resize(8 + hlen);
    const ssize_t got = ::pread(fd, buf.data(), buf.size(), 0);
    parts.push_back(hash_bytes(buf.data(), got > 0 ? static_cast<size_t>(got) : 0, 2));
    // Sampled bytes: a checkpoint rewritten with the same shapes, sizes and (restored) mtimes
    // still changes here unless every difference falls between the samples.
    constexpr size_t kSamples = 64, kSample = 4096;
    buf.assign(kSamples * kSample, 0);
    size_t n = 0;
    for (size_t i = 0; i < kSamples && size > 0; i++) {
      const size_t at = size <= kSample ? 0 : (size - kSample) * i / (kSamples - 1);
      const ssize_t r = ::pread(fd, buf.data() + n, std::min(kSample, size), static_cast<off_t>(at));
      if (r > 0) n += static_cast<size_t>(r);
    }
    parts.push_back(hash_bytes(buf.data(), n, 3));
    ::close(fd);
  }
  return hex64(hash_words(parts, 0x1a4));
}

std::string int4_cache_root() {
  const char* x = std::getenv("XDG_CACHE_HOME");
  if (x && x[0] == '/') return std::string(x) + "/qflash";  // the XDG spec ignores relative paths
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/qflash";
  return (fs::temp_directory_path() / "qflash-cache").string();
}

std::string int4_cache_file_name(const Int4Spec& spec) {
  return strf("qflash-int4-g%d-head-%s.cache", spec.group, spec.lm_head_int4 ? "int4" : "bf16");
}

std::string int4_cache_path_beside(const std::string& dir, const Int4Spec& spec) {
  return (fs::path(dir) / int4_cache_file_name(spec)).string();
}

// One folder per checkpoint under the root: its folder name (for people) and a hash of its
// absolute path (two checkpoints with the same folder name do not share a cache).
std::string int4_cache_path_fallback(const std::string& dir, const Int4Spec& spec, const std::string& root) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  if (abs.empty()) abs = dir;
  const std::string a = abs.string();
  std::string name = abs.filename().string();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  if (name.empty() || name == "." || name == "..") name = "model";
  return (fs::path(root) / (name + "-" + hex64(hash_bytes(a.data(), a.size(), 4))) / int4_cache_file_name(spec)).string();
}

std::string int4_cache_problem(const std::string& path, const TensorStore& store, const Int4Spec& spec) {
  std::unique_ptr<SafetensorsFile> f;
  const std::string p = check_file(path, make_plan(store, spec), spec, int4_source_fingerprint(store, spec), &f);
  return p;
}

size_t int4_load_quantized_matrices() { return g_quantized.load(); }

// ---- Int4Cache ----------------------------------------------------------------------------------

Int4Cache::~Int4Cache() = default;

const Int4Cache::Matrix* Int4Cache::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

std::unique_ptr<Int4Cache> Int4Cache::open_or_build(const TensorStore& store, const Int4Spec& spec,
                                                    const std::string& root_arg) {
  if (!int4_group_supported(spec.group))
    fail(ErrorKind::Usage, "int4 group: expected 32, 64 or 128, found %d", spec.group);
  std::unique_ptr<Int4Cache> c(new Int4Cache());
  const std::vector<Planned> plan = make_plan(store, spec);
  c->status_.matrices = plan.size();
  if (plan.empty()) return c;
  const std::string fp = int4_source_fingerprint(store, spec);
  const std::string dir = source_dir(store);
  const std::string root = root_arg.empty() ? int4_cache_root() : root_arg;
  const std::string places[2] = {int4_cache_path_beside(dir, spec), int4_cache_path_fallback(dir, spec, root)};

  auto adopt = [&](std::unique_ptr<SafetensorsFile> f, const std::string& path) {
    std::map<std::string, const TensorInfo*> by;
    for (const TensorInfo& t : f->tensors()) by[t.name] = &t;
    for (const Planned& p : plan) {
      const auto ts = cache_tensors(p);
      Matrix m{by[ts[0].name], by[ts[1].name], by[ts[2].name]};
      QF_CHECK(m.q && m.scales && m.biases, "int4 cache %s lacks '%s'", path.c_str(), ts[0].name.c_str());
      c->by_name_[p.name] = m;
    }
    c->file_ = std::move(f);
    c->status_.path = path;
  };

  std::string rejected;
  for (const std::string& path : places) {
    std::unique_ptr<SafetensorsFile> f;
    const std::string problem = check_file(path, plan, spec, fp, &f);
    if (problem.empty()) {
      adopt(std::move(f), path);
      log_info("int4: %zu matrices from the cache %s", plan.size(), path.c_str());
      return c;
    }
    if (problem != kMissing) rejected += (rejected.empty() ? "" : "; ") + path + ": " + problem;
  }
  c->status_.rejected = rejected;
  if (!rejected.empty()) log_warn("int4 cache not used, rebuilding it: %s", rejected.c_str());

  size_t src_bytes = 0;
  for (const Planned& p : plan) src_bytes += p.src->nbytes;
  log_info("int4: quantizing %zu matrices of %s (%.2f GB; once, then cached)", plan.size(), dir.c_str(), src_bytes / 1e9);
  c->status_.built = true;
  for (const std::string& path : places) {
    Progress progress("quantizing to int4", src_bytes);
    try {
      fs::create_directories(fs::path(path).parent_path());
      write_cache(path, plan, spec, fp, progress);
      progress.done();
      adopt(SafetensorsFile::open(path), path);
      log_info("int4: cache written to %s", path.c_str());
      return c;
    } catch (const std::exception& e) {
      progress.done();
      log_info("int4: cannot write the cache at %s: %s", path.c_str(), e.what());
    }
  }
  // Neither place can be written: keep the quantized matrices in memory for this process.
  log_warn("int4: no cache could be written (beside %s or under %s); the next load quantizes again", dir.c_str(),
           root.c_str());
  c->mem_.reserve(3 * plan.size());
  for (const Planned& p : plan) {
    const size_t first = c->mem_.size();
    for (const CacheTensor& t : cache_tensors(p)) {
      c->mem_bytes_.emplace_back(t.bytes);  // operator new storage: aligned for u32 / u16 access
      c->mem_.push_back({t.name, t.dtype, t.shape, c->mem_bytes_.back().data(), t.bytes, "(memory)"});
    }
    int4_quantize_matrix(p.src->data, p.src->dtype, p.rows, p.cols, spec.group,
                         reinterpret_cast<uint32_t*>(c->mem_bytes_[first].data()),
                         reinterpret_cast<uint16_t*>(c->mem_bytes_[first + 1].data()),
                         reinterpret_cast<uint16_t*>(c->mem_bytes_[first + 2].data()));
    g_quantized++;
  }
  for (size_t i = 0; i < plan.size(); i++)
    c->by_name_[plan[i].name] = {&c->mem_[3 * i], &c->mem_[3 * i + 1], &c->mem_[3 * i + 2]};
  return c;
}

}  // namespace qf
