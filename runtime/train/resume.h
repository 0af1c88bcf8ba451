// Resuming a training job from its checkpoint directory: which checkpoint
// to take (the one `latest` names, or the newest complete one before it),
// that it was trained with the same model and data, where the data stood,
// which newer checkpoints an abandoned run left, and, after the load, the
// files that had to be read around (a lost or corrupt file read through
// copies or parity) rebuilt on disk. Model-agnostic: the caller loads its
// own tensors from the reader.
#ifndef TESSERA_RUNTIME_TRAIN_RESUME_H_
#define TESSERA_RUNTIME_TRAIN_RESUME_H_

#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/env.h"
#include "core/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/train/data.h"

namespace tessera {

// The checkpoint a job resumes from in `dir`, opened; null when `dir`
// holds none that is complete (the job starts afresh). Its "config" metadata must be `config` (the
// job's model and data settings), else the error names both.
Result<std::unique_ptr<CheckpointReader>> OpenResumeCheckpoint(Env* env, const std::string& dir,
                                                               const std::string& config);
// Where the data loader stood when `checkpoint` was saved ("data.position").
Result<DataPosition> SavedDataPosition(const CheckpointReader& checkpoint);
// The committed checkpoints in `dir` newer than `step`: left by a run that
// was abandoned (killed between a commit and the update of `latest`, or
// rolled back); the resumed run's saves replace them.
Result<std::vector<std::string>> AbandonedCheckpoints(Env* env, const std::string& dir,
                                                      int64_t step);

// What loading a checkpoint had to work around, and what was done about it.
struct RepairNotes {
  std::vector<std::string> recovered;  // this rank's reads around lost or corrupt files
  std::vector<std::string> rebuilt;    // on rank 0: files rebuilt on disk
  std::vector<std::string> failed;     // on rank 0: files that could not be rebuilt
  Status repair = Status::Ok();        // on rank 0: the repair's own failure, if any
};
// Collective, after every rank loaded from `checkpoint`: when any rank had
// to read around a file, rank 0 rebuilds the checkpoint's lost files so it
// is whole again (RepairNativeCheckpoint). A failed repair does not fail
// the resume (the tensors were read); it is reported in the notes.
Result<RepairNotes> RepairAfterLoad(Env* env, const CheckpointReader& checkpoint,
                                    Communicator& world);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TRAIN_RESUME_H_
