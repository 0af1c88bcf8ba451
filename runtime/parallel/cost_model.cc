#include "runtime/parallel/cost_model.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/env.h"
#include "core/timer.h"
#include "runtime/kernels.h"

namespace tessera {
namespace {

using Json = nlohmann::ordered_json;

Status Positive(const std::string& source, const char* key, double v) {
  if (v > 0 && std::isfinite(v)) return Status::Ok();
  return InvalidArgumentError(source + ": \"" + key + "\" must be a positive number");
}

// A ring collective over n ranks: its latency steps, and the share of
// CollectiveSeconds' bytes each rank moves over the link.
struct Ring {
  double steps, moved;
};
Ring RingOf(CollectiveKind kind, double n) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return {2 * (n - 1), 2 * (n - 1) / n};
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
      return {n - 1, (n - 1) / n};
    case CollectiveKind::kSendRecv:
      return {1, 1};
  }
  return {0, 0};
}

// A kernel's roofline: bytes and flops per unit.
struct Roofline {
  double bytes, flops;
};
constexpr Roofline kRoofline[] = {
    {8, 0},  {12, 0},  // layer norm: read x, write y; backward reads x, dy, writes dx
    {8, 0},  {12, 0},  // GELU
    {12, 0},           // residual add: two reads, a write
    {12, 0}, {12, 0},  // embedding: wte and wpe rows into the output; back
    {12, 0}, {12, 0},  // cross-entropy: logits, probabilities; back
    {12, 0}, {0, 1},   // attention forward: scores written, read, the softmax; products
    {24, 0}, {0, 1},   // attention backward
    {28, 0},           // AdamW: parameter, gradient, two moments read, three written
    {4, 0},            // squared norm: one read
};

constexpr std::string_view kKernelNames[] = {"layer_norm_forward",
                                             "layer_norm_backward",
                                             "gelu_forward",
                                             "gelu_backward",
                                             "residual_add",
                                             "embedding_forward",
                                             "embedding_backward",
                                             "cross_entropy_forward",
                                             "cross_entropy_backward",
                                             "attention_forward_scores",
                                             "attention_forward_products",
                                             "attention_backward_scores",
                                             "attention_backward_products",
                                             "adamw",
                                             "squared_norm"};
static_assert(std::size(kRoofline) == kKernelCount && std::size(kKernelNames) == kKernelCount,
              "a roofline and a name for every Kernel");

}  // namespace

std::string_view KernelName(Kernel kernel) { return kKernelNames[static_cast<int>(kernel)]; }

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

std::string_view CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "AllReduce";
    case CollectiveKind::kReduceScatter:
      return "ReduceScatter";
    case CollectiveKind::kAllGather:
      return "AllGather";
    case CollectiveKind::kAllToAll:
      return "AllToAll";
    case CollectiveKind::kSendRecv:
      return "SendRecv";
  }
  return "?";
}

