#include "runtime/train/offload.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/byte_size.h"
#include "core/pages.h"
#include "core/trace.h"

namespace tessera {
namespace {

constexpr int64_t kAlign = ScratchFile::kAlign;
constexpr int64_t kAlignFloats = kAlign / static_cast<int64_t>(sizeof(float));

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Transfers of the weights go through buffers of this many bytes.
constexpr int64_t kChunkBytes = int64_t{4} << 20;

}  // namespace

AlignedFloats AllocateAligned(int64_t floats) {
  const int64_t bytes = RoundUp(std::max<int64_t>(floats, 1) * 4, kAlign);
  float* p = static_cast<float*>(std::aligned_alloc(kAlign, static_cast<size_t>(bytes)));
  if (p != nullptr) std::memset(p, 0, static_cast<size_t>(bytes));
  return AlignedFloats(p);
}

// ---------------------------------------------------------------- ScratchFile

Status ScratchFile::Error(const std::string& what, int err) const {
  return InternalError(kind_ + " offload: " + what + " '" + path_ + "': " + std::strerror(err));
}

Result<std::unique_ptr<ScratchFile>> ScratchFile::Create(const std::string& path, int64_t bytes,
                                                         const std::string& kind,
                                                         const std::string& contents) {
  constexpr int kFlags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  bool direct = true;
  int fd = ::open(path.c_str(), kFlags | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {  // the filesystem has no direct I/O (tmpfs)
    direct = false;
    fd = ::open(path.c_str(), kFlags, 0600);
  }
  std::unique_ptr<ScratchFile> f(new ScratchFile(path, kind, fd, direct));
  if (fd < 0) return f->Error("cannot create", errno);
  if (bytes > 0) {
    const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc == ENOSPC) {
      return ResourceExhaustedError(kind + " offload: '" + path + "' needs " + HumanBytes(bytes) +
                                    " (" + contents + "); the disk has no room");
    }
    if (rc != 0) return f->Error("cannot allocate " + HumanBytes(bytes) + " for", rc);
  }
  return f;
}

ScratchFile::~ScratchFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());  // scratch: state lives in checkpoints
  }
}

Status ScratchFile::Read(void* data, int64_t bytes, int64_t at) const {
  char* out = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, out, static_cast<size_t>(bytes), static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return Error("cannot read", got < 0 ? errno : EIO);
    out += got;
    at += got;
    bytes -= got;
  }
  return Status::Ok();
}

Status ScratchFile::Write(const void* data, int64_t bytes, int64_t at) const {
  const char* in = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t put = ::pwrite(fd_, in, static_cast<size_t>(bytes), static_cast<off_t>(at));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return Error("cannot write", put < 0 ? errno : EIO);
    in += put;
    at += put;
    bytes -= put;
  }
  return Status::Ok();
}

