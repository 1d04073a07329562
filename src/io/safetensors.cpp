// safetensors layout: [u64 little-endian header length N][N bytes of JSON][data section].
// The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} with offsets
// relative to the data section, plus an optional "__metadata__" string map.
#include "io/safetensors.h"

#include <algorithm>
#include <cstdarg>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/mmap.h"

namespace qf {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Real headers are tens of KB (8,928 bytes for the 27B drafter, ~100 KB for 1,200-tensor
// checkpoints); 100 MB is far above that and still cheap to reject before parsing.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// A tensor entry nests 3 deep ({name: {shape: [...]}}); anything much deeper is garbage, and
// rejecting it up front keeps a hostile header from driving deep recursion anywhere.
constexpr int kMaxJsonDepth = 16;

[[noreturn]] void format_error(const std::string& path, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
void format_error(const std::string& path, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string msg = vstrf(fmt, ap);
  va_end(ap);
  throw Error(ErrorKind::Format, "safetensors " + path + ": " + msg);
}

// Deepest bracket nesting outside string literals.
int json_depth(const char* p, size_t n) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < n; ++i) {
    char c = p[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

std::string json_short(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// A non-negative JSON integer; `what` names the field in errors.
uint64_t get_u64(const json& v, const std::string& path, const std::string& name,
                 const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer())
    format_error(path, "tensor '%s': %s must be non-negative, found %s", name.c_str(), what,
                 json_short(v).c_str());
  format_error(path, "tensor '%s': %s must be an integer, found %s", name.c_str(), what,
               json_short(v).c_str());
}

// `wildcard`: print negative entries as "*" (require()'s any-size marker).
std::string shape_string(const std::vector<int64_t>& shape, bool wildcard = false) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += wildcard && shape[i] < 0 ? std::string("*") : std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const { return shape_string(shape); }

std::vector<TensorInfo> SafetensorsFile::parse(const uint8_t* data, size_t file_size,
                                               const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
  if (file_size < 8)
    format_error(path, "file is %zu bytes, too small for the 8-byte header length", file_size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > file_size - 8)
    format_error(path, "header length %llu exceeds file size - 8 = %zu",
                 static_cast<unsigned long long>(header_len), file_size - 8);
  if (header_len > kMaxHeaderBytes)
    format_error(path, "header length %llu exceeds the %llu-byte limit",
                 static_cast<unsigned long long>(header_len),
                 static_cast<unsigned long long>(kMaxHeaderBytes));
  const char* hdr = reinterpret_cast<const char*>(data + 8);
  const uint64_t data_size = file_size - 8 - header_len;
  const uint8_t* data_start = data + 8 + header_len;

  int depth = json_depth(hdr, header_len);
  if (depth > kMaxJsonDepth)
    format_error(path, "header JSON nests %d deep, expected at most %d", depth, kMaxJsonDepth);

  // nlohmann keeps the last of duplicate keys silently; a duplicated tensor name would hide a
  // tensor from the overlap check, so catch it while parsing.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int d, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && d == 1 && parsed.is_string()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json root = json::parse(hdr, hdr + header_len, on_event, /*allow_exceptions=*/false);
  if (root.is_discarded()) format_error(path, "header (%llu bytes) is not valid JSON",
                                        static_cast<unsigned long long>(header_len));
  if (!root.is_object())
    format_error(path, "header must be a JSON object, found %s", root.type_name());
  if (!duplicate.empty()) format_error(path, "tensor '%s' appears twice in the header",
                                       duplicate.c_str());

  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<TensorInfo> out;
  std::vector<Range> ranges;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object())
        format_error(path, "__metadata__ must be an object, found %s", e.type_name());
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string())
          format_error(path, "__metadata__ value '%s' must be a string, found %s",
                       m.key().c_str(), m.value().type_name());
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!e.is_object())
      format_error(path, "tensor '%s': entry must be an object, found %s", name.c_str(),
                   e.type_name());
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!e.contains(key)) format_error(path, "tensor '%s': missing '%s'", name.c_str(), key);

    TensorInfo t;
    t.name = name;
    t.file = path;
    const json& jd = e["dtype"];
    if (!jd.is_string())
      format_error(path, "tensor '%s': dtype must be a string, found %s", name.c_str(),
                   json_short(jd).c_str());
    if (!dtype_from_name(jd.get<std::string>(), &t.dtype))
      format_error(path, "tensor '%s': unknown dtype '%s' (expected BF16, F16, F32, U32, U8, "
                   "I32, I64 or F64)", name.c_str(), jd.get<std::string>().c_str());

