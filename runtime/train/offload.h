// Heterogeneous storage for optimizer states (ZeRO-Infinity's NVMe offload,
// MindSpore's offload to disk): a rank's Adam moments live in a file on a
// local disk, not in its memory, and the update streams them through a few
// buckets: while bucket i updates, bucket i + 1 is read and bucket i - 1
// written back, each on its own I/O thread. At most kResidentBuckets
// buckets of m and v are in memory.
//
// Parameter offload (ZeRO-Infinity's offload_param): a stage's weights live
// in a file too, cut into units (the parameters outside the blocks, then
// each block); only the unit being computed and the next one are in memory
// (OffloadedWeights below).
//
// The files are read and written with direct I/O (O_DIRECT: aligned
// transfers that bypass the page cache, so the memory really is freed and
// every pass reads the disk). Where the filesystem refuses O_DIRECT
// (tmpfs), they are read and written through the page cache and their pages
// synced and dropped (posix_fadvise DONTNEED) after each pass instead.
//
// The files are scratch: created afresh (truncated, preallocated, zero)
// when a job starts and deleted when it ends. State survives only through
// checkpoints, so no file left by a killed run is ever read as current.
#ifndef TESSERA_RUNTIME_TRAIN_OFFLOAD_H_
#define TESSERA_RUNTIME_TRAIN_OFFLOAD_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera {

// A scratch file of aligned transfers (offload.cc): direct I/O where the
// filesystem allows it. Removed when destroyed.
class ScratchFile {
 public:
  static constexpr int64_t kAlign = 4096;  // of offsets, lengths and buffers
  // A new file of `bytes` (a multiple of kAlign), its room reserved now so
  // that a full disk stops the job before it trains: errors name the path,
  // the bytes and `contents`. `kind` starts the messages ("optimizer").
  static Result<std::unique_ptr<ScratchFile>> Create(const std::string& path, int64_t bytes,
                                                     const std::string& kind,
                                                     const std::string& contents);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  // `bytes` at `at` into or from `data`: all aligned to kAlign.
  Status Read(void* data, int64_t bytes, int64_t at) const;
  Status Write(const void* data, int64_t bytes, int64_t at) const;
  // Without direct I/O: [at, at + bytes) (bytes 0: all) synced and dropped
  // from the page cache. Nothing to do with it.
  Status DropCache(int64_t at = 0, int64_t bytes = 0) const;

 private:
  ScratchFile(std::string path, std::string kind, int fd, bool direct)
      : path_(std::move(path)), kind_(std::move(kind)), fd_(fd), direct_(direct) {}
  Status Error(const std::string& what, int err) const;
  std::string path_, kind_;
  int fd_ = -1;
  bool direct_ = false;
};

// Memory aligned for direct I/O.
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;
// `floats` floats (rounded up to whole kAlign blocks), zero.
AlignedFloats AllocateAligned(int64_t floats);

class OffloadedMoments {
 public:
  // Buckets in memory at once: the one updating, the next being read, the
  // last being written.
  static constexpr int kResidentBuckets = 3;

  // `floats` moments of each of m and v in DIR/adam.rank<R>.bin, streamed
  // in buckets of about `bucket_floats` (whole kAlign blocks). Errors name
  // the path and, when the disk lacks room, the bytes needed.
  static Result<std::unique_ptr<OffloadedMoments>> Create(const std::string& dir, int rank,
                                                          int64_t floats, int64_t bucket_floats);
  OffloadedMoments(const OffloadedMoments&) = delete;
  OffloadedMoments& operator=(const OffloadedMoments&) = delete;

  int64_t floats() const { return floats_; }
  int64_t bucket_floats() const { return bucket_; }
  const std::string& path() const { return file_->path(); }
  bool direct_io() const { return file_->direct(); }
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
  // saving a checkpoint), through a bucket's buffer.
  Status Read(int64_t begin, int64_t n, float* m, float* v);
  Status Write(int64_t begin, int64_t n, const float* m, const float* v);
  // Moments [begin, begin + n) of m (`which` 0) or v (1) alone, through a
  // bucket's buffer (a save streaming them: no more in memory).
  Status ReadOne(int which, int64_t begin, int64_t n, float* out);
  // ... and to it (a load streaming them in); the rest of a bucket written
  // in part is kept.
  Status WriteOne(int which, int64_t begin, int64_t n, const float* in);

 private:
  OffloadedMoments(std::unique_ptr<ScratchFile> file, int64_t floats, int64_t bucket);
  // Bucket-aligned moments [begin, begin + n) of m and v, to or from a
  // bucket's buffer (m, then v at m + bucket_).
  Status ReadBucket(int64_t begin, int64_t n, float* buffer);
  Status WriteBucket(int64_t begin, int64_t n, const float* buffer);
  Status CheckRange(int64_t begin, int64_t n) const;