Status ScratchFile::DropCache(int64_t at, int64_t bytes) const {
  if (direct_) return Status::Ok();  // nothing was cached
  if (bytes == 0) {
    if (::fdatasync(fd_) != 0) return Error("cannot sync", errno);
  } else if (::sync_file_range(fd_, static_cast<off_t>(at), static_cast<off_t>(bytes),
                               SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                   SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
    return Error("cannot sync", errno);
  }
  const int rc =
      ::posix_fadvise(fd_, static_cast<off_t>(at), static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
  if (rc != 0) return Error("cannot drop the cached pages of", rc);
  return Status::Ok();
}

// ----------------------------------------------------------- OffloadedMoments

OffloadedMoments::OffloadedMoments(std::unique_ptr<ScratchFile> file, int64_t floats,
                                   int64_t bucket)
    : file_(std::move(file)), floats_(floats), bucket_(bucket) {}

Result<std::unique_ptr<OffloadedMoments>> OffloadedMoments::Create(const std::string& dir, int rank,
                                                                   int64_t floats,
                                                                   int64_t bucket_floats) {
  if (dir.empty()) return InvalidArgumentError("optimizer offload needs a directory (offload_dir)");
  if (floats < 0 || bucket_floats < 1) {
    return InvalidArgumentError("optimizer offload: " + std::to_string(floats) +
                                " moments in buckets of " + std::to_string(bucket_floats));
  }
  // Buckets of whole aligned blocks, and m's region then v's, aligned.
  const int64_t bucket =
      RoundUp(std::min(bucket_floats, std::max<int64_t>(floats, 1)), kAlignFloats);
  const int64_t region = RoundUp(floats * 4, kAlign);
  ASSIGN_OR_RETURN(std::unique_ptr<ScratchFile> file,
                   ScratchFile::Create(
                       dir + "/adam.rank" + std::to_string(rank) + ".bin", 2 * region, "optimizer",
                       "Adam's m and v of " + std::to_string(floats) + " parameters"));
  std::unique_ptr<OffloadedMoments> o(new OffloadedMoments(std::move(file), floats, bucket));
  o->region_ = region;
  // Buffers for the buckets that can be in flight at once (fewer than
  // three when the moments are fewer buckets).
  const int64_t buckets = (floats + bucket - 1) / bucket;
  o->buffers_ = static_cast<int>(std::clamp<int64_t>(buckets, 1, kResidentBuckets));
  for (int i = 0; i < o->buffers_; ++i) {
    o->buf_[i] = AllocateAligned(2 * bucket);
    if (o->buf_[i] == nullptr) {
      return ResourceExhaustedError("optimizer offload: no memory for a bucket of " +
                                    HumanBytes(8 * bucket));
    }
  }
  return o;
}

int64_t OffloadedMoments::resident_bytes() const {
  return buffers_ * 2 * bucket_ * static_cast<int64_t>(sizeof(float));
}

Status OffloadedMoments::ReadBucket(int64_t begin, int64_t n, float* buffer) {
  const int64_t bytes = RoundUp(n * 4, kAlign);
  RETURN_IF_ERROR(file_->Read(buffer, bytes, begin * 4));
  RETURN_IF_ERROR(file_->Read(buffer + bucket_, bytes, region_ + begin * 4));
  bytes_read_ += 2 * n * static_cast<int64_t>(sizeof(float));
  return Status::Ok();
}

Status OffloadedMoments::WriteBucket(int64_t begin, int64_t n, const float* buffer) {
  const int64_t bytes = RoundUp(n * 4, kAlign);
  RETURN_IF_ERROR(file_->Write(buffer, bytes, begin * 4));
  RETURN_IF_ERROR(file_->Write(buffer + bucket_, bytes, region_ + begin * 4));
  bytes_written_ += 2 * n * static_cast<int64_t>(sizeof(float));
  return Status::Ok();
}

Status OffloadedMoments::Stream(
    const std::function<void(int64_t begin, int64_t n, float* m, float* v)>& update,
    bool from_zero) {
  const int64_t buckets = (floats_ + bucket_ - 1) / bucket_;
  auto range = [&](int64_t i) { return std::min(bucket_, floats_ - i * bucket_); };
  auto slot = [&](int64_t i) { return buf_[i % kResidentBuckets].get(); };
  std::future<Status> reading, writing[kResidentBuckets];
  // On a timeline (--trace): each bucket's read and write (category
  // offload, on the I/O threads) and its update (optimizer).
  Trace* const trace = Trace::Current();
  auto read = [&](int64_t i) {
    return std::async(std::launch::async,
                      [this, i, n = range(i), m = slot(i), b = bucket_, from_zero, trace] {
                        ScopedTrace scoped(trace);
                        TraceSpan span("offload", "read bucket");
                        if (!from_zero) return ReadBucket(i * b, n, m);
                        std::fill(m, m + 2 * b, 0.0f);
                        return Status::Ok();
                      });
  };
  Status status;
  if (buckets > 0) reading = read(0);
  for (int64_t i = 0; i < buckets; ++i) {
    const Status got = reading.get();
    if (status.ok()) status = got;
    // Bucket i + 1's slot last held bucket i - 2: its write must be done.
    std::future<Status>& before = writing[(i + 1) % kResidentBuckets];
    if (before.valid()) {
      const Status wrote = before.get();
      if (status.ok()) status = wrote;
    }
    if (i + 1 < buckets && status.ok()) reading = read(i + 1);
    if (!status.ok()) break;
    float* m = slot(i);
    {
      TraceSpan span("optimizer", "update bucket");
      update(i * bucket_, range(i), m, m + bucket_);
    }
    writing[i % kResidentBuckets] =
        std::async(std::launch::async, [this, i, n = range(i), m, b = bucket_, trace] {
          ScopedTrace scoped(trace);
          TraceSpan span("offload", "write bucket");
          return WriteBucket(i * b, n, m);
        });
  }
  if (reading.valid()) reading.wait();
  for (std::future<Status>& w : writing) {
    if (!w.valid()) continue;
    const Status wrote = w.get();
    if (status.ok()) status = wrote;
  }
  RETURN_IF_ERROR(status);
  if (file_->direct()) return Status::Ok();
  TraceSpan span("offload", "sync and drop pages");
  return file_->DropCache();
}

Status OffloadedMoments::CheckRange(int64_t begin, int64_t n) const {
  if (begin < 0 || n < 0 || begin + n > floats_) {
    return OutOfRangeError("optimizer offload '" + path() + "': moments [" + std::to_string(begin) +
                           ", " + std::to_string(begin + n) + ") of " + std::to_string(floats_));
  }
  return Status::Ok();
}

Status OffloadedMoments::ReadOne(int which, int64_t begin, int64_t n, float* out) {
  RETURN_IF_ERROR(CheckRange(begin, n));
  float* buffer = buf_[0].get();
  for (int64_t b = begin / bucket_ * bucket_; b < begin + n; b += bucket_) {
    const int64_t count = std::min(bucket_, floats_ - b);
    RETURN_IF_ERROR(file_->Read(buffer, RoundUp(count * 4, kAlign), which * region_ + b * 4));
    const int64_t lo = std::max(b, begin), hi = std::min(b + count, begin + n);
    std::copy(buffer + (lo - b), buffer + (hi - b), out + (lo - begin));
  }
  bytes_read_ += n * static_cast<int64_t>(sizeof(float));
  return file_->DropCache();
}

Status OffloadedMoments::WriteOne(int which, int64_t begin, int64_t n, const float* in) {
  RETURN_IF_ERROR(CheckRange(begin, n));
  float* buffer = buf_[0].get();
  for (int64_t b = begin / bucket_ * bucket_; b < begin + n; b += bucket_) {
    const int64_t count = std::min(bucket_, floats_ - b);
    const int64_t at = which * region_ + b * 4, bytes = RoundUp(count * 4, kAlign);
    const int64_t lo = std::max(b, begin), hi = std::min(b + count, begin + n);
    if (lo > b || hi < b + count) RETURN_IF_ERROR(file_->Read(buffer, bytes, at));
    std::copy(in + (lo - begin), in + (hi - begin), buffer + (lo - b));
    RETURN_IF_ERROR(file_->Write(buffer, bytes, at));
  }
  bytes_written_ += n * static_cast<int64_t>(sizeof(float));
  return file_->DropCache();
}

Status OffloadedMoments::Read(int64_t begin, int64_t n, float* m, float* v) {
  RETURN_IF_ERROR(ReadOne(0, begin, n, m));
  return ReadOne(1, begin, n, v);
}

Status OffloadedMoments::Write(int64_t begin, int64_t n, const float* m, const float* v) {
  RETURN_IF_ERROR(WriteOne(0, begin, n, m));
  return WriteOne(1, begin, n, v);
}

// ----------------------------------------------------------- OffloadedWeights

Result<std::unique_ptr<OffloadedWeights>> OffloadedWeights::Create(
    const std::string& dir, int rank, float* weights, int64_t floats,
    std::vector<std::vector<Range>> units) {
  if (dir.empty()) {
    return InvalidArgumentError("parameter offload needs a directory (offload_dir)");
  }
  // Each range at an aligned offset of the file.
  int64_t at = 0;
  for (std::vector<Range>& unit : units) {
    for (Range& r : unit) {
      if (r.begin < 0 || r.n < 0 || r.begin + r.n > floats) {
        return InvalidArgumentError("parameter offload: weights [" + std::to_string(r.begin) +
                                    ", " + std::to_string(r.begin + r.n) + ") of " +
                                    std::to_string(floats));
      }
      r.file = at;
      at += RoundUp(r.n * 4, kAlign);
    }
  }
  std::unique_ptr<OffloadedWeights> w(new OffloadedWeights(weights));
  ASSIGN_OR_RETURN(
      w->file_,
      ScratchFile::Create(dir + "/weights.rank" + std::to_string(rank) + ".bin", at, "parameter",
                          "the weights of " + std::to_string(floats) + " parameters"));
  // A chunk, or all the weights where they are less (a range is never more).
  w->buffer_floats_ = std::min(kChunkBytes, std::max(RoundUp(floats * 4, kAlign), kAlign)) / 4;
  w->read_buf_ = AllocateAligned(w->buffer_floats_);
  w->write_buf_ = AllocateAligned(w->buffer_floats_);
  if (w->read_buf_ == nullptr || w->write_buf_ == nullptr) {
    return ResourceExhaustedError("parameter offload: no memory for its transfer buffers");
  }
  for (std::vector<Range>& ranges : units) {
    Unit& u = w->units_.emplace_back();
    u.ranges = std::move(ranges);
    for (const Range& r : u.ranges) u.bytes += r.n * static_cast<int64_t>(sizeof(float));
  }
  // Units come and go every step: in huge pages, filling one faults 512
  // times less (4x faster reads of a block here).
  RETURN_IF_ERROR(PreferHugePages(weights, floats * static_cast<int64_t>(sizeof(float))));
  // Every unit out: the memory reads zero, as the file does.
  for (int u = 0; u < w->units(); ++u) RETURN_IF_ERROR(w->DropUnit(u));
  return w;
}

OffloadedWeights::~OffloadedWeights() {
  if (reading_.valid()) reading_.wait();
  if (writing_.valid()) writing_.wait();
}

int64_t OffloadedWeights::buffer_bytes() const {
  return 2 * buffer_floats_ * static_cast<int64_t>(sizeof(float));
}

Status OffloadedWeights::ReadUnit(int unit) {
  const int64_t chunk = kChunkBytes;
  for (const Range& r : units_[unit].ranges) {
    const int64_t bytes = r.n * 4;
    char* into = reinterpret_cast<char*>(weights_ + r.begin);
    for (int64_t off = 0; off < bytes; off += chunk) {
      const int64_t n = std::min(chunk, bytes - off);
      RETURN_IF_ERROR(file_->Read(read_buf_.get(), RoundUp(n, kAlign), r.file + off));
      std::memcpy(into + off, read_buf_.get(), static_cast<size_t>(n));
    }
    RETURN_IF_ERROR(file_->DropCache(r.file, RoundUp(bytes, kAlign)));
  }
  bytes_read_ += units_[unit].bytes;
  return Status::Ok();
}

Status OffloadedWeights::WriteUnit(int unit) {
  const int64_t chunk = kChunkBytes;
  for (const Range& r : units_[unit].ranges) {
    const int64_t bytes = r.n * 4;
    const char* from = reinterpret_cast<const char*>(weights_ + r.begin);
    for (int64_t off = 0; off < bytes; off += chunk) {
      const int64_t n = std::min(chunk, bytes - off);
      std::memcpy(write_buf_.get(), from + off, static_cast<size_t>(n));
      RETURN_IF_ERROR(file_->Write(write_buf_.get(), RoundUp(n, kAlign), r.file + off));
    }
    // Through the page cache: written out and dropped, so the memory is
    // really freed.
    RETURN_IF_ERROR(file_->DropCache(r.file, RoundUp(bytes, kAlign)));
  }
  bytes_written_ += units_[unit].bytes;
  return DropUnit(unit);
}

Status OffloadedWeights::DropUnit(int unit) {
  for (const Range& r : units_[unit].ranges) {
    RETURN_IF_ERROR(ReturnPages(weights_ + r.begin, r.n * static_cast<int64_t>(sizeof(float))));
  }
  return Status::Ok();
}

void OffloadedWeights::SetState(int unit, State state) {
  Unit& u = units_[unit];
  const bool was = u.state != State::kOut, is = state != State::kOut;
  if (is && !was) resident_ += u.bytes;
  if (was && !is) resident_ -= u.bytes;
  peak_resident_ = std::max(peak_resident_, resident_);
  u.state = state;
}

Status OffloadedWeights::SettleRead() {
  if (reading_unit_ < 0) return Status::Ok();
  const Status s = reading_.get();
  SetState(reading_unit_, s.ok() ? State::kIn : State::kOut);
  reading_unit_ = -1;
  return s;
}

Status OffloadedWeights::SettleWrite() {
  if (writing_unit_ < 0) return Status::Ok();
  const Status s = writing_.get();
  SetState(writing_unit_, State::kOut);
  writing_unit_ = -1;
  return s;
}

Status OffloadedWeights::Release(int unit) {
  Unit& u = units_[unit];
  if (u.state != State::kIn) return Status::Ok();
  if (!u.dirty) {
    RETURN_IF_ERROR(DropUnit(unit));
    SetState(unit, State::kOut);
    return Status::Ok();
  }
  RETURN_IF_ERROR(SettleWrite());  // one write-back in flight at most
  u.dirty = false;
  SetState(unit, State::kWriting);
  writing_unit_ = unit;
  writing_ = std::async(std::launch::async, [this, unit, trace = Trace::Current()] {
    ScopedTrace scoped(trace);
    TraceSpan span("offload", "write weights");
    return WriteUnit(unit);
  });
  return Status::Ok();
}

int OffloadedWeights::Next(int unit) {
  if (recording_ || order_.empty()) return -1;
  const size_t n = order_.size();
  if (order_[at_] != unit) {
    size_t k = 1;
    while (k <= n && order_[(at_ + k) % n] != unit) ++k;
    if (k > n) return -1;  // not a unit of the step's order: nothing expected
    at_ = (at_ + k) % n;
  }
  for (size_t k = 1; k < n; ++k) {
    if (order_[(at_ + k) % n] != unit) return order_[(at_ + k) % n];
  }
  return -1;
}

Status OffloadedWeights::Need(int unit, bool write) {
  if (unit < 0 || unit >= units()) {
    return OutOfRangeError("parameter offload '" + path() + "': unit " + std::to_string(unit) +
                           " of " + std::to_string(units()));
  }
  Unit& u = units_[unit];
  if (unit == current_ && u.state == State::kIn) {
    u.dirty = u.dirty || write;
    return Status::Ok();
  }
  if (recording_ && (order_.empty() || order_.back() != unit)) order_.push_back(unit);
  // One read at a time: the one in flight (this unit's, or one expected
  // and not needed, released below) finishes first.
  if (reading_unit_ >= 0 && (reading_unit_ == unit || u.state == State::kOut)) {
    RETURN_IF_ERROR(SettleRead());
  }
  if (writing_unit_ == unit) RETURN_IF_ERROR(SettleWrite());
  // The units neither in use nor expected next leave before this one comes.
  const int next = Next(unit);
  for (int v = 0; v < units(); ++v) {
    if (v != unit && v != next) RETURN_IF_ERROR(Release(v));
  }
  if (u.state == State::kOut) {
    TraceSpan span("offload", "read weights (waited)");
    RETURN_IF_ERROR(ReadUnit(unit));
    SetState(unit, State::kIn);
  }
  u.dirty = u.dirty || write;
  current_ = unit;
  if (next < 0 || units_[next].state != State::kOut) return Status::Ok();
  if (reading_unit_ >= 0) {  // a unit expected before and not needed
    const int stale = reading_unit_;
    RETURN_IF_ERROR(SettleRead());
    RETURN_IF_ERROR(Release(stale));
  }
  SetState(next, State::kReading);
  reading_unit_ = next;
  reading_ = std::async(std::launch::async, [this, next, trace = Trace::Current()] {
    ScopedTrace scoped(trace);
    TraceSpan span("offload", "read weights");
    return ReadUnit(next);
  });
  return Status::Ok();
}

Status OffloadedWeights::NeedAll() {
  RETURN_IF_ERROR(SettleRead());
  RETURN_IF_ERROR(SettleWrite());
  for (int v = 0; v < units(); ++v) {
    if (units_[v].state != State::kOut) continue;
    RETURN_IF_ERROR(ReadUnit(v));
    SetState(v, State::kIn);
  }
  return Status::Ok();
}

Status OffloadedWeights::StoreAll() {
  RETURN_IF_ERROR(SettleRead());
  RETURN_IF_ERROR(SettleWrite());
  for (int v = 0; v < units(); ++v) {
    SetState(v, State::kIn);  // while it is written
    RETURN_IF_ERROR(WriteUnit(v));
    units_[v].dirty = false;
    SetState(v, State::kOut);
  }
  current_ = -1;
  return Status::Ok();
}

Status OffloadedWeights::Evict() {
  RETURN_IF_ERROR(SettleRead());
  for (int v = 0; v < units(); ++v) RETURN_IF_ERROR(Release(v));
  RETURN_IF_ERROR(SettleWrite());
  current_ = -1;
  return Status::Ok();
}

void OffloadedWeights::BeginOrder() {
  order_.clear();
  at_ = 0;
  recording_ = true;
}

void OffloadedWeights::EndOrder() {
  recording_ = false;
  at_ = order_.empty() ? 0 : order_.size() - 1;  // the unit in use is the last recorded
}

}  // namespace tessera
