// Heterogeneous storage for optimizer states (ZeRO-Infinity's NVMe offload,
// MindSpore's offload to disk): a rank's Adam moments live in a file on a
// local disk, not in its memory, and the update streams them through a few
// buckets: while bucket i updates, bucket i + 1 is read and bucket i - 1
// written back, each on its own I/O thread. At most kResidentBuckets
// buckets of m and v are in memory; after each pass the written pages are
// synced and dropped from the page cache (posix_fadvise DONTNEED), so the
// memory really is freed and the next pass reads the disk.
//
// The file is scratch: created afresh (truncated, preallocated, zero) when
// a job starts and deleted when it ends. State survives only through
// checkpoints, so no file left by a killed run is ever read as current.
#ifndef TESSERA_RUNTIME_TRAIN_OFFLOAD_H_
#define TESSERA_RUNTIME_TRAIN_OFFLOAD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera {

class OffloadedMoments {
 public:
  // Buckets in memory at once: the one updating, the next being read, the
  // last being written.
  static constexpr int kResidentBuckets = 3;

  // `floats` moments of each of m and v in DIR/adam.rank<R>.bin, streamed
  // in buckets of `bucket_floats`. Errors name the path and, when the disk
  // lacks room, the bytes needed.
  static Result<std::unique_ptr<OffloadedMoments>> Create(const std::string& dir, int rank,
                                                          int64_t floats, int64_t bucket_floats);
  ~OffloadedMoments();
  OffloadedMoments(const OffloadedMoments&) = delete;
  OffloadedMoments& operator=(const OffloadedMoments&) = delete;

  int64_t floats() const { return floats_; }
  int64_t bucket_floats() const { return bucket_; }
  const std::string& path() const { return path_; }
  // Bytes held in memory: the buckets' buffers.
  int64_t resident_bytes() const;
  // Bytes read from and written to the file so far.
  int64_t bytes_read() const { return bytes_read_.load(); }
  int64_t bytes_written() const { return bytes_written_.load(); }

  // Every bucket in order: `update(begin, n, m, v)` gets moments [begin,
  // begin + n) of m and v to change in place; they are written back.
  // `from_zero`: the moments are taken as zero, not read (a fresh start).
  Status Stream(const std::function<void(int64_t begin, int64_t n, float* m, float* v)>& update,
                bool from_zero = false);
  // Moments [begin, begin + n) of m and v to or from memory (loading and
  // saving a checkpoint).
  Status Read(int64_t begin, int64_t n, float* m, float* v);
  Status Write(int64_t begin, int64_t n, const float* m, const float* v);
  // Sets every moment to zero.
  Status Zero();

 private:
  OffloadedMoments(std::string path, int fd, int64_t floats, int64_t bucket);
  Status ReadRange(int64_t begin, int64_t n, float* m, float* v);
  Status WriteRange(int64_t begin, int64_t n, const float* m, const float* v);
  // Writes out and drops the file's pages from the page cache.
  Status DropCache();

  std::string path_;
  int fd_ = -1;
  int64_t floats_ = 0, bucket_ = 0;
  std::vector<float> buf_[kResidentBuckets];               // m then v, bucket_ each
  std::atomic<int64_t> bytes_read_{0}, bytes_written_{0};  // from the I/O threads
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TRAIN_OFFLOAD_H_
