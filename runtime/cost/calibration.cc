#include "runtime/cost/calibration.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "core/timer.h"
#include "runtime/kernels.h"
#include "runtime/parallel/copy_turns.h"
#include "runtime/train/offload.h"
#include "runtime/train/optim.h"

namespace tessera {

std::vector<double> Ascending(const std::vector<double>& v) {
  // Pool adjacent violators: blocks of equal values, merged while a block
  // is below the one before it, each holding its members' mean.
  std::vector<std::pair<double, int>> blocks;  // mean, members
  for (double x : v) {
    blocks.push_back({x, 1});
    while (blocks.size() > 1 && blocks[blocks.size() - 2].first > blocks.back().first) {
      auto [mean, count] = blocks.back();
      blocks.pop_back();
      auto& prev = blocks.back();
      prev.first = (prev.first * prev.second + mean * count) / (prev.second + count);
      prev.second += count;
    }
  }
  std::vector<double> out;
  for (auto [mean, count] : blocks) out.insert(out.end(), count, mean);
  return out;
}

double MeasureMatmulFlops(int64_t n) {
  const int64_t C = 256, M = 4 * C;
  const int N = static_cast<int>(std::max<int64_t>(n, 64));
  std::vector<float> x(N * C, 0.5f), w(C * M, 0.25f), b(M, 0.0f), y(N * M), dy(N * M, 0.01f),
      dx(N * C), dw(C * M), db(M);
  // A training linear: the forward and its backward (the input's and the
  // weight's gradients, twice the forward's flops; on this VM 10-15%
  // slower a flop than the forward).
  auto both = [&] {
    kernels::MatmulForward(y.data(), x.data(), w.data(), b.data(), N, C, M);
    kernels::MatmulBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C,
                            M);
  };
  const double s = MedianSeconds(5, both, /*warm_up=*/true);
  return 6.0 * N * C * M / s;
}

double MeasureMemoryBandwidth(int64_t floats) {
  std::vector<float> a(floats, 1.0f), b(floats, 2.0f), out(floats);
  const double s = MedianSeconds(
      7, [&] { kernels::ResidualForward(out.data(), a.data(), b.data(), floats); },
      /*warm_up=*/true);
  return 12.0 * static_cast<double>(floats) / s;
}

Result<LinkProfile> MeasureLink(Communicator& comm, int64_t max_bytes) {
  const int n = comm.size();
  if (n < 2) return InvalidArgumentError("measuring a link needs at least 2 ranks");
  // The latency from one-float AllReduces (2 (n - 1) steps), then the
  // bandwidth by least squares of what remains of each timing against the
  // bytes moved per rank (AllReduce and AllGather, 4 KiB to max_bytes).
  float one = 1.0f, sum = 0.0f;
  RETURN_IF_ERROR(comm.Barrier());
  Status status = Status::Ok();
  double t1 = MedianSeconds(21, [&] {
    Status s = comm.AllReduce(&one, &sum, 1, DType::kF32, ReduceOp::kSum);
    if (status.ok()) status = s;
  });
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(comm.Broadcast(&t1, 1, DType::kF64, 0));
  LinkProfile link;
  link.latency_s = t1 / RingOf(CollectiveKind::kAllReduce, n).steps;
  double sbb = 0, sbt = 0;
  std::vector<float> send, recv;
  for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const int64_t count = bytes / 4;
    send.assign(count, 1.0f);
    recv.assign(count * n, 0.0f);
    for (int kind = 0; kind < 2; ++kind) {
      RETURN_IF_ERROR(comm.Barrier());
      double t = MedianSeconds(5, [&] {
        Status s =
            kind == 0 ? comm.AllReduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum)
                      : comm.AllGather(send.data(), count / n, recv.data(), DType::kF32);
        if (status.ok()) status = s;
      });
      RETURN_IF_ERROR(status);
      RETURN_IF_ERROR(comm.Broadcast(&t, 1, DType::kF64, 0));  // rank 0's timing everywhere
      const RingShape ring =
          RingOf(kind == 0 ? CollectiveKind::kAllReduce : CollectiveKind::kAllGather, n);
      const double moved = ring.moved * static_cast<double>(bytes);
      sbb += moved * moved;
      sbt += moved * std::max(0.0, t - ring.steps * link.latency_s);
    }
  }
  link.bandwidth = sbt > 0 ? sbb / sbt : 1e12;
  return link;
}