    const json& js = e["shape"];
    if (!js.is_array())
      format_error(path, "tensor '%s': shape must be an array, found %s", name.c_str(),
                   json_short(js).c_str());
    uint64_t numel = 1;
    for (const json& d : js) {
      uint64_t dim = get_u64(d, path, name, "shape entry");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel, dim, &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        format_error(path, "tensor '%s': shape %s overflows the element count", name.c_str(),
                     json_short(js).c_str());
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &nbytes))
      format_error(path, "tensor '%s': shape %s x %s overflows the byte count", name.c_str(),
                   t.shape_str().c_str(), dtype_name(t.dtype));

    const json& jo = e["data_offsets"];
    if (!jo.is_array() || jo.size() != 2)
      format_error(path, "tensor '%s': data_offsets must be [begin, end], found %s",
                   name.c_str(), json_short(jo).c_str());
    uint64_t begin = get_u64(jo[0], path, name, "data_offsets[0]");
    uint64_t end = get_u64(jo[1], path, name, "data_offsets[1]");
    if (begin > end)
      format_error(path, "tensor '%s': data_offsets [%llu, %llu] has begin > end", name.c_str(),
                   static_cast<unsigned long long>(begin), static_cast<unsigned long long>(end));
    if (end - begin != nbytes)
      format_error(path, "tensor '%s': data_offsets [%llu, %llu] span %llu bytes, expected %llu "
                   "(shape %s x %s)", name.c_str(), static_cast<unsigned long long>(begin),
                   static_cast<unsigned long long>(end),
                   static_cast<unsigned long long>(end - begin),
                   static_cast<unsigned long long>(nbytes), t.shape_str().c_str(),
                   dtype_name(t.dtype));
    if (end > data_size)
      format_error(path, "tensor '%s': data_offsets end %llu is past the data section (%llu "
                   "bytes)", name.c_str(), static_cast<unsigned long long>(end),
                   static_cast<unsigned long long>(data_size));
    t.data = data_start + begin;
    t.nbytes = static_cast<size_t>(nbytes);
    ranges.push_back({begin, end, out.size()});
    out.push_back(std::move(t));
  }

  // Empty tensors occupy no bytes, so they cannot overlap anything.
  std::erase_if(ranges, [](const Range& r) { return r.begin == r.end; });
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range& a = ranges[i - 1];
    const Range& b = ranges[i];
    if (b.begin < a.end)
      format_error(path, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                   out[a.index].name.c_str(), static_cast<unsigned long long>(a.begin),
                   static_cast<unsigned long long>(a.end), out[b.index].name.c_str(),
                   static_cast<unsigned long long>(b.begin),
                   static_cast<unsigned long long>(b.end));
  }
  return out;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  f->tensors_ = parse(f->map_->data(), f->map_->size(), path, &f->metadata_);
  return f;
}

SafetensorsFile::~SafetensorsFile() = default;

// ---- TensorStore ------------------------------------------------------------------------

namespace {

void add_file(std::vector<std::unique_ptr<SafetensorsFile>>& files,
              std::map<std::string, const TensorInfo*>& by_name,
              std::unique_ptr<SafetensorsFile> f) {
  for (const TensorInfo& t : f->tensors()) {
    auto [it, inserted] = by_name.emplace(t.name, &t);
    if (!inserted)
      fail(ErrorKind::Format, "tensor '%s' appears in both %s and %s", t.name.c_str(),
           it->second->file.c_str(), t.file.c_str());
  }
  files.push_back(std::move(f));
}

}  // namespace

