// The operators of runtime/parallel/operators.h one by one, against
// expectations written here from the header's documentation (and
// torch.chunk's cut), not from operators.cc:
//  - placements: equality, Resolved, ToString, and the Layout each gives,
//    whose ShardOf boxes must be the shards the runtime holds;
//  - PlanSteps for every pair of placements, tp 1 to 4, rows cut evenly or
//    not; OpContext::Plan's collectives and bytes per rank;
//  - OpContext::Convert run on in-process ranks for every pair: every
//    rank's result is its shard of the global matrix bit for bit, made by
//    the collectives the documented steps name (a recording communicator
//    sees them), forward and as OpGpt's backward uses it (ConvGrad);
//  - every operator's strategy checks over every assignment of {-, dp, tp,
//    dp*tp, tp*dp} to its dimensions: accepted == the documented set, each
//    with its documented OpInfo; refusals name the operator and the input;
//  - every operator's forward and backward on tp ranks, with the
//    conversions around it, against the same operator run whole.
#include "runtime/parallel/operators.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <utility>

#include "runtime/comm/inprocess.h"
#include "runtime/model/op_gpt.h"
#include "transform/layout.h"

namespace tessera {
namespace {

using Step = RedistStep;
using Calls = std::vector<std::pair<std::string, int64_t>>;

const Placement kRep{-1}, kRows{0}, kCols{1, 1}, kHeads{1, 3};

Placement Partial(Placement p) {
  p.partial = true;
  return p;
}

// For messages, spelled here (ToString is under test).
std::string Name(const Placement& p) {
  std::string s = p.split == -1  ? "replicated"
                  : p.split == 0 ? "rows"
                                 : "cols in " + std::to_string(p.groups) + " group(s)";
  return p.partial ? s + " + partial" : s;
}

// Placement equality as documented: split and partial alike, groups only
// for a column cut.
bool SamePlace(const Placement& a, const Placement& b) {
  return a.split == b.split && a.partial == b.partial && (a.split != 1 || a.groups == b.groups);
}

// ---- shards, by torch.chunk ----

// Piece i of [0, size) cut n ways (torch.chunk): pieces of ceil(size / n),
// the last ones short or empty.
std::pair<int64_t, int64_t> Piece(int64_t size, int64_t n, int64_t i) {
  const int64_t step = (size + n - 1) / n;
  return {std::min(size, i * step), std::min(size, (i + 1) * step)};
}

// The global rows and columns of a [R, C] tensor that `rank`'s shard holds,
// in its local (row-major) order. Columns cut within `groups` equal groups:
// each group's piece, group after group.
struct Index {
  std::vector<int64_t> rows, cols;
  int64_t size() const { return static_cast<int64_t>(rows.size() * cols.size()); }
};

Index IndexOf(const Placement& p, int64_t R, int64_t C, int tp, int rank) {
  Index ix;
  const auto [r0, r1] = p.split == 0 ? Piece(R, tp, rank) : std::pair<int64_t, int64_t>{0, R};
  for (int64_t r = r0; r < r1; ++r) ix.rows.push_back(r);
  if (p.split == 1) {
    const int64_t width = C / p.groups;
    const auto [c0, c1] = Piece(width, tp, rank);
    for (int64_t g = 0; g < p.groups; ++g) {
      for (int64_t c = c0; c < c1; ++c) ix.cols.push_back(g * width + c);
    }
  } else {
    for (int64_t c = 0; c < C; ++c) ix.cols.push_back(c);
  }
  return ix;
}

int64_t LocalSize(const Placement& p, int64_t R, int64_t C, int tp, int rank) {
  return IndexOf(p, R, C, tp, rank).size();
}

// `rank`'s shard of the [R, C] matrix `m` placed as `p` (partial or not).
std::vector<float> Cut(const std::vector<float>& m, int64_t R, int64_t C, const Placement& p,
                       int tp, int rank) {
  const Index ix = IndexOf(p, R, C, tp, rank);
  std::vector<float> out;
  for (int64_t r : ix.rows) {
    for (int64_t c : ix.cols) out.push_back(m[r * C + c]);
  }
  return out;
}

// The [R, C] tensor that the shards of ranks 0 .. n-1, placed as `p`, stand
// for: partial shards summed in rank order; otherwise each piece put in its
// place, and every copy of an element checked to be the same bits.
std::vector<float> Whole(const std::vector<std::vector<float>>& shards, int64_t R, int64_t C,
                         const Placement& p) {
  const int tp = static_cast<int>(shards.size());
  std::vector<float> m(R * C, 0.0f);
  std::vector<int> seen(R * C, 0);
  int64_t differ = 0;
  for (int r = 0; r < tp; ++r) {
    const Index ix = IndexOf(p, R, C, tp, r);
    INFO("rank " << r << " of " << tp << ", " << Name(p) << " [" << R << ", " << C << "]");
    REQUIRE(static_cast<int64_t>(shards[r].size()) == ix.size());
    size_t k = 0;
    for (int64_t i : ix.rows) {
      for (int64_t j : ix.cols) {
        const float v = shards[r][k++];
        float& e = m[i * C + j];
        if (p.partial) {
          e += v;
        } else if (seen[i * C + j] > 0) {
          differ += std::memcmp(&e, &v, sizeof(float)) != 0;
        } else {
          e = v;
        }
        ++seen[i * C + j];
      }
    }
  }
  CHECK(differ == 0);  // replicas agree bit for bit
  CHECK(std::count(seen.begin(), seen.end(), 0) == 0);
  return m;
}

// got == want bit for bit (rel == 0), or within rel of the largest |want|.
void Same(const std::vector<float>& got, const std::vector<float>& want, double rel,
          const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  if (rel == 0) {
    size_t at = 0;
    while (at < got.size() && std::memcmp(&got[at], &want[at], sizeof(float)) == 0) ++at;
    INFO("first difference at " << at
                                << (at < got.size() ? ": " + std::to_string(got[at]) +
                                                          " != " + std::to_string(want[at])
                                                    : std::string()));
    CHECK(at == got.size());
    return;
  }
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  INFO("max difference " << diff << ", largest value " << scale);
  CHECK(diff <= rel * scale);
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// ---- ranks ----

// A communicator noting every call (its name and element count) before
// passing it on: the collectives a conversion or an operator inserts.
class Recorder : public Communicator {
 public:
  explicit Recorder(Communicator& c) : c_(c) {}
  Calls calls;

  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::string_view backend() const override { return c_.backend(); }
  Status Barrier() override {
    calls.emplace_back("Barrier", 0);
    return c_.Barrier();
  }
  Status Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    calls.emplace_back("Broadcast", count);
    return c_.Broadcast(buf, count, dtype, root);
  }
  Status AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    calls.emplace_back("AllReduce", count);
    return c_.AllReduce(send, recv, count, dtype, op);
  }
  Status AllGather(const void* send, int64_t count, void* recv, DType dtype) override {
    calls.emplace_back("AllGather", count);
    return c_.AllGather(send, count, recv, dtype);
  }
  Status AllGatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                    DType dtype) override {
    calls.emplace_back("AllGatherV", count);
    return c_.AllGatherV(send, count, recv, counts, dtype);
  }
  Status ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                       ReduceOp op) override {
    calls.emplace_back("ReduceScatter", recv_count);
    return c_.ReduceScatter(send, recv, recv_count, dtype, op);
  }
  Status GatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                 DType dtype, int root) override {
    calls.emplace_back("GatherV", count);
    return c_.GatherV(send, count, recv, counts, dtype, root);
  }
  Status ScatterV(const void* send, std::span<const int64_t> counts, void* recv, int64_t count,
                  DType dtype, int root) override {
    calls.emplace_back("ScatterV", count);
    return c_.ScatterV(send, counts, recv, count, dtype, root);
  }
  Status AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                   std::span<const int64_t> recv_counts, DType dtype) override {
    int64_t n = 0;
    for (int64_t c : send_counts) n += c;
    calls.emplace_back("AllToAllV", n);
    return c_.AllToAllV(send, send_counts, recv, recv_counts, dtype);
  }
  Status Send(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    calls.emplace_back("Send", count);
    return c_.Send(buf, count, dtype, peer, tag);
  }
  Status Recv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    calls.emplace_back("Recv", count);
    return c_.Recv(buf, count, dtype, peer, tag);
  }
  Result<Request> ISend(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    calls.emplace_back("ISend", count);
    return c_.ISend(buf, count, dtype, peer, tag);
  }
  Result<Request> IRecv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    calls.emplace_back("IRecv", count);
    return c_.IRecv(buf, count, dtype, peer, tag);
  }
  Result<std::unique_ptr<Communicator>> Split(int color, int key) override {
    calls.emplace_back("Split", 0);
    return c_.Split(color, key);
  }

 private:
  Communicator& c_;
};