namespace {

// Times fn(run) on every rank of `comm`, nine times, each after a write
// of a buffer larger than a core's caches (so that the collective finds
// its buffers and the runtime's state cold) and a barrier of all ranks:
// rank 0's median, on every rank. A rank whose call failed fails them all
// (nobody is left waiting in the broadcast).
class ColdTimer {
 public:
  explicit ColdTimer(Communicator& comm) : comm_(comm), scratch_(size_t{16} << 20) {}
  Result<double> Median(const std::function<Status(int)>& fn) {
    std::vector<double> t;
    Status status = Status::Ok();
    for (int run = 0; run < 9; ++run) {
      std::memset(scratch_.data(), run + 1, scratch_.size());
      // The buffer is never read: without this the compiler may drop the
      // writes, and the caches would stay warm.
      asm volatile("" : : "r"(scratch_.data()) : "memory");
      RETURN_IF_ERROR(comm_.Barrier());
      const double start = SteadySeconds();
      const Status s = status.ok() ? fn(run) : Status::Ok();
      t.push_back(SteadySeconds() - start);
      if (status.ok()) status = s;
    }
    int32_t failed = status.ok() ? 0 : 1;
    RETURN_IF_ERROR(comm_.AllReduce(&failed, &failed, 1, DType::kI32, ReduceOp::kMax));
    RETURN_IF_ERROR(status);
    if (failed != 0) return InternalError("measuring collectives: another rank's call failed");
    std::sort(t.begin(), t.end());
    double median = t[t.size() / 2];
    RETURN_IF_ERROR(comm_.Broadcast(&median, 1, DType::kF64, 0));  // rank 0's timing everywhere
    return median;
  }

 private:
  Communicator& comm_;
  std::vector<char> scratch_;
};

// One of the three collectives MeasureCollectives tables (0: AllReduce,
// 1: AllGather, 2: ReduceScatter) of `count` floats over `c`'s g ranks.
Status RunCollective(Communicator* c, int kind, int64_t count, int g, std::vector<float>& send,
                     std::vector<float>& recv) {
  switch (kind) {
    case 0:
      return c->AllReduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum);
    case 1:
      return c->AllGather(send.data(), count / g, recv.data(), DType::kF32);
    default:
      return c->ReduceScatter(send.data(), recv.data(), count / g, DType::kF32, ReduceOp::kSum);
  }
}

// AllReduce, AllGather and ReduceScatter over the n / g groups of g
// consecutive ranks at once, at sizes from 4 KiB to `max_bytes`.
Result<std::vector<CollectiveTable>> GroupTables(Communicator& comm, ColdTimer& timer, int g,
                                                 int64_t max_bytes) {
  std::unique_ptr<Communicator> sub;
  Communicator* c = &comm;
  if (g < comm.size()) {
    ASSIGN_OR_RETURN(sub, comm.Split(comm.rank() / g, comm.rank()));
    c = sub.get();
  }
  std::vector<CollectiveTable> tables(3);
  tables[0].kind = CollectiveKind::kAllReduce;
  tables[1].kind = CollectiveKind::kAllGather;
  tables[2].kind = CollectiveKind::kReduceScatter;
  std::vector<float> send, recv;
  for (int64_t size = 4096; size <= max_bytes; size *= 4) {
    const int64_t count = size / 4 / g * g;  // a whole block per rank
    send.assign(count, 1.0f);
    recv.assign(count * g, 0.0f);
    for (int kind = 0; kind < 3; ++kind) {
      ASSIGN_OR_RETURN(double median, timer.Median([&](int) {
        return RunCollective(c, kind, count, g, send, recv);
      }));
      tables[kind].group = g;
      tables[kind].bytes.push_back(static_cast<double>(count * 4));
      tables[kind].seconds.push_back(median);
    }
  }
  return tables;
}