Result<MachineProfile> MachineProfile::Parse(std::string_view text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgumentError(source + ": not JSON: " + e.what());
  }
  if (!j.is_object() || j.value("format", "") != kMachineProfileFormat) {
    return InvalidArgumentError(source + ": not a machine profile (\"format\" must be \"" +
                                std::string(kMachineProfileFormat) + "\")");
  }
  MachineProfile p;
  try {
    if (j.value("version", 0) != 1) {
      return InvalidArgumentError(source + ": machine profile version " +
                                  j.value("version", Json(0)).dump() + " (this build reads 1)");
    }
    p.name = j.value("name", "");
    p.source = j.value("source", "");
    p.backend = j.value("backend", "");
    p.devices_per_host = j.value("devices_per_host", 1);
    p.hosts = j.value("hosts", 0);
    if (!j.contains("device") || !j["device"].is_object()) {
      return InvalidArgumentError(source + ": no \"device\" object");
    }
    const Json& d = j["device"];
    p.matmul_flops = d.value("matmul_flops", 0.0);
    p.memory_bandwidth = d.value("memory_bandwidth", 0.0);
    p.memory_bytes = static_cast<int64_t>(d.value("memory_bytes", 0.0));
    RETURN_IF_ERROR(Positive(source, "device.matmul_flops", p.matmul_flops));
    RETURN_IF_ERROR(Positive(source, "device.memory_bandwidth", p.memory_bandwidth));
    for (auto [key, link] :
         {std::pair{"intra_host", &p.intra_host}, {"inter_host", &p.inter_host}}) {
      if (!j.contains(key)) {
        if (std::string(key) == "inter_host") {  // one host: never used
          p.inter_host = p.intra_host;
          continue;
        }
        return InvalidArgumentError(source + ": no \"" + key + "\" link");
      }
      const Json& l = j[key];
      link->latency_s = l.value("latency_s", 0.0);
      link->bandwidth = l.value("bandwidth", 0.0);
      RETURN_IF_ERROR(Positive(source, (std::string(key) + ".bandwidth").c_str(), link->bandwidth));
      if (link->latency_s < 0) {
        return InvalidArgumentError(source + ": \"" + key + ".latency_s\" must be >= 0");
      }
    }
    if (j.contains("collectives")) {
      const Json& list = j["collectives"];
      if (!list.is_array())
        return InvalidArgumentError(source + ": \"collectives\" must be a list");
      for (const Json& c : list) {
        CollectiveTable t;
        const std::string kind = c.value("kind", "");
        const std::string where =
            source + ": collectives[" + std::to_string(p.collectives.size()) + "]";
        bool known = false;
        for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                                 CollectiveKind::kReduceScatter, CollectiveKind::kSendRecv}) {
          if (kind == CollectiveName(k)) {
            t.kind = k;
            known = true;
          }
        }
        if (!known) {
          return InvalidArgumentError(where + ": kind \"" + kind +
                                      "\" (measured tables are of AllReduce, AllGather, "
                                      "ReduceScatter or SendRecv)");
        }
        t.group = c.value("group", 0);
        t.bytes = c.value("bytes", std::vector<double>{});
        t.seconds = c.value("seconds", std::vector<double>{});
        if (t.group < 2 || t.bytes.empty() || t.bytes.size() != t.seconds.size()) {
          return InvalidArgumentError(where +
                                      ": needs a group of at least 2 and as many "
                                      "\"seconds\" as \"bytes\" (at least one)");
        }
        for (size_t i = 0; i < t.bytes.size(); ++i) {
          if (!(t.bytes[i] > 0 && t.seconds[i] > 0 && std::isfinite(t.seconds[i])) ||
              (i > 0 && t.bytes[i] <= t.bytes[i - 1])) {
            return InvalidArgumentError(where + ": sizes must ascend and every figure be positive");
          }
        }
        p.collectives.push_back(std::move(t));
      }
    }
    if (j.contains("kernels")) {
      const Json& kernels = j["kernels"];
      if (!kernels.is_object())
        return InvalidArgumentError(source + ": \"kernels\" must be an object");
      for (const auto& [name, value] : kernels.items()) {
        int k = 0;
        while (k < kKernelCount && kKernelNames[k] != name) ++k;
        if (k == kKernelCount) {
          std::string known;
          for (std::string_view n : kKernelNames)
            known += (known.empty() ? "" : ", ") + std::string(n);
          return InvalidArgumentError(source + ": kernels: unknown kernel \"" + name +
                                      "\" (known: " + known + ")");
        }
        const double v = value.is_number() ? value.get<double>() : -1;
        if (!(v > 0 && std::isfinite(v))) {
          return InvalidArgumentError(source + ": kernels: \"" + name +
                                      "\" must be a positive number (seconds per unit)");
        }
        p.kernel_seconds[k] = v;
      }
    }
  } catch (const std::exception& e) {
    return InvalidArgumentError(source + ": " + e.what());
  }
  if (p.devices_per_host < 1 || p.hosts < 0) {
    return InvalidArgumentError(source + ": devices_per_host must be >= 1 and hosts >= 0");
  }
  return p;
}

Result<MachineProfile> MachineProfile::Load(const std::string& path) {
  auto text = ReadFileToString(Env::Default(), path);
  if (!text.ok()) {
    return Status(text.status().code(), "machine profile " + path + ": " + text.status().message());
  }
  return Parse(*text, path);
}

