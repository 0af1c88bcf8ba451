// Tessera's side of the comparison with PyTorch's distributed checkpoint
// (dcp_bench.sh runs dcp_peer.py beside it): N tensors of S x S float32
// (16 x 4096^2 = 1 GiB), t[i][r, c] = i + r * 1e-3 + c * 1e-7, split by
// rows over WORLD in-process ranks.
//   dcp_bench save DIR WORLD [N S]   sliced save by WORLD ranks (the
//                                    SlicedCheckpointWriter training uses)
//                                    into DIR/r<k>; DIR/ckpt kept
//   dcp_bench load DIR WORLD [N S]   saved by rows, read by columns on WORLD
//                                    ranks: each opens the checkpoint
//                                    (OpenCheckpoint) and reads its boxes
//                                    (ReadRegion), checksums verified
//   dcp_bench merge DIR [N S]        one rank reads whole tensors
//   dcp_bench floor BYTES THREADS    memcpy and XXH3 over BYTES per thread
// Destination buffers are allocated and touched before the clock, as DCP's
// state dict is; contents are checked after it. Prints "seconds <median of
// 3>" (floor: "memcpy_gbs <x>" and "xxh3_gbs <y>", per thread, all running).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/ops.h"
#include "core/checksum.h"
#include "runtime/comm/inprocess.h"
#include "runtime/train/sliced_checkpoint.h"

using namespace tessera;