// SendRecv (a pipeline's transfer between neighbour stages): half a
// ping-pong of ranks 0 and 1, the others idle.
Result<CollectiveTable> SendRecvTable(Communicator& comm, ColdTimer& timer, int64_t max_bytes) {
  CollectiveTable p2p;
  p2p.kind = CollectiveKind::kSendRecv;
  p2p.group = 2;
  std::vector<float> send, recv;
  for (int64_t size = 4096; size <= max_bytes; size *= 4) {
    const int64_t count = size / 4;
    send.assign(count, 1.0f);
    recv.assign(count, 0.0f);
    ASSIGN_OR_RETURN(double round_trip, timer.Median([&](int run) -> Status {
      if (comm.rank() == 0) {
        RETURN_IF_ERROR(comm.Send(send.data(), count, DType::kF32, 1, run));
        return comm.Recv(recv.data(), count, DType::kF32, 1, run);
      }
      if (comm.rank() == 1) {
        RETURN_IF_ERROR(comm.Recv(recv.data(), count, DType::kF32, 0, run));
        return comm.Send(recv.data(), count, DType::kF32, 0, run);
      }
      return Status::Ok();
    }));
    p2p.bytes.push_back(static_cast<double>(count * 4));
    p2p.seconds.push_back(round_trip / 2);
  }
  return p2p;
}

}  // namespace

