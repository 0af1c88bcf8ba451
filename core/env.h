// Env: every byte Tessera reads or writes goes through one of these, so the
// same code runs on the real file system (PosixEnv), in memory (MemEnv) and
// under injected faults (FaultInjectionEnv), as in leveldb.
#ifndef TESSERA_CORE_ENV_H_
#define TESSERA_CORE_ENV_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tessera {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(const void* data, size_t size) = 0;
  // Writes `size` bytes at `offset` (pwrite), growing the file as needed;
  // for formats whose layout is fixed before the data arrives (safetensors,
  // MindSpore .ckpt). Thread-safe with other WriteAt calls; not to be mixed
  // with concurrent Appends.
  virtual Status WriteAt(uint64_t offset, const void* data, size_t size) = 0;
  // Makes the file `size` bytes long (never shorter), its blocks allocated
  // now where the file system can (fallocate), so that writers filling it
  // at planned offsets do not allocate piecemeal; the new bytes read as
  // zeros. By default the last byte is written.
  virtual Status Preallocate(uint64_t size) {
    if (size == 0) return Status::Ok();
    const char zero = 0;
    return WriteAt(size - 1, &zero, 1);
  }
  // A hint: hands what was written so far to the disk without waiting
  // for it, so that a later Sync has less to wait for. Errors surface in
  // Sync.
  virtual void StartWriteback() {}
  // Makes everything appended so far durable.
  virtual Status Sync() = 0;
  virtual Status Close() = 0;
};

// Bytes of a file lent without a copy (a read-only mapping of the page
// cache); valid until the view is destroyed, also after the file that lent
// it is closed (readers close files they have not used lately).
class FileView {
 public:
  virtual ~FileView() = default;
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 protected:
  FileView(const char* data, size_t size) : data_(data), size_(size) {}

 private:
  const char* data_;
  size_t size_;
};

// Readers lend (map) byte runs at least this long; shorter ones cost less
// to copy than a mapping and its unmapping do.
inline constexpr uint64_t kViewAtLeast = 64 << 10;

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads exactly `size` bytes at `offset` into `dst` (pread); a file that
  // ends early is a DataLoss error naming the file and the range.
  virtual Status Read(uint64_t offset, size_t size, void* dst) const = 0;
  virtual Result<uint64_t> Size() const = 0;
  // `size` bytes at `offset` without copying them (PosixEnv maps them), or
  // null when this file cannot lend its bytes (then Read them). A range past
  // the end of the file is a DataLoss error, as for Read. The file must not
  // shrink while a view of it lives (a committed checkpoint never does).
  virtual Result<std::unique_ptr<FileView>> View(uint64_t /*offset*/, size_t /*size*/) const {
    return std::unique_ptr<FileView>();
  }
};

// A part of another view (which it keeps alive).
class SubView : public FileView {
 public:
  SubView(std::unique_ptr<FileView> whole, size_t offset, size_t size)
      : FileView(whole->data() + offset, size), whole_(std::move(whole)) {}

 private:
  std::unique_ptr<FileView> whole_;
};

class Env {
 public:
  virtual ~Env() = default;

  // The process-wide POSIX environment.
  static Env* Default();

  // Creates or truncates `path`.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Opens the existing `path` for WriteAt, keeping its bytes: for a file
  // several writers fill at planned offsets (a merged save's data file,
  // written by every rank), one of them having created it.
  virtual Result<std::unique_ptr<WritableFile>> OpenWritableFile(const std::string& path) = 0;
  virtual Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  virtual Result<uint64_t> GetFileSize(const std::string& path) = 0;
  // Atomically replaces `to` with `from`.
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual Status DeleteFile(const std::string& path) = 0;
  // mkdir -p.
  virtual Status CreateDirs(const std::string& path) = 0;
  // Removes an empty directory.
  virtual Status DeleteDir(const std::string& path) = 0;
  // Names (not paths) of the entries of `dir`, sorted.
  virtual Result<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  // Makes the directory's entries (creations, renames) durable.
  virtual Status SyncDir(const std::string& dir) = 0;
};

