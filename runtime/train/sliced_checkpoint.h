// A native checkpoint written by every rank of a job at once (a sliced
// save): each rank writes the pieces it holds to its own data file
// (`data-<rank>.tsr`; with SlicedWriteOptions::merged, all of them into
// one, at planned offsets) in the shared temporary directory, and the collective
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
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/native.h"
#include "ckpt/save_plan.h"
#include "formats/manifest.h"
#include "formats/native_files.h"
#include "runtime/comm/communicator.h"

namespace tessera {

// The save plan (who writes which piece, copies and parity, host-aware)
// is ckpt/save_plan.h's, the same one `ckpt convert` uses.

// The name of the host this process runs on (gethostname).
std::string ThisHostName();
// Collective: every rank's ThisHostName, by rank.
Result<std::vector<std::string>> GatherHostNames(Communicator& comm);

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
  // The host of every rank (any names; equal names, same host), recorded
  // with each file in the manifest; the plan places copies and parity by
  // them. Empty: learnt with one all-gather of ThisHostName. In-process
  // ranks of tests and demos may be given fake hosts here.
  std::vector<std::string> hosts;
  // Called at named points of the save ("write" after each piece this rank
  // writes, "redundancy" before its copies and parity, "commit" when its
  // files are done, "rename" on rank 0 just before the directory moves into
  // place, "committed" on rank 0 once it is there, before `latest` names
  // it): fault-injection tests kill the process there.
  std::function<void(std::string_view point, int64_t step)> fault_hook;  // step: meta.step
  // A merged save: the same pieces, but every rank writes its own into one
  // data file at offsets all ranks plan alike from the strategy (no rank
  // gathers anything), and the manifest records whole tensors (one rank,
  // nothing split), so the checkpoint is a merged one: the same tensors,
  // bit for bit, that rank 0 gathering and writing them would give. Raw
  // pieces only, and no redundancy (one file: replicas and parity are the
  // sliced save's).
  bool merged = false;
};

class SlicedCheckpointWriter {
 public:
  // Collective over `comm` (rank r is mesh rank r of the strategy): rank 0
  // prepares `<path>.tmp-<pid>`, every rank opens its data file there.
  static Result<std::unique_ptr<SlicedCheckpointWriter>> Create(Env* env, Communicator& comm,
                                                                const std::string& path,
                                                                Strategy strategy,
                                                                CheckpointMeta meta,
                                                                SlicedWriteOptions options = {});
  ~SlicedCheckpointWriter();

  const SavePlan& plan() const { return plan_; }
  // The pieces this rank writes from memory (PiecesToWrite of the plan).
  std::vector<PieceToWrite> Pieces() const { return PiecesToWrite(plan_, comm_->rank()); }

  // Local: stores `box` (over the split shape) of tensor `index`, one of
  // Pieces().
  Status WritePiece(size_t index, const Box& box, const void* data);
  // The same with the bytes read through `read` (formats/native_files.h:
  // at most kStreamBytes of them in memory at once, hashed as they
  // stream), for state that is not in memory (the offload tier). Written
  // raw; under a codec the piece is read whole and encoded.
  Status WritePieceFrom(size_t index, const Box& box, const PieceReader& read);
  // Local: this rank's data file is complete; durable now, or after the
  // redundancy phase when the plan has one (Commit does it if not done).
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
  // Makes this rank's data file durable (once).
  Status SyncData();
  // WritePiece and WritePieceFrom: `data` or else `read`.
  Status Store(size_t index, const Box& box, const void* data, const PieceReader* read);
  // This rank's records as a partial manifest: its files (data file first),
  // with pieces and copies in them.
  std::string Part() const;

  Strategy strategy_;
  CheckpointMeta meta_;
  SlicedWriteOptions options_;
  SavePlan plan_;
  std::map<std::pair<size_t, std::vector<int64_t>>, size_t> plan_index_;  // (tensor, origin)
  std::unique_ptr<DataFileWriter> file_;
  // A merged save's one data file, and every planned piece's offset in it.
  std::unique_ptr<PlacedDataFile> placed_;
  std::vector<uint64_t> offsets_;
  std::string file_name_;
  uint64_t data_size_ = 0;
  uint64_t data_checksum_ = 0;  // of every byte of the data file
  // This rank's files after its data file (copies, parity), with sizes.
  std::vector<FileInfo> extra_files_;
  // Records by tensor, file indices into [data file, extra_files_...].
  std::vector<std::vector<PieceInfo>> pieces_, copies_;
  std::vector<Manifest> exchanged_;  // every rank's part, after Exchange
  Status failed_;                    // the first local error, reported at Commit
  bool data_finished_ = false, data_synced_ = false, exchanged_done_ = false,
       redundancy_done_ = false;
  bool done_ = false;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TRAIN_SLICED_CHECKPOINT_H_
