#include "ckpt/diff.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>

#include "core/buffer.h"
#include "core/thread_pool.h"

namespace tessera {
namespace {

double HalfToDouble(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(frac, -24);
  } else if (exp == 31) {
    v = frac ? NAN : INFINITY;
  } else {
    v = std::ldexp(frac | 0x400, exp - 25);
  }
  return sign ? -v : v;
}

template <typename T>
double Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return static_cast<double>(v);
}

double ValueAt(const char* p, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return Load<float>(p);
    case DType::kF64:
      return Load<double>(p);
    case DType::kF16:
      return HalfToDouble(static_cast<uint16_t>(Load<uint16_t>(p)));
    case DType::kBF16: {
      const uint32_t bits = static_cast<uint32_t>(Load<uint16_t>(p)) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kI8:
      return Load<int8_t>(p);
    case DType::kU8:
      return Load<uint8_t>(p);
    case DType::kI16:
      return Load<int16_t>(p);
    case DType::kU16:
      return Load<uint16_t>(p);
    case DType::kI32:
      return Load<int32_t>(p);
    case DType::kU32:
      return Load<uint32_t>(p);
    case DType::kI64:
      return Load<int64_t>(p);
    case DType::kU64:
      return Load<uint64_t>(p);
    case DType::kBool:
      return p[0] != 0 ? 1 : 0;
  }
  return 0;
}

struct Partial {
  int64_t differing = 0;
  double max_abs = 0, max_rel = 0;
};

Partial Compare(const char* a, const char* b, int64_t n, DType dtype, const DiffOptions& o) {
  Partial r;
  const int64_t es = DTypeSize(dtype);
  if (std::memcmp(a, b, n * es) == 0) return r;
  for (int64_t i = 0; i < n; ++i) {
    const double x = ValueAt(a + i * es, dtype), y = ValueAt(b + i * es, dtype);
    if (std::memcmp(a + i * es, b + i * es, es) == 0 || (std::isnan(x) && std::isnan(y))) continue;
    const double d = std::fabs(x - y);  // inf - inf and NaN vs number give NaN or inf
    const double rel = y != 0 ? d / std::fabs(y) : (d == 0 ? 0 : INFINITY);
    if (std::isnan(d) || d > r.max_abs) r.max_abs = std::isnan(d) ? INFINITY : d;
    if (std::isnan(rel) || rel > r.max_rel) r.max_rel = std::isnan(rel) ? INFINITY : rel;
    if (!(d <= o.atol + o.rtol * std::fabs(y))) ++r.differing;
  }
  return r;
}

}  // namespace

bool DiffReport::ok() const {
  return std::all_of(tensors.begin(), tensors.end(), [](const TensorDiff& t) { return t.ok(); });
}

Result<DiffReport> DiffCheckpoints(const CheckpointReader& a, const CheckpointReader& b,
                                   const DiffOptions& options) {
  DiffReport report;
  struct Job {
    size_t diff, ia, ib;
    Box box;
    std::vector<int64_t> coords;  // what `box` is over
  };
  std::vector<Job> jobs;
  ThreadPool pool(options.threads);
  // Per worker: one slab of each side, plus what a reader stages.
  const int64_t slab =
      std::max<int64_t>(int64_t{64} << 10, options.memory_budget / (4 * pool.size()));
  for (size_t ia = 0; ia < a.strategy().tensors().size(); ++ia) {
    const TensorStrategy& ta = a.strategy().tensors()[ia];
    TensorDiff d;
    d.name = ta.name;
    const TensorStrategy* tb = b.strategy().Find(ta.name);
    if (tb == nullptr) {
      d.problem = "missing in B";
    } else if (ta.layout.shape != tb->layout.shape || ta.layout.dtype != tb->layout.dtype) {
      d.problem = std::string(DTypeName(ta.layout.dtype)) + " " + ShapeToString(ta.layout.shape) +
                  " vs " + std::string(DTypeName(tb->layout.dtype)) + " " +
                  ShapeToString(tb->layout.shape);
    } else {
      d.elements = NumElements(ta.layout);
      const size_t ib = static_cast<size_t>(tb - b.strategy().tensors().data());
      if (d.elements > 0) {
        // Slabs over the finer of the two split shapes (views), which both
        // readers can read; the whole tensor when neither refines the other.
        const std::vector<int64_t>& ca = ta.layout.split_shape();
        const std::vector<int64_t>& cb = tb->layout.split_shape();
        const std::vector<int64_t> coords = RefinesShape(ca, cb)   ? ca
                                            : RefinesShape(cb, ca) ? cb
                                                                   : ta.layout.shape;
        const bool whole = !RefinesShape(coords, ca) || !RefinesShape(coords, cb);
        const int64_t limit = whole ? std::numeric_limits<int64_t>::max() : slab;
        for (const Box& box : SplitBox(Box::FromShape(coords), DTypeSize(ta.layout.dtype), limit)) {
          jobs.push_back({report.tensors.size(), ia, ib, box, coords});
        }
      }
    }
    report.tensors.push_back(std::move(d));
  }
  for (const TensorStrategy& tb : b.strategy().tensors()) {
    if (a.strategy().Find(tb.name) == nullptr) {
      TensorDiff d;
      d.name = tb.name;
      d.problem = "missing in A";
      report.tensors.push_back(std::move(d));
    }
  }
  std::mutex mu;
  RETURN_IF_ERROR(pool.ParallelFor(static_cast<int64_t>(jobs.size()), [&](int64_t k) -> Status {
    const Job& j = jobs[k];
    const DType dtype = a.strategy().tensors()[j.ia].layout.dtype;
    const int64_t n = NumElements(j.box);
    const std::vector<int64_t> ext = j.box.extents();
    const std::string what = "tensor '" + report.tensors[j.diff].name + "' " + ToString(j.box);
    ASSIGN_OR_RETURN(auto x, AllocateBytes(n * DTypeSize(dtype), what));
    ASSIGN_OR_RETURN(auto y, AllocateBytes(n * DTypeSize(dtype), what));
    RETURN_IF_ERROR(ReadRegionOver(a, j.ia, j.coords, j.box, x.get()));
    RETURN_IF_ERROR(ReadRegionOver(b, j.ib, j.coords, j.box, y.get()));
    const Partial p = Compare(x.get(), y.get(), n, dtype, options);
    std::lock_guard<std::mutex> lock(mu);
    TensorDiff& d = report.tensors[j.diff];
    d.differing += p.differing;
    d.max_abs = std::max(d.max_abs, p.max_abs);
    d.max_rel = std::max(d.max_rel, p.max_rel);
    return Status::Ok();
  }));
  return report;
}

}  // namespace tessera