namespace {

constexpr int kRounds = 3;

// TESSERA_BENCH_COLD=1 (dcp_bench.sh's cold runs, root only): the page
// cache dropped before each timed round, so the files come off the disk.
bool Cold() {
  const char* v = std::getenv("TESSERA_BENCH_COLD");
  return v != nullptr && std::string(v) == "1";
}

Status DropCaches() {
  sync();
  FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
  if (f == nullptr) return IOError("cannot open /proc/sys/vm/drop_caches (root only)");
  const bool ok = std::fputs("3\n", f) >= 0;
  return std::fclose(f) == 0 && ok ? Status::Ok() : IOError("drop_caches refused the write");
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

float Expected(int64_t i, int64_t r, int64_t c) {
  return static_cast<float>(static_cast<double>(i) + static_cast<double>(r) * 1e-3 +
                            static_cast<double>(c) * 1e-7);
}

// `box` of tensor i, row-major.
void Fill(int64_t i, const Box& box, float* out) {
  for (int64_t r = box[0].begin; r < box[0].end; ++r) {
    for (int64_t c = box[1].begin; c < box[1].end; ++c) *out++ = Expected(i, r, c);
  }
}
bool Matches(int64_t i, const Box& box, const float* got) {
  for (int64_t r = box[0].begin; r < box[0].end; ++r) {
    for (int64_t c = box[1].begin; c < box[1].end; ++c) {
      if (*got++ != Expected(i, r, c)) return false;
    }
  }
  return true;
}

Strategy Rows(int64_t world, int64_t n, int64_t s) {
  Strategy strategy(*Mesh::Parse("r=" + std::to_string(world)));
  for (int64_t i = 0; i < n; ++i) {
    Layout l = Layout::Replicated({s, s}, DType::kF32);
    l.dim_axes = {{"r"}, {}};
    char name[32];
    std::snprintf(name, sizeof(name), "t%02lld", static_cast<long long>(i));
    (void)strategy.Add({name, l});
  }
  return strategy;
}

Status Save(const std::string& dir, int world, int64_t n, int64_t s, double* seconds) {
  Env* env = Env::Default();
  if (env->FileExists(dir)) RETURN_IF_ERROR(DeleteRecursively(env, dir));
  RETURN_IF_ERROR(env->CreateDirs(dir));
  const Strategy strategy = Rows(world, n, s);
  std::vector<double> times(kRounds);
  RETURN_IF_ERROR(RunInProcess(world, [&](Communicator& comm) -> Status {
    const int64_t rank = comm.rank();
    const Box mine{ChunkOf({0, s}, world, rank), {0, s}};
    std::vector<std::vector<float>> data(n, std::vector<float>(NumElements(mine)));
    for (int64_t i = 0; i < n; ++i) Fill(i, mine, data[i].data());
    for (int round = 0; round < kRounds; ++round) {
      const std::string path = dir + "/r" + std::to_string(round);
      if (rank == 0) sync();  // the last round's writeback out of the way (both sides)
      RETURN_IF_ERROR(comm.Barrier());
      const auto t0 = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(auto writer, SlicedCheckpointWriter::Create(env, comm, path, strategy,
                                                                   {0, {}, "dcp_bench"}));
      Status wrote;
      for (const PieceToWrite& p : writer->Pieces()) {
        if (wrote.ok()) wrote = writer->WritePiece(p.tensor, p.box, data[p.tensor].data());
      }
      const Status committed = writer->Commit();
      RETURN_IF_ERROR(wrote);
      RETURN_IF_ERROR(committed);
      RETURN_IF_ERROR(comm.Barrier());
      if (rank == 0) times[round] = Since(t0);
    }
    return Status::Ok();
  }));
  RETURN_IF_ERROR(env->RenameFile(dir + "/r0", dir + "/ckpt"));
  for (int round = 1; round < kRounds; ++round) {
    RETURN_IF_ERROR(DeleteRecursively(env, dir + "/r" + std::to_string(round)));
  }
  *seconds = Median(times);
  return Status::Ok();
}

// `world` ranks each read their columns of every tensor (world 1: whole
// tensors).
Status Load(const std::string& path, int world, int64_t n, int64_t s, double* seconds) {
  Env* env = Env::Default();
  std::vector<double> times(kRounds);
  RETURN_IF_ERROR(RunInProcess(world, [&](Communicator& comm) -> Status {
    const int64_t rank = comm.rank();
    const Box mine{{0, s}, ChunkOf({0, s}, world, rank)};
    const std::vector<int64_t> extents = mine.extents();
    std::vector<std::vector<float>> dst(n, std::vector<float>(NumElements(mine), -1.0f));
    for (int round = 0; round < kRounds; ++round) {
      for (auto& d : dst) std::fill(d.begin(), d.end(), -1.0f);  // touched, not the answer
      if (rank == 0 && Cold()) RETURN_IF_ERROR(DropCaches());
      RETURN_IF_ERROR(comm.Barrier());
      const auto t0 = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(auto reader, OpenCheckpoint(env, path));
      for (int64_t i = 0; i < n; ++i) {
        RETURN_IF_ERROR(reader->ReadRegion(static_cast<size_t>(i), mine, dst[i].data(), extents,
                                           Box::FromShape(extents)));
      }
      RETURN_IF_ERROR(comm.Barrier());
      if (rank == 0) times[round] = Since(t0);
      for (int64_t i = 0; i < n; ++i) {
        if (!Matches(i, mine, dst[i].data())) {
          return DataLossError("rank " + std::to_string(rank) + ": tensor " + std::to_string(i) +
                               " read wrong");
        }
      }
    }
    return Status::Ok();
  }));
  *seconds = Median(times);
  return Status::Ok();
}

// memcpy and XXH3 throughput (GB/s per thread) over `bytes` per thread,
// `threads` running at once: the floor of a load that copies and verifies
// that many bytes. XXH3 both as the library hashes (Xxh3: libxxhash's
// run-time dispatch) and through the plain SSE2 entry point.
void Floor(size_t bytes, int threads) {
  std::vector<double> copy(threads), hash(threads), plain(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<char> a(bytes, 1), b(bytes, 2);
      std::vector<double> c, h, p;
      uint64_t sink = 0;
      for (int round = 0; round < kRounds; ++round) {
        auto t0 = std::chrono::steady_clock::now();
        std::memcpy(b.data(), a.data(), bytes);
        c.push_back(Since(t0));
        t0 = std::chrono::steady_clock::now();
        sink += Xxh3(b.data(), bytes);
        h.push_back(Since(t0));
        t0 = std::chrono::steady_clock::now();
        sink += Xxh3Plain(b.data(), bytes);
        p.push_back(Since(t0));
      }
      copy[t] = static_cast<double>(bytes) / Median(c) / 1e9;
      hash[t] = static_cast<double>(bytes) / Median(h) / 1e9 + (sink == 42 ? 1e-12 : 0);
      plain[t] = static_cast<double>(bytes) / Median(p) / 1e9;
    });
  }
  for (auto& th : pool) th.join();
  std::printf("memcpy_gbs %.2f\nxxh3_gbs %.2f\nxxh3_plain_gbs %.2f\n", Median(copy), Median(hash),
              Median(plain));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::stoll(argv[i]) : fallback; };
  double seconds = 0;
  Status s;
  if (mode == "save" && argc >= 4) {
    s = Save(argv[2], static_cast<int>(arg(3, 2)), arg(4, 16), arg(5, 4096), &seconds);
  } else if (mode == "load" && argc >= 4) {
    s = Load(argv[2], static_cast<int>(arg(3, 2)), arg(4, 16), arg(5, 4096), &seconds);
  } else if (mode == "merge" && argc >= 3) {
    s = Load(argv[2], 1, arg(3, 16), arg(4, 4096), &seconds);
  } else if (mode == "floor" && argc == 4) {
    Floor(static_cast<size_t>(arg(2, 0)), static_cast<int>(arg(3, 1)));
    return 0;
  } else {
    std::fprintf(
        stderr,
        "usage: dcp_bench save|load DIR WORLD [N S] | merge DIR [N S] | floor BYTES THREADS\n");
    return 2;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "dcp_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("seconds %.4f\n", seconds);
  return 0;
}