Result<std::vector<CollectiveTable>> MeasureCollectives(Communicator& comm, int64_t max_bytes) {
  const int n = comm.size();
  if (n < 2) return InvalidArgumentError("measuring collectives needs at least 2 ranks");
  ColdTimer timer(comm);
  std::vector<CollectiveTable> out;
  // Every group size g >= 2 that divides the ranks, the n / g groups of
  // consecutive ranks at once (as a mesh axis's groups run side by side,
  // sharing the cores when ranks outnumber them). ReduceScatter is timed
  // on its own: backends implement it differently (Gloo and, up to
  // CommOptions::fold_reduce_scatter_ranks, MPI as an AllToAll and a fold
  // in rank order; NCCL its own), so it costs what neither of the others
  // does.
  for (int g = 2; g <= n; ++g) {
    if (n % g != 0) continue;
    ASSIGN_OR_RETURN(std::vector<CollectiveTable> tables, GroupTables(comm, timer, g, max_bytes));
    for (CollectiveTable& t : tables) out.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(CollectiveTable p2p, SendRecvTable(comm, timer, max_bytes));
  out.push_back(std::move(p2p));
  for (CollectiveTable& t : out) t.seconds = Ascending(t.seconds);
  return out;
}

// Multi-copy's turn: 4 KiB allreduces back to back, blocking, against the
// same issued by two copies taking turns (IAllReduce, the turn handed on,
// wait, the turn taken back: what a copy does around each collective) with
// no compute between; the extra per collective, the largest of the ranks'.
Result<double> MeasureCopyTurn(Communicator& comm) {
  constexpr int kRounds = 200;
  std::vector<float> a(1024, 1.0f), b(1024, 1.0f);
  RETURN_IF_ERROR(comm.AllReduce(a.data(), a.data(), 1024, DType::kF32, ReduceOp::kSum));
  ASSIGN_OR_RETURN(Request warm, comm.IAllReduce(a.data(), a.data(), 1024, DType::kF32,
                                                 ReduceOp::kSum));  // makes the lane
  RETURN_IF_ERROR(warm.Wait());
  RETURN_IF_ERROR(comm.Barrier());
  double start = SteadySeconds();
  for (int i = 0; i < kRounds; ++i) {
    RETURN_IF_ERROR(comm.AllReduce(a.data(), a.data(), 1024, DType::kF32, ReduceOp::kSum));
  }
  const double block = (SteadySeconds() - start) / kRounds;
  RETURN_IF_ERROR(comm.Barrier());
  CopyTurns turns(2);
  Status status[2];
  auto copy = [&](int k, float* buf) {
    turns.Acquire(k);
    for (int i = 0; i < kRounds / 2 && status[k].ok(); ++i) {
      Result<Request> r = comm.IAllReduce(buf, buf, 1024, DType::kF32, ReduceOp::kSum);
      if (!r.ok()) {
        status[k] = r.status();
        break;
      }
      turns.Pass(k);
      status[k] = r->Wait();
      turns.Acquire(k);
    }
    turns.Finish(k);
  };
  start = SteadySeconds();
  std::thread second(copy, 1, b.data());
  copy(0, a.data());
  second.join();
  const double turn = (SteadySeconds() - start) / kRounds;
  RETURN_IF_ERROR(status[0]);
  RETURN_IF_ERROR(status[1]);
  double extra = std::max(0.0, turn - block);
  RETURN_IF_ERROR(comm.AllReduce(&extra, &extra, 1, DType::kF64, ReduceOp::kMax));
  return extra;
}

Result<MachineProfile> Calibrate(Communicator& world) {
  MachineProfile p;
  p.name = "calibrated";
  p.source = "measured by Calibrate on " + std::to_string(world.size()) + " " +
             std::string(world.backend()) + " rank(s)";
  p.backend = std::string(world.backend());
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  p.devices_per_host = cores;
  p.hosts = 1;
  double figures[2] = {0, 0};
  RETURN_IF_ERROR(world.Barrier());
  if (world.rank() == 0) {
    figures[0] = MeasureMatmulFlops(1024);
    figures[1] = MeasureMemoryBandwidth(int64_t{8} << 20);
  }
  RETURN_IF_ERROR(world.Broadcast(figures, 2, DType::kF64, 0));
  p.matmul_flops = figures[0];
  p.memory_bandwidth = figures[1];
  const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  p.memory_bytes = static_cast<int64_t>(pages / cores);
  if (world.size() > 1) {
    ASSIGN_OR_RETURN(p.intra_host, MeasureLink(world, int64_t{16} << 20));
    ASSIGN_OR_RETURN(p.collectives, MeasureCollectives(world, int64_t{16} << 20));
    ASSIGN_OR_RETURN(p.copy_turn_s, MeasureCopyTurn(world));
  } else {
    p.intra_host = {1e-6, figures[1] / 3};  // one rank: a copy through memory
  }
  p.inter_host = p.intra_host;
  return p;
}

namespace {

// The median of `runs` timings of fn(), after one that warms it up.
template <typename F>
double Median(int runs, F&& fn) {
  return MedianSeconds(runs, fn, /*warm_up=*/true);
}

// Seconds per score and per flop of products minimizing the relative
// squared error of a * scores + b * products against the times, neither
// negative.
std::pair<double, double> FitTwo(const std::vector<double>& scores,
                                 const std::vector<double>& products,
                                 const std::vector<double>& seconds) {
  double ss = 0, sp = 0, pp = 0, st = 0, pt = 0;
  for (size_t i = 0; i < seconds.size(); ++i) {
    const double s = scores[i] / seconds[i],
                 p = products[i] / seconds[i];  // each row over its time
    ss += s * s, sp += s * p, pp += p * p, st += s, pt += p;
  }
  const double det = ss * pp - sp * sp;
  double a = det > 0 ? (st * pp - pt * sp) / det : 0;
  double b = det > 0 ? (pt * ss - st * sp) / det : 0;
  if (a <= 0) a = 0, b = pt / pp;
  if (b <= 0) b = 0, a = st / ss;
  return {a, b};
}

constexpr int kRuns = 7;

void SetPerUnit(MachineProfile* profile, Kernel k, double seconds, double units) {
  profile->kernel_seconds[static_cast<int>(k)] = seconds / units;
}

// Element-wise kernels over 512 Ki floats (2 MiB an array): activations
// of a small GPT's micro-batch, beyond a core's private caches.
void MeasureElementwise(MachineProfile* profile) {
  const int N = 2048, C = 256;
  const int64_t n = int64_t{N} * C;
  std::vector<float> x(n, 0.5f), y(n), dy(n, 0.01f), dx(n), w(C, 1.0f), b(C, 0.0f), dw(C), db(C),
      mean(N), rstd(N);
  SetPerUnit(profile, Kernel::kLayerNormForward,
             Median(kRuns,
                    [&] {
                      kernels::LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(),
                                                w.data(), b.data(), N, C);
                    }),
             static_cast<double>(n));
  SetPerUnit(profile, Kernel::kLayerNormBackward,
             Median(kRuns,
                    [&] {
                      kernels::LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(),
                                                 x.data(), w.data(), mean.data(), rstd.data(), N,
                                                 C);
                    }),
             static_cast<double>(n));
  SetPerUnit(profile, Kernel::kGeluForward,
             Median(kRuns, [&] { kernels::GeluForward(y.data(), x.data(), n); }),
             static_cast<double>(n));
  SetPerUnit(profile, Kernel::kGeluBackward,
             Median(kRuns, [&] { kernels::GeluBackward(dx.data(), x.data(), dy.data(), n); }),
             static_cast<double>(n));
  SetPerUnit(profile, Kernel::kResidualAdd,
             Median(kRuns, [&] { kernels::ResidualForward(y.data(), x.data(), dy.data(), n); }),
             static_cast<double>(n));
  // The embedding: 8 sequences of 256 tokens, C 256, a vocabulary of 1024.
  const int B = 8, T = 256, V = 1024;
  std::vector<int32_t> tokens(B * T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7919 % V);
  std::vector<float> wte(int64_t{V} * C, 0.1f), wpe(int64_t{T} * C, 0.1f), dwte(wte.size()),
      dwpe(wpe.size());
  SetPerUnit(profile, Kernel::kEmbeddingForward,
             Median(kRuns,
                    [&] {
                      kernels::EncoderForward(y.data(), tokens.data(), wte.data(), wpe.data(), B, T,
                                              C);
                    }),
             static_cast<double>(n));
  SetPerUnit(profile, Kernel::kEmbeddingBackward,
             Median(kRuns,
                    [&] {
                      kernels::EncoderBackward(dwte.data(), dwpe.data(), dy.data(), tokens.data(),
                                               B, T, C);
                    }),
             static_cast<double>(n));
  // The loss over 1024 rows of 512 logits.
  const int R = 1024, L = 512;
  std::vector<float> logits(int64_t{R} * L, 0.1f), probs(logits.size());
  std::vector<int32_t> targets(R);
  for (int i = 0; i < R; ++i) targets[i] = i * 31 % L;
  SetPerUnit(profile, Kernel::kCrossEntropyForward,
             Median(kRuns,
                    [&] {
                      kernels::SoftmaxCrossEntropyForward(probs.data(), logits.data(),
                                                          targets.data(), R, L);
                    }),
             static_cast<double>(logits.size()));
  SetPerUnit(profile, Kernel::kCrossEntropyBackward,
             Median(kRuns,
                    [&] {
                      kernels::SoftmaxCrossEntropyBackward(probs.data(), probs.data(),
                                                           targets.data(), 1.0f, R, L);
                    }),
             static_cast<double>(logits.size()));
}

