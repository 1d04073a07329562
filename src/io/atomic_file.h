// Crash-safe file writing: data goes to `<path>.tmp.<pid>` in the same folder, is fsynced and
// then renamed over `path`, so readers see either the old file or the complete new one. The
// temp file is removed on any failure (and when the writer is destroyed uncommitted).
#pragma once
#include <cstddef>
#include <string>

namespace qf {

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);  // Io error naming the temp path
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);  // Io error naming the temp path
  // Overwrites bytes already written at `offset` (a field patched once its value is known).
  void write_at(size_t offset, const void* data, size_t n);
  void commit();                           // fsync, rename; Io error naming both paths
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace qf
