// Calibration: the figures a machine profile (machine_profile.h) holds,
// measured on this machine: matrix products, element-wise memory traffic,
// the runtime's kernels one by one, and the collectives of the job's
// backend at several sizes and group sizes.
#ifndef TESSERA_RUNTIME_COST_CALIBRATION_H_
#define TESSERA_RUNTIME_COST_CALIBRATION_H_

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/cost/machine_profile.h"

namespace tessera {

// Calibration: the figures a profile holds, measured here.
// f32 matrix products of the sizes the GPT's linears have ([rows, C] x
// [C, 4C]), forward and backward, on the threads the kernels have been
// given.
double MeasureMatmulFlops(int64_t n);
// The element-wise kernels' memory throughput (a residual add over
// `floats` floats, counting 3 x 4 bytes per element).
double MeasureMemoryBandwidth(int64_t floats);
// A link's latency and bandwidth, fitted (least squares) to AllReduce and
// AllGather times over `comm` at sizes from 4 KiB to `max_bytes`.
// Collective; every rank returns the same figures.
Result<LinkProfile> MeasureLink(Communicator& comm, int64_t max_bytes);
// The closest ascending sequence to `v` in least squares (isotonic
// regression): measured times of growing sizes, where noise made a larger
// size look cheaper, without letting one slow outlier raise all after it.
std::vector<double> Ascending(const std::vector<double>& v);
// AllReduce, AllGather and ReduceScatter timed at sizes from 4 KiB to
// `max_bytes` in groups of every size g >= 2 dividing `comm`'s ranks (the
// n / g groups of consecutive ranks at once, as a mesh axis's groups run),
// each timing after the ranks wrote a buffer larger than their caches and
// met at a barrier (so the collective starts cold and together, as one
// after a step's kernels does, without their skew): the median of nine,
// made ascending in size (Ascending); and SendRecv (group 2), half a
// ping-pong of ranks 0 and 1 timed alike. Tables by group size (AllReduce,
// AllGather, ReduceScatter each), SendRecv last. Collective; every rank
// returns rank 0's tables, or every rank an error when one rank's call
// failed.
Result<std::vector<CollectiveTable>> MeasureCollectives(Communicator& comm, int64_t max_bytes);
// This machine as `world` runs on it: rank 0's matrix products and memory
// (the others wait), the link measured over `world` (one host: intra_host
// and inter_host alike) and its collectives' tables (MeasureCollectives:
// calibrated on 4 ranks, groups of 2 and 4), devices = cores,
// ranks_per_device from how many ranks share them. Collective; every rank
// returns the same profile.
Result<MachineProfile> Calibrate(Communicator& world);

// The runtime's kernels (runtime/kernels.h: Kernel) timed on this rank's compute threads at
// the sizes of a small GPT's activations (arrays of 2 MiB, run back to back:
// warm caches, as a micro-batch's activations of that size are; larger
// ones that spill to memory may cost more), each the median of several
// runs, into `profile`'s kernel_seconds. The attention core's cost per score
// its causal blocks compute (the softmax) and per flop of its products come
// from a fit over sequences of 128 and 256 and heads of 32 and 128.
void MeasureKernels(MachineProfile* profile);
// What train_gpt --calibrate measures: Calibrate (above) and the
// kernels, timed on rank 0 while the others wait, and with `disk_dir`
// the bandwidth of direct-I/O reads and writes of a scratch file there
// (offload's disk). Collective; every rank returns the same profile.
Result<MachineProfile> CalibrateMachine(Communicator& world, const std::string& disk_dir = "");
// The disk's figures alone (MachineProfile::disk_read, disk_write).
Status MeasureDisk(const std::string& dir, MachineProfile* profile);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COST_CALIBRATION_H_
