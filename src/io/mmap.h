// Read-only memory map of a whole file (RAII). Checkpoint tensors point straight into the map,
// so the map must outlive every TensorInfo that refers to it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace qf {

class MappedFile {
 public:
  // Maps `path` read-only; throws qf::Error(Io) naming the path and the OS error.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace qf