// The attention core of 512 tokens (sequences of 128 and 256), 4 heads
// of 32 and 128: its cost per score computed (the softmax, the causal
// blocks' bookkeeping) and per flop of its products.
void MeasureAttention(MachineProfile* profile) {
  const int NH = 4;
  std::vector<double> scores, fw_products, bw_products, fw, bw;
  for (auto [T, hs] : {std::pair{128, 32}, {128, 128}, {256, 32}, {256, 128}}) {
    const int B = 512 / T, C = NH * hs;
    std::vector<float> qkv(int64_t{B} * T * 3 * C, 0.01f), out(int64_t{B} * T * C),
        att(int64_t{B} * NH * T * T), dout(out.size(), 0.01f), dqkv(qkv.size());
    const double s = static_cast<double>(B) * NH * kernels::AttentionScores(T);
    scores.push_back(s);
    fw_products.push_back(2.0 * s * hs);
    bw_products.push_back(4.0 * s * hs);
    fw.push_back(Median(kRuns, [&] {
      kernels::AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    }));
    bw.push_back(Median(kRuns, [&] {
      kernels::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    }));
  }
  auto [fa, fb] = FitTwo(scores, fw_products, fw);
  auto [ba, bb] = FitTwo(scores, bw_products, bw);
  // Each unit a positive figure (a profile refuses 0): a term the fit
  // drops costs a tenth of a percent of the kernel.
  auto floor = [](double x, double at) { return std::max(x, at * 1e-3); };
  profile->kernel_seconds[static_cast<int>(Kernel::kAttentionForwardScores)] =
      floor(fa, fw[0] / scores[0]);
  profile->kernel_seconds[static_cast<int>(Kernel::kAttentionForwardProducts)] =
      floor(fb, fw[0] / fw_products[0]);
  profile->kernel_seconds[static_cast<int>(Kernel::kAttentionBackwardScores)] =
      floor(ba, bw[0] / scores[0]);
  profile->kernel_seconds[static_cast<int>(Kernel::kAttentionBackwardProducts)] =
      floor(bb, bw[0] / bw_products[0]);
}

