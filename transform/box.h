// Interval and Box: half-open index ranges and their products. Value types
// with free-function verbs, after tensorstore's Box.
#ifndef TESSERA_TRANSFORM_BOX_H_
#define TESSERA_TRANSFORM_BOX_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

// Tensors of more dimensions than this are rejected by layout validation.
inline constexpr int kMaxRank = 8;

// [begin, end). An interval with end <= begin is empty.
struct Interval {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return end <= begin; }
  bool operator==(const Interval& o) const { return begin == o.begin && end == o.end; }
  bool operator!=(const Interval& o) const { return !(*this == o); }
};

Interval Intersect(const Interval& a, const Interval& b);
// True if `inner` is empty or lies within `outer`.
bool Contains(const Interval& outer, const Interval& inner);

// The i-th of n pieces of `whole` as torch.chunk makes them: every piece has
// ceil(size/n) elements except trailing ones, which are smaller or empty.
// torch.chunk(torch.arange(10), 4) -> [0:3] [3:6] [6:9] [9:10].
Interval ChunkOf(const Interval& whole, int64_t n, int64_t i);

// A product of intervals, one per dimension; rank 0 is a scalar (one
// element). Up to kInlineRank dimensions are stored inline, so copying
// such a Box never allocates; more (up to kMaxRank) are on the heap. A
// manifest of a 4,096-rank checkpoint holds half a million boxes: each is
// 80 bytes, where inline room for all kMaxRank dimensions would make it
// 136.
class Box {
 public:
  static constexpr int kInlineRank = 4;

  Box() = default;
  explicit Box(int rank);  // all dimensions [0, 0)
  Box(std::initializer_list<Interval> dims);
  Box(const Box& o) : rank_(o.rank_) { CopyFrom(o); }
  Box(Box&& o) noexcept : rank_(o.rank_), heap_(std::move(o.heap_)) {
    std::copy(o.inline_.begin(), o.inline_.end(), inline_.begin());
    o.rank_ = 0;
  }
  Box& operator=(const Box& o) {
    if (this != &o) {
      rank_ = o.rank_;
      CopyFrom(o);
    }
    return *this;
  }
  Box& operator=(Box&& o) noexcept {
    if (this != &o) {
      rank_ = o.rank_;
      heap_ = std::move(o.heap_);
      std::copy(o.inline_.begin(), o.inline_.end(), inline_.begin());
      o.rank_ = 0;
    }
    return *this;
  }
  // [0, shape[d]) for every d.
  static Box FromShape(const std::vector<int64_t>& shape);

  int rank() const { return rank_; }
  Interval& operator[](int d) { return data()[d]; }
  const Interval& operator[](int d) const { return data()[d]; }
  std::vector<int64_t> extents() const;
  std::vector<int64_t> origin() const;

  bool operator==(const Box& o) const;
  bool operator!=(const Box& o) const { return !(*this == o); }

 private:
  Interval* data() { return rank_ <= kInlineRank ? inline_.data() : heap_.get(); }
  const Interval* data() const { return rank_ <= kInlineRank ? inline_.data() : heap_.get(); }
  // The dimensions of `o` (rank_ already set to o.rank_).
  void CopyFrom(const Box& o) {
    inline_ = o.inline_;
    if (rank_ > kInlineRank) {
      heap_.reset(new Interval[rank_]);
      std::copy(o.heap_.get(), o.heap_.get() + rank_, heap_.get());
    } else {
      heap_.reset();
    }
  }
  int rank_ = 0;
  std::array<Interval, kInlineRank> inline_{};
  std::unique_ptr<Interval[]> heap_;  // rank_ > kInlineRank
};

// A Box as the manifests keep one per piece, in 32 bytes where a Box takes
// 80: up to kInlineRank dimensions whose bounds fit in 32 bits are stored
// inline as 32-bit bounds, others on the heap. Read-only: it converts to a
// Box (no allocation up to Box::kInlineRank dimensions) and is assigned
// from one. A 16,384-rank checkpoint's manifest holds 1.7 million pieces,
// held twice by a reshard (reader and writer): 78 MiB less for each.
class CompactBox {
 public:
  static constexpr int kInlineRank = 3;

