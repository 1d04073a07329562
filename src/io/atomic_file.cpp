#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/safetensors.h"

namespace qf {

AtomicFile::AtomicFile(const std::string& path)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail(ErrorKind::Io, "cannot create %s (writing %s): %s", tmp_.c_str(), path_.c_str(),
         std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // write() may be partial (large tensors, signals); loop until everything is out.
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(ErrorKind::Io, "write to %s failed: %s", tmp_.c_str(), std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::write_at(size_t offset, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(ErrorKind::Io, "write to %s at offset %zu failed: %s", tmp_.c_str(), offset, std::strerror(errno));
    }
    p += w;
    offset += static_cast<size_t>(w);
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0)
    fail(ErrorKind::Io, "fsync of %s failed: %s", tmp_.c_str(), std::strerror(errno));
  int fd = fd_;
  fd_ = -1;
  // close() can report a deferred write error (NFS, quota), so it is checked too.
  if (::close(fd) != 0)
    fail(ErrorKind::Io, "close of %s failed: %s", tmp_.c_str(), std::strerror(errno));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail(ErrorKind::Io, "cannot rename %s to %s: %s", tmp_.c_str(), path_.c_str(),
         std::strerror(errno));
  committed_ = true;
  // Persist the rename itself; best effort, the data is already safe in the file.
  size_t slash = path_.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.write(contents.data(), contents.size());
  f.commit();
}

std::string read_text_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::Io, "cannot open %s: %s", path.c_str(), std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      fail(ErrorKind::Io, "cannot read %s: %s", path.c_str(), std::strerror(e));
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

}  // namespace qf