// The update and the clipping norm over 1 Mi parameters.
void MeasureOptimizer(MachineProfile* profile) {
  const int64_t n = int64_t{1} << 20;
  std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n), v(n);
  AdamWConfig config;
  int64_t step = 0;
  SetPerUnit(
      profile, Kernel::kAdamW,
      Median(kRuns,
             [&] { AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, ++step, config, true); }),
      static_cast<double>(n));
  double sink = 0;
  SetPerUnit(profile, Kernel::kSquaredNorm,
             Median(kRuns, [&] { sink += SquaredNorm(g.data(), n); }), static_cast<double>(n));
  asm volatile("" : : "r"(&sink) : "memory");
}

}  // namespace

void MeasureKernels(MachineProfile* profile) {
  MeasureElementwise(profile);
  MeasureAttention(profile);
  MeasureOptimizer(profile);
}

Status MeasureDisk(const std::string& dir, MachineProfile* profile) {
  // 256 MiB in 4 MiB requests, as offload moves its buckets and units:
  // written, then read back, direct I/O (ScratchFile; through the page
  // cache, dropped, where the filesystem has none).
  constexpr int64_t kChunk = int64_t{4} << 20, kBytes = int64_t{256} << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<ScratchFile> file,
                   ScratchFile::Create(dir + "/tessera-calibrate." + std::to_string(::getpid()),
                                       kBytes, "calibration", "a disk bandwidth test"));
  AlignedFloats buf = AllocateAligned(kChunk / 4);
  if (buf == nullptr) return ResourceExhaustedError("calibration: no memory for a disk buffer");
  for (int64_t i = 0; i < kChunk / 4; ++i) buf[i] = static_cast<float>(i);
  double start = SteadySeconds();
  for (int64_t at = 0; at < kBytes; at += kChunk)
    RETURN_IF_ERROR(file->Write(buf.get(), kChunk, at));
  RETURN_IF_ERROR(file->DropCache());
  profile->disk_write = static_cast<double>(kBytes) / (SteadySeconds() - start);
  start = SteadySeconds();
  for (int64_t at = 0; at < kBytes; at += kChunk)
    RETURN_IF_ERROR(file->Read(buf.get(), kChunk, at));
  profile->disk_read = static_cast<double>(kBytes) / (SteadySeconds() - start);
  return Status::Ok();
}

Result<MachineProfile> CalibrateMachine(Communicator& world, const std::string& disk_dir) {
  ASSIGN_OR_RETURN(MachineProfile profile, Calibrate(world));
  RETURN_IF_ERROR(world.Barrier());
  Status disk;
  if (world.rank() == 0) {
    MeasureKernels(&profile);
    if (!disk_dir.empty()) disk = MeasureDisk(disk_dir, &profile);
  }
  RETURN_IF_ERROR(world.Broadcast(profile.kernel_seconds, kKernelCount, DType::kF64, 0));
  double bandwidths[2] = {profile.disk_read, profile.disk_write};
  RETURN_IF_ERROR(world.Broadcast(bandwidths, 2, DType::kF64, 0));
  profile.disk_read = bandwidths[0];
  profile.disk_write = bandwidths[1];
  RETURN_IF_ERROR(disk);  // rank 0's (the others wait on its broadcast)
  return profile;
}

}  // namespace tessera