// Raises this process's soft limit on open files to its hard limit (best
// effort), for tools about to write a data file per destination rank of a
// reshard to thousands of ranks: the soft limit is often 1,024 while the
// hard one is far higher. The ckpt binary calls it at start; a library
// call never does (the native writer parks files beyond its share of the
// limit instead, so a library caller under a low limit still succeeds).
void RaiseOpenFileLimit();

// "a/b/c" -> "a/b"; "c" -> ".".
std::string Dirname(std::string_view path);
// Joins with exactly one '/'.
std::string JoinPath(std::string_view a, std::string_view b);

Result<std::string> ReadFileToString(Env* env, const std::string& path);
// The commit primitive: writes `data` to "<path>.tmp", syncs it, renames it
// over `path`, syncs the directory. Readers see the old file or the new one,
// never a mix, and after a crash the old one survives unless the rename was
// made durable.
Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data);
// The same for a file made of several byte ranges, written in order without
// first joining them (a header and large tensors).
Status WriteFileAtomically(Env* env, const std::string& path,
                           std::span<const std::string_view> parts);
// Deletes a directory tree (files and sub-directories).
Status DeleteRecursively(Env* env, const std::string& path);

// All files in memory; for fast tests. Thread-safe.
std::unique_ptr<Env> NewMemEnv();

// Forwards every call to another Env: the base of Envs that change a few
// (leveldb's EnvWrapper).
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* base) : base_(base) {}

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return base_->NewWritableFile(path);
  }
  Result<std::unique_ptr<WritableFile>> OpenWritableFile(const std::string& path) override {
    return base_->OpenWritableFile(path);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    return base_->NewRandomAccessFile(path);
  }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  Result<uint64_t> GetFileSize(const std::string& path) override {
    return base_->GetFileSize(path);
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    return base_->RenameFile(from, to);
  }
  Status DeleteFile(const std::string& path) override { return base_->DeleteFile(path); }
  Status CreateDirs(const std::string& path) override { return base_->CreateDirs(path); }
  Status DeleteDir(const std::string& path) override { return base_->DeleteDir(path); }
  Result<std::vector<std::string>> GetChildren(const std::string& dir) override {
    return base_->GetChildren(dir);
  }
  bool IsDirectory(const std::string& path) override { return base_->IsDirectory(path); }
  Status SyncDir(const std::string& dir) override { return base_->SyncDir(dir); }

 protected:
  Env* base_;
};

// Wraps another Env and remembers what was made durable, so a test can
// simulate a power loss or kill -9 at any point (leveldb's FaultInjectionTestEnv
// idea). Not for production.
class FaultInjectionEnv : public EnvWrapper {
 public:
  explicit FaultInjectionEnv(Env* base) : EnvWrapper(base) {}

  // The n-th Append from now on (1-based) fails with an IOError, and so do
  // all later ones while `sticky`; n == 0 disables the fault.
  void FailNthWrite(int64_t n, bool sticky = false);
  int64_t writes_seen() const;

  // Puts the file system in the state a crash at this instant would leave:
  // data appended after a file's last Sync() is dropped, files created in a
  // directory that was not synced since are deleted, and renames whose
  // directory was not synced are undone.
  Status SimulateCrash();

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> OpenWritableFile(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status DeleteFile(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;

 private:
  friend class FaultWritableFile;
  Status BeforeWrite();
  void OnSynced(const std::string& path, uint64_t size);
  void MoveTrackedLocked(const std::string& from, const std::string& to);

  struct PendingRename {
    std::string from, to;
    bool had_old_to = false;
    std::string old_to_contents;
  };

  mutable std::mutex mu_;
  int64_t writes_ = 0;
  int64_t fail_at_ = 0;
  bool sticky_ = false;
  std::map<std::string, uint64_t> synced_size_;  // tracked files by current name
  std::set<std::string> new_files_;              // created, directory not synced
  std::vector<PendingRename> pending_renames_;
};

}  // namespace tessera

#endif  // TESSERA_CORE_ENV_H_
