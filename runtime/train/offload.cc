#include "runtime/train/offload.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>

#include "core/byte_size.h"
#include "core/trace.h"

namespace tessera {
namespace {

Status Errno(const std::string& what, const std::string& path, int err) {
  return InternalError("optimizer offload: " + what + " '" + path + "': " + std::strerror(err));
}

}  // namespace

OffloadedMoments::OffloadedMoments(std::string path, int fd, int64_t floats, int64_t bucket)
    : path_(std::move(path)), fd_(fd), floats_(floats), bucket_(bucket) {}

OffloadedMoments::~OffloadedMoments() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());  // scratch: state lives in checkpoints
  }
}

Result<std::unique_ptr<OffloadedMoments>> OffloadedMoments::Create(const std::string& dir, int rank,
                                                                   int64_t floats,
                                                                   int64_t bucket_floats) {
  if (dir.empty()) return InvalidArgumentError("optimizer offload needs a directory (offload_dir)");
  if (floats < 0 || bucket_floats < 1) {
    return InvalidArgumentError("optimizer offload: " + std::to_string(floats) +
                                " moments in buckets of " + std::to_string(bucket_floats));
  }
  const std::string path = dir + "/adam.rank" + std::to_string(rank) + ".bin";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", path, errno);
  const uint64_t bytes = 2 * static_cast<uint64_t>(floats) * sizeof(float);
  // Room for m and v now, so a full disk stops the job before it trains.
  if (bytes > 0) {
    const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc != 0) {
      ::close(fd);
      ::unlink(path.c_str());
      if (rc == ENOSPC) {
        return ResourceExhaustedError(
            "optimizer offload: '" + path + "' needs " + HumanBytes(static_cast<int64_t>(bytes)) +
            " (Adam's m and v of " + std::to_string(floats) + " parameters); the disk has no room");
      }
      return Errno("cannot allocate " + HumanBytes(static_cast<int64_t>(bytes)) + " for", path, rc);
    }
  }
  std::unique_ptr<OffloadedMoments> o(new OffloadedMoments(
      path, fd, floats, std::min(bucket_floats, std::max<int64_t>(floats, 1))));
  // Buffers for the buckets that can be in flight at once (fewer than
  // three when the moments are fewer buckets).
  const int64_t buckets = (floats + o->bucket_ - 1) / o->bucket_;
  for (int64_t i = 0; i < std::min<int64_t>(kResidentBuckets, std::max<int64_t>(buckets, 1)); ++i) {
    o->buf_[i].resize(2 * o->bucket_);
  }
  return o;
}

int64_t OffloadedMoments::resident_bytes() const {
  int64_t n = 0;
  for (const std::vector<float>& b : buf_) n += static_cast<int64_t>(b.capacity());
  return n * static_cast<int64_t>(sizeof(float));
}

Status OffloadedMoments::ReadRange(int64_t begin, int64_t n, float* m, float* v) {
  for (int k = 0; k < 2; ++k) {
    char* out = reinterpret_cast<char*>(k == 0 ? m : v);
    uint64_t at = (static_cast<uint64_t>(k) * floats_ + begin) * sizeof(float);
    size_t left = static_cast<size_t>(n) * sizeof(float);
    while (left > 0) {
      const ssize_t got = ::pread(fd_, out, left, static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return Errno("cannot read", path_, got < 0 ? errno : EIO);
      out += got;
      at += static_cast<uint64_t>(got);
      left -= static_cast<size_t>(got);
    }
  }
  bytes_read_ += 2 * n * static_cast<int64_t>(sizeof(float));
  return Status::Ok();
}

Status OffloadedMoments::WriteRange(int64_t begin, int64_t n, const float* m, const float* v) {
  for (int k = 0; k < 2; ++k) {
    const char* in = reinterpret_cast<const char*>(k == 0 ? m : v);
    uint64_t at = (static_cast<uint64_t>(k) * floats_ + begin) * sizeof(float);
    size_t left = static_cast<size_t>(n) * sizeof(float);
    while (left > 0) {
      const ssize_t put = ::pwrite(fd_, in, left, static_cast<off_t>(at));
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) return Errno("cannot write", path_, put < 0 ? errno : EIO);
      in += put;
      at += static_cast<uint64_t>(put);
      left -= static_cast<size_t>(put);
    }
  }
  bytes_written_ += 2 * n * static_cast<int64_t>(sizeof(float));
  return Status::Ok();
}

Status OffloadedMoments::DropCache() {
  if (::fdatasync(fd_) != 0) return Errno("cannot sync", path_, errno);
  const int rc = ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  if (rc != 0) return Errno("cannot drop the cached pages of", path_, rc);
  return Status::Ok();
}

Status OffloadedMoments::Stream(
    const std::function<void(int64_t begin, int64_t n, float* m, float* v)>& update,
    bool from_zero) {
  const int64_t buckets = (floats_ + bucket_ - 1) / bucket_;
  auto range = [&](int64_t i) { return std::min(bucket_, floats_ - i * bucket_); };
  auto slot = [&](int64_t i) { return buf_[i % kResidentBuckets].data(); };
  std::future<Status> reading, writing[kResidentBuckets];
  // On a timeline (--trace): each bucket's read and write (category
  // offload, on the I/O threads) and its update (optimizer).
  Trace* const trace = Trace::Current();
  auto read = [&](int64_t i) {
    return std::async(std::launch::async,
                      [this, i, n = range(i), m = slot(i), b = bucket_, from_zero, trace] {
                        ScopedTrace scoped(trace);
                        TraceSpan span("offload", "read bucket");
                        if (!from_zero) return ReadRange(i * b, n, m, m + b);
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
          return WriteRange(i * b, n, m, m + b);
        });
  }
  if (reading.valid()) reading.wait();
  for (std::future<Status>& w : writing) {
    if (!w.valid()) continue;
    const Status wrote = w.get();
    if (status.ok()) status = wrote;
  }
  RETURN_IF_ERROR(status);
  TraceSpan span("offload", "sync and drop pages");
  return DropCache();
}

Status OffloadedMoments::Read(int64_t begin, int64_t n, float* m, float* v) {
  if (begin < 0 || n < 0 || begin + n > floats_) {
    return OutOfRangeError("optimizer offload '" + path_ + "': moments [" + std::to_string(begin) +
                           ", " + std::to_string(begin + n) + ") of " + std::to_string(floats_));
  }
  return ReadRange(begin, n, m, v);
}

Status OffloadedMoments::Write(int64_t begin, int64_t n, const float* m, const float* v) {
  if (begin < 0 || n < 0 || begin + n > floats_) {
    return OutOfRangeError("optimizer offload '" + path_ + "': moments [" + std::to_string(begin) +
                           ", " + std::to_string(begin + n) + ") of " + std::to_string(floats_));
  }
  RETURN_IF_ERROR(WriteRange(begin, n, m, v));
  return DropCache();
}

Status OffloadedMoments::Zero() {
  std::vector<float>& zeros = buf_[0];
  std::fill(zeros.begin(), zeros.end(), 0.0f);
  for (int64_t at = 0; at < floats_; at += bucket_) {
    const int64_t n = std::min(bucket_, floats_ - at);
    RETURN_IF_ERROR(WriteRange(at, n, zeros.data(), zeros.data()));
  }
  return DropCache();
}

}  // namespace tessera
