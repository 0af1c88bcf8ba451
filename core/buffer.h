// Large byte buffers whose allocation can fail politely: sizes come from
// files (a manifest may claim a terabyte), so running out of memory is an
// error naming what was being allocated, never an exception or abort.
#ifndef TESSERA_CORE_BUFFER_H_
#define TESSERA_CORE_BUFFER_H_

#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace tessera {

// Uninitialised bytes (at least one, so a zero-size buffer is valid);
// `describe()` says what they are for, called only if they cannot be had
// (hot paths allocate per piece and should not build the text each time).
template <typename Describe>
Result<std::unique_ptr<char[]>> AllocateBytesFor(size_t size, Describe&& describe) {
  std::unique_ptr<char[]> p(new (std::nothrow) char[size == 0 ? 1 : size]);
  if (!p) {
    return ResourceExhaustedError("cannot allocate " + std::to_string(size) + " bytes for " +
                                  describe());
  }
  return p;
}

inline Result<std::unique_ptr<char[]>> AllocateBytes(size_t size, const std::string& what) {
  return AllocateBytesFor(size, [&] { return what; });
}

// Buffers reused across the iterations of a loop that moves many large
// slabs. Fresh memory costs a page fault per page on first touch, and glibc
// hands large blocks back to the kernel on free, so a new buffer per slab
// spends more time faulting than copying. Thread-safe; at most as many
// buffers live as leases are held at once.
class BufferPool {
 public:
  class Lease {
   public:
    Lease(BufferPool* pool, size_t capacity, std::unique_ptr<char[]> p)
        : pool_(pool), capacity_(capacity), p_(std::move(p)) {}
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (p_) pool_->Return(capacity_, std::move(p_));
    }
    char* get() const { return p_.get(); }

   private:
    BufferPool* pool_;
    size_t capacity_;
    std::unique_ptr<char[]> p_;
  };

  // A buffer of at least `size` bytes: the smallest free one that fits, or a
  // new one (a free one too small is released first).
  Result<Lease> Get(size_t size, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].first >= size &&
            (best == free_.size() || free_[i].first < free_[best].first)) {
          best = i;
        }
      }
      if (best != free_.size()) {
        auto entry = std::move(free_[best]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
        return Lease(this, entry.first, std::move(entry.second));
      }
      if (!free_.empty()) free_.pop_back();
    }
    auto p = AllocateBytes(size, what);
    if (!p.ok()) return p.status();
    return Lease(this, size, std::move(p).value());
  }

 private:
  void Return(size_t capacity, std::unique_ptr<char[]> p) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace_back(capacity, std::move(p));
  }

  std::mutex mu_;
  std::vector<std::pair<size_t, std::unique_ptr<char[]>>> free_;
};

}  // namespace tessera

#endif  // TESSERA_CORE_BUFFER_H_
