// A native checkpoint written by every rank of a job at once (a sliced
// save): each rank writes the pieces it holds to its own data file
// (`data-<rank>.tsr`) in the shared temporary directory, and the collective
// Commit gathers every rank's piece records on rank 0, which checks that
// every tensor is covered, writes the manifest and renames the directory
// into place. Until then nothing exists at the final path; if any rank
// fails, every rank gets an error and the temporary is removed. The path
// must be on a file system every rank sees (one host, or a shared one).
#ifndef TESSERA_RUNTIME_TRAIN_SLICED_CHECKPOINT_H_
#define TESSERA_RUNTIME_TRAIN_SLICED_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/native.h"
#include "formats/manifest.h"
#include "formats/native_files.h"
#include "runtime/comm/communicator.h"

namespace tessera {

// How much redundancy a sliced save adds (`--redundancy`):
//   replicas:K  every piece stored in K data files written by K different
//               ranks, on different hosts when there are enough. Ranks that
//               hold the piece write it from memory (data-parallel replicas
//               cost no traffic); when fewer than K hold it (ZeRO shards, tp
//               slices without dp), other ranks copy its stored bytes into
//               their `copies-<rank>.tsr` once the data files are written.
//   parity:G    the data files in groups of G (members on different hosts
//               first), each group with `parity-<g>.tsr`, the XOR of its
//               members, written by a rank outside the group when there is
//               one: any one lost file of a group is rebuilt.
// Both may be combined: "replicas:2,parity:4". "none" is the default.
struct Redundancy {
  int replicas = 1;
  int parity_group = 0;  // 0: no parity
  static Result<Redundancy> Parse(std::string_view text);
  std::string ToString() const;
  bool none() const { return replicas <= 1 && parity_group == 0; }
};

// Who writes what in a sliced save, the same on every rank.
struct PlannedPiece {
  size_t tensor = 0;
  Box box;  // over the layout's split shape
  // writers[0] stores the piece, the others copies of it. The first
  // `from_memory` of them hold the piece and write it during the data
  // phase; the rest copy writers[0]'s stored bytes afterwards.
  std::vector<int64_t> writers;
  int64_t from_memory = 1;
  int64_t bytes = 0;
};
struct PlannedParity {
  std::vector<int64_t> members;  // ranks whose data files the group protects
  int64_t writer = 0;
};
struct SavePlan {
  std::vector<PlannedPiece> pieces;
  std::vector<PlannedParity> parity;
  int64_t world = 0;
  // Copies made after the data phase, or parity: the ranks must exchange
  // their records and run WriteRedundancy before the commit.
  bool needs_redundancy_phase() const;
};
// `hosts[r]` tells which host rank r runs on (any ids; equal ids, same
// host). With replicas 1 each piece is written once, by its holders in turn
// (piece i of the strategy by holder i mod holders) so replicas share the
// writing.
Result<SavePlan> PlanSave(const Strategy& strategy, const std::vector<int64_t>& hosts,
                          const Redundancy& redundancy);
// An id of the host this process runs on (a hash of its name).
int64_t ThisHostId();

// The pieces rank `rank` writes from memory under `plan`.
struct PieceToWrite {
  size_t tensor = 0;
  Box box;  // over the layout's split shape
};
std::vector<PieceToWrite> PiecesToWrite(const SavePlan& plan, int64_t rank);
// The same without redundancy, every rank on one host.
Result<std::vector<PieceToWrite>> PiecesToWrite(const Strategy& strategy, int64_t rank);

// A piece with where its bytes are: `box` of tensor `tensor`, dense at
// `data` (`bytes` long).
struct LocalPiece {
  size_t tensor = 0;
  Box box;
  const void* data = nullptr;
  int64_t bytes = 0;
};

// Collective, after a checkpoint `root`/`name` was committed: rank 0
// points `root`/latest at it and, with keep > 0, keeps only the newest
// `keep` checkpoints (PruneCheckpoints); every rank returns rank 0's
// outcome.
Status PointLatest(Env* env, Communicator& comm, const std::string& root, const std::string& name,
                   int keep);

struct SlicedWriteOptions {
  NativeWriteOptions native;
  Redundancy redundancy;
  // Host id of every rank; empty: learnt with one all-gather of ThisHostId.
  std::vector<int64_t> hosts;
  // Called at named points of the save ("write" after each piece this rank
  // writes, "redundancy" before its copies and parity, "commit" when its
  // files are done, "rename" on rank 0 just before the directory moves into
  // place, "committed" on rank 0 once it is there, before `latest` names
  // it): fault-injection tests kill the process there.
  std::function<void(std::string_view point, int64_t step)> fault_hook;  // step: meta.step
};

class SlicedCheckpointWriter {
 public:
  // Collective over `comm` (rank r is mesh rank r of the strategy): rank 0
  // prepares `<path>.tmp-<pid>`, every rank opens its data file there.
  static Result<std::unique_ptr<SlicedCheckpointWriter>> Create(
      Env* env, Communicator& comm, const std::string& path, Strategy strategy,
      CheckpointMeta meta, SlicedWriteOptions options = {});
  ~SlicedCheckpointWriter();

  const SavePlan& plan() const { return plan_; }
  // The pieces this rank writes from memory (PiecesToWrite of the plan).
  std::vector<PieceToWrite> Pieces() const { return PiecesToWrite(plan_, comm_->rank()); }

  // Local: stores `box` (over the split shape) of tensor `index`, one of
  // Pieces().
  Status WritePiece(size_t index, const Box& box, const void* data);
  // Local: makes this rank's data file durable (Commit does it if not done).
  Status FinishData();
  // The redundancy phase, when plan().needs_redundancy_phase(): Exchange
  // (collective, after FinishData on every rank) shares every rank's piece
  // records; WriteRedundancy (local) then writes this rank's copies and
  // parity files. Commit runs whatever was not run; an asynchronous save
  // runs them itself to keep the file work off the training thread.
  Status Exchange();
  Status WriteRedundancy();
  // Collective: the manifest written by rank 0, the directory renamed into
  // place. The error of a rank that failed is returned on it; the others
  // get one naming it.
  Status Commit();

  const std::string& path() const { return path_; }

 private:
  SlicedCheckpointWriter() = default;
  Env* env_ = nullptr;
  Communicator* comm_ = nullptr;
  std::string path_, tmp_;
  void Hook(std::string_view point) const {
    if (options_.fault_hook) options_.fault_hook(point, meta_.step);
  }
  // This rank's records as a partial manifest: its files (data file first),
  // with pieces and copies in them.
  std::string Part() const;

  Strategy strategy_;
  CheckpointMeta meta_;
  SlicedWriteOptions options_;
  SavePlan plan_;
  std::map<std::pair<size_t, std::vector<int64_t>>, size_t> plan_index_;  // (tensor, origin)
  std::unique_ptr<DataFileWriter> file_;
  std::string file_name_;
  uint64_t data_size_ = 0;
  uint64_t data_checksum_ = 0;  // of every byte of the data file
  // This rank's files after its data file (copies, parity), with sizes.
  std::vector<FileInfo> extra_files_;
  // Records by tensor, file indices into [data file, extra_files_...].
  std::vector<std::vector<PieceInfo>> pieces_, copies_;
  std::vector<Manifest> exchanged_;  // every rank's part, after Exchange
  Status failed_;  // the first local error, reported at Commit
  bool data_finished_ = false, exchanged_done_ = false, redundancy_done_ = false;
  bool done_ = false;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TRAIN_SLICED_CHECKPOINT_H_