// Runs fn on `tp` in-process ranks, each with an OpContext over a Recorder.
// (Catch2 is not thread-safe: ranks store what they saw, the caller checks.)
void OnRanks(int tp, const std::function<Status(OpContext&, Recorder&)>& fn) {
  const Status s = RunInProcess(tp, [&](Communicator& comm) -> Status {
    Recorder rec(comm);
    OpContext ctx(&rec);
    return fn(ctx, rec);
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
}

std::string Text(const Calls& calls) {
  std::string s;
  for (const auto& [name, n] : calls)
    s += (s.empty() ? "" : ", ") + name + "(" + std::to_string(n) + ")";
  return "[" + s + "]";
}

// ---- the documented rule of conversions ----

// operators.h: "a partial resolves by an AllReduce, or by a ReduceScatter
// when `to` cuts the rows; then cut rows gather, a replicated tensor is
// sliced, anything else is redistributed". A ReduceScatter sums and cuts
// at once only where every rank holds the whole partial tensor and the
// row pieces are equal (the communicator's ReduceScatter gives every rank
// an equal block); cut rows gather into the whole tensor with an AllGather
// when the pieces are equal (the same). A partial cut over tp (which no
// operator makes) is summed as it lies.
std::vector<Step> Documented(const Placement& from, const Placement& to, int64_t rows, int tp) {
  const bool equal_pieces = rows % tp == 0;
  std::vector<Step> steps;
  if (from.partial) {
    if (from.split == -1 && to.split == 0 && equal_pieces) return {Step::kReduceScatter};
    steps.push_back(Step::kAllReduce);
  }
  if (SamePlace(from.Resolved(), to)) return steps;
  if (from.split == -1) {
    steps.push_back(Step::kSlice);
  } else if (from.split == 0 && to.split == -1 && equal_pieces) {
    steps.push_back(Step::kAllGather);
  } else {
    steps.push_back(Step::kRedistribute);
  }
  return steps;
}

std::string Text(const std::vector<Step>& steps) {
  static const char* names[] = {"AllReduce", "ReduceScatter", "AllGather", "Slice", "Redistribute"};
  std::string s;
  for (Step st : steps) s += (s.empty() ? "" : " + ") + std::string(names[static_cast<int>(st)]);
  return "[" + s + "]";
}

const std::vector<Placement> kResolved = {kRep, kRows, kCols, kHeads};
const std::vector<Placement> kAll = {
    kRep, kRows, kCols, kHeads, Partial(kRep), Partial(kRows), Partial(kCols), Partial(kHeads)};
// The partials an operator makes: whole-shaped pending sums.
const std::vector<Placement> kMade = {kRep, kRows, kCols, kHeads, Partial(kRep)};

// ---- Placement ----

TEST_CASE("Placement: equality, Resolved, ToString", "[operators]") {
  int pairs = 0;
  for (int sa : {-1, 0, 1}) {
    for (int ga : {1, 2, 3}) {
      for (bool pa : {false, true}) {
        const Placement a{sa, ga, pa};
        const Placement r = a.Resolved();
        CHECK((r.split == sa && r.groups == ga && !r.partial));
        for (int sb : {-1, 0, 1}) {
          for (int gb : {1, 2, 3}) {
            for (bool pb : {false, true}) {
              const Placement b{sb, gb, pb};
              const bool same = sa == sb && pa == pb && (sa != 1 || ga == gb);
              INFO(Name(a) << " vs " << Name(b));
              CHECK((a == b) == same);
              CHECK((a != b) == !same);
              ++pairs;
            }
          }
        }
      }
    }
  }
  CHECK(pairs == 18 * 18);
  CHECK(kRep.ToString() == "replicated");
  CHECK(kRows.ToString() == "rows/tp");
  CHECK(kCols.ToString() == "cols/tp");
  CHECK(kHeads.ToString() == "heads/tp");
  CHECK(Partial(kRep).ToString() == "replicated partial");
  CHECK(Partial(kCols).ToString() == "cols/tp partial");
  CHECK(Partial(kHeads).ToString() == "heads/tp partial");
}

TEST_CASE("Placement::ToLayout: ShardOf gives every tp rank the shard it holds", "[operators]") {
  int checked = 0;
  for (int tp = 1; tp <= 4; ++tp) {
    const auto mesh = Mesh::Create({"tp"}, {tp});
    REQUIRE(mesh.ok());
    for (const auto& [R, C] :
         std::vector<std::pair<int64_t, int64_t>>{{12, 12}, {7, 6}, {5, 12}, {2, 6}, {12, 24}}) {
      for (Placement p : {kRep, kRows, kCols, kHeads, Placement{1, 2}, Partial(kRows)}) {
        INFO("tp " << tp << ", " << Name(p) << " of [" << R << ", " << C << "]");
        const Layout l = p.ToLayout(R, C);
        CHECK(l.shape == std::vector<int64_t>{R, C});
        CHECK(l.dtype == DType::kF32);
        REQUIRE(ValidateLayout(l, *mesh).ok());
        for (int r = 0; r < tp; ++r) {
          INFO("rank " << r);
          auto box = ShardOf(l, *mesh, r);
          REQUIRE(box.ok());
          REQUIRE(box->has_value());
          const Box& b = **box;
          // The box in the layout's coordinates, as global rows and columns.
          Index got;
          for (int64_t i = b[0].begin; i < b[0].end; ++i) got.rows.push_back(i);
          if (b.rank() == 2) {
            for (int64_t j = b[1].begin; j < b[1].end; ++j) got.cols.push_back(j);
          } else {  // the view [rows, groups, cols / groups]
            REQUIRE(b.rank() == 3);
            CHECK(l.split_shape() == std::vector<int64_t>{R, p.groups, C / p.groups});
            for (int64_t g = b[1].begin; g < b[1].end; ++g) {
              for (int64_t j = b[2].begin; j < b[2].end; ++j) {
                got.cols.push_back(g * (C / p.groups) + j);
              }
            }
          }
          const Index want = IndexOf(p, R, C, tp, r);
          CHECK(got.rows == want.rows);
          CHECK(got.cols == want.cols);
          // The runtime's extents of the same shard.
          const OpContext ctx(tp, r);
          const Act a{nullptr, R, C, p};
          CHECK(ctx.LocalRows(a) == static_cast<int64_t>(want.rows.size()));
          CHECK(ctx.LocalCols(a) == static_cast<int64_t>(want.cols.size()));
          CHECK(ctx.LocalSize(a) == want.size());
          if (!want.rows.empty()) CHECK(ctx.FirstRow(a) == want.rows[0]);
          ++checked;
        }
      }
    }
  }
  CHECK(checked == 6 * 5 * (1 + 2 + 3 + 4));
}

// ---- PlanSteps and Plan ----

TEST_CASE("PlanSteps: the documented steps for every pair of placements", "[operators]") {
  int cases = 0;
  for (int tp = 1; tp <= 4; ++tp) {
    for (int64_t rows : {12, 13, 6, 2}) {  // 12: every tp cuts evenly; 13: none; 6, 2: some
      for (const Placement& from : kAll) {
        for (const Placement& to : kResolved) {
          INFO("tp " << tp << ", " << rows << " rows: " << Name(from) << " -> " << Name(to));
          const std::vector<Step> want = Documented(from, to, rows, tp);
          const std::vector<Step> got = PlanSteps(from, to, rows, tp);
          INFO("want " << Text(want) << ", got " << Text(got));
          CHECK(got == want);
          ++cases;
        }
      }
    }
  }
  CHECK(cases == 4 * 4 * 8 * 4);

  // The documented rule on the pairs the GPT uses, written out.
  using V = std::vector<Step>;
  CHECK(PlanSteps(kRows, kRows, 8, 2) == V{});
  CHECK(PlanSteps(kHeads, kHeads, 8, 2) == V{});
  CHECK(PlanSteps(Partial(kRep), kRep, 8, 2) == V{Step::kAllReduce});
  CHECK(PlanSteps(Partial(kRep), kRows, 8, 2) == V{Step::kReduceScatter});
  CHECK(PlanSteps(Partial(kRep), kRows, 7, 2) == V{Step::kAllReduce, Step::kSlice});
  CHECK(PlanSteps(Partial(kRep), kCols, 8, 2) == V{Step::kAllReduce, Step::kSlice});
  CHECK(PlanSteps(Partial(kRep), kHeads, 8, 2) == V{Step::kAllReduce, Step::kSlice});
  CHECK(PlanSteps(kRows, kRep, 8, 2) == V{Step::kAllGather});
  CHECK(PlanSteps(kRows, kRep, 7, 2) == V{Step::kRedistribute});
  CHECK(PlanSteps(kRep, kRows, 7, 2) == V{Step::kSlice});
  CHECK(PlanSteps(kRep, kHeads, 8, 4) == V{Step::kSlice});
  CHECK(PlanSteps(kCols, kRep, 8, 2) == V{Step::kRedistribute});
  CHECK(PlanSteps(kCols, kHeads, 8, 2) == V{Step::kRedistribute});
  CHECK(PlanSteps(kRows, kCols, 8, 2) == V{Step::kRedistribute});
  CHECK(PlanSteps(Partial(kCols), kRows, 8, 2) == V{Step::kAllReduce, Step::kRedistribute});
}

TEST_CASE("OpContext::Plan: the collectives and the bytes each rank contributes", "[operators]") {
  // Bytes: the buffer each rank puts into the collective: its shard of the
  // partial (AllReduce), the whole partial (ReduceScatter), its shard
  // (AllGather, Redistribute); a slice moves nothing.
  static const char* names[] = {"AllReduce", "ReduceScatter", "AllGather", "Split (local slice)",
                                "Redistribute (AllToAllV)"};
  int cases = 0;
  for (int tp : {2, 4}) {
    for (const auto& [R, C] : std::vector<std::pair<int64_t, int64_t>>{{8, 12}, {4, 24}}) {
      const int64_t whole = R * C * 4;
      for (int rank = 0; rank < tp; ++rank) {
        const OpContext ctx(tp, rank);
        for (const Placement& from : kAll) {
          for (const Placement& to : kResolved) {
            INFO("tp " << tp << " rank " << rank << ": " << Name(from) << " -> " << Name(to));
            std::string collective;
            int64_t bytes = 0;
            for (Step s : Documented(from, to, R, tp)) {
              collective += (collective.empty() ? "" : " + ") + std::string(names[int(s)]);
              const int64_t shard = from.split == -1 ? whole : whole / tp;
              if (s == Step::kAllReduce || s == Step::kAllGather || s == Step::kRedistribute) {
                bytes += shard;
              }
              if (s == Step::kReduceScatter) bytes += whole;
            }
            // The sizes cut evenly: every rank's shard is the same.
            CHECK(LocalSize(from, R, C, tp, rank) * 4 == (from.split == -1 ? whole : whole / tp));
            const OpContext::Redistribution r = ctx.Plan(from, to, R, C);
            CHECK(r.collective == collective);
            CHECK(r.bytes == bytes);
            ++cases;
          }
        }
      }
    }
  }
  CHECK(cases == 2 * (2 + 4) * 8 * 4);
  // One rank: nothing to move.
  for (const Placement& from : kAll) {
    for (const Placement& to : kResolved) {
      const OpContext::Redistribution r = OpContext(1, 0).Plan(from, to, 8, 12);
      CHECK(r.collective.empty());
      CHECK(r.bytes == 0);
    }
  }
  // Uneven rows: the same collectives PlanSteps names.
  const OpContext four(4, 0);
  CHECK(four.Plan(kRows, kRep, 6, 12).collective == "Redistribute (AllToAllV)");
  CHECK(four.Plan(Partial(kRep), kRows, 6, 12).collective == "AllReduce + Split (local slice)");
}

// ---- Convert on ranks ----

// A [R, C] matrix of small integers, and tp shares of it (small integers
// too) whose sum over ranks is it: every sum is exact in float.
std::vector<float> Matrix(int64_t R, int64_t C, int salt) {
  std::vector<float> m(R * C);
  for (int64_t i = 0; i < R * C; ++i) m[i] = static_cast<float>((i * 7 + salt) % 23 - 11);
  return m;
}

std::vector<float> Share(const std::vector<float>& m, int tp, int rank) {
  std::vector<float> s(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    float rest = m[i];
    for (int r = 0; r < tp; ++r) {
      const float part = static_cast<float>(static_cast<int64_t>(i * 5 + r * 7) % 9 - 4);
      if (r == rank) s[i] = r == tp - 1 ? rest : part;
      rest -= part;
    }
  }
  return s;
}

// This rank's input of `from` for the global matrix m: its shard, or its
// share of the whole matrix when partial (whole-shaped: kMade's partial).
std::vector<float> Input(const std::vector<float>& m, int64_t R, int64_t C, const Placement& from,
                         int tp, int rank) {
  return from.partial ? Share(m, tp, rank) : Cut(m, R, C, from, tp, rank);
}

// What Convert did on one rank for one case.
struct Converted {
  std::vector<float> data;
  Placement place;
  int64_t rows = 0, cols = 0;
  bool input = false, storage = false;  // where the result lies
  Calls calls;
};

// The calls the documented steps make on one rank: an AllReduce of its
// shard, a ReduceScatter into its piece, an AllGather of its piece, a
// redistribution (one AllToAllV, or one AllGatherV for rows gathering
// unevenly), and a slice of nothing.
void CheckCalls(const Calls& calls, const Placement& from, const Placement& to, int64_t R,
                int64_t C, int tp, int rank) {
  const std::vector<Step> steps = Documented(from, to, R, tp);
  INFO("steps " << Text(steps) << ", calls " << Text(calls));
  size_t at = 0;
  for (Step s : steps) {
    if (s == Step::kSlice) continue;
    REQUIRE(at < calls.size());
    const auto& [name, n] = calls[at++];
    switch (s) {
      case Step::kAllReduce:
        CHECK(name == "AllReduce");
        CHECK(n == LocalSize(from, R, C, tp, rank));
        break;
      case Step::kReduceScatter:
        CHECK(name == "ReduceScatter");
        CHECK(n == LocalSize(to, R, C, tp, rank));
        break;
      case Step::kAllGather:
        CHECK(name == "AllGather");
        CHECK(n == LocalSize(from, R, C, tp, rank));
        break;
      default:
        CHECK((name == "AllToAllV" || name == "AllGatherV"));
        break;
    }
  }
  CHECK(at == calls.size());
}

TEST_CASE("OpContext::Convert: every pair of placements on 2, 3 and 4 ranks", "[operators]") {
  struct Case {
    int64_t R, C;
    Placement from, to;
  };
  std::vector<Case> cases;
  // Rows: even for every tp, even for none, and ranks with no rows (5 on 4);
  // columns: groups of 4 (cut unevenly on 3) and of 2 (empty pieces on 3, 4).
  for (const auto& [R, C] :
       std::vector<std::pair<int64_t, int64_t>>{{12, 12}, {7, 6}, {5, 12}, {2, 6}}) {
    for (const Placement& from : kMade) {
      for (const Placement& to : kResolved) cases.push_back({R, C, from, to});
    }
  }
  int checked = 0;
  for (int tp : {2, 3, 4}) {
    std::vector<std::vector<Converted>> got(tp, std::vector<Converted>(cases.size()));
    OnRanks(tp, [&](OpContext& ctx, Recorder& rec) -> Status {
      const int r = ctx.tp_rank();
      for (size_t k = 0; k < cases.size(); ++k) {
        const Case& c = cases[k];
        std::vector<float> in = Input(Matrix(c.R, c.C, 0), c.R, c.C, c.from, tp, r), storage;
        Act a{in.data(), c.R, c.C, c.from};
        rec.calls.clear();
        ASSIGN_OR_RETURN(Act out, ctx.Convert(a, c.to, &storage, "op", "x"));
        Converted& g = got[r][k];
        const int64_t n = LocalSize(c.to, c.R, c.C, tp, r);
        g.data.assign(out.data, out.data + n);
        g.place = out.place;
        g.rows = out.rows;
        g.cols = out.cols;
        g.input = out.data == in.data();
        g.storage = out.data == storage.data();
        g.calls = rec.calls;
      }
      return Status::Ok();
    });
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      const std::vector<float> m = Matrix(c.R, c.C, 0);
      for (int r = 0; r < tp; ++r) {
        INFO("tp " << tp << " rank " << r << ", [" << c.R << ", " << c.C << "] " << Name(c.from)
                   << " -> " << Name(c.to));
        const Converted& g = got[r][k];
        Same(g.data, Cut(m, c.R, c.C, c.to, tp, r), 0, "the shard");
        CHECK(SamePlace(g.place, c.to));
        CHECK((g.rows == c.R && g.cols == c.C));
        // Documented: `a` itself when it already is `to` (a partial summed
        // in place), else a new shard in *storage.
        if (SamePlace(c.from.Resolved(), c.to)) {
          CHECK(g.input);
        } else {
          CHECK(g.storage);
        }
        CheckCalls(g.calls, c.from, c.to, c.R, c.C, tp, r);
        ++checked;
      }
    }
  }
  CHECK(checked == static_cast<int>(cases.size()) * (2 + 3 + 4));
}

TEST_CASE("OpContext::Convert: one rank, and partial targets", "[operators]") {
  // On one rank every placement is the whole tensor: `a` itself, summed.
  OpContext one(nullptr);
  const std::vector<float> m = Matrix(5, 6, 3);
  for (const Placement& from : kAll) {
    for (const Placement& to : kResolved) {
      INFO(Name(from) << " -> " << Name(to));
      std::vector<float> in = m, storage;
      Act a{in.data(), 5, 6, from};
      auto out = one.Convert(a, to, &storage, "op", "x");
      REQUIRE(out.ok());
      CHECK(out->data == in.data());
      CHECK_FALSE(out->place.partial);
      CHECK(in == m);
      CHECK(storage.empty());
    }
  }
  // A partial input is never asked for.
  for (int tp : {1, 2}) {
    const Status s = RunInProcess(tp, [&](Communicator& comm) -> Status {
      OpContext ctx(tp == 1 ? nullptr : &comm);
      std::vector<float> in(30), storage;
      Act a{in.data(), 5, 6, Partial(kRep)};
      auto out = ctx.Convert(a, Partial(kRep), &storage, "h.0.mlp.c_fc", "forward");
      if (out.ok()) return InternalError("a partial target was accepted");
      const std::string& msg = out.status().message();
      if (msg.find("operator 'h.0.mlp.c_fc'") == std::string::npos ||
          msg.find("forward") == std::string::npos) {
        return InternalError("the message names neither operator nor input: " + msg);
      }
      return Status::Ok();
    });
    INFO(s.ToString());
    CHECK(s.ok());
  }
}

TEST_CASE("OpContext::Convert backward: gradients go back as OpGpt's ConvGrad sends them",
          "[operators]") {
  // An edge from -> to carries forward the producer's output; backward the
  // consumer's input gradient, placed `to` or, for a consumer that cuts its
  // weight's columns (or the vocabulary), replicated + partial, goes back
  // to from.Resolved(). Each forward step has its documented dual.
  using V = std::vector<Step>;
  CHECK(PlanSteps(kRep, kRep, 8, 2) == V{});                   // AllReduce's: unchanged
  CHECK(PlanSteps(kRows, kRep, 8, 2) == V{Step::kAllGather});  // ReduceScatter's
  CHECK(PlanSteps(Partial(kRep), kRows, 8, 2) == V{Step::kReduceScatter});  // AllGather's
  CHECK(PlanSteps(kRep, kRows, 8, 2) == V{Step::kSlice});      // AllGather's, not partial
  CHECK(PlanSteps(kRows, kRep, 8, 4) == V{Step::kAllGather});  // a row slice's
  struct Edge {
    int64_t R, C;
    Placement from, to, grad;
  };
  std::vector<Edge> edges;
  for (const auto& [R, C] : std::vector<std::pair<int64_t, int64_t>>{{8, 12}, {6, 12}}) {
    for (const Placement& from : kMade) {
      for (const Placement& to : kResolved) {
        edges.push_back({R, C, from, to, to});
        if (to.split == -1) edges.push_back({R, C, from, to, Partial(kRep)});
      }
    }
  }
  int checked = 0;
  for (int tp : {2, 4}) {
    std::vector<std::vector<Converted>> fwd(tp, std::vector<Converted>(edges.size()));
    std::vector<std::vector<Converted>> bwd = fwd;
    OnRanks(tp, [&](OpContext& ctx, Recorder& rec) -> Status {
      const int r = ctx.tp_rank();
      for (size_t k = 0; k < edges.size(); ++k) {
        const Edge& e = edges[k];
        std::vector<float> x = Input(Matrix(e.R, e.C, 1), e.R, e.C, e.from, tp, r), xs;
        Act a{x.data(), e.R, e.C, e.from};
        rec.calls.clear();
        ASSIGN_OR_RETURN(Act y, ctx.Convert(a, e.to, &xs, "edge", "forward"));
        fwd[r][k].data.assign(y.data, y.data + LocalSize(e.to, e.R, e.C, tp, r));
        fwd[r][k].calls = rec.calls;
        // ConvGrad: the gradient as the consumer left it, back to the producer.
        std::vector<float> g = Input(Matrix(e.R, e.C, 2), e.R, e.C, e.grad, tp, r), gs;
        Act ga{g.data(), e.R, e.C, e.to};
        ga.place = e.grad;
        rec.calls.clear();
        ASSIGN_OR_RETURN(Act dx, ctx.Convert(ga, e.from.Resolved(), &gs, "edge", "backward"));
        bwd[r][k].data.assign(dx.data, dx.data + LocalSize(e.from.Resolved(), e.R, e.C, tp, r));
        bwd[r][k].place = dx.place;
        bwd[r][k].calls = rec.calls;
      }
      return Status::Ok();
    });
    for (size_t k = 0; k < edges.size(); ++k) {
      const Edge& e = edges[k];
      for (int r = 0; r < tp; ++r) {
        INFO("tp " << tp << " rank " << r << ", [" << e.R << ", " << e.C << "] " << Name(e.from)
                   << " -> " << Name(e.to) << ", gradient " << Name(e.grad));
        Same(fwd[r][k].data, Cut(Matrix(e.R, e.C, 1), e.R, e.C, e.to, tp, r), 0, "forward");
        CheckCalls(fwd[r][k].calls, e.from, e.to, e.R, e.C, tp, r);
        Same(bwd[r][k].data, Cut(Matrix(e.R, e.C, 2), e.R, e.C, e.from.Resolved(), tp, r), 0,
             "backward");
        CHECK(SamePlace(bwd[r][k].place, e.from.Resolved()));
        CheckCalls(bwd[r][k].calls, e.grad, e.from.Resolved(), e.R, e.C, tp, r);
        ++checked;
      }
    }
  }
  CHECK(checked == static_cast<int>(edges.size()) * (2 + 4));
}

// ---- strategy checks ----

const DimAxes kNo{}, kDp{"dp"}, kTp{"tp"}, kDpTp{"dp", "tp"}, kTpDp{"tp", "dp"};

OpStrategy S(std::vector<InputStrategy> inputs) { return OpStrategy{std::move(inputs)}; }

// Every strategy whose inputs have `dims` dimensions, each cut by one of
// -, dp, tp, dp*tp, tp*dp.
std::vector<OpStrategy> Every(const std::vector<size_t>& dims) {
  const std::vector<DimAxes> choices = {kNo, kDp, kTp, kDpTp, kTpDp};
  size_t n = 0;
  for (size_t d : dims) n += d;
  std::vector<OpStrategy> out;
  std::vector<size_t> pick(n, 0);
  while (true) {
    OpStrategy s;
    size_t at = 0;
    for (size_t d : dims) {
      InputStrategy in;
      for (size_t j = 0; j < d; ++j) in.push_back(choices[pick[at++]]);
      s.inputs.push_back(std::move(in));
    }
    out.push_back(std::move(s));
    size_t i = 0;
    while (i < n && ++pick[i] == choices.size()) pick[i++] = 0;
    if (i == n) break;
  }
  return out;
}

// What the header documents for one accepted strategy.
struct Doc {
  OpStrategy strategy;
  std::vector<Placement> inputs;
  Placement output;
  bool rows_over_tp = false;
  int weight_split = -1;
  Placement input_grad;  // linear and lm_head
};

// A refusal names the operator, and the input at fault or the rule.
bool NamesOperatorAndInput(const std::string& msg, const std::string& op) {
  if (msg.find("operator '" + op + "'") == std::string::npos) return false;
  for (const char* what :
       {"input 0 (", "input 1 (", "tp cuts", "cut alike", "does not have the operator's inputs"}) {
    if (msg.find(what) != std::string::npos) return true;
  }
  return false;
}

std::string Text(const OpStrategy& s) { return s.ToString(); }

// Creates the operator for every strategy of `dims` on dp = 1 and 2:
// accepted == `docs` (on that dp), each with its documented OpInfo
// (checked by `check`); every refusal names the operator and an input.
template <typename Op>
void CheckStrategies(const std::string& name, const std::string& kind,
                     const std::vector<size_t>& dims, const std::vector<Doc>& docs,
                     const std::vector<int>& rows_dims,
                     const std::function<Result<Op>(const OpStrategy&, int dp)>& create,
                     const std::function<void(const Op&, const Doc&)>& check = nullptr) {
  for (int dp : {1, 2}) {
    // With dp = 1 the rows need no dp cut: each documented strategy also
    // without the leading dp of its rows (in every input at once).
    std::vector<Doc> want = docs;
    if (dp == 1) {
      for (Doc d : docs) {
        bool changed = false;
        for (int i : rows_dims) {
          DimAxes& rows = d.strategy.inputs[i][0];
          if (!rows.empty() && rows[0] == "dp") {
            rows.erase(rows.begin());
            changed = true;
          }
        }
        if (changed) want.push_back(d);
      }
    }
    int accepted = 0, refused = 0;
    for (const OpStrategy& s : Every(dims)) {
      INFO(name << " on dp " << dp << ": " << Text(s));
      auto doc =
          std::find_if(want.begin(), want.end(), [&](const Doc& d) { return d.strategy == s; });
      Result<Op> op = create(s, dp);
      if (doc == want.end()) {
        CHECK_FALSE(op.ok());
        if (!op.ok()) {
          INFO(op.status().message());
          CHECK(NamesOperatorAndInput(op.status().message(), name));
          ++refused;
        }
        continue;
      }
      INFO((op.ok() ? std::string() : op.status().message()));
      REQUIRE(op.ok());
      ++accepted;
      const OpInfo& info = op->info();
      CHECK(info.name == name);
      CHECK(info.kind == kind);
      CHECK(info.strategy == s);
      REQUIRE(info.inputs.size() == doc->inputs.size());
      for (size_t i = 0; i < info.inputs.size(); ++i) {
        INFO("input " << i << ": " << Name(info.inputs[i]) << ", documented "
                      << Name(doc->inputs[i]));
        CHECK(SamePlace(info.inputs[i], doc->inputs[i]));
      }
      INFO("output " << Name(info.output) << ", documented " << Name(doc->output));
      CHECK(SamePlace(info.output, doc->output));
      CHECK(info.rows_over_tp == doc->rows_over_tp);
      if (check) check(*op, *doc);
    }
    CHECK(accepted == static_cast<int>(want.size()));
    CHECK(accepted + refused == static_cast<int>(Every(dims).size()));
  }
}

template <typename Op>
std::string Refusal(const Result<Op>& op) {
  REQUIRE_FALSE(op.ok());
  return op.status().message();
}

// The matmuls' documented strategies: ((rows, k), (k, m)) with at most one
// of rows, k and m cut over tp; k cut alike in both.
std::vector<Doc> LinearDocs(int groups) {
  const Placement out_cols{1, groups};
  return {
      // Data parallel: everything whole on tp.
      {S({{kDp, kNo}, {kNo, kNo}}), {kRep}, kRep, false, -1, kRep},
      // Column parallel: the weight's columns cut (q, k and v alike), the
      // input gradient partial.
      {S({{kDp, kNo}, {kNo, kTp}}), {kRep}, out_cols, false, 1, Partial(kRep)},
      // Row parallel: the contraction cut, the output partial.
      {S({{kDp, kTp}, {kTp, kNo}}), {kCols}, Partial(kRep), false, 0, kCols},
      // Rows over tp (sequence parallel): the parameters' gradients partial.
      {S({{kDpTp, kNo}, {kNo, kNo}}), {kRows}, kRows, true, -1, kRows},
  };
}

TEST_CASE("LinearOp::Create: the documented strategies, and refusals", "[operators]") {
  for (int groups : {1, 3}) {
    INFO("groups " << groups);
    CheckStrategies<LinearOp>(
        "h.0.attn.c_attn", "linear", {2, 2}, LinearDocs(groups), {0},
        [&](const OpStrategy& s, int dp) {
          return LinearOp::Create("h.0.attn.c_attn", s, 8, 24, groups, dp);
        },
        [](const LinearOp& op, const Doc& d) {
          CHECK(op.weight_split() == d.weight_split);
          CHECK(op.bias_split() == (d.weight_split == 1));
          INFO("input gradient " << Name(op.InputGradient()));
          CHECK(SamePlace(op.InputGradient(), d.input_grad));
        });
  }
  auto create = [](const OpStrategy& s, int dp = 2) {
    return LinearOp::Create("fc", s, 8, 12, 1, dp);
  };
  auto has = [](const std::string& msg, std::vector<std::string> parts) {
    for (const std::string& p : parts) {
      INFO(msg << "\n  should name: " << p);
      CHECK(msg.find(p) != std::string::npos);
    }
  };
  // Rows cut by tp before dp, or not over dp on dp 2.
  has(Refusal(create(S({{kTpDp, kNo}, {kNo, kNo}}))), {"operator 'fc'", "input 0 (x) dimension 0"});
  has(Refusal(create(S({{kNo, kNo}, {kNo, kNo}}))), {"operator 'fc'", "input 0 (x) dimension 0"});
  has(Refusal(create(S({{kTp, kNo}, {kNo, kNo}}))), {"operator 'fc'", "input 0 (x) dimension 0"});
  // Parameters and columns are cut over tp only.
  has(Refusal(create(S({{kDp, kNo}, {kDp, kNo}}))),
      {"operator 'fc'", "input 1 (weight) dimension 0"});
  has(Refusal(create(S({{kDp, kDpTp}, {kNo, kNo}}))), {"operator 'fc'", "input 0 (x) dimension 1"});
  // The contraction cut in one of its inputs only.
  has(Refusal(create(S({{kDp, kTp}, {kNo, kNo}}))),
      {"operator 'fc'", "input 0 (x) dimension 1", "input 1 (weight) dimension 0"});
  has(Refusal(create(S({{kDp, kNo}, {kTp, kNo}}))),
      {"operator 'fc'", "input 0 (x) dimension 1", "input 1 (weight) dimension 0"});
  // tp cutting two of rows, contraction and columns.
  has(Refusal(create(S({{kDpTp, kNo}, {kNo, kTp}}))), {"operator 'fc'", "tp cuts"});
  has(Refusal(create(S({{kDp, kTp}, {kTp, kTp}}))), {"operator 'fc'", "tp cuts"});
  // Wrong numbers of inputs or dimensions.
  has(Refusal(create(S({{kDp, kNo}}))), {"operator 'fc'", "inputs and dimensions"});
  has(Refusal(create(S({{kDp, kNo, kNo}, {kNo, kNo}}))),
      {"operator 'fc'", "inputs and dimensions"});
  has(Refusal(create(S({{kDp, kNo}, {kNo, kNo}, {kNo}}))),
      {"operator 'fc'", "inputs and dimensions"});
}

TEST_CASE("LayerNormOp, GeluOp, AddOp::Create: the documented strategies", "[operators]") {
  // Layer norm: ((rows, -),), the normalized columns never cut.
  CheckStrategies<LayerNormOp>(
      "ln_1", "layer_norm", {2},
      {{S({{kDp, kNo}}), {kRep}, kRep, false}, {S({{kDpTp, kNo}}), {kRows}, kRows, true}}, {0},
      [](const OpStrategy& s, int dp) { return LayerNormOp::Create("ln_1", s, dp); });
  const std::string ln = Refusal(LayerNormOp::Create("ln_1", S({{kDp, kTp}}), 2));
  CHECK_THAT(ln, Catch::Contains("operator 'ln_1'") && Catch::Contains("input 0 (x) dimension 1"));
  // GELU: any one of rows, columns over tp.
  CheckStrategies<GeluOp>(
      "gelu", "gelu", {2},
      {{S({{kDp, kNo}}), {kRep}, kRep, false},
       {S({{kDp, kTp}}), {kCols}, kCols, false},
       {S({{kDpTp, kNo}}), {kRows}, kRows, true}},
      {0}, [](const OpStrategy& s, int dp) { return GeluOp::Create("gelu", s, dp); });
  // Add: the same, both inputs cut alike.
  CheckStrategies<AddOp>("add_1", "add", {2, 2},
                         {{S({{kDp, kNo}, {kDp, kNo}}), {kRep, kRep}, kRep, false},
                          {S({{kDp, kTp}, {kDp, kTp}}), {kCols, kCols}, kCols, false},
                          {S({{kDpTp, kNo}, {kDpTp, kNo}}), {kRows, kRows}, kRows, true}},
                         {0, 1},
                         [](const OpStrategy& s, int dp) { return AddOp::Create("add_1", s, dp); });
  const std::string add = Refusal(AddOp::Create("add_1", S({{kDp, kNo}, {kDpTp, kNo}}), 2));
  CHECK_THAT(add, Catch::Contains("operator 'add_1'") && Catch::Contains("cut alike"));
  // tp cuts one dimension of an element-wise input, not two.
  CHECK_THAT(Refusal(GeluOp::Create("gelu", S({{kDpTp, kTp}}), 2)),
             Catch::Contains("operator 'gelu'") && Catch::Contains("tp cuts"));
  CHECK_THAT(Refusal(AddOp::Create("add_1", S({{kDpTp, kTp}, {kDpTp, kTp}}), 2)),
             Catch::Contains("operator 'add_1'") && Catch::Contains("tp cuts"));
}

TEST_CASE("AttentionOp::Create: heads over tp, rows whole sequences", "[operators]") {
  for (int tp : {2, 4}) {
    CheckStrategies<AttentionOp>("attn", "attention", {2},
                                 {{S({{kDp, kNo}}), {kRep}, kRep, false},
                                  // By heads: q, k and v cut alike (the fused [rows, 3, C] view),
                                  // the output by columns.
                                  {S({{kDp, kTp}}), {kHeads}, kCols, false},
                                  {S({{kDpTp, kNo}}), {kRows}, kRows, true}},
                                 {0}, [&](const OpStrategy& s, int dp) {
                                   return AttentionOp::Create("attn", s, 4, 8, tp, dp);
                                 });
  }
  // 4 heads on 3 ranks: not by heads.
  CheckStrategies<AttentionOp>(
      "attn", "attention", {2},
      {{S({{kDp, kNo}}), {kRep}, kRep, false}, {S({{kDpTp, kNo}}), {kRows}, kRows, true}}, {0},
      [&](const OpStrategy& s, int dp) { return AttentionOp::Create("attn", s, 4, 12, 3, dp); });
  CHECK_THAT(Refusal(AttentionOp::Create("attn", S({{kDp, kTp}}), 4, 12, 3, 2)),
             Catch::Contains("operator 'attn'") &&
                 Catch::Contains("input 0 (qkv) dimension 1 (heads)") &&
                 Catch::Contains("not divisible by tp 3"));
  CHECK_THAT(Refusal(AttentionOp::Create("attn", S({{kDpTp, kTp}}), 4, 8, 2, 2)),
             Catch::Contains("operator 'attn'") && Catch::Contains("tp cuts"));

  // Rows cut into pieces that are not whole sequences: refused when run,
  // naming the operator and the rank.
  OpContext ctx(2, 1);
  auto op = AttentionOp::Create("h.3.attn.attention", S({{kDpTp, kNo}}), 4, 8, 2, 2);
  REQUIRE(op.ok());
  std::vector<float> qkv(6 * 24), y(6 * 8), att(1000);
  const Act in{qkv.data(), 12, 24, kRows};  // 12 rows of T = 4: rank 1 holds [6, 12)
  Act out{y.data(), 12, 8, kRows};
  const Status s = op->Forward(ctx, in, 4, att.data(), &out);
  CHECK_THAT(s.message(), Catch::Contains("operator 'h.3.attn.attention'") &&
                              Catch::Contains("tp rank 1") && Catch::Contains("[6, 12)"));
  CHECK(op->Forward(ctx, in, 3, att.data(), &out).ok());  // T = 3: whole sequences
}

TEST_CASE("EmbeddingOp, LmHeadOp, CrossEntropyOp::Create: the documented strategies",
          "[operators]") {
  // Embedding ((vocab, cols), (rows,)): a vocabulary cut leaves the output
  // partial; at most one of the vocabulary, the columns, the rows over tp.
  CheckStrategies<EmbeddingOp>(
      "embedding", "embedding", {2, 1},
      {{S({{kNo, kNo}, {kDp}}), {}, kRep, false, -1},
       {S({{kTp, kNo}, {kDp}}), {}, Partial(kRep), false, 0},
       {S({{kNo, kTp}, {kDp}}), {}, kCols, false, 1},
       {S({{kNo, kNo}, {kDpTp}}), {}, kRows, true, -1}},
      {1},
      [](const OpStrategy& s, int dp) { return EmbeddingOp::Create("embedding", s, 11, 8, dp); },
      [](const EmbeddingOp& op, const Doc& d) { CHECK(op.weight_split() == d.weight_split); });
  CHECK_THAT(Refusal(EmbeddingOp::Create("embedding", S({{kDp, kNo}, {kDp}}), 11, 8, 2)),
             Catch::Contains("operator 'embedding'") &&
                 Catch::Contains("input 0 (wte) dimension 0 (vocabulary)"));
  CHECK_THAT(
      Refusal(EmbeddingOp::Create("embedding", S({{kNo, kNo}, {kTp}}), 11, 8, 2)),
      Catch::Contains("operator 'embedding'") && Catch::Contains("input 1 (tokens) dimension 0"));
  CHECK_THAT(Refusal(EmbeddingOp::Create("embedding", S({{kTp, kNo}, {kDpTp}}), 11, 8, 2)),
             Catch::Contains("operator 'embedding'") && Catch::Contains("tp cuts"));

  // Output projection ((rows, k), (vocab, k)).
  CheckStrategies<LmHeadOp>(
      "lm_head", "lm_head", {2, 2},
      {{S({{kDp, kNo}, {kNo, kNo}}), {kRep}, kRep, false, -1, kRep},
       // The vocabulary cut: logits by columns, the input gradient partial.
       {S({{kDp, kNo}, {kTp, kNo}}), {kRep}, kCols, false, 0, Partial(kRep)},
       // The contraction cut: the logits partial.
       {S({{kDp, kTp}, {kNo, kTp}}), {kCols}, Partial(kRep), false, 1, kCols},
       {S({{kDpTp, kNo}, {kNo, kNo}}), {kRows}, kRows, true, -1, kRows}},
      {0}, [](const OpStrategy& s, int dp) { return LmHeadOp::Create("lm_head", s, 11, 8, dp); },
      [](const LmHeadOp& op, const Doc& d) {
        CHECK(op.weight_split() == d.weight_split);
        INFO("input gradient " << Name(op.InputGradient()));
        CHECK(SamePlace(op.InputGradient(), d.input_grad));
      });
  CHECK_THAT(Refusal(LmHeadOp::Create("lm_head", S({{kDp, kTp}, {kNo, kNo}}), 11, 8, 2)),
             Catch::Contains("operator 'lm_head'") && Catch::Contains("input 1 (wte) dimension 1"));
  CHECK_THAT(Refusal(LmHeadOp::Create("lm_head", S({{kDp, kTp}, {kTp, kTp}}), 11, 8, 2)),
             Catch::Contains("operator 'lm_head'") && Catch::Contains("tp cuts"));

  // Loss ((rows, vocab), (rows,)): the targets cut like the logits' rows.
  CheckStrategies<CrossEntropyOp>("loss", "cross_entropy", {2, 1},
                                  {{S({{kDp, kNo}, {kDp}}), {kRep}, kRep, false},
                                   {S({{kDp, kTp}, {kDp}}), {kCols}, kCols, false},
                                   {S({{kDpTp, kNo}, {kDpTp}}), {kRows}, kRows, true}},
                                  {0, 1}, [](const OpStrategy& s, int dp) {
                                    return CrossEntropyOp::Create("loss", s, 11, dp);
                                  });
  CHECK_THAT(
      Refusal(CrossEntropyOp::Create("loss", S({{kDp, kTp}, {kDpTp}}), 11, 2)),
      Catch::Contains("operator 'loss'") && Catch::Contains("input 1 (targets) dimension 0"));
  CHECK_THAT(Refusal(CrossEntropyOp::Create("loss", S({{kDp, kDp}, {kDp}}), 11, 2)),
             Catch::Contains("operator 'loss'") &&
                 Catch::Contains("input 0 (logits) dimension 1 (vocabulary)"));
  CHECK_THAT(Refusal(CrossEntropyOp::Create("loss", S({{kDpTp, kTp}, {kDpTp}}), 11, 2)),
             Catch::Contains("operator 'loss'") && Catch::Contains("tp cuts"));
}

TEST_CASE("Megatron's preset: every operator's placements and the collectives between them",
          "[operators]") {
  // Megatron-LM: vocabulary-parallel embedding and loss, column then row
  // parallel linears, attention by heads; two AllReduces per block forward
  // (after each row-parallel linear), or with sequence parallelism an
  // AllGather before and a ReduceScatter after each pair.
  for (bool sp : {false, true}) {
    INFO((sp ? "sequence parallel" : "tensor parallel"));
    const OpStrategyFile f = OpGpt::Megatron(sp);
    auto strategy = [&](const std::string& pattern) {
      for (const OpStrategyFile::Entry& e : f.operators) {
        if (e.pattern == pattern) return OpStrategy{e.axes};
      }
      FAIL("no entry " << pattern);
      return OpStrategy{};
    };
    const int dp = 2, tp = 2;
    const int64_t V = 11, C = 8, N = 8;
    auto emb = EmbeddingOp::Create("embedding", strategy("embedding"), V, C, dp);
    auto ln1 = LayerNormOp::Create("ln_1", strategy("h.*.ln_1"), dp);
    auto qkv = LinearOp::Create("c_attn", strategy("h.*.attn.c_attn"), C, 3 * C, 3, dp);
    auto attn = AttentionOp::Create("attention", strategy("h.*.attn.attention"), 4, C, tp, dp);
    auto proj = LinearOp::Create("c_proj", strategy("h.*.attn.c_proj"), C, C, 1, dp);
    auto add1 = AddOp::Create("add_1", strategy("h.*.add_1"), dp);
    auto ln2 = LayerNormOp::Create("ln_2", strategy("h.*.ln_2"), dp);
    auto fc = LinearOp::Create("c_fc", strategy("h.*.mlp.c_fc"), C, 4 * C, 1, dp);
    auto gelu = GeluOp::Create("gelu", strategy("h.*.mlp.gelu"), dp);
    auto fcproj = LinearOp::Create("mlp.c_proj", strategy("h.*.mlp.c_proj"), 4 * C, C, 1, dp);
    auto add2 = AddOp::Create("add_2", strategy("h.*.add_2"), dp);
    auto lnf = LayerNormOp::Create("ln_f", strategy("ln_f"), dp);
    auto lm = LmHeadOp::Create("lm_head", strategy("lm_head"), V, C, dp);
    auto loss = CrossEntropyOp::Create("loss", strategy("loss"), V, dp);
    REQUIRE((emb.ok() && ln1.ok() && qkv.ok() && attn.ok() && proj.ok() && add1.ok() && ln2.ok() &&
             fc.ok() && gelu.ok() && fcproj.ok() && add2.ok() && lnf.ok() && lm.ok() && loss.ok()));
    const Placement stream = sp ? kRows : kRep;
    CHECK(SamePlace(emb->info().output, Partial(kRep)));
    CHECK(emb->weight_split() == 0);
    for (const LayerNormOp* ln : {&*ln1, &*ln2, &*lnf}) {
      CHECK(SamePlace(ln->info().inputs[0], stream));
      CHECK(ln->info().rows_over_tp == sp);
    }
    for (const LinearOp* col : {&*qkv, &*fc}) {
      CHECK(SamePlace(col->info().inputs[0], kRep));
      CHECK(col->weight_split() == 1);
      CHECK(SamePlace(col->InputGradient(), Partial(kRep)));
    }
    CHECK(SamePlace(qkv->info().output, kHeads));
    CHECK(SamePlace(fc->info().output, kCols));
    CHECK(SamePlace(attn->info().inputs[0], kHeads));
    CHECK(SamePlace(attn->info().output, kCols));
    CHECK(SamePlace(gelu->info().output, kCols));
    for (const LinearOp* row : {&*proj, &*fcproj}) {
      CHECK(SamePlace(row->info().inputs[0], kCols));
      CHECK(SamePlace(row->info().output, Partial(kRep)));
      CHECK(row->weight_split() == 0);
      CHECK(SamePlace(row->InputGradient(), kCols));
    }
    CHECK(SamePlace(add1->info().output, stream));
    CHECK(SamePlace(lm->info().inputs[0], kRep));
    CHECK(SamePlace(lm->info().output, kCols));
    CHECK(lm->weight_split() == emb->weight_split());
    CHECK(SamePlace(loss->info().inputs[0], kCols));

    // The edges: forward from -> to, backward the consumer's gradient back.
    using Steps = std::vector<Step>;
    const Steps none, reduce = sp ? Steps{Step::kReduceScatter} : Steps{Step::kAllReduce},
                      gather = sp ? Steps{Step::kAllGather} : Steps{};
    struct {
      const char* what;
      Placement from, to, grad;
      Steps forward, backward;
    } edges[] = {
        {"embedding -> ln_1", emb->info().output, ln1->info().inputs[0], ln1->info().inputs[0],
         reduce, gather},
        {"ln_1 -> c_attn", ln1->info().output, qkv->info().inputs[0], qkv->InputGradient(), gather,
         reduce},
        {"c_attn -> attention", qkv->info().output, attn->info().inputs[0], attn->info().inputs[0],
         none, none},
        {"attention -> c_proj", attn->info().output, proj->info().inputs[0], proj->InputGradient(),
         none, none},
        {"c_proj -> add_1", proj->info().output, add1->info().inputs[1], add1->info().inputs[1],
         reduce, gather},
        {"add_1 -> ln_2", add1->info().output, ln2->info().inputs[0], ln2->info().inputs[0], none,
         none},
        {"ln_2 -> c_fc", ln2->info().output, fc->info().inputs[0], fc->InputGradient(), gather,
         reduce},
        {"c_fc -> gelu", fc->info().output, gelu->info().inputs[0], gelu->info().inputs[0], none,
         none},
        {"gelu -> mlp.c_proj", gelu->info().output, fcproj->info().inputs[0],
         fcproj->InputGradient(), none, none},
        {"mlp.c_proj -> add_2", fcproj->info().output, add2->info().inputs[1],
         add2->info().inputs[1], reduce, gather},
        {"ln_f -> lm_head", lnf->info().output, lm->info().inputs[0], lm->InputGradient(), gather,
         reduce},
        {"lm_head -> loss", lm->info().output, loss->info().inputs[0], loss->info().inputs[0], none,
         none},
    };
    for (const auto& e : edges) {
      INFO(e.what);
      CHECK(PlanSteps(e.from, e.to, N, tp) == e.forward);
      CHECK(PlanSteps(e.grad, e.from.Resolved(), N, tp) == e.backward);
    }
  }
}

// ---- forward and backward on ranks against the whole operator ----

// An Act over all of `v`, placed `p` (for the whole operator: tp = 1).
Act ActOf(std::vector<float>* v, int64_t rows, int64_t cols, const Placement& p) {
  return Act{v->data(), rows, cols, p};
}

// What one rank computed.
struct RankOut {
  std::vector<std::vector<float>> local;  // the operator's outputs, as it left them
  std::vector<std::vector<float>> whole;  // outputs converted to replicated
  Calls op_calls;                         // collectives inside the operator
};

// Every rank's `which` local output.
std::vector<std::vector<float>> Locals(const std::vector<RankOut>& outs, size_t which) {
  std::vector<std::vector<float>> v;
  for (const RankOut& o : outs) v.push_back(o.local[which]);
  return v;
}

// Converts the whole `x` (every rank holds it) to `to` on this rank: the
// conversion the runtime inserts before an operator.
Result<Act> Place(OpContext& ctx, std::vector<float>* x, int64_t rows, int64_t cols,
                  const Placement& to, std::vector<float>* storage) {
  Act a{x->data(), rows, cols, kRep};
  return ctx.Convert(a, to, storage, "test", "input");
}

// Converts an operator's output (or input gradient) `a` to replicated and
// keeps it: the conversion the next operator (or the producer) inserts.
Status KeepWhole(OpContext& ctx, Act a, std::vector<std::vector<float>>* whole) {
  std::vector<float> storage;
  ASSIGN_OR_RETURN(Act w, ctx.Convert(a, kRep, &storage, "test", "output"));
  whole->emplace_back(w.data, w.data + a.rows * a.cols);
  return Status::Ok();
}

constexpr double kRel = 1e-6;

TEST_CASE("LinearOp on tp ranks: outputs and gradients of the whole operator", "[operators]") {
  const int64_t N = 6, K = 8;
  int runs = 0;
  for (int groups : {1, 3}) {
    const int64_t M = 12;
    const std::vector<float> x = Random(N * K, 1), w = Random(K * M, 2), b = Random(M, 3),
                             dy = Random(N * M, 4);
    for (const Doc& d : LinearDocs(groups)) {
      INFO("groups " << groups << ", " << Text(d.strategy));
      // The whole operator.
      auto whole = LinearOp::Create("fc", d.strategy, K, M, groups, 1);
      REQUIRE(whole.ok());
      OpContext one(nullptr);
      std::vector<float> x1 = x, y1(N * M), dy1 = dy, dx1(N * K), dw1(K * M), db1(M);
      {
        Act xa = ActOf(&x1, N, K, whole->info().inputs[0]), ya = ActOf(&y1, N, M, kRep);
        whole->Forward(one, xa, w.data(), b.data(), &ya);
        Act dya = ActOf(&dy1, N, M, kRep), dxa = ActOf(&dx1, N, K, kRep);
        whole->Backward(one, xa, w.data(), dya, &dxa, dw1.data(), db1.data());
      }
      for (int tp : {2, 4}) {
        INFO("tp " << tp);
        auto op = LinearOp::Create("fc", d.strategy, K, M, groups, 1);
        REQUIRE(op.ok());
        const Placement in = op->info().inputs[0], out = op->info().output,
                        grad = op->InputGradient();
        // The weight [K, M] cut like x's columns (K) or like the output's
        // columns (M, in groups); the bias like the output's columns.
        const Placement wp = d.weight_split == 0 ? kRows : d.weight_split == 1 ? out : kRep;
        const Placement bp = d.weight_split == 1 ? out : kRep;
        std::vector<RankOut> outs(tp);
        OnRanks(tp, [&](OpContext& ctx, Recorder& rec) -> Status {
          const int r = ctx.tp_rank();
          RankOut& o = outs[r];
          std::vector<float> xw = x, xs, wl = Cut(w, K, M, wp.Resolved(), tp, r),
                             bl = Cut(b, 1, M, bp.Resolved(), tp, r);
          ASSIGN_OR_RETURN(Act xa, Place(ctx, &xw, N, K, in, &xs));
          std::vector<float> y(LocalSize(out, N, M, tp, r), 0.0f);
          Act ya{y.data(), N, M, out};
          rec.calls.clear();
          op->Forward(ctx, xa, wl.data(), bl.data(), &ya);
          // Backward: the gradient arrives whole, converted to the output's
          // placement (resolved), as OpGpt's ConvGrad does.
          std::vector<float> dyw = dy, dys, dx(LocalSize(grad, N, K, tp, r), 0.0f),
                             dw(wl.size(), 0.0f), db(bl.size(), 0.0f);
          ASSIGN_OR_RETURN(Act dya, Place(ctx, &dyw, N, M, out.Resolved(), &dys));
          Act dxa{dx.data(), N, K, grad};
          op->Backward(ctx, xa, wl.data(), dya, &dxa, dw.data(), db.data());
          o.op_calls = rec.calls;
          o.local = {y, dx, dw, db};
          RETURN_IF_ERROR(KeepWhole(ctx, ya, &o.whole));
          return KeepWhole(ctx, dxa, &o.whole);
        });
        // Parameters' gradients: partial over tp where the rows are cut.
        Placement wg = wp.Resolved(), bg = bp.Resolved();
        wg.partial = bg.partial = d.rows_over_tp;
        Same(Whole(Locals(outs, 0), N, M, out), y1, kRel, "y");
        Same(Whole(Locals(outs, 1), N, K, grad), dx1, kRel, "dx");
        Same(Whole(Locals(outs, 2), K, M, wg), dw1, kRel, "dw");
        Same(Whole(Locals(outs, 3), 1, M, bg), db1, kRel, "db");
        for (int r = 0; r < tp; ++r) {
          INFO("rank " << r);
          Same(outs[r].whole[0], y1, kRel, "y, converted to replicated");
          Same(outs[r].whole[1], dx1, kRel, "dx, converted to replicated");
          CHECK(outs[r].op_calls.empty());  // the conversions are the only traffic
        }
        ++runs;
      }
    }
  }
  CHECK(runs == 2 * 4 * 2);
}

TEST_CASE("LayerNormOp, GeluOp, AddOp on tp ranks: the whole operator's results", "[operators]") {
  const int64_t N = 6, C = 12;
  const std::vector<float> x = Random(N * C, 5), x2 = Random(N * C, 6), dy = Random(N * C, 7),
                           lw = Random(C, 8), lb = Random(C, 9);
  int runs = 0;
  // Layer norm: rows are independent (bit for bit); the parameters'
  // gradients are sums over rows (partial where the rows are cut).
  for (const OpStrategy& s : {S({{kDp, kNo}}), S({{kDpTp, kNo}})}) {
    INFO("layer norm " << Text(s));
    auto whole = LayerNormOp::Create("ln", s, 1);
    REQUIRE(whole.ok());
    OpContext one(nullptr);
    std::vector<float> x1 = x, y1(N * C), mean1(N), rstd1(N), dy1 = dy, dx1(N * C, 0.0f), dw1(C),
                       db1(C);
    Act xa = ActOf(&x1, N, C, kRep), ya = ActOf(&y1, N, C, kRep), dya = ActOf(&dy1, N, C, kRep),
        dxa = ActOf(&dx1, N, C, kRep);
    whole->Forward(one, xa, lw.data(), lb.data(), &ya, mean1.data(), rstd1.data());
    whole->Backward(one, xa, lw.data(), mean1.data(), rstd1.data(), dya, &dxa, dw1.data(),
                    db1.data());
    for (int tp : {2, 4}) {
      INFO("tp " << tp);
      const Placement p = whole->info().inputs[0];
      std::vector<RankOut> outs(tp);
      OnRanks(tp, [&](OpContext& ctx, Recorder& rec) -> Status {
        const int r = ctx.tp_rank();
        std::vector<float> xw = x, xs, dyw = dy, dys;
        ASSIGN_OR_RETURN(Act xi, Place(ctx, &xw, N, C, p, &xs));
        const int64_t n = LocalSize(p, N, C, tp, r), rows = n / C;
        std::vector<float> y(n), mean(rows), rstd(rows), dx(n, 7.0f), dw(C), db(C);
        Act yo{y.data(), N, C, p};
        rec.calls.clear();
        whole->Forward(ctx, xi, lw.data(), lb.data(), &yo, mean.data(), rstd.data());
        ASSIGN_OR_RETURN(Act dyi, Place(ctx, &dyw, N, C, p, &dys));
        Act dxo{dx.data(), N, C, p};
        // dx is set over what it held (7s), then accumulated onto.
        whole->Backward(ctx, xi, lw.data(), mean.data(), rstd.data(), dyi, &dxo, dw.data(),
                        db.data());
        std::vector<float> twice = dx, dw2(C), db2(C);
        Act twice_o{twice.data(), N, C, p};
        whole->Backward(ctx, xi, lw.data(), mean.data(), rstd.data(), dyi, &twice_o, dw2.data(),
                        db2.data(), /*accumulate=*/true);
        outs[r].op_calls = rec.calls;
        outs[r].local = {y, mean, rstd, dx, dw, db, twice};
        RETURN_IF_ERROR(KeepWhole(ctx, yo, &outs[r].whole));
        return KeepWhole(ctx, dxo, &outs[r].whole);
      });
      const Placement rows_of = p.split == 0 ? kRows : kRep;
      Placement sum = kRep;
      sum.partial = whole->info().rows_over_tp;
      Same(Whole(Locals(outs, 0), N, C, p), y1, 0, "y");
      Same(Whole(Locals(outs, 1), N, 1, rows_of), mean1, 0, "mean");
      Same(Whole(Locals(outs, 2), N, 1, rows_of), rstd1, 0, "rstd");
      Same(Whole(Locals(outs, 3), N, C, p), dx1, 0, "dx (set, not accumulated)");
      std::vector<float> dx2 = dx1;
      for (float& v : dx2) v *= 2;  // exact
      Same(Whole(Locals(outs, 6), N, C, p), dx2, 0, "dx accumulated onto");
      Same(Whole(Locals(outs, 4), 1, C, sum), dw1, kRel, "dw");
      Same(Whole(Locals(outs, 5), 1, C, sum), db1, kRel, "db");
      for (int r = 0; r < tp; ++r) {
        Same(outs[r].whole[0], y1, 0, "y, replicated");
        Same(outs[r].whole[1], dx1, 0, "dx, replicated");
        CHECK(outs[r].op_calls.empty());
      }
      ++runs;
    }
  }
  // GELU and the residual add: element-wise. The add is bit for bit; GELU's
  // kernel is vectorized, and its vector body and scalar tail may round an
  // element differently, so its bits depend on where the element falls in
  // the shard.
  for (const OpStrategy& s : {S({{kDp, kNo}}), S({{kDp, kTp}}), S({{kDpTp, kNo}})}) {
    INFO("gelu and add " << Text(s));
    auto gelu = GeluOp::Create("gelu", s, 1);
    auto add = AddOp::Create("add", S({s.inputs[0], s.inputs[0]}), 1);
    REQUIRE((gelu.ok() && add.ok()));
    OpContext one(nullptr);
    std::vector<float> x1 = x, x21 = x2, y1(N * C), dy1 = dy, dx1(N * C), sum1(N * C);
    Act xa = ActOf(&x1, N, C, kRep), x2a = ActOf(&x21, N, C, kRep), ya = ActOf(&y1, N, C, kRep),
        dya = ActOf(&dy1, N, C, kRep), dxa = ActOf(&dx1, N, C, kRep),
        suma = ActOf(&sum1, N, C, kRep);
    gelu->Forward(one, xa, &ya);
    gelu->Backward(one, xa, dya, &dxa);
    add->Forward(one, xa, x2a, &suma);
    for (int tp : {2, 4}) {
      INFO("tp " << tp);
      const Placement p = gelu->info().inputs[0];
      CHECK(SamePlace(add->info().inputs[1], p));
      std::vector<RankOut> outs(tp);
      OnRanks(tp, [&](OpContext& ctx, Recorder& rec) -> Status {
        const int r = ctx.tp_rank();
        std::vector<float> xw = x, xs, x2w = x2, x2s, dyw = dy, dys;
        ASSIGN_OR_RETURN(Act xi, Place(ctx, &xw, N, C, p, &xs));
        ASSIGN_OR_RETURN(Act x2i, Place(ctx, &x2w, N, C, p, &x2s));
        ASSIGN_OR_RETURN(Act dyi, Place(ctx, &dyw, N, C, p, &dys));
        const int64_t n = LocalSize(p, N, C, tp, r);
        std::vector<float> y(n), dx(n), sum(n);
        Act yo{y.data(), N, C, p}, dxo{dx.data(), N, C, p}, so{sum.data(), N, C, p};
        rec.calls.clear();
        gelu->Forward(ctx, xi, &yo);
        gelu->Backward(ctx, xi, dyi, &dxo);
        add->Forward(ctx, xi, x2i, &so);
        outs[r].op_calls = rec.calls;
        outs[r].local = {y, dx, sum};
        RETURN_IF_ERROR(KeepWhole(ctx, yo, &outs[r].whole));
        return KeepWhole(ctx, so, &outs[r].whole);
      });
      Same(Whole(Locals(outs, 0), N, C, p), y1, kRel, "gelu y");
      Same(Whole(Locals(outs, 1), N, C, p), dx1, kRel, "gelu dx");
      Same(Whole(Locals(outs, 2), N, C, p), sum1, 0, "add y");
      for (int r = 0; r < tp; ++r) {
        Same(outs[r].whole[0], y1, kRel, "gelu y, replicated");
        Same(outs[r].whole[1], sum1, 0, "add y, replicated");
        CHECK(outs[r].op_calls.empty());
      }
      ++runs;
    }
  }
  CHECK(runs == 2 * 2 + 3 * 2);
}

TEST_CASE("AttentionOp on tp ranks: by heads and by whole sequences", "[operators]") {
  const int H = 4, T = 3;
  const int64_t C = 8, B = 4, N = B * T;
  const std::vector<float> qkv = Random(N * 3 * C, 10), dy = Random(N * C, 11);
  int runs = 0;
  for (const OpStrategy& s : {S({{kDp, kNo}}), S({{kDp, kTp}}), S({{kDpTp, kNo}})}) {
    INFO(Text(s));
    auto whole = AttentionOp::Create("attn", s, H, C, 1, 1);
    REQUIRE(whole.ok());
    OpContext one(nullptr);
    std::vector<float> q1 = qkv, y1(N * C), att1(whole->AttSize(one, N, T)), dy1 = dy,
                       dq1(N * 3 * C);
    CHECK(att1.size() == static_cast<size_t>(B * H * T * T));
    Act qa = ActOf(&q1, N, 3 * C, kRep), ya = ActOf(&y1, N, C, kRep), dya = ActOf(&dy1, N, C, kRep),
        dqa = ActOf(&dq1, N, 3 * C, kRep);
    REQUIRE(whole->Forward(one, qa, T, att1.data(), &ya).ok());
    REQUIRE(whole->Backward(one, qa, att1.data(), T, dya, &dqa).ok());
    for (int tp : {2, 4}) {
      INFO("tp " << tp);
      auto op = AttentionOp::Create("attn", s, H, C, tp, 1);
      REQUIRE(op.ok());
      const Placement in = op->info().inputs[0], out = op->info().output;
      std::vector<RankOut> outs(tp);
      std::vector<int64_t> att_sizes(tp);
      OnRanks(tp, [&](OpContext& ctx, Recorder& rec) -> Status {
        const int r = ctx.tp_rank();
        std::vector<float> qw = qkv, qs, dyw = dy, dys;
        ASSIGN_OR_RETURN(Act qi, Place(ctx, &qw, N, 3 * C, in, &qs));
        att_sizes[r] = op->AttSize(ctx, N, T);
        std::vector<float> y(LocalSize(out, N, C, tp, r)), att(att_sizes[r]),
            dq(LocalSize(in, N, 3 * C, tp, r));
        Act yo{y.data(), N, C, out};
        rec.calls.clear();
        RETURN_IF_ERROR(op->Forward(ctx, qi, T, att.data(), &yo));
        ASSIGN_OR_RETURN(Act dyi, Place(ctx, &dyw, N, C, out, &dys));
        Act dqo{dq.data(), N, 3 * C, in};
        RETURN_IF_ERROR(op->Backward(ctx, qi, att.data(), T, dyi, &dqo));
        outs[r].op_calls = rec.calls;
        outs[r].local = {y, dq};
        RETURN_IF_ERROR(KeepWhole(ctx, yo, &outs[r].whole));
        return KeepWhole(ctx, dqo, &outs[r].whole);
      });
      Same(Whole(Locals(outs, 0), N, C, out), y1, 0, "y");
      Same(Whole(Locals(outs, 1), N, 3 * C, in), dq1, 0, "dqkv");
      for (int r = 0; r < tp; ++r) {
        // Its sequences' heads: [B_local, heads_local, T, T].
        const int64_t b = in.split == 0 ? B / tp : B, h = in.split == 1 ? H / tp : H;
        CHECK(att_sizes[r] == b * h * T * T);
        Same(outs[r].whole[0], y1, 0, "y, replicated");
        Same(outs[r].whole[1], dq1, 0, "dqkv, replicated");
        CHECK(outs[r].op_calls.empty());
      }
      ++runs;
    }
  }
  CHECK(runs == 3 * 2);
}

TEST_CASE("EmbeddingOp and LmHeadOp on tp ranks: vocabulary, columns, rows", "[operators]") {
  // An uneven vocabulary (11 on 2 and 4 ranks), sequences of 4 over rows
  // cut mid-sequence.
  const int T = 4;
  const int64_t V = 11, C = 8, N = 12;
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 5 + 3) % V);
  const std::vector<float> wte = Random(V * C, 12), wpe = Random(T * C, 13), dy = Random(N * C, 14),
                           dlogits = Random(N * V, 15), h = Random(N * C, 16);
  int runs = 0;
  for (const OpStrategy& s : {S({{kNo, kNo}, {kDp}}), S({{kTp, kNo}, {kDp}}),
                              S({{kNo, kTp}, {kDp}}), S({{kNo, kNo}, {kDpTp}})}) {
    INFO("embedding " << Text(s));
    auto op = EmbeddingOp::Create("embedding", s, V, C, 1);
    REQUIRE(op.ok());
    OpContext one(nullptr);
    std::vector<float> y1(N * C), dy1 = dy, dwte1(V * C), dwpe1(T * C);
    Act ya = ActOf(&y1, N, C, kRep), dya = ActOf(&dy1, N, C, kRep);
    op->Forward(one, tokens.data(), T, wte.data(), wpe.data(), &ya);
    op->Backward(one, tokens.data(), T, dya, dwte1.data(), dwpe1.data());
    for (int tp : {2, 4}) {
      INFO("tp " << tp);
      const Placement out = op->info().output;
      // wte [V, C] cut by the vocabulary (rows) or columns; wpe [T, C] by
      // columns alike, else whole.
      const Placement wp = op->weight_split() == 0 ? kRows : op->weight_split() == 1 ? kCols : kRep;
      const Placement pp = op->weight_split() == 1 ? kCols : kRep;
      std::vector<RankOut> outs(tp);
      OnRanks(tp, [&](OpContext& ctx, Recorder& rec) -> Status {
        const int r = ctx.tp_rank();
        std::vector<float> wl = Cut(wte, V, C, wp, tp, r), pl = Cut(wpe, T, C, pp, tp, r),
                           y(LocalSize(out, N, C, tp, r)), dyw = dy, dys, dw(wl.size()),
                           dp(pl.size());
        Act yo{y.data(), N, C, out};
        rec.calls.clear();
        op->Forward(ctx, tokens.data(), T, wl.data(), pl.data(), &yo);
        ASSIGN_OR_RETURN(Act dyi, Place(ctx, &dyw, N, C, out.Resolved(), &dys));
        op->Backward(ctx, tokens.data(), T, dyi, dw.data(), dp.data());
        outs[r].op_calls = rec.calls;
        outs[r].local = {y, dw, dp};
        return KeepWhole(ctx, yo, &outs[r].whole);
      });
      Placement wg = wp, pg = pp;
      wg.partial = pg.partial = op->info().rows_over_tp;
      // One rank adds wte's row and wpe's, or wpe alone and another the row:
      // the same bits.
      Same(Whole(Locals(outs, 0), N, C, out), y1, 0, "y");
      Same(Whole(Locals(outs, 1), V, C, wg), dwte1, wg.partial ? kRel : 0, "dwte");
      Same(Whole(Locals(outs, 2), T, C, pg), dwpe1, pg.partial ? kRel : 0, "dwpe");
      for (int r = 0; r < tp; ++r) {
        Same(outs[r].whole[0], y1, 0, "y, replicated");
        CHECK(outs[r].op_calls.empty());
      }
      ++runs;
    }
  }
  for (const Doc& d :
       std::vector<Doc>{{S({{kDp, kNo}, {kNo, kNo}}), {kRep}, kRep, false, -1},
                        {S({{kDp, kNo}, {kTp, kNo}}), {kRep}, kCols, false, 0},
                        {S({{kDp, kTp}, {kNo, kTp}}), {kCols}, Partial(kRep), false, 1},
                        {S({{kDpTp, kNo}, {kNo, kNo}}), {kRows}, kRows, true, -1}}) {
    INFO("lm_head " << Text(d.strategy));
    auto op = LmHeadOp::Create("lm_head", d.strategy, V, C, 1);
    REQUIRE(op.ok());
    OpContext one(nullptr);
    std::vector<float> h1 = h, l1(N * V), dl1 = dlogits, dh1(N * C), dw1(V * C);
    Act ha = ActOf(&h1, N, C, kRep), la = ActOf(&l1, N, V, kRep), dla = ActOf(&dl1, N, V, kRep),
        dha = ActOf(&dh1, N, C, kRep);
    op->Forward(one, ha, wte.data(), &la);
    op->Backward(one, ha, wte.data(), dla, &dha, dw1.data());
    for (int tp : {2, 4}) {
      INFO("tp " << tp);
      const Placement in = op->info().inputs[0], out = op->info().output,
                      grad = op->InputGradient();
      const Placement wp = d.weight_split == 0 ? kRows : d.weight_split == 1 ? kCols : kRep;
      std::vector<RankOut> outs(tp);
      OnRanks(tp, [&](OpContext& ctx, Recorder& rec) -> Status {
        const int r = ctx.tp_rank();
        std::vector<float> hw = h, hs, wl = Cut(wte, V, C, wp, tp, r),
                           l(LocalSize(out, N, V, tp, r)), dlw = dlogits, dls,
                           dh(LocalSize(grad, N, C, tp, r)), dw(wl.size());
        ASSIGN_OR_RETURN(Act hi, Place(ctx, &hw, N, C, in, &hs));
        Act lo{l.data(), N, V, out};
        rec.calls.clear();
        op->Forward(ctx, hi, wl.data(), &lo);
        ASSIGN_OR_RETURN(Act dli, Place(ctx, &dlw, N, V, out.Resolved(), &dls));
        Act dho{dh.data(), N, C, grad};
        op->Backward(ctx, hi, wl.data(), dli, &dho, dw.data());
        outs[r].op_calls = rec.calls;
        outs[r].local = {l, dh, dw};
        RETURN_IF_ERROR(KeepWhole(ctx, lo, &outs[r].whole));
        return KeepWhole(ctx, dho, &outs[r].whole);
      });
      Placement wg = wp;
      wg.partial = d.rows_over_tp;
      Same(Whole(Locals(outs, 0), N, V, out), l1, kRel, "logits");
      Same(Whole(Locals(outs, 1), N, C, grad), dh1, kRel, "dx");
      Same(Whole(Locals(outs, 2), V, C, wg), dw1, kRel, "dwte");
      for (int r = 0; r < tp; ++r) {
        Same(outs[r].whole[0], l1, kRel, "logits, replicated");
        Same(outs[r].whole[1], dh1, kRel, "dx, replicated");
        CHECK(outs[r].op_calls.empty());
      }
      ++runs;
    }
  }
  CHECK(runs == 4 * 2 + 4 * 2);
}