std::string MachineProfile::ToJson() const {
  Json j;
  j["format"] = kMachineProfileFormat;
  j["version"] = 1;
  j["name"] = name;
  j["source"] = source;
  if (!backend.empty()) j["backend"] = backend;
  j["devices_per_host"] = devices_per_host;
  j["hosts"] = hosts;
  j["device"] = {{"matmul_flops", matmul_flops},
                 {"memory_bandwidth", memory_bandwidth},
                 {"memory_bytes", static_cast<double>(memory_bytes)}};
  j["intra_host"] = {{"latency_s", intra_host.latency_s}, {"bandwidth", intra_host.bandwidth}};
  j["inter_host"] = {{"latency_s", inter_host.latency_s}, {"bandwidth", inter_host.bandwidth}};
  if (!collectives.empty()) {
    Json list = Json::array();
    for (const CollectiveTable& t : collectives) {
      list.push_back({{"kind", CollectiveName(t.kind)},
                      {"group", t.group},
                      {"bytes", t.bytes},
                      {"seconds", t.seconds}});
    }
    j["collectives"] = list;
  }
  Json kernels = Json::object();
  for (int k = 0; k < kKernelCount; ++k) {
    if (kernel_seconds[k] > 0) kernels[std::string(kKernelNames[k])] = kernel_seconds[k];
  }
  if (!kernels.empty()) j["kernels"] = kernels;
  return j.dump(2) + "\n";
}

MachineProfile MachineProfile::ForRanks(int ranks) const {
  MachineProfile p = *this;
  const int64_t devices = static_cast<int64_t>(hosts) * devices_per_host;
  p.ranks_per_device =
      hosts > 0 && ranks > devices ? static_cast<int>((ranks + devices - 1) / devices) : 1;
  return p;
}

double MachineProfile::ComputeSeconds(double flops, double bytes) const {
  return (flops / matmul_flops + bytes / memory_bandwidth) * ranks_per_device;
}

double MachineProfile::KernelSeconds(Kernel kernel, double units) const {
  const int k = static_cast<int>(kernel);
  if (kernel_seconds[k] > 0) return units * kernel_seconds[k] * ranks_per_device;
  return ComputeSeconds(units * kRoofline[k].flops, units * kRoofline[k].bytes);
}

double MachineProfile::CollectiveSeconds(CollectiveKind kind, double bytes, int group,
                                         bool inter_host) const {
  if (group <= 1 || bytes <= 0) return 0;
  const LinkProfile& l = inter_host ? this->inter_host : intra_host;
  const Ring ring = RingOf(kind, group);
  const double line = ring.steps * l.latency_s + ring.moved * bytes / l.bandwidth;
  if (!inter_host) {
    for (const CollectiveTable& t : collectives) {
      if (t.kind != kind || t.group != group) continue;
      double table;
      if (bytes <= t.bytes.front()) {
        table = t.seconds.front();
      } else if (bytes >= t.bytes.back()) {
        table = t.seconds.back() + ring.moved * (bytes - t.bytes.back()) / l.bandwidth;
      } else {
        const size_t i = static_cast<size_t>(
            std::upper_bound(t.bytes.begin(), t.bytes.end(), bytes) - t.bytes.begin());
        const double f = std::log(bytes / t.bytes[i - 1]) / std::log(t.bytes[i] / t.bytes[i - 1]);
        table =
            std::exp(std::log(t.seconds[i - 1]) + f * std::log(t.seconds[i] / t.seconds[i - 1]));
      }
      // Timed cold (the table) and back to back (the line), a collective
      // costs at least the larger: on this VM either can be the slow one
      // from one calibration to the next under Gloo.
      return std::max(table, line);
    }
  }
  return line;
}

bool MachineProfile::CrossesHosts(int64_t stride, int64_t size) const {
  // The ranks are row-major over the mesh, so such a group lies in an
  // aligned block of stride x size ranks: inside one host when the block
  // divides a host, else some group straddles two.
  const int64_t block = stride * size;
  return size > 1 && (block > devices_per_host || devices_per_host % block != 0);
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
      const Ring ring =
          RingOf(kind == 0 ? CollectiveKind::kAllReduce : CollectiveKind::kAllGather, n);
      const double moved = ring.moved * static_cast<double>(bytes);
      sbb += moved * moved;
      sbt += moved * std::max(0.0, t - ring.steps * link.latency_s);
    }
  }
  link.bandwidth = sbt > 0 ? sbb / sbt : 1e12;
  return link;
}