  std::unique_ptr<ScratchFile> file_;
  int64_t floats_ = 0, bucket_ = 0;
  int64_t region_ = 0;                   // bytes of m's region of the file (aligned), then v's
  AlignedFloats buf_[kResidentBuckets];  // m then v, bucket_ each
  int buffers_ = 0;
  std::atomic<int64_t> bytes_read_{0}, bytes_written_{0};
};

// What the model's runners see of weights that are not all in memory: they
// ask for a unit before they read its weights (or change them: `write`).
class WeightUnits {
 public:
  virtual ~WeightUnits() = default;
  virtual Status Need(int unit, bool write) = 0;
};

// A stage's weights in DIR/weights.rank<R>.bin, in memory a unit or two at
// a time. The weights vector stays allocated, so the kernels keep their
// addresses and read the very same numbers: offload changes no arithmetic.
// The pages of a unit that is out are given back to the system
// (core/pages.h); Need fills them again from the file.
//
// Need(u) makes u the unit in use; every other unit in memory is dropped
// (written back first when it was changed, on an I/O thread) except the
// one expected next, which is read on an I/O thread while u computes. What
// comes next is learned: the units needed during one step (BeginOrder to
// EndOrder) repeat every step, so the last unit of a step expects the
// first of the next. At most the unit in use, the one being read and one
// being written back are in memory at once, besides two transfer buffers.
class OffloadedWeights : public WeightUnits {
 public:
  struct Range {
    int64_t begin = 0, n = 0;  // floats of the weights vector
    int64_t file = 0;          // its offset in the file (aligned)
  };
  // `weights` (`floats` of them, which must outlive this) in units, each a
  // list of ranges (`file` is set here). The file is created zero (its
  // room reserved: errors name the path and the bytes); every unit starts
  // out of memory.
  static Result<std::unique_ptr<OffloadedWeights>> Create(const std::string& dir, int rank,
                                                          float* weights, int64_t floats,
                                                          std::vector<std::vector<Range>> units);
  ~OffloadedWeights() override;
  OffloadedWeights(const OffloadedWeights&) = delete;
  OffloadedWeights& operator=(const OffloadedWeights&) = delete;

  Status Need(int unit, bool write) override;
  // Every unit in memory (a save reads the weights whole) until the next
  // Need.
  Status NeedAll();
  // After the weights were set whole in memory (a checkpoint loaded):
  // every unit to the file, none kept.
  Status StoreAll();
  // Every unit out of memory (those changed written back first), nothing
  // in flight.
  Status Evict();
  // Records the order of Need calls from here (one step's) ...
  void BeginOrder();
  // ... to here; the next units are expected in it from now on.
  void EndOrder();

  const std::string& path() const { return file_->path(); }
  bool direct_io() const { return file_->direct(); }
  int units() const { return static_cast<int>(units_.size()); }
  int64_t unit_bytes(int unit) const { return units_[unit].bytes; }
  // Bytes of units in memory now (in use, being read or written back), and
  // the most there have been at once; the transfer buffers' bytes.
  int64_t resident_bytes() const { return resident_; }
  int64_t peak_resident_bytes() const { return peak_resident_; }
  int64_t buffer_bytes() const;
  int64_t bytes_read() const { return bytes_read_.load(); }
  int64_t bytes_written() const { return bytes_written_.load(); }

 private:
  enum class State { kOut, kReading, kIn, kWriting };
  struct Unit {
    std::vector<Range> ranges;
    int64_t bytes = 0;
    State state = State::kOut;
    bool dirty = false;
  };
  explicit OffloadedWeights(float* weights) : weights_(weights) {}
  // A unit from the file into memory (one read at a time: read_buf_), and
  // from memory to the file with its pages given back (write_buf_).
  Status ReadUnit(int unit);
  Status WriteUnit(int unit);
  Status DropUnit(int unit);  // not changed: its pages given back
  // Waits for the read in flight and the write-back in flight.
  Status SettleRead();
  Status SettleWrite();
  // Out of memory: written back (asynchronously) when changed.
  Status Release(int unit);
  void SetState(int unit, State state);
  // The unit expected after `unit` (-1: none known).
  int Next(int unit);

  std::unique_ptr<ScratchFile> file_;
  float* weights_;
  std::vector<Unit> units_;
  AlignedFloats read_buf_, write_buf_;
  int64_t buffer_floats_ = 0;  // of each
  int current_ = -1;           // the unit in use
  int reading_unit_ = -1, writing_unit_ = -1;
  std::future<Status> reading_, writing_;
  bool recording_ = false;
  std::vector<int> order_;
  size_t at_ = 0;  // in order_
  int64_t resident_ = 0, peak_resident_ = 0;
  std::atomic<int64_t> bytes_read_{0}, bytes_written_{0};
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TRAIN_OFFLOAD_H_
