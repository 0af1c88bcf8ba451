// The machine half of the automatic-parallelism cost model: what one device
// computes per second, how fast its memory moves, and what a collective
// costs over the links inside a host and between hosts (latency +
// bytes / bandwidth, ring algorithms). A profile is JSON, measured on this
// machine by calibration (train_gpt --calibrate) or written by hand for
// machines we do not have:
//
//   {
//     "format": "tessera.machine_profile", "version": 1,
//     "name": "dgx-a100", "source": "NVIDIA DGX A100 datasheet ...",
//     "devices_per_host": 8,
//     "device": {"matmul_flops": 1.56e14, "memory_bandwidth": 1.555e12,
//                "memory_bytes": 4.295e10},
//     "intra_host": {"latency_s": 5e-6, "bandwidth": 2.4e11},
//     "inter_host": {"latency_s": 1e-5, "bandwidth": 2.5e10},
//     "hosts": 0,
//     "collectives": [{"kind": "AllReduce", "group": 2,
//                      "bytes": [4096, ...], "seconds": [1.2e-4, ...]}, ...],
//     "kernels": {"layer_norm_forward": 1.2e-9, ...},
//     "copy_turn_s": 4e-5
//   }
//
// "collectives" (optional; calibration writes it) holds collectives timed
// at several sizes on a group of ranks of one host, each after the ranks
// have done other work (as a training step's collectives follow its
// kernels): back to back they run several times faster on some backends
// (Gloo: 0.5 against 2 ms for 512 KiB here), which a line through the
// sizes cannot say. For that kind and group size within a host a
// collective costs the larger of the table's time (interpolated log-log
// between its sizes; below the smallest: the smallest's time; above the
// largest: the line's bandwidth beyond it) and the link's line.
//
// Bandwidths are bytes per second one rank moves (a ring's bus
// bandwidth). `hosts` (0: as many as a job needs) bounds the devices: a
// job with more ranks than hosts x devices_per_host shares devices (more
// ranks than cores on a CPU), which divides their throughput (a pipeline's
// waiting ranks lend theirs: runtime/model/gpt_search.cc).
// The model's half (what a stage of the GPT does, how a step is priced)
// is the rest of runtime/cost/ and runtime/model/gpt_work.h; measuring a
// profile is runtime/cost/calibration.h.
#ifndef TESSERA_RUNTIME_COST_MACHINE_PROFILE_H_
#define TESSERA_RUNTIME_COST_MACHINE_PROFILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "runtime/kernels.h"
#include "runtime/matmul_library.h"