Result<std::vector<CollectiveTable>> MeasureCollectives(Communicator& comm, int64_t max_bytes) {
  const int n = comm.size();
  if (n < 2) return InvalidArgumentError("measuring collectives needs at least 2 ranks");
  // Larger than a core's caches: written before each timing, so that the
  // collective finds its buffers and the runtime's state cold.
  std::vector<char> scratch(size_t{16} << 20);
  // fn(run) on every rank, nine times, each after the cold write and a
  // barrier of all ranks: rank 0's median, on every rank. A rank whose
  // call failed fails them all (nobody is left waiting in the broadcast).
  auto timed = [&](const std::function<Status(int)>& fn) -> Result<double> {
    std::vector<double> t;
    Status status = Status::Ok();
    for (int run = 0; run < 9; ++run) {
      std::memset(scratch.data(), run + 1, scratch.size());
      // The buffer is never read: without this the compiler may drop the
      // writes, and the caches would stay warm.
      asm volatile("" : : "r"(scratch.data()) : "memory");
      RETURN_IF_ERROR(comm.Barrier());
      const double start = SteadySeconds();
      const Status s = status.ok() ? fn(run) : Status::Ok();
      t.push_back(SteadySeconds() - start);
      if (status.ok()) status = s;
    }
    int32_t failed = status.ok() ? 0 : 1;
    RETURN_IF_ERROR(comm.AllReduce(&failed, &failed, 1, DType::kI32, ReduceOp::kMax));
    RETURN_IF_ERROR(status);
    if (failed != 0) return InternalError("measuring collectives: another rank's call failed");
    std::sort(t.begin(), t.end());
    double median = t[t.size() / 2];
    RETURN_IF_ERROR(comm.Broadcast(&median, 1, DType::kF64, 0));  // rank 0's timing everywhere
    return median;
  };
  std::vector<CollectiveTable> out;
  // Every group size g >= 2 that divides the ranks, the n / g groups of
  // consecutive ranks at once (as a mesh axis's groups run side by side,
  // sharing the cores when ranks outnumber them). ReduceScatter is timed
  // on its own: backends implement it differently (Gloo and, up to
  // CommOptions::fold_reduce_scatter_ranks, MPI as an AllToAll and a fold
  // in rank order; NCCL its own), so it costs what neither of the others
  // does.
  std::vector<float> send, recv;
  for (int g = 2; g <= n; ++g) {
    if (n % g != 0) continue;
    std::unique_ptr<Communicator> sub;
    Communicator* c = &comm;
    if (g < n) {
      ASSIGN_OR_RETURN(sub, comm.Split(comm.rank() / g, comm.rank()));
      c = sub.get();
    }
    CollectiveTable tables[3];
    tables[0].kind = CollectiveKind::kAllReduce;
    tables[1].kind = CollectiveKind::kAllGather;
    tables[2].kind = CollectiveKind::kReduceScatter;
    for (int64_t size = 4096; size <= max_bytes; size *= 4) {
      const int64_t count = size / 4 / g * g;  // a whole block per rank
      send.assign(count, 1.0f);
      recv.assign(count * g, 0.0f);
      for (int kind = 0; kind < 3; ++kind) {
        ASSIGN_OR_RETURN(
            double median, timed([&](int) {
              switch (kind) {
                case 0:
                  return c->AllReduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum);
                case 1:
                  return c->AllGather(send.data(), count / g, recv.data(), DType::kF32);
                default:
                  return c->ReduceScatter(send.data(), recv.data(), count / g, DType::kF32,
                                          ReduceOp::kSum);
              }
            }));
        tables[kind].group = g;
        tables[kind].bytes.push_back(static_cast<double>(count * 4));
        tables[kind].seconds.push_back(median);
      }
    }
    for (CollectiveTable& t : tables) out.push_back(std::move(t));
  }
  // SendRecv (a pipeline's transfer between neighbour stages): half a
  // ping-pong of ranks 0 and 1, the others idle.
  CollectiveTable p2p;
  p2p.kind = CollectiveKind::kSendRecv;
  p2p.group = 2;
  for (int64_t size = 4096; size <= max_bytes; size *= 4) {
    const int64_t count = size / 4;
    send.assign(count, 1.0f);
    recv.assign(count, 0.0f);
    ASSIGN_OR_RETURN(double round_trip, timed([&](int run) -> Status {
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
  out.push_back(std::move(p2p));
  for (CollectiveTable& t : out) t.seconds = Ascending(t.seconds);
  return out;
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
  } else {
    p.intra_host = {1e-6, figures[1] / 3};  // one rank: a copy through memory
  }
  p.inter_host = p.intra_host;
  return p;
}

}  // namespace tessera