  CompactBox() = default;
  CompactBox(const Box& box) { Assign(box); }  // NOLINT: implicit, as a Box is
  CompactBox(const CompactBox& o) { *this = o; }
  CompactBox(CompactBox&& o) noexcept { *this = std::move(o); }
  CompactBox& operator=(const Box& box) {
    Release();
    Assign(box);
    return *this;
  }
  CompactBox& operator=(const CompactBox& o);
  CompactBox& operator=(CompactBox&& o) noexcept;
  ~CompactBox() { Release(); }

  int rank() const { return rank_; }
  Interval operator[](int d) const {
    return heap_ ? dims_[d] : Interval{bounds_[2 * d], bounds_[2 * d + 1]};
  }
  operator Box() const;  // NOLINT: implicit, so it reads as a Box
  std::vector<int64_t> extents() const;
  std::vector<int64_t> origin() const;

  bool operator==(const CompactBox& o) const;
  bool operator!=(const CompactBox& o) const { return !(*this == o); }

 private:
  void Assign(const Box& box);
  void Release() {
    if (heap_) delete[] dims_;
    heap_ = false;
    rank_ = 0;
  }
  uint8_t rank_ = 0;
  bool heap_ = false;
  union {
    int32_t bounds_[2 * kInlineRank] = {};  // begin, end of each dimension
    Interval* dims_;                        // heap_
  };
};

bool operator==(const Box& a, const CompactBox& b);
inline bool operator==(const CompactBox& a, const Box& b) { return b == a; }
inline bool operator!=(const Box& a, const CompactBox& b) { return !(a == b); }
inline bool operator!=(const CompactBox& a, const Box& b) { return !(a == b); }

bool IsEmpty(const Box& box);
int64_t NumElements(const Box& box);
// Boxes of different ranks never intersect: the result is empty.
Box Intersect(const Box& a, const Box& b);
bool Contains(const Box& outer, const Box& inner);
// a.origin() < b.origin() (lexicographic, as std::vector compares), without
// building either: the writers sort half a million pieces by it.
bool OriginLess(const Box& a, const Box& b);
bool OriginLess(const CompactBox& a, const CompactBox& b);
// The same verbs on a piece's CompactBox, without converting it.
Box Intersect(const CompactBox& a, const Box& b);
// `box` in the coordinates of a box starting at `origin` (box - origin).
Box RelativeTo(const Box& box, const Box& origin);
Box RelativeTo(const Box& box, const CompactBox& origin);
// "[0:512, 0:3072]"; a scalar is "[]".
std::string ToString(const Box& box);

// Copies the elements of `src_box` (coordinates relative to a dense,
// row-major buffer of shape `src_extents`) to `dst_box` of a buffer of shape
// `dst_extents`. The two boxes must have the same extents.
void CopyBox(const void* src, const std::vector<int64_t>& src_extents, const Box& src_box,
             void* dst, const std::vector<int64_t>& dst_extents, const Box& dst_box,
             int64_t element_size);

// A byte range contiguous both in a source buffer and in a destination
// buffer: `len` bytes at `src` land at `dst`.
struct ByteRun {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t len = 0;
};

// The runs that copy `src_box` of a dense row-major buffer of shape
// `src_extents` to `dst_box` of one of shape `dst_extents` (same box
// extents), in ascending source order, each as long as both layouts allow.
// An empty box has no runs.
std::vector<ByteRun> ByteRuns(const std::vector<int64_t>& src_extents, const Box& src_box,
                              const std::vector<int64_t>& dst_extents, const Box& dst_box,
                              int64_t element_size);

}  // namespace tessera

#endif  // TESSERA_TRANSFORM_BOX_H_