namespace tessera {

inline constexpr std::string_view kMachineProfileFormat = "tessera.machine_profile";

struct LinkProfile {
  double latency_s = 0;  // per message step
  double bandwidth = 0;  // bytes per second
};

enum class CollectiveKind { kAllReduce, kReduceScatter, kAllGather, kAllToAll, kSendRecv };
inline constexpr int kCollectiveKinds = 5;
std::string_view CollectiveName(CollectiveKind kind);

// A ring collective over n ranks: its latency steps, and the share of
// CollectiveSeconds' bytes each rank moves over the link.
struct RingShape {
  double steps, moved;
};
RingShape RingOf(CollectiveKind kind, double n);

// One collective's measured times on `group` ranks, by size (ascending
// bytes, in CollectiveSeconds' sense of bytes).
struct CollectiveTable {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int group = 2;
  std::vector<double> bytes, seconds;
};

// The runtime's kernels (runtime/kernels.h, the optimizer's), which a
// profile may price by measurement, each per its own unit. Calibration
// times them (runtime/cost/calibration.h: MeasureKernels); a kernel without
// a measured figure costs its roofline: its bytes per unit at
// memory_bandwidth and its flops per unit at matmul_flops. On this VM the
// roofline misses by up to 4x either way (a layer norm's per-row
// reductions, the attention core's exponentials and small products, a
// residual add in cache): BENCHMARKS.md "Automatic parallelism".
// The enum itself is in runtime/kernels.h, beside the kernels.
std::string_view KernelName(Kernel kernel);

struct MachineProfile {
  std::string name, source;
  std::string backend;  // what the links were measured over ("inprocess", "mpi", ...)
  int devices_per_host = 1;
  // FLOP/s of one device in f32 matrix products: a training linear's
  // forward and backward, as training runs them (the forward alone runs
  // 10-15% faster a flop here, so timing it alone would overrate the
  // device).
  double matmul_flops = 0;
  // The GEMM library the kernels use on this machine (runtime/matmul.h),
  // chosen by calibration as the fastest of those measured, with what each
  // measured (FLOP/s of model work in a training step,
  // runtime/model/matmul_choice.h: ChooseMatmulLibrary); unset: the
  // default, OpenBLAS. JSON: "device": {"matmul_library": "onednn",
  // "matmul_libraries": {"openblas": 1.0e11, ...}}.
  std::optional<MatmulLibrary> matmul_library;
  std::vector<std::pair<MatmulLibrary, double>> matmul_libraries;
  double memory_bandwidth = 0;  // bytes/s of one device's element-wise kernels
  int64_t memory_bytes = 0;     // one device's memory (0: unknown)
  LinkProfile intra_host, inter_host;
  int hosts = 0;
  std::vector<CollectiveTable> collectives;  // measured; see above
  // Measured seconds per unit of each kernel (0: not measured, the
  // roofline). JSON: "kernels": {"layer_norm_forward": 1.2e-9, ...}.
  double kernel_seconds[kKernelCount] = {};
  // Multi-copy: what a collective issued non-blocking with the turn handed
  // on and taken back costs beyond the blocking call (thread wake-ups, the
  // lane's hop, MPI's polling), measured by calibration; 0: not measured.
  double copy_turn_s = 0;
  // The local disk offload writes to: bytes/s of direct-I/O reads and
  // writes in 4 MiB requests, measured by calibration (JSON "disk":
  // {"read": ..., "write": ...}); 0: not measured (kDefaultDiskBandwidth).
  double disk_read = 0, disk_write = 0;
  static constexpr double kDefaultDiskBandwidth = 500e6;
  // Ranks sharing one host's disk (ForRanks sets it; not in the file).
  int ranks_per_host = 1;
  // Ranks sharing one device (ForRanks sets it; not in the file).
  int ranks_per_device = 1;
  // This machine running a job of `ranks`.
  MachineProfile ForRanks(int ranks) const;

  static Result<MachineProfile> Parse(std::string_view json, const std::string& source);
  static Result<MachineProfile> Load(const std::string& path);
  std::string ToJson() const;

  // Seconds for `flops` of matrix products and `bytes` of element-wise
  // memory traffic on one rank (shared devices divide the throughput).
  double ComputeSeconds(double flops, double bytes) const;
  // Seconds for a rank to read and write those bytes of its offload files
  // (the ranks of a host share its disk).
  double DiskSeconds(double read_bytes, double write_bytes) const;
  // Seconds for `units` of `kernel` on one rank: measured, else its
  // roofline (shared devices divide the throughput).
  double KernelSeconds(Kernel kernel, double units) const;
  // Seconds for one collective over `group` ranks on `link` (true: crosses
  // hosts) with `bytes` the size of the whole tensor (AllReduce), of the
  // gathered result (AllGather, ReduceScatter's input), of what each rank
  // sends (AllToAll, SendRecv).
  double CollectiveSeconds(CollectiveKind kind, double bytes, int group, bool inter_host) const;
  // Whether some group of `size` ranks `stride` apart in the rank order
  // (an axis of a row-major mesh) spans more than one host.
  bool CrossesHosts(int64_t stride, int64_t size) const;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COST_MACHINE_PROFILE_H_