TEST_CASE("CrossEntropyOp on tp ranks: vocabulary-parallel and by rows", "[operators]") {
  const int64_t V = 11, N = 6;
  const float dloss = 0.75f;
  std::vector<float> logits = Random(N * V, 17);
  for (float& l : logits) l *= 4.0f;
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 4 + 1) % V);
  int runs = 0;
  for (const OpStrategy& s :
       {S({{kDp, kNo}, {kDp}}), S({{kDp, kTp}, {kDp}}), S({{kDpTp, kNo}, {kDpTp}})}) {
    INFO(Text(s));
    auto op = CrossEntropyOp::Create("loss", s, V, 1);
    REQUIRE(op.ok());
    OpContext one(nullptr);
    std::vector<float> l1 = logits, probs1(N * V), max1, dl1(N * V);
    std::vector<double> sums1;
    Act la = ActOf(&l1, N, V, kRep);
    auto loss1 = op->Forward(one, la, targets.data(), probs1.data(), &max1, &sums1);
    REQUIRE(loss1.ok());
    op->Backward(one, la, probs1.data(), targets.data(), dloss, dl1.data());
    for (int tp : {2, 4}) {
      INFO("tp " << tp);
      const Placement p = op->info().inputs[0];
      std::vector<RankOut> outs(tp);
      std::vector<double> losses(tp);
      OnRanks(tp, [&](OpContext& ctx, Recorder& rec) -> Status {
        const int r = ctx.tp_rank();
        std::vector<float> lw = logits, ls, probs(LocalSize(p, N, V, tp, r)), max, dl(probs.size());
        std::vector<double> sums;
        ASSIGN_OR_RETURN(Act li, Place(ctx, &lw, N, V, p, &ls));
        rec.calls.clear();
        ASSIGN_OR_RETURN(losses[r],
                         op->Forward(ctx, li, targets.data(), probs.data(), &max, &sums));
        op->Backward(ctx, li, probs.data(), targets.data(), dloss, dl.data());
        outs[r].op_calls = rec.calls;
        outs[r].local = {probs, dl};
        return Status::Ok();
      });
      Same(Whole(Locals(outs, 0), N, V, p), probs1, kRel, "probabilities");
      Same(Whole(Locals(outs, 1), N, V, p), dl1, kRel, "dlogits");
      for (int r = 0; r < tp; ++r) {
        INFO("rank " << r);
        CHECK(std::fabs(losses[r] - *loss1) <= kRel * std::fabs(*loss1));
        CHECK(losses[r] == losses[0]);  // the same on every rank
        // Megatron's vocabulary-parallel loss: the rows' maxima and the
        // (sum of exponentials, target logit) pairs reduced over tp; by
        // rows, the loss summed; whole, nothing.
        const Calls want = p.split == 1   ? Calls{{"AllReduce", N}, {"AllReduce", 2 * N}}
                           : p.split == 0 ? Calls{{"AllReduce", 1}}
                                          : Calls{};
        INFO(Text(outs[r].op_calls));
        CHECK(outs[r].op_calls == want);
      }
      ++runs;
    }
  }
  CHECK(runs == 3 * 2);
}

}  // namespace
}  // namespace tessera
