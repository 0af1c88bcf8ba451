#include "runtime/comm/reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/half.h"

namespace tessera {
namespace {

// How a stored element type is accumulated: T is the storage, A the
// accumulator; Load/Store convert.
template <typename T, bool kSignedInt = std::is_integral_v<T>&& std::is_signed_v<T>>
struct Accumulator {
  using type = T;
};
template <typename T>
struct Accumulator<T, true> {  // signed sums wrap like unsigned ones, never UB
  using type = std::make_unsigned_t<T>;
};

template <typename T>
struct Plain {
  using A = typename Accumulator<T>::type;
  static A Load(T v) { return static_cast<A>(v); }
  static T Store(A v) { return static_cast<T>(v); }
  static A Div(A v, int n) {
    if constexpr (std::is_integral_v<T>) return static_cast<A>(static_cast<T>(v) / n);
    return v / static_cast<A>(n);
  }
  static A Max(A a, A b) { return static_cast<T>(a) < static_cast<T>(b) ? b : a; }
  static A Min(A a, A b) { return static_cast<T>(b) < static_cast<T>(a) ? b : a; }
};
struct F16 {
  using A = float;
  static A Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(A v) { return FloatToHalf(v); }
  static A Div(A v, int n) { return v / static_cast<float>(n); }
  static A Max(A a, A b) { return a < b ? b : a; }
  static A Min(A a, A b) { return b < a ? b : a; }
};
struct BF16 : F16 {
  static A Load(uint16_t v) { return BF16ToFloat(v); }
  static uint16_t Store(A v) { return FloatToBF16(v); }
};
struct Bool {  // sum/max = or, min = and
  using A = uint8_t;
  static A Load(uint8_t v) { return v != 0; }
  static uint8_t Store(A v) { return v; }
  static A Div(A v, int) { return v; }
  static A Max(A a, A b) { return a | b; }
  static A Min(A a, A b) { return a & b; }
};

template <typename T, typename Traits>
void Fold(ReduceOp op, std::span<const void* const> inputs, void* out_v, int64_t count) {
  using A = typename Traits::A;
  constexpr int64_t kBlock = 1024;
  A acc[kBlock];
  T* out = static_cast<T*>(out_v);
  const int n = static_cast<int>(inputs.size());
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t len = std::min(kBlock, count - begin);
    const T* first = static_cast<const T*>(inputs[0]) + begin;
    for (int64_t i = 0; i < len; ++i) acc[i] = Traits::Load(first[i]);
    for (int r = 1; r < n; ++r) {
      const T* in = static_cast<const T*>(inputs[r]) + begin;
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          if constexpr (std::is_same_v<Traits, Bool>) {
            for (int64_t i = 0; i < len; ++i) acc[i] |= Traits::Load(in[i]);
          } else {
            for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] + Traits::Load(in[i]);
          }
          break;
        case ReduceOp::kMax:
          for (int64_t i = 0; i < len; ++i) acc[i] = Traits::Max(acc[i], Traits::Load(in[i]));
          break;
        case ReduceOp::kMin:
          for (int64_t i = 0; i < len; ++i) acc[i] = Traits::Min(acc[i], Traits::Load(in[i]));
          break;
      }
    }
    if (op == ReduceOp::kAvg) {
      for (int64_t i = 0; i < len; ++i) acc[i] = Traits::Div(acc[i], n);
    }
    for (int64_t i = 0; i < len; ++i) out[begin + i] = Traits::Store(acc[i]);
  }
}

template <typename T, typename Traits>
void Divide(void* buf_v, int64_t count, int n) {
  T* buf = static_cast<T*>(buf_v);
  for (int64_t i = 0; i < count; ++i) buf[i] = Traits::Store(Traits::Div(Traits::Load(buf[i]), n));
}

template <typename T, typename Traits, int kOp>  // kOp: 0 sum, 1 max, 2 min
void Pairwise(void* out_v, const void* a_v, const void* b_v, size_t n) {
  T* out = static_cast<T*>(out_v);
  const T* a = static_cast<const T*>(a_v);
  const T* b = static_cast<const T*>(b_v);
  for (size_t i = 0; i < n; ++i) {
    const auto x = Traits::Load(a[i]), y = Traits::Load(b[i]);
    if constexpr (kOp == 1) {
      out[i] = Traits::Store(Traits::Max(x, y));
    } else if constexpr (kOp == 2) {
      out[i] = Traits::Store(Traits::Min(x, y));
    } else if constexpr (std::is_same_v<Traits, Bool>) {
      out[i] = Traits::Store(x | y);
    } else {
      out[i] = Traits::Store(x + y);
    }
  }
}

