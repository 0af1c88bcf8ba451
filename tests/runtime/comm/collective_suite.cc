#include "tests/runtime/comm/collective_suite.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "core/half.h"
#include "runtime/comm/mesh_comms.h"
#include "transform/mesh.h"

namespace tessera::testing {
namespace {

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI8,
                                DType::kU8,  DType::kI16, DType::kU16,  DType::kI32, DType::kU32,
                                DType::kI64, DType::kU64, DType::kBool};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg};

bool IsSigned(DType d) {
  return IsFloatingPoint(d) || d == DType::kI8 || d == DType::kI16 || d == DType::kI32 ||
         d == DType::kI64;
}

// Writes v (exactly representable in d, or rounded as d rounds) as element i.
void Set(DType d, void* buf, int64_t i, double v) {
  switch (d) {
    case DType::kF32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      return;
    case DType::kF64:
      static_cast<double*>(buf)[i] = v;
      return;
    case DType::kF16:
      static_cast<uint16_t*>(buf)[i] = FloatToHalf(static_cast<float>(v));
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(buf)[i] = FloatToBF16(static_cast<float>(v));
      return;
    case DType::kI8:
      static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v);
      return;
    case DType::kI16:
      static_cast<int16_t*>(buf)[i] = static_cast<int16_t>(v);
      return;
    case DType::kU16:
      static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(v);
      return;
    case DType::kI32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      return;
    case DType::kU32:
      static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(v);
      return;
    case DType::kI64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      return;
    case DType::kU64:
      static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(v);
      return;
    case DType::kBool:
      static_cast<uint8_t*>(buf)[i] = v != 0;
      return;
  }
}

