#include "transform/box.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>

namespace tessera {

Interval Intersect(const Interval& a, const Interval& b) {
  Interval r{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

bool Contains(const Interval& outer, const Interval& inner) {
  return inner.empty() || (inner.begin >= outer.begin && inner.end <= outer.end);
}

Interval ChunkOf(const Interval& whole, int64_t n, int64_t i) {
  const int64_t size = whole.size();
  const int64_t chunk = (size + n - 1) / n;
  const int64_t b = std::min(i * chunk, size);
  const int64_t e = std::min((i + 1) * chunk, size);
  return {whole.begin + b, whole.begin + e};
}

Box::Box(int rank) : rank_(rank) {
  assert(rank >= 0 && rank <= kMaxRank);
  if (rank_ > kInlineRank) heap_.reset(new Interval[rank_]);
}

Box::Box(std::initializer_list<Interval> dims) : Box(static_cast<int>(dims.size())) {
  std::copy(dims.begin(), dims.end(), data());
}

Box Box::FromShape(const std::vector<int64_t>& shape) {
  Box b(static_cast<int>(shape.size()));
  for (int d = 0; d < b.rank(); ++d) b[d] = {0, shape[d]};
  return b;
}

namespace {

// Each dimension's size, or its begin, over either kind of box.
template <typename B>
std::vector<int64_t> ExtentsOf(const B& box) {
  std::vector<int64_t> e(box.rank());
  for (int d = 0; d < box.rank(); ++d) e[d] = box[d].size();
  return e;
}

template <typename B>
std::vector<int64_t> OriginOf(const B& box) {
  std::vector<int64_t> o(box.rank());
  for (int d = 0; d < box.rank(); ++d) o[d] = box[d].begin;
  return o;
}

// Equal rank and intervals, over either kind of box.
template <typename A, typename B>
bool SameBox(const A& a, const B& b) {
  if (a.rank() != b.rank()) return false;
  for (int d = 0; d < a.rank(); ++d) {
    if (a[d] != b[d]) return false;
  }
  return true;
}

}  // namespace

std::vector<int64_t> Box::extents() const { return ExtentsOf(*this); }
std::vector<int64_t> Box::origin() const { return OriginOf(*this); }
bool Box::operator==(const Box& o) const { return SameBox(*this, o); }

void CompactBox::Assign(const Box& box) {
  rank_ = static_cast<uint8_t>(box.rank());
  bool small = box.rank() <= kInlineRank;
  for (int d = 0; small && d < box.rank(); ++d) {
    small = box[d].begin >= INT32_MIN && box[d].begin <= INT32_MAX && box[d].end >= INT32_MIN &&
            box[d].end <= INT32_MAX;
  }
  heap_ = !small;
  if (heap_) {
    dims_ = new Interval[rank_];
    for (int d = 0; d < rank_; ++d) dims_[d] = box[d];
  } else {
    for (int d = 0; d < rank_; ++d) {
      bounds_[2 * d] = static_cast<int32_t>(box[d].begin);
      bounds_[2 * d + 1] = static_cast<int32_t>(box[d].end);
    }
  }
}

CompactBox& CompactBox::operator=(const CompactBox& o) {
  if (this == &o) return *this;
  Release();
  rank_ = o.rank_;
  heap_ = o.heap_;
  if (heap_) {
    dims_ = new Interval[rank_];
    std::copy(o.dims_, o.dims_ + rank_, dims_);
  } else {
    std::copy(o.bounds_, o.bounds_ + 2 * kInlineRank, bounds_);
  }
  return *this;
}

CompactBox& CompactBox::operator=(CompactBox&& o) noexcept {
  if (this == &o) return *this;
  Release();
  rank_ = o.rank_;
  heap_ = o.heap_;
  if (heap_) {
    dims_ = o.dims_;
    o.heap_ = false;
    o.rank_ = 0;
  } else {
    std::copy(o.bounds_, o.bounds_ + 2 * kInlineRank, bounds_);
  }
  return *this;
}

CompactBox::operator Box() const {
  Box b(rank_);
  for (int d = 0; d < rank_; ++d) b[d] = (*this)[d];
  return b;
}

bool CompactBox::operator==(const CompactBox& o) const { return SameBox(*this, o); }
// Compared as they are, without building a CompactBox (an allocation past
// its inline rank) for the Box.
bool operator==(const Box& a, const CompactBox& b) { return SameBox(a, b); }

bool IsEmpty(const Box& box) {
  for (int d = 0; d < box.rank(); ++d) {
    if (box[d].empty()) return true;
  }
  return false;
}

int64_t NumElements(const Box& box) {
  int64_t n = 1;
  for (int d = 0; d < box.rank(); ++d) n *= box[d].size();
  return n;
}

namespace {

// The verbs over either kind of box: a CompactBox converted to a Box for
// each call cost 6% of a 16,384-rank reshard.
template <typename A, typename B>
bool OriginLessOf(const A& a, const B& b) {
  const int n = std::min(a.rank(), b.rank());
  for (int d = 0; d < n; ++d) {
    if (a[d].begin != b[d].begin) return a[d].begin < b[d].begin;
  }
  return a.rank() < b.rank();
}

template <typename A, typename B>
Box IntersectOf(const A& a, const B& b) {
  if (a.rank() != b.rank()) return Box(std::max(a.rank(), b.rank()));
  Box r(a.rank());
  for (int d = 0; d < a.rank(); ++d) r[d] = Intersect(a[d], b[d]);
  return r;
}

template <typename O>
Box RelativeToOf(const Box& box, const O& origin) {
  Box r(box.rank());
  for (int d = 0; d < box.rank(); ++d) {
    r[d] = {box[d].begin - origin[d].begin, box[d].end - origin[d].begin};
  }
  return r;
}

}  // namespace

bool OriginLess(const Box& a, const Box& b) { return OriginLessOf(a, b); }
bool OriginLess(const CompactBox& a, const CompactBox& b) { return OriginLessOf(a, b); }
Box Intersect(const Box& a, const Box& b) { return IntersectOf(a, b); }
Box Intersect(const CompactBox& a, const Box& b) { return IntersectOf(a, b); }
Box RelativeTo(const Box& box, const CompactBox& origin) { return RelativeToOf(box, origin); }

std::vector<int64_t> CompactBox::extents() const { return ExtentsOf(*this); }
std::vector<int64_t> CompactBox::origin() const { return OriginOf(*this); }

bool Contains(const Box& outer, const Box& inner) {
  if (outer.rank() != inner.rank()) return false;
  if (IsEmpty(inner)) return true;
  for (int d = 0; d < outer.rank(); ++d) {
    if (!Contains(outer[d], inner[d])) return false;
  }
  return true;
}

Box RelativeTo(const Box& box, const Box& origin) { return RelativeToOf(box, origin); }

std::string ToString(const Box& box) {
  std::string s = "[";
  for (int d = 0; d < box.rank(); ++d) {
    if (d) s += ", ";
    s += std::to_string(box[d].begin) + ":" + std::to_string(box[d].end);
  }
  return s + "]";
}

void CopyBox(const void* src, const std::vector<int64_t>& src_extents, const Box& src_box,
             void* dst, const std::vector<int64_t>& dst_extents, const Box& dst_box,
             int64_t element_size) {
  const int rank = src_box.rank();
  assert(dst_box.rank() == rank);
  if (IsEmpty(src_box)) return;
  if (rank == 0) {
    std::memcpy(dst, src, element_size);
    return;
  }
  // Row-major strides in elements.
  std::array<int64_t, kMaxRank> src_stride{}, dst_stride{};
  src_stride[rank - 1] = dst_stride[rank - 1] = 1;
  for (int d = rank - 2; d >= 0; --d) {
    src_stride[d] = src_stride[d + 1] * src_extents[d + 1];
    dst_stride[d] = dst_stride[d + 1] * dst_extents[d + 1];
  }
  // Merge the trailing dimensions that are whole in both buffers into one
  // contiguous run, so a copy of full rows is one memcpy.
  int inner = rank - 1;
  int64_t run = src_box[inner].size();
  while (inner > 0 && src_box[inner].begin == 0 && dst_box[inner].begin == 0 &&
         src_box[inner].size() == src_extents[inner] &&
         dst_box[inner].size() == dst_extents[inner]) {
    --inner;
    run *= src_box[inner].size();
  }
  const int64_t run_bytes = run * element_size;
  const char* s = static_cast<const char*>(src);
  char* t = static_cast<char*>(dst);
  std::array<int64_t, kMaxRank> idx{};  // position within the box, dims [0, inner)
  for (;;) {
    int64_t so = src_box[inner].begin * src_stride[inner];
    int64_t to = dst_box[inner].begin * dst_stride[inner];
    for (int d = 0; d < inner; ++d) {
      so += (src_box[d].begin + idx[d]) * src_stride[d];
      to += (dst_box[d].begin + idx[d]) * dst_stride[d];
    }
    std::memcpy(t + to * element_size, s + so * element_size, run_bytes);
    int d = inner - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < src_box[d].size()) break;
      idx[d] = 0;
    }
    if (d < 0) break;
  }
}

std::vector<ByteRun> ByteRuns(const std::vector<int64_t>& src_ext, const Box& rel,
                              const std::vector<int64_t>& dst_ext, const Box& dst_box, int64_t es) {
  const int rank = rel.rank();
  if (rank == 0) return {{0, 0, static_cast<uint64_t>(es)}};
  if (IsEmpty(rel)) return {};
  // Dimensions after k are whole in both buffers, so one run spans them.
  int k = rank - 1;
  while (k > 0 && rel[k].size() == src_ext[k] && dst_box[k].size() == dst_ext[k]) --k;
  auto strides = [](const std::vector<int64_t>& ext) {
    std::vector<int64_t> s(ext.size(), 1);
    for (int d = static_cast<int>(ext.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * ext[d + 1];
    return s;
  };
  const std::vector<int64_t> ss = strides(src_ext), ds = strides(dst_ext);
  const uint64_t len = static_cast<uint64_t>(rel[k].size() * ss[k] * es);
  std::vector<ByteRun> runs;
  std::vector<int64_t> idx(k, 0);
  while (true) {
    int64_t so = rel[k].begin * ss[k], doff = dst_box[k].begin * ds[k];
    for (int d = 0; d < k; ++d) {
      so += (rel[d].begin + idx[d]) * ss[d];
      doff += (dst_box[d].begin + idx[d]) * ds[d];
    }
    runs.push_back({static_cast<uint64_t>(so * es), static_cast<uint64_t>(doff * es), len});
    int d = k - 1;
    while (d >= 0 && ++idx[d] == rel[d].size()) idx[d--] = 0;
    if (d < 0) break;
  }
  return runs;
}

}  // namespace tessera