TensorStore TensorStore::open_dir(const std::string& dir_arg) {
  std::string dir = dir_arg;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();  // "ckpt/" names files "ckpt/x"
  TensorStore store;
  store.dir_ = dir;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {  // a single .safetensors file given directly
    add_file(store.files_, store.by_name_, SafetensorsFile::open(dir));
    return store;
  }
  if (!fs::is_directory(dir, ec))
    fail(ErrorKind::Io, "checkpoint folder %s does not exist or is not a folder", dir.c_str());

  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single_path = dir + "/model.safetensors";
  if (fs::exists(index_path, ec)) {
    json idx = json::parse(read_text_file(index_path), nullptr, /*allow_exceptions=*/false);
    if (idx.is_discarded() || !idx.is_object())
      fail(ErrorKind::Format, "index %s is not a JSON object", index_path.c_str());
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail(ErrorKind::Format, "index %s has no 'weight_map' object", index_path.c_str());
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        fail(ErrorKind::Format, "index %s: weight_map['%s'] must be a shard file name, found %s",
             index_path.c_str(), it.key().c_str(), json_short(it.value()).c_str());
      const std::string shard = it.value().get<std::string>();
      // Shards live beside the index; a path component could point anywhere on disk.
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        fail(ErrorKind::Format, "index %s: shard name '%s' for tensor '%s' is not a plain file "
             "name", index_path.c_str(), shard.c_str(), it.key().c_str());
      by_shard[shard].push_back(it.key());
    }
    if (by_shard.empty())
      fail(ErrorKind::Format, "index %s: weight_map is empty", index_path.c_str());
    for (const auto& [shard, names] : by_shard) {
      const std::string shard_path = dir + "/" + shard;
      if (!fs::is_regular_file(shard_path, ec))
        fail(ErrorKind::Io, "index %s lists shard '%s' (for tensor '%s'), but %s does not exist",
             index_path.c_str(), shard.c_str(), names.front().c_str(), shard_path.c_str());
      auto f = SafetensorsFile::open(shard_path);
      for (const std::string& n : names) {
        bool found = std::any_of(f->tensors().begin(), f->tensors().end(),
                                 [&](const TensorInfo& t) { return t.name == n; });
        if (!found)
          fail(ErrorKind::Format, "index %s maps tensor '%s' to shard '%s', but %s does not "
               "contain it (%zu tensors)", index_path.c_str(), n.c_str(), shard.c_str(),
               shard_path.c_str(), f->tensors().size());
      }
      add_file(store.files_, store.by_name_, std::move(f));
    }
  } else if (fs::exists(single_path, ec)) {
    add_file(store.files_, store.by_name_, SafetensorsFile::open(single_path));
  } else {
    std::vector<std::string> paths;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.size() > 12 && name.ends_with(".safetensors") && entry.is_regular_file(ec))
        paths.push_back(entry.path().string());
    }
    if (ec) fail(ErrorKind::Io, "cannot list %s: %s", dir.c_str(), ec.message().c_str());
    if (paths.empty())
      fail(ErrorKind::Io, "no model.safetensors, model.safetensors.index.json or *.safetensors "
           "in %s", dir.c_str());
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) add_file(store.files_, store.by_name_, SafetensorsFile::open(p));
  }
  return store;
}

const TensorInfo* TensorStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& TensorStore::require(const std::string& name, const std::vector<DType>& dtypes,
                                       const std::vector<int64_t>& shape) const {
  const TensorInfo* t = find(name);
  if (!t)
    fail(ErrorKind::Tensor, "tensor '%s' not found in %s (%zu tensors)", name.c_str(),
         dir_.c_str(), by_name_.size());
  if (!dtypes.empty() && std::find(dtypes.begin(), dtypes.end(), t->dtype) == dtypes.end()) {
    std::string want;
    for (size_t i = 0; i < dtypes.size(); ++i)
      want += std::string(i == 0 ? "" : i + 1 == dtypes.size() ? " or " : ", ") +
              dtype_name(dtypes[i]);
    fail(ErrorKind::Tensor, "tensor '%s' in %s: dtype %s, expected %s", name.c_str(),
         t->file.c_str(), dtype_name(t->dtype), want.c_str());
  }
  bool shape_ok = shape.size() == t->shape.size();
  for (size_t i = 0; shape_ok && i < shape.size(); ++i)
    shape_ok = shape[i] < 0 || shape[i] == t->shape[i];
  if (!shape_ok)
    fail(ErrorKind::Tensor, "tensor '%s' in %s: shape %s, expected %s", name.c_str(),
         t->file.c_str(), t->shape_str().c_str(), shape_string(shape, true).c_str());
  return *t;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& kv : by_name_) out.push_back(kv.first);
  return out;
}

size_t TensorStore::total_bytes() const {
  size_t n = 0;
  for (const auto& kv : by_name_) n += kv.second->nbytes;
  return n;
}

// ---- writing ----------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });

  // Validate everything before the temp file exists, so bad input leaves nothing behind.
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorToWrite& t = *sorted[i];
    if (t.name.empty() || t.name == "__metadata__")
      fail(ErrorKind::Tensor, "writing %s: invalid tensor name '%s'", path.c_str(), t.name.c_str());
    if (i > 0 && sorted[i - 1]->name == t.name)
      fail(ErrorKind::Tensor, "writing %s: tensor '%s' given twice", path.c_str(), t.name.c_str());
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape)
      if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
        fail(ErrorKind::Tensor, "writing %s: tensor '%s' has invalid shape %s", path.c_str(),
             t.name.c_str(), shape_string(t.shape).c_str());
    if (n > 0 && !t.data)
      fail(ErrorKind::Tensor, "writing %s: tensor '%s' has no data", path.c_str(), t.name.c_str());
    sizes.push_back(n);
  }

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    header[sorted[i]->name] = {{"dtype", dtype_name(sorted[i]->dtype)},
                               {"shape", sorted[i]->shape},
                               {"data_offsets", {offset, offset + sizes[i]}}};
    offset += sizes[i];
  }
  std::string text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  const uint64_t text_len = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text_len >> (8 * i));

  AtomicFile out(path);
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (size_t i = 0; i < sorted.size(); ++i)
    if (sizes[i]) out.write(sorted[i]->data, sizes[i]);
  out.commit();
}

}  // namespace qf