double Get(DType d, const void* buf, int64_t i) {
  switch (d) {
    case DType::kF32:
      return static_cast<const float*>(buf)[i];
    case DType::kF64:
      return static_cast<const double*>(buf)[i];
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::kBF16:
      return BF16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::kI8:
      return static_cast<const int8_t*>(buf)[i];
    case DType::kU8:
      return static_cast<const uint8_t*>(buf)[i];
    case DType::kI16:
      return static_cast<const int16_t*>(buf)[i];
    case DType::kU16:
      return static_cast<const uint16_t*>(buf)[i];
    case DType::kI32:
      return static_cast<const int32_t*>(buf)[i];
    case DType::kU32:
      return static_cast<const uint32_t*>(buf)[i];
    case DType::kI64:
      return static_cast<const int64_t*>(buf)[i];
    case DType::kU64:
      return static_cast<double>(static_cast<const uint64_t*>(buf)[i]);
    case DType::kBool:
      return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

// Small integers (exact in every dtype, sums of 8 ranks too), so that any
// reduction order gives the same bits.
double Value(DType d, int rank, int64_t i, int salt) {
  if (d == DType::kBool) return (rank + i + salt) % 3 == 0;
  const int64_t v = (rank * 7 + i * 13 + salt * 5) % 17;
  return IsSigned(d) ? static_cast<double>(v - 8) : static_cast<double>(v);
}

using Bytes = std::vector<char>;

std::string Show(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

Bytes Make(DType d, int64_t count, int rank, int salt) {
  Bytes b(std::max<int64_t>(count, 1) * DTypeSize(d));
  for (int64_t i = 0; i < count; ++i) Set(d, b.data(), i, Value(d, rank, i, salt));
  return b;
}

// The expected reduction of the ranks' Value()s at element i.
double Reduced(DType d, ReduceOp op, int n, int64_t i, int salt) {
  double acc = Value(d, 0, i, salt);
  for (int r = 1; r < n; ++r) {
    const double v = Value(d, r, i, salt);
    if (d == DType::kBool) {
      acc = op == ReduceOp::kMin ? (acc && v) : (acc || v);
    } else if (op == ReduceOp::kMax) {
      acc = std::max(acc, v);
    } else if (op == ReduceOp::kMin) {
      acc = std::min(acc, v);
    } else {
      acc += v;
    }
  }
  if (op != ReduceOp::kAvg) return acc;
  if (d == DType::kF64) return acc / n;
  if (IsFloatingPoint(d)) return static_cast<float>(acc) / static_cast<float>(n);
  return std::trunc(acc / n);
}

class Suite {
 public:
  Suite(Communicator& comm, const SuiteOptions& options)
      : c_(comm), o_(options), n_(comm.size()), r_(comm.rank()) {}

  std::vector<std::string> Run() {
    (void)(Barrier() && Broadcast() && AllReduce() && AllReduceOrder() && AllGather() &&
           ReduceScatter() && GatherScatter() && AllToAll() && Async() && PointToPoint() &&
           Split() && Mismatch());
    return failures_;
  }

 private:
  void Fail(const std::string& what) {
    if (failures_.size() < 20) failures_.push_back("rank " + std::to_string(r_) + ": " + what);
  }
  // False (and a failure) when s is not OK: the caller stops the suite.
  bool Ok(const Status& s, const std::string& what) {
    if (s.ok()) return true;
    Fail(what + ": " + s.ToString());
    return false;
  }
  // Compares `count` elements of got against want (bytes).
  void Same(const void* got, const void* want, int64_t count, DType d, const std::string& what) {
    if (count == 0) return;
    if (std::memcmp(got, want, count * DTypeSize(d)) == 0) return;
    for (int64_t i = 0; i < count; ++i) {
      if (std::memcmp(static_cast<const char*>(got) + i * DTypeSize(d),
                      static_cast<const char*>(want) + i * DTypeSize(d), DTypeSize(d)) != 0) {
        Fail(what + ": element " + std::to_string(i) + " is " + Show(Get(d, got, i)) +
             ", expected " + Show(Get(d, want, i)));
        return;
      }
    }
  }
  std::string Name(const char* op, DType d, int64_t count) {
    return std::string(op) + " " + std::string(DTypeName(d)) + " x" + std::to_string(count);
  }

  bool Reducible(DType d) const {
    return o_.reduces_16bit_ints || (d != DType::kI16 && d != DType::kU16);
  }

  bool Barrier() { return Ok(c_.Barrier(), "barrier"); }

  bool Broadcast() {
    for (DType d : kAllDTypes) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1000}}) {
        for (int root = 0; root < n_; ++root) {
          Bytes buf = r_ == root ? Make(d, count, root, 1) : Bytes(Make(d, count, 99, 2));
          const std::string what = Name("broadcast", d, count) + " root " + std::to_string(root);
          if (!Ok(c_.Broadcast(buf.data(), count, d, root), what)) return false;
          Same(buf.data(), Make(d, count, root, 1).data(), count, d, what);
        }
      }
    }
    return true;
  }

  bool AllReduce() {
    int round = 0;
    for (DType d : kAllDTypes) {
      for (ReduceOp op : kAllOps) {
        if (d == DType::kBool && op == ReduceOp::kAvg) continue;
        if (!Reducible(d)) continue;
        for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{5003}}) {
          const int salt = ++round;
          Bytes send = Make(d, count, r_, salt);
          Bytes want(send.size());
          for (int64_t i = 0; i < count; ++i) Set(d, want.data(), i, Reduced(d, op, n_, i, salt));
          const bool in_place = round % 2 == 0;
          Bytes recv(send.size());
          const std::string what = Name("allreduce", d, count) + " " +
                                   std::string(ReduceOpName(op)) + (in_place ? " in place" : "");
          if (!Ok(c_.AllReduce(send.data(), in_place ? send.data() : recv.data(), count, d, op),
                  what)) {
            return false;
          }
          Same(in_place ? send.data() : recv.data(), want.data(), count, d, what);
        }
      }
    }
    // bool avg is refused on every rank, before any communication.
    uint8_t flag = 1;
    if (c_.AllReduce(&flag, &flag, 1, DType::kBool, ReduceOp::kAvg).ok()) {
      Fail("allreduce avg of bool was accepted");
    }
    return true;
  }

  // Non-integer data: the result depends on the order of the additions.
  bool AllReduceOrder() {
    const int64_t count = 4099;
    for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        auto value = [&](int rank, int64_t i) {
          return std::sin(0.37 * (i + 1) * (rank + 1)) * (1 + rank) / 3.0;
        };
        Bytes send(count * DTypeSize(d)), want(count * DTypeSize(d));
        for (int64_t i = 0; i < count; ++i) Set(d, send.data(), i, value(r_, i));
        for (int64_t i = 0; i < count; ++i) {
          Bytes one(DTypeSize(d));
          // The left fold, in the accumulation type of the dtype.
          if (d == DType::kF64) {
            double acc = value(0, i);
            for (int r = 1; r < n_; ++r) acc = acc + value(r, i);
            Set(d, want.data(), i, op == ReduceOp::kAvg ? acc / n_ : acc);
          } else {
            float acc = 0;
            for (int r = 0; r < n_; ++r) {
              Set(d, one.data(), 0, value(r, i));
              const float x = static_cast<float>(Get(d, one.data(), 0));
              acc = r == 0 ? x : acc + x;
            }
            Set(d, want.data(), i, op == ReduceOp::kAvg ? acc / static_cast<float>(n_) : acc);
          }
        }
        const std::string what =
            Name("allreduce (order)", d, count) + " " + std::string(ReduceOpName(op));
        if (!Ok(c_.AllReduce(send.data(), send.data(), count, d, op), what)) return false;
        if (o_.bitwise_order) {
          Same(send.data(), want.data(), count, d, what);
          continue;
        }
        const double tol = d == DType::kF64 ? 1e-12 : d == DType::kF32 ? 1e-5 : 2e-2;
        for (int64_t i = 0; i < count; ++i) {
          const double g = Get(d, send.data(), i), w = Get(d, want.data(), i);
          if (std::fabs(g - w) > tol * (std::fabs(w) + 1)) {
            Fail(what + ": element " + std::to_string(i) + " is " + Show(g) + ", expected " +
                 Show(w));
            break;
          }
        }
      }
    }
    return true;
  }

  bool AllGather() {
    for (DType d : kAllDTypes) {
      for (int64_t count : {int64_t{0}, int64_t{3}, int64_t{777}}) {
        Bytes send = Make(d, count, r_, 5);
        Bytes recv(std::max<int64_t>(count * n_, 1) * DTypeSize(d));
        const std::string what = Name("allgather", d, count);
        if (!Ok(c_.AllGather(send.data(), count, recv.data(), d), what)) return false;
        for (int r = 0; r < n_; ++r) {
          Same(recv.data() + r * count * DTypeSize(d), Make(d, count, r, 5).data(), count, d,
               what + " block " + std::to_string(r));
        }
      }
      // Variable sizes, some ranks contributing nothing.
      std::vector<int64_t> counts(n_);
      for (int r = 0; r < n_; ++r) counts[r] = r % 3 == 2 ? 0 : 10 * r + 1;
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      Bytes send = Make(d, counts[r_], r_, 6);
      Bytes recv(std::max<int64_t>(total, 1) * DTypeSize(d));
      const std::string what = Name("allgatherv", d, total);
      if (!Ok(c_.AllGatherV(send.data(), counts[r_], recv.data(), counts, d), what)) return false;
      int64_t offset = 0;
      for (int r = 0; r < n_; ++r) {
        Same(recv.data() + offset * DTypeSize(d), Make(d, counts[r], r, 6).data(), counts[r], d,
             what + " block " + std::to_string(r));
        offset += counts[r];
      }
    }
    return true;
  }

  bool ReduceScatter() {
    int salt = 100;
    for (DType d : kAllDTypes) {
      for (ReduceOp op : kAllOps) {
        if (d == DType::kBool && op == ReduceOp::kAvg) continue;
        if (!Reducible(d)) continue;
        for (int64_t count : {int64_t{0}, int64_t{3}, int64_t{1001}}) {
          ++salt;
          Bytes send = Make(d, count * n_, r_, salt);
          Bytes recv(std::max<int64_t>(count, 1) * DTypeSize(d)), want(recv.size());
          for (int64_t i = 0; i < count; ++i) {
            Set(d, want.data(), i, Reduced(d, op, n_, r_ * count + i, salt));
          }
          const std::string what =
              Name("reduce_scatter", d, count) + " " + std::string(ReduceOpName(op));
          if (!Ok(c_.ReduceScatter(send.data(), recv.data(), count, d, op), what)) return false;
          Same(recv.data(), want.data(), count, d, what);
        }
      }
    }
    return true;
  }

  bool GatherScatter() {
    for (DType d : {DType::kF32, DType::kBF16, DType::kI64, DType::kBool, DType::kU8}) {
      std::vector<int64_t> counts(n_);
      for (int r = 0; r < n_; ++r) counts[r] = (r * 5) % 7;
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      for (int root = 0; root < n_; ++root) {
        const std::string at = " root " + std::to_string(root);
        // Gather.
        const int64_t count = 9;
        Bytes send = Make(d, count, r_, 7);
        Bytes recv(count * n_ * DTypeSize(d));
        if (!Ok(c_.Gather(send.data(), count, recv.data(), d, root),
                Name("gather", d, count) + at)) {
          return false;
        }
        if (r_ == root) {
          for (int r = 0; r < n_; ++r) {
            Same(recv.data() + r * count * DTypeSize(d), Make(d, count, r, 7).data(), count, d,
                 Name("gather", d, count) + at);
          }
        }
        // GatherV.
        Bytes vsend = Make(d, counts[r_], r_, 8);
        Bytes vrecv(std::max<int64_t>(total, 1) * DTypeSize(d));
        if (!Ok(c_.GatherV(vsend.data(), counts[r_], vrecv.data(), counts, d, root),
                Name("gatherv", d, total) + at)) {
          return false;
        }
        if (r_ == root) {
          int64_t offset = 0;
          for (int r = 0; r < n_; ++r) {
            Same(vrecv.data() + offset * DTypeSize(d), Make(d, counts[r], r, 8).data(), counts[r],
                 d, Name("gatherv", d, total) + at);
            offset += counts[r];
          }
        }
        // Scatter: the root's buffer holds block r = Make(r).
        Bytes all(count * n_ * DTypeSize(d));
        for (int r = 0; r < n_ && r_ == root; ++r) {
          Bytes block = Make(d, count, r, 9);
          std::memcpy(all.data() + r * count * DTypeSize(d), block.data(), count * DTypeSize(d));
        }
        Bytes mine(count * DTypeSize(d));
        if (!Ok(c_.Scatter(all.data(), mine.data(), count, d, root),
                Name("scatter", d, count) + at)) {
          return false;
        }
        Same(mine.data(), Make(d, count, r_, 9).data(), count, d, Name("scatter", d, count) + at);
        // ScatterV.
        Bytes vall(std::max<int64_t>(total, 1) * DTypeSize(d));
        int64_t offset = 0;
        for (int r = 0; r < n_; ++r) {
          Bytes block = Make(d, counts[r], r, 10);
          if (r_ == root && counts[r] > 0) {
            std::memcpy(vall.data() + offset * DTypeSize(d), block.data(),
                        counts[r] * DTypeSize(d));
          }
          offset += counts[r];
        }
        Bytes vmine(std::max<int64_t>(counts[r_], 1) * DTypeSize(d));
        if (!Ok(c_.ScatterV(vall.data(), counts, vmine.data(), counts[r_], d, root),
                Name("scatterv", d, total) + at)) {
          return false;
        }
        Same(vmine.data(), Make(d, counts[r_], r_, 10).data(), counts[r_], d,
             Name("scatterv", d, total) + at);
      }
    }
    return true;
  }

  bool AllToAll() {
    for (DType d : kAllDTypes) {
      // Uniform: block j of rank i's send is Make(d, count, i * 100 + j).
      const int64_t count = 5;
      Bytes send(count * n_ * DTypeSize(d)), recv(send.size());
      for (int j = 0; j < n_; ++j) {
        Bytes block = Make(d, count, r_ * 100 + j, 11);
        std::memcpy(send.data() + j * count * DTypeSize(d), block.data(), count * DTypeSize(d));
      }
      if (!Ok(c_.AllToAll(send.data(), recv.data(), count, d), Name("alltoall", d, count))) {
        return false;
      }
      for (int i = 0; i < n_; ++i) {
        Same(recv.data() + i * count * DTypeSize(d), Make(d, count, i * 100 + r_, 11).data(), count,
             d, Name("alltoall", d, count) + " from rank " + std::to_string(i));
      }
      // Variable: rank i sends (i + 2j) % 4 elements to rank j.
      auto amount = [](int i, int j) { return int64_t{(i + 2 * j) % 4}; };
      std::vector<int64_t> sc(n_), rc(n_);
      for (int j = 0; j < n_; ++j) sc[j] = amount(r_, j);
      for (int i = 0; i < n_; ++i) rc[i] = amount(i, r_);
      Bytes vsend(std::max<int64_t>(std::accumulate(sc.begin(), sc.end(), int64_t{0}), 1) *
                  DTypeSize(d));
      Bytes vrecv(std::max<int64_t>(std::accumulate(rc.begin(), rc.end(), int64_t{0}), 1) *
                  DTypeSize(d));
      int64_t offset = 0;
      for (int j = 0; j < n_; ++j) {
        Bytes block = Make(d, sc[j], r_ * 100 + j, 12);
        if (sc[j])
          std::memcpy(vsend.data() + offset * DTypeSize(d), block.data(), sc[j] * DTypeSize(d));
        offset += sc[j];
      }
      if (!Ok(c_.AllToAllV(vsend.data(), sc, vrecv.data(), rc, d), Name("alltoallv", d, 0))) {
        return false;
      }
      offset = 0;
      for (int i = 0; i < n_; ++i) {
        Same(vrecv.data() + offset * DTypeSize(d), Make(d, rc[i], i * 100 + r_, 12).data(), rc[i],
             d, Name("alltoallv", d, rc[i]) + " from rank " + std::to_string(i));
        offset += rc[i];
      }
    }
    return true;
  }

  // Non-blocking collectives: five in flight at once, a blocking one issued
  // between them, waited for in reverse order; each equals its blocking
  // twin (bit for bit where the backend's order is the rank-order fold).
  bool Async() {
    const int64_t count = 1031;
    for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        const int64_t es = DTypeSize(d);
        auto fill = [&](int64_t n, int salt) {
          Bytes b(std::max<int64_t>(n, 1) * es);
          for (int64_t i = 0; i < n; ++i) {
            Set(d, b.data(), i,
                IsFloatingPoint(d) ? std::sin(0.37 * (i + 1 + salt) * (r_ + 1)) * (1 + r_) / 3.0
                                   : Value(d, r_, i, salt));
          }
          return b;
        };
        const Bytes ar_in = fill(count, 1), rs_in = fill(count * n_, 2), ag_in = fill(count, 3),
                    aa_in = fill(count * n_, 4);
        Bytes ar_out(count * es), in_place = fill(count, 5), rs_out(count * es),
                                  ag_out(count * n_ * es), aa_out(count * n_ * es);
        const std::string what = Name("async", d, count) + " " + std::string(ReduceOpName(op));
        std::vector<Request> reqs;
        auto issue = [&](Result<Request> r, const char* call) {
          if (!Ok(r.status(), what + ": " + call)) return false;
          reqs.push_back(std::move(r).value());
          return true;
        };
        if (!issue(c_.IAllReduce(ar_in.data(), ar_out.data(), count, d, op), "iallreduce") ||
            !issue(c_.IAllReduce(in_place.data(), in_place.data(), count, d, op),
                   "iallreduce in place") ||
            !issue(c_.IReduceScatter(rs_in.data(), rs_out.data(), count, d, op),
                   "ireducescatter")) {
          return false;
        }
        int64_t mid = r_ + 1;
        if (!Ok(c_.AllReduce(&mid, &mid, 1, DType::kI64, ReduceOp::kSum), what + ": blocking")) {
          return false;
        }
        if (mid != int64_t{n_} * (n_ + 1) / 2) Fail(what + ": the blocking allreduce between");
        if (!issue(c_.IAllGather(ag_in.data(), count, ag_out.data(), d), "iallgather") ||
            !issue(c_.IAllToAll(aa_in.data(), aa_out.data(), count, d), "ialltoall")) {
          return false;
        }
        std::reverse(reqs.begin(), reqs.end());
        if (!Ok(WaitAll(reqs), what + ": wait")) return false;
        // The blocking twins.
        Bytes ar_want(count * es), in_place_want = fill(count, 5), rs_want(count * es),
                                   ag_want(count * n_ * es), aa_want(count * n_ * es);
        if (!Ok(c_.AllReduce(ar_in.data(), ar_want.data(), count, d, op), what) ||
            !Ok(c_.AllReduce(in_place_want.data(), in_place_want.data(), count, d, op), what) ||
            !Ok(c_.ReduceScatter(rs_in.data(), rs_want.data(), count, d, op), what) ||
            !Ok(c_.AllGather(ag_in.data(), count, ag_want.data(), d), what) ||
            !Ok(c_.AllToAll(aa_in.data(), aa_want.data(), count, d), what)) {
          return false;
        }
        Same(ag_out.data(), ag_want.data(), count * n_, d, what + " allgather");
        Same(aa_out.data(), aa_want.data(), count * n_, d, what + " alltoall");
        const bool exact = o_.bitwise_order || !IsFloatingPoint(d) || op == ReduceOp::kMax;
        auto close = [&](const Bytes& got, const Bytes& want, const std::string& which) {
          if (exact) return Same(got.data(), want.data(), count, d, what + " " + which);
          const double tol = d == DType::kF64 ? 1e-12 : d == DType::kF32 ? 1e-5 : 2e-2;
          for (int64_t i = 0; i < count; ++i) {
            const double g = Get(d, got.data(), i), w = Get(d, want.data(), i);
            if (std::fabs(g - w) > tol * (std::fabs(w) + 1)) {
              return Fail(what + " " + which + ": element " + std::to_string(i) + " is " + Show(g) +
                          ", expected " + Show(w));
            }
          }
        };
        close(ar_out, ar_want, "allreduce");
        close(in_place, in_place_want, "allreduce in place");
        close(rs_out, rs_want, "reducescatter");
      }
    }
    return Ok(c_.Barrier(), "barrier after async");
  }

  bool PointToPoint() {
    if (n_ == 1) return true;
    const int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
    for (DType d : {DType::kF32, DType::kF16, DType::kI64, DType::kBool}) {
      // Three tagged messages each way around the ring, received in the
      // reverse order of sending: tags, not arrival order, match them.
      std::vector<Bytes> out, in;
      std::vector<Request> reqs;
      for (int tag = 0; tag < 3; ++tag) {
        out.push_back(Make(d, 100 + tag, r_ * 10 + tag, 13));
        in.emplace_back((100 + tag) * DTypeSize(d));
      }
      for (int tag = 2; tag >= 0; --tag) {
        auto req = c_.IRecv(in[tag].data(), 100 + tag, d, prev, tag);
        if (!Ok(req.status(), "irecv")) return false;
        reqs.push_back(std::move(req).value());
      }
      for (int tag = 0; tag < 3; ++tag) {
        auto req = c_.ISend(out[tag].data(), 100 + tag, d, next, tag);
        if (!Ok(req.status(), "isend")) return false;
        reqs.push_back(std::move(req).value());
      }
      if (!Ok(WaitAll(reqs), "wait (ring)")) return false;
      for (int tag = 0; tag < 3; ++tag) {
        Same(in[tag].data(), Make(d, 100 + tag, prev * 10 + tag, 13).data(), 100 + tag, d,
             Name("ring", d, 100 + tag) + " tag " + std::to_string(tag));
      }
    }
    // Blocking Send/Recv between ranks 0 and 1, both directions.
    if (r_ < 2) {
      Bytes mine = Make(DType::kI32, 64, r_, 14), theirs(64 * 4);
      const int peer = 1 - r_;
      Status s = r_ == 0 ? c_.Send(mine.data(), 64, DType::kI32, peer, 7)
                         : c_.Recv(theirs.data(), 64, DType::kI32, peer, 7);
      if (!Ok(s, "send/recv")) return false;
      s = r_ == 0 ? c_.Recv(theirs.data(), 64, DType::kI32, peer, 8)
                  : c_.Send(mine.data(), 64, DType::kI32, peer, 8);
      if (!Ok(s, "send/recv back")) return false;
      Same(theirs.data(), Make(DType::kI32, 64, peer, 14).data(), 64, DType::kI32, "send/recv");
    }
    // A receive expecting a different count fails on the receiver, naming
    // the peer and tag.
    if (r_ < 2) {
      Bytes buf(16 * 4);
      if (r_ == 0) {
        if (!Ok(c_.Send(buf.data(), 12, DType::kF32, 1, 9), "send (short)")) return false;
      } else {
        Status s = c_.Recv(buf.data(), 16, DType::kF32, 0, 9);
        if (s.ok() || s.message().find("rank 0") == std::string::npos ||
            s.message().find("tag 9") == std::string::npos) {
          Fail("receive with the wrong count: " + s.ToString());
        }
      }
    }
    return Ok(c_.Barrier(), "barrier after p2p");
  }

  bool Split() {
    // Even and odd ranks, each group ordered by descending old rank.
    auto sub = c_.Split(r_ % 2, -r_);
    if (!Ok(sub.status(), "split")) return false;
    Communicator& g = **sub;
    std::vector<int> members;
    for (int r = n_ - 1; r >= 0; --r) {
      if (r % 2 == r_ % 2) members.push_back(r);
    }
    if (g.size() != static_cast<int>(members.size())) Fail("split: wrong group size");
    const int expect_rank =
        static_cast<int>(std::find(members.begin(), members.end(), r_) - members.begin());
    if (g.rank() != expect_rank) Fail("split: rank " + std::to_string(g.rank()));
    int64_t sum = r_;
    if (!Ok(g.AllReduce(&sum, &sum, 1, DType::kI64, ReduceOp::kSum), "allreduce in split")) {
      return false;
    }
    const int64_t want = std::accumulate(members.begin(), members.end(), int64_t{0});
    if (sum != want) Fail("split: allreduce gave " + std::to_string(sum));
    // Rank 0 stays out (negative color): it gets no communicator.
    auto rest = c_.Split(r_ == 0 ? -1 : 0, r_);
    if (!Ok(rest.status(), "split (undefined)")) return false;
    if ((r_ == 0) != (*rest == nullptr)) Fail("split: negative color must give nullptr");
    if (*rest != nullptr && (*rest)->size() != n_ - 1) Fail("split: wrong size without rank 0");
    return Ok(c_.Barrier(), "barrier after split");
  }

  bool Mismatch() {
    // Every backend refuses a negative count locally, before any exchange.
    float one = 1.0f;
    Status negative = c_.AllReduce(&one, &one, -3, DType::kF32, ReduceOp::kSum);
    if (negative.code() != StatusCode::kInvalidArgument ||
        negative.message().find("negative count -3") == std::string::npos) {
      Fail("allreduce of -3 elements: " + negative.ToString());
      return false;
    }
    negative = c_.ReduceScatter(&one, &one, -1, DType::kF32, ReduceOp::kSum);
    if (negative.code() != StatusCode::kInvalidArgument) {
      Fail("reduce-scatter of -1 elements: " + negative.ToString());
      return false;
    }
    if (!o_.reports_mismatch || n_ == 1) return true;
    std::vector<float> buf(16, 1.0f);
    const int64_t count = r_ == 0 ? 10 : 11;
    Status s = c_.AllReduce(buf.data(), buf.data(), count, DType::kF32, ReduceOp::kSum);
    if (s.ok() || s.code() != StatusCode::kInvalidArgument ||
        s.message().find("rank 0: allreduce of 10 f32") == std::string::npos ||
        s.message().find("rank 1: allreduce of 11 f32") == std::string::npos) {
      Fail("mismatched allreduce: " + s.ToString());
      return false;
    }
    // A different collective altogether.
    s = r_ == 1 ? c_.Broadcast(buf.data(), 4, DType::kF32, 0)
                : c_.AllGather(buf.data(), 1, buf.data() + 8, DType::kF32);
    if (s.ok() || s.message().find("broadcast") == std::string::npos) {
      Fail("mismatched collectives: " + s.ToString());
      return false;
    }
    return Ok(c_.Barrier(), "barrier after mismatch");
  }

  Communicator& c_;
  SuiteOptions o_;
  int n_, r_;
  std::vector<std::string> failures_;
};

}  // namespace

