// Collective latency (4 KiB) and bandwidth (64 MiB): allreduce, allgather,
// reduce-scatter.
//   mpirun -np N comm_bench mpi      our MPI backend beside raw MPI calls on
//                                    the same processes, interleaved
//   mpirun -np N comm_bench gloo     our Gloo backend (its own TCP world over
//                                    loopback, rendezvous on a free port) beside
//                                    raw MPI calls on the same processes
//   comm_bench inprocess N           the in-process backend on N threads
// Prints the median time per call over several timed batches and the
// algorithm bandwidth (the vector's bytes / time).
//
// This file calls MPI directly on purpose: raw MPI_Allreduce & co. are the
// peer the backend is measured against.
#include <arpa/inet.h>
#include <mpi.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/gloo.h"
#include "runtime/comm/inprocess.h"
#include "runtime/comm/mpi.h"

using namespace tessera;

namespace {

struct Case {
  const char* op;
  int64_t bytes;
  int iters, rounds;
};

const Case kCases[] = {
    {"allreduce", 4 << 10, 200, 41},      {"allreduce", 64 << 10, 50, 21},
    {"allreduce", 512 << 10, 20, 21},     {"allreduce", 2 << 20, 10, 11},
    {"allreduce", 16 << 20, 2, 7},        {"allgather", 4 << 10, 200, 41},
    {"reduce_scatter", 4 << 10, 200, 41}, {"reduce_scatter", 512 << 10, 20, 21},
    {"reduce_scatter", 2 << 20, 10, 11},  {"allreduce", 64 << 20, 2, 5},
    {"allgather", 64 << 20, 2, 5},        {"reduce_scatter", 64 << 20, 2, 5},
};

// The call for `op` over `comm` on buffers sized for `bytes` of f32 (the
// full vector: allgather's output, reduce_scatter's input).
std::function<Status()> OurCall(Communicator& comm, const Case& c, std::vector<float>& a,
                                std::vector<float>& b) {
  const int64_t n = c.bytes / 4, p = comm.size();
  const std::string op = c.op;
  if (op == "allreduce") {
    return [&, n] { return comm.AllReduce(a.data(), b.data(), n, DType::kF32, ReduceOp::kSum); };
  }
  if (op == "allgather") {
    return [&, n, p] { return comm.AllGather(a.data(), n / p, b.data(), DType::kF32); };
  }
  return [&, n, p] {
    return comm.ReduceScatter(a.data(), b.data(), n / p, DType::kF32, ReduceOp::kSum);
  };
}

std::function<void()> RawCall(MPI_Comm comm, int p, const Case& c, std::vector<float>& a,
                              std::vector<float>& b) {
  const int n = static_cast<int>(c.bytes / 4);
  const std::string op = c.op;
  if (op == "allreduce") {
    return [=, &a, &b] { MPI_Allreduce(a.data(), b.data(), n, MPI_FLOAT, MPI_SUM, comm); };
  }
  if (op == "allgather") {
    return [=, &a, &b] {
      MPI_Allgather(a.data(), n / p, MPI_FLOAT, b.data(), n / p, MPI_FLOAT, comm);
    };
  }
  return [=, &a, &b] {
    MPI_Reduce_scatter_block(a.data(), b.data(), n / p, MPI_FLOAT, MPI_SUM, comm);
  };
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string Size(int64_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + " MiB"
                            : std::to_string(bytes >> 10) + " KiB";
}

void PrintTime(double s) {
  if (s < 1e-3) {
    std::printf("%9.1f us", s * 1e6);
  } else {
    std::printf("%9.2f ms", s * 1e3);
  }
}

int BenchMpi(bool gloo) {
  auto world = CreateMpiWorld();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 1;
  }
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  std::unique_ptr<Communicator> gloo_world;
  if (gloo) {
    // Rank 0 picks a free port and tells the others (through MPI, which is
    // only the peer here).
    int port = 0;
    if ((*world)->rank() == 0) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      socklen_t len = sizeof(addr);
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
      port = ntohs(addr.sin_port);
      close(fd);
    }
    MPI_Bcast(&port, 1, MPI_INT, 0, raw);
    RankTable table{(*world)->rank(), (*world)->size(), "127.0.0.1", port, "bench"};
    auto g = CreateGlooWorld(table);
    if (!g.ok()) {
      std::fprintf(stderr, "%s\n", g.status().ToString().c_str());
      return 1;
    }
    gloo_world = std::move(*g);
  }
  Communicator& comm = gloo ? *gloo_world : **world;
  const int p = comm.size();
  if (comm.rank() == 0) {
    std::printf("%s backend vs raw MPI, %d ranks (median of timed batches; GB/s = bytes/time)\n",
                gloo ? "Gloo" : "MPI", p);
    std::printf("%-15s %7s %12s %12s %7s %9s %9s\n", "collective", "size",
                gloo ? "gloo" : "tessera", "raw MPI", "ratio", "GB/s", "raw GB/s");
  }
  for (const Case& c : kCases) {
    std::vector<float> a(c.bytes / 4, 1.0f), b(c.bytes / 4);
    auto ours = OurCall(comm, c, a, b);
    auto peer = RawCall(raw, p, c, a, b);
    std::vector<double> t_ours, t_raw;
    for (int i = 0; i < 2; ++i) {  // warm-up
      (void)ours();
      peer();
    }
    for (int round = 0; round < c.rounds; ++round) {
      // Alternate which goes first, so neither always follows the other.
      for (int which = 0; which < 2; ++which) {
        const bool our_turn = (round + which) % 2 == 0;
        MPI_Barrier(raw);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < c.iters; ++i) {
          if (our_turn) {
            if (!ours().ok()) return 1;
          } else {
            peer();
          }
        }
        double t = Seconds(t0) / c.iters;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, raw);  // the slowest rank
        (our_turn ? t_ours : t_raw).push_back(t);
      }
    }
    if (comm.rank() == 0) {
      const double o = Median(t_ours), r = Median(t_raw);
      std::printf("%-15s %7s ", c.op, Size(c.bytes).c_str());
      PrintTime(o);
      std::printf("   ");
      PrintTime(r);
      std::printf(" %6.3fx %9.2f %9.2f\n", o / r, c.bytes / o / 1e9, c.bytes / r / 1e9);
    }
  }
  MPI_Comm_free(&raw);
  return 0;
}