template <typename T, typename Traits>
struct PairwiseF {
  static void Run(ReduceOp op, PairwiseReduceFn* fn) {
    *fn = op == ReduceOp::kMax   ? &Pairwise<T, Traits, 1>
          : op == ReduceOp::kMin ? &Pairwise<T, Traits, 2>
                                 : &Pairwise<T, Traits, 0>;
  }
};

// Calls F<T, Traits>(args...) for the dtype.
template <template <typename, typename> class F, typename... Args>
void Dispatch(DType dtype, Args&&... args) {
  switch (dtype) {
    case DType::kF32:
      return F<float, Plain<float>>::Run(args...);
    case DType::kF64:
      return F<double, Plain<double>>::Run(args...);
    case DType::kF16:
      return F<uint16_t, F16>::Run(args...);
    case DType::kBF16:
      return F<uint16_t, BF16>::Run(args...);
    case DType::kI8:
      return F<int8_t, Plain<int8_t>>::Run(args...);
    case DType::kU8:
      return F<uint8_t, Plain<uint8_t>>::Run(args...);
    case DType::kI16:
      return F<int16_t, Plain<int16_t>>::Run(args...);
    case DType::kU16:
      return F<uint16_t, Plain<uint16_t>>::Run(args...);
    case DType::kI32:
      return F<int32_t, Plain<int32_t>>::Run(args...);
    case DType::kU32:
      return F<uint32_t, Plain<uint32_t>>::Run(args...);
    case DType::kI64:
      return F<int64_t, Plain<int64_t>>::Run(args...);
    case DType::kU64:
      return F<uint64_t, Plain<uint64_t>>::Run(args...);
    case DType::kBool:
      return F<uint8_t, Bool>::Run(args...);
  }
}

template <typename T, typename Traits>
struct FoldF {
  static void Run(ReduceOp op, std::span<const void* const> in, void* out, int64_t count) {
    Fold<T, Traits>(op, in, out, count);
  }
};
template <typename T, typename Traits>
struct DivideF {
  static void Run(void* buf, int64_t count, int n) { Divide<T, Traits>(buf, count, n); }
};

}  // namespace

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "?";
}

Result<ReduceOp> ParseReduceOp(std::string_view name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
    if (name == ReduceOpName(op)) return op;
  }
  return InvalidArgumentError("unknown reduction '" + std::string(name) +
                              "' (expected sum, max, min or avg)");
}

Status CheckReduction(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool && op == ReduceOp::kAvg) {
    return InvalidArgumentError("avg is not defined on bool");
  }
  return Status::Ok();
}

void FoldBlocks(const void* blocks, int n, int64_t count, DType dtype, ReduceOp op, void* out) {
  std::vector<const void*> in(n);
  for (int i = 0; i < n; ++i)
    in[i] = static_cast<const char*>(blocks) + i * count * DTypeSize(dtype);
  ReduceRankOrder(dtype, op, in, out, count);
}

std::vector<int64_t> RankChunks(int64_t count, int n) {
  std::vector<int64_t> chunk(n);
  for (int r = 0; r < n; ++r) chunk[r] = count * (r + 1) / n - count * r / n;
  return chunk;
}

void ReduceRankOrder(DType dtype, ReduceOp op, std::span<const void* const> inputs, void* out,
                     int64_t count) {
  if (count <= 0 || inputs.empty()) return;
  // One input (a world of one rank): the fold is that input, bit for bit
  // (a mean divides by 1, f16 and bf16 come back from f32 exactly), so it
  // is copied, or left where it is, rather than folded (a single-process
  // GPT-2 step folded its 124M gradients into themselves).
  if (inputs.size() == 1) {
    if (inputs[0] != out) std::memcpy(out, inputs[0], count * DTypeSize(dtype));
    return;
  }
  Dispatch<FoldF>(dtype, op, inputs, out, count);
}

PairwiseReduceFn PairwiseReduce(DType dtype, ReduceOp op) {
  PairwiseReduceFn fn = nullptr;
  Dispatch<PairwiseF>(dtype, op, &fn);
  return fn;
}

void DivideInPlace(DType dtype, void* buf, int64_t count, int n) {
  if (count <= 0) return;
  Dispatch<DivideF>(dtype, buf, count, n);
}

}  // namespace tessera