std::vector<std::string> RunCollectiveSuite(Communicator& comm, const SuiteOptions& options) {
  return Suite(comm, options).Run();
}

std::vector<std::string> RunMeshSuite(Communicator& comm) {
  std::vector<std::string> failures;
  const std::string me = "rank " + std::to_string(comm.rank()) + ": ";
  auto fail = [&](const std::string& s) { failures.push_back(me + s); };
  const int n = comm.size();
  auto mesh = n == 8   ? Mesh::Create({"pp", "dp", "tp"}, {2, 2, 2})
              : n == 4 ? Mesh::Create({"dp", "tp"}, {2, 2})
              : n == 2 ? Mesh::Create({"dp", "tp"}, {2, 1})
                       : Mesh::Create({"tp"}, {n});
  if (!mesh.ok()) return {me + mesh.status().ToString()};
  auto comms = MeshCommunicators::Create(comm, *mesh);
  if (!comms.ok()) return {me + comms.status().ToString()};
  const std::vector<int64_t> coord = mesh->Coordinates(comm.rank());
  const int nd = mesh->ndim();
  for (uint32_t mask = 1; mask < (1u << nd); ++mask) {
    std::vector<std::string> axes;
    int64_t size = 1, expect_rank = 0;
    for (int a = 0; a < nd; ++a) {
      if (!(mask & (1u << a))) continue;
      axes.push_back(mesh->axis_name(a));
      size *= mesh->axis_size(a);
      expect_rank = expect_rank * mesh->axis_size(a) + coord[a];
    }
    auto g = comms->Along(axes);
    if (!g.ok()) return {me + g.status().ToString()};
    std::string label = axes[0];
    for (size_t i = 1; i < axes.size(); ++i) label += "+" + axes[i];
    if ((*g)->size() != size || (*g)->rank() != expect_rank || (*g)->name() != label) {
      fail("group " + label + ": size " + std::to_string((*g)->size()) + " rank " +
           std::to_string((*g)->rank()) + " name " + (*g)->name());
    }
    // The sum of world ranks over the group: those agreeing on the other axes.
    int64_t sum = comm.rank(), want = 0;
    for (int64_t r = 0; r < n; ++r) {
      const auto c = mesh->Coordinates(r);
      bool same = true;
      for (int a = 0; a < nd; ++a) same = same && ((mask & (1u << a)) || c[a] == coord[a]);
      if (same) want += r;
    }
    Status s = (*g)->AllReduce(&sum, &sum, 1, DType::kI64, ReduceOp::kSum);
    if (!s.ok()) return {me + s.ToString()};
    if (sum != want) fail("group " + label + ": sum of ranks " + std::to_string(sum));
  }
  // Named in any order, the same group.
  if (nd >= 2) {
    auto a = comms->Along({mesh->axis_name(nd - 1), mesh->axis_name(0)});
    auto b = comms->Along({mesh->axis_name(0), mesh->axis_name(nd - 1)});
    if (!a.ok() || !b.ok() || *a != *b) fail("axis order changed the group");
  }
  const std::string first = mesh->axis_name(0);
  const int64_t c0 = coord[0];
  if (comms->Prev(first) != (c0 == 0 ? -1 : c0 - 1) ||
      comms->Next(first) != (c0 + 1 == mesh->axis_size(0) ? -1 : c0 + 1)) {
    fail("neighbours along " + first);
  }
  if (comms->Along("nope").ok()) fail("an unknown axis was accepted");
  return failures;
}

}  // namespace tessera::testing