int BenchInProcess(int ranks) {
  std::printf("in-process backend, %d ranks (threads)\n", ranks);
  std::printf("%-15s %7s %12s %9s\n", "collective", "size", "tessera", "GB/s");
  for (const Case& c : kCases) {
    std::vector<double> times;
    Status s = RunInProcess(ranks, [&](Communicator& comm) -> Status {
      std::vector<float> a(c.bytes / 4, 1.0f), b(c.bytes / 4);
      auto call = OurCall(comm, c, a, b);
      for (int i = 0; i < 2; ++i) RETURN_IF_ERROR(call());
      for (int round = 0; round < c.rounds; ++round) {
        RETURN_IF_ERROR(comm.Barrier());
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < c.iters; ++i) RETURN_IF_ERROR(call());
        double t = Seconds(t0) / c.iters;
        RETURN_IF_ERROR(comm.AllReduce(&t, &t, 1, DType::kF64, ReduceOp::kMax));
        if (comm.rank() == 0) times.push_back(t);
      }
      return Status::Ok();
    });
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    const double t = Median(times);
    std::printf("%-15s %7s ", c.op, Size(c.bytes).c_str());
    PrintTime(t);
    std::printf(" %9.2f\n", c.bytes / t / 1e9);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "mpi") return BenchMpi(false);
  if (mode == "gloo") return BenchMpi(true);
  if (mode == "inprocess" && argc > 2) return BenchInProcess(std::atoi(argv[2]));
  std::fprintf(stderr, "usage: mpirun -np N comm_bench mpi|gloo | comm_bench inprocess N\n");
  return 2;
}
