// The POSIX Env: open/pread/write/fsync/rename.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/env.h"

namespace tessera {
namespace {

Status PosixError(const std::string& what, const std::string& path, int err) {
  std::string msg = what + " '" + path + "': " + std::strerror(err);
  if (err == ENOENT) return NotFoundError(std::move(msg));
  return IOError(std::move(msg));
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Append(const void* data, size_t size) override {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = ::write(fd_, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("write", path_, errno);
      }
      p += n;
      size -= static_cast<size_t>(n);
      Wrote(static_cast<uint64_t>(n));
    }
    return Status::Ok();
  }
  Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("write", path_, errno);
      }
      p += n;
      offset += static_cast<uint64_t>(n);
      size -= static_cast<size_t>(n);
      Wrote(static_cast<uint64_t>(n), offset);  // offset: already past this write
    }
    return Status::Ok();
  }
  Status Preallocate(uint64_t size) override {
    const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(size));
    if (rc == 0) return Status::Ok();
    if (rc == EOPNOTSUPP || rc == EINVAL)
      return WritableFile::Preallocate(size);  // e.g. tmpfs quirks
    return PosixError("fallocate", path_, rc);
  }
  void StartWriteback() override {
    unsynced_.store(0, std::memory_order_relaxed);
    (void)::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
  }
  Status Sync() override {
    if (::fdatasync(fd_) != 0) return PosixError("fdatasync", path_, errno);
    return Status::Ok();
  }
  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return PosixError("close", path_, errno);
    return Status::Ok();
  }

 private:
  // Every kWritebackBytes written, the file's dirty pages are handed to the
  // disk (sync_file_range, which does not wait): the disk writes while we
  // copy, instead of all of it in Sync at the end, and dirty pages never
  // pile up to the kernel's throttling limits (RocksDB's bytes_per_sync).
  // A hint: its errors surface in Sync.
  static constexpr uint64_t kWritebackBytes = uint64_t{16} << 20;
  // Positional writes (`end`: where the write ended) hand over the range
  // before `end` that this handle wrote since, not the whole file: a file
  // several writers fill at once (a merged save's) would otherwise have
  // every writer start the writeback of everyone's pages, and wait on it
  // (measured: a 1.4 GiB merged save's writes took 0.6-3 s instead of 0.6).
  void Wrote(uint64_t n, uint64_t end = 0) {
    const uint64_t unsynced = unsynced_.fetch_add(n, std::memory_order_relaxed) + n;
    if (unsynced < kWritebackBytes) return;
    unsynced_.store(0, std::memory_order_relaxed);
    if (end == 0) {
      (void)::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
    } else {
      const uint64_t from = end > unsynced ? end - unsynced : 0;
      (void)::sync_file_range(fd_, static_cast<off_t>(from), static_cast<off_t>(end - from),
                              SYNC_FILE_RANGE_WRITE);
    }
  }
  std::string path_;
  int fd_;
  std::atomic<uint64_t> unsynced_{0};
};

class PosixRandomAccessFile : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }
  Status Read(uint64_t offset, size_t size, void* dst) const override {
    char* p = static_cast<char*>(dst);
    uint64_t off = offset;
    size_t left = size;
    while (left > 0) {
      ssize_t n = ::pread(fd_, p, left, static_cast<off_t>(off));
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("pread", path_, errno);
      }
      if (n == 0) {
        return DataLossError("file '" + path_ + "': read of " + std::to_string(size) +
                             " bytes at offset " + std::to_string(offset) +
                             " ends early at offset " + std::to_string(off) + " (file truncated?)");
      }
      p += n;
      off += static_cast<uint64_t>(n);
      left -= static_cast<size_t>(n);
    }
    return Status::Ok();
  }
  Result<uint64_t> Size() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return PosixError("fstat", path_, errno);
    return static_cast<uint64_t>(st.st_size);
  }
  Result<std::unique_ptr<FileView>> View(uint64_t offset, size_t size) const override {
    ASSIGN_OR_RETURN(const uint64_t file_size, Size());
    if (offset > file_size || size > file_size - offset) {
      return DataLossError("file '" + path_ + "': read of " + std::to_string(size) +
                           " bytes at offset " + std::to_string(offset) + " ends past its " +
                           std::to_string(file_size) + " bytes (file truncated?)");
    }
    if (size == 0) return std::unique_ptr<FileView>();
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t start = offset / page * page;
    const size_t length = static_cast<size_t>(offset + size - start);
    // Populated at once: every byte of a view is read (checksums), and one
    // call maps the pages already in the page cache far cheaper than a
    // fault per few pages.
    void* base = ::mmap(nullptr, length, PROT_READ, MAP_SHARED | MAP_POPULATE, fd_,
                        static_cast<off_t>(start));
    if (base == MAP_FAILED) return std::unique_ptr<FileView>();  // Read instead
    return std::unique_ptr<FileView>(
        new Mapping(static_cast<char*>(base), length, static_cast<size_t>(offset - start), size));
  }

 private:
  class Mapping : public FileView {
   public:
    Mapping(char* base, size_t length, size_t skip, size_t size)
        : FileView(base + skip, size), base_(base), length_(length) {}
    ~Mapping() override { ::munmap(base_, length_); }

   private:
    char* base_;
    size_t length_;
  };
  std::string path_;
  int fd_;
};

class PosixEnv : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("open", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }
  Result<std::unique_ptr<WritableFile>> OpenWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path, errno);
    return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(path, fd));
  }
  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }
  Result<uint64_t> GetFileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("stat", path, errno);
    return static_cast<uint64_t>(st.st_size);
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError("rename to '" + to + "' of", from, errno);
    }
    return Status::Ok();
  }
  Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("unlink", path, errno);
    return Status::Ok();
  }
  Status CreateDirs(const std::string& path) override {
    if (path.empty() || IsDirectory(path)) return Status::Ok();
    const std::string parent = Dirname(path);
    if (parent != path) RETURN_IF_ERROR(CreateDirs(parent));
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return PosixError("mkdir", path, errno);
    }
    return Status::Ok();
  }
  Status DeleteDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return PosixError("rmdir", path, errno);
    return Status::Ok();
  }
  Result<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError("opendir", dir, errno);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }
  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }
  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PosixError("open directory", dir, errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return PosixError("fsync directory", dir, err);
    return Status::Ok();
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv* env = new PosixEnv();
  return env;
}

void RaiseOpenFileLimit() {
  struct rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);  // the old limit stays if refused
  }
}

}  // namespace tessera
