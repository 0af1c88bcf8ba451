// A native checkpoint written by every rank of a job at once (a sliced
// save): each rank writes the pieces it holds to its own data file
// (`data-<rank>.tsr`) in the shared temporary directory, and the collective
// Commit gathers every rank's piece records on rank 0, which checks that
// every tensor is covered, writes the manifest and renames the directory
// into place. Until then nothing exists at the final path; if any rank
// fails, every rank gets an error and the temporary is removed. The path
// must be on a file system every rank sees (one host, or a shared one).
#ifndef TESSERA_RUNTIME_SLICED_CHECKPOINT_H_
#define TESSERA_RUNTIME_SLICED_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/native.h"
#include "formats/manifest.h"
#include "formats/native_files.h"
#include "runtime/comm/communicator.h"

namespace tessera {

// The pieces rank `rank` writes of `strategy` (ranks are the strategy's
// mesh ranks): one box per piece some rank holds, written by exactly one of
// its holders, the holder chosen in turn (piece i of a tensor by holder
// i mod holders, counting pieces over the whole strategy) so replicas share
// the writing.
struct PieceToWrite {
  size_t tensor = 0;
  Box box;  // over the layout's split shape
};
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

class SlicedCheckpointWriter {
 public:
  // Collective over `comm` (rank r is mesh rank r of the strategy): rank 0
  // prepares `<path>.tmp-<pid>`, every rank opens its data file there.
  static Result<std::unique_ptr<SlicedCheckpointWriter>> Create(
      Env* env, Communicator& comm, const std::string& path, Strategy strategy,
      CheckpointMeta meta, const NativeWriteOptions& options = {});
  ~SlicedCheckpointWriter();

  // Local: stores `box` (over the split shape) of tensor `index`.
  Status WritePiece(size_t index, const Box& box, const void* data);
  // Collective: every rank's file made durable, the manifest written by
  // rank 0, the directory renamed into place. The error of a rank that
  // failed is returned on it; the others get one naming it.
  Status Commit();

  const std::string& path() const { return path_; }

 private:
  SlicedCheckpointWriter() = default;
  Env* env_ = nullptr;
  Communicator* comm_ = nullptr;
  std::string path_, tmp_;
  Strategy strategy_;
  CheckpointMeta meta_;
  NativeWriteOptions options_;
  std::unique_ptr<DataFileWriter> file_;
  std::string file_name_;
  std::vector<std::vector<PieceInfo>> pieces_;
  Status failed_;  // the first local error, reported at Commit
  bool done_ = false;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SLICED_CHECKPOINT_H_
