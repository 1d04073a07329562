// safetensors reading (mmap, single file and sharded index) and atomic writing.
// Everything in a header is validated before any tensor is used: header length vs file size,
// JSON syntax, dtype names, shape x dtype size == byte range, ranges inside the data section,
// no overlaps. Failures are qf::Error(Format/Io/Tensor) naming the file and the tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qf {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mmap; not necessarily aligned to the dtype
  size_t nbytes = 0;
  std::string file;               // path of the file holding it
  int64_t numel() const;
  std::string shape_str() const;  // "[248320, 5120]"
};

class MappedFile;  // RAII mmap (read-only)

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Parse and validate a header from memory (used by the fuzz test); `file_size` is the whole
  // file's size. Throws on any problem; never reads outside [data, data+file_size).
  static std::vector<TensorInfo> parse(const uint8_t* data, size_t file_size, const std::string& path,
                                       std::map<std::string, std::string>* metadata);
  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  ~SafetensorsFile();

 private:
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint folder: model.safetensors, or model.safetensors.index.json with
// its shards, or (fallback) every *.safetensors in the folder. Duplicate names are an error.
class TensorStore {
 public:
  // `dir` may also name a single .safetensors file.
  static TensorStore open_dir(const std::string& dir);
  const TensorInfo* find(const std::string& name) const;
  // Fetch by name with expected dtype(s) and shape; a missing or misshapen tensor is a
  // qf::Error(Tensor) naming the tensor, the file, the expected and the found shape/dtype.
  // An empty `dtypes` accepts any dtype; a negative entry in `shape` matches any size there
  // (so {} means a scalar, not "any shape").
  const TensorInfo& require(const std::string& name, const std::vector<DType>& dtypes,
                            const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;
  size_t size() const { return by_name_.size(); }
  size_t total_bytes() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> by_name_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // numel * dtype_size bytes
};

// Writes a safetensors file atomically: temp file in the same folder, fsync, rename.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Atomic text write (temp, fsync, rename); used for config.json and caches.
void write_file_atomic(const std::string& path, const std::string& contents);
std::string read_text_file(const std::string& path);  // Io error naming the path

}  // namespace qf
