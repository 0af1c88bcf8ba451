#include "runtime/train/resume.h"

#include "ckpt/ops.h"
#include "ckpt/repair.h"
#include "formats/native_files.h"

namespace tessera {

Result<std::unique_ptr<CheckpointReader>> OpenResumeCheckpoint(Env* env, const std::string& dir,
                                                               const std::string& config) {
  if (!env->IsDirectory(dir)) return std::unique_ptr<CheckpointReader>();
  const Result<std::string> name = ResumeCheckpoint(env, dir);
  if (!name.ok()) return std::unique_ptr<CheckpointReader>();
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> checkpoint,
                   OpenCheckpoint(env, JoinPath(dir, *name)));
  const auto& saved = checkpoint->meta().metadata;
  const auto it = saved.find("config");
  if (it == saved.end() || it->second != config) {
    return InvalidArgumentError("checkpoint '" + checkpoint->path() + "' was trained with '" +
                                (it == saved.end() ? std::string("?") : it->second) + "', not '" +
                                config + "'");
  }
  return checkpoint;
}

Result<DataPosition> SavedDataPosition(const CheckpointReader& checkpoint) {
  const auto& saved = checkpoint.meta().metadata;
  const auto pos = saved.find("data.position");
  return DataPosition::Parse(pos == saved.end() ? "" : pos->second);
}

Result<std::vector<std::string>> AbandonedCheckpoints(Env* env, const std::string& dir,
                                                      int64_t step) {
  ASSIGN_OR_RETURN(const auto committed, CommittedSteps(env, dir));
  std::vector<std::string> out;
  for (const auto& [s, name] : committed) {
    if (s > step) out.push_back(name);
  }
  return out;
}

Result<RepairNotes> RepairAfterLoad(Env* env, const CheckpointReader& checkpoint,
                                    Communicator& world) {
  RepairNotes notes;
  notes.recovered = checkpoint.Recoveries();
  int any = notes.recovered.empty() ? 0 : 1;
  RETURN_IF_ERROR(world.AllReduce(&any, &any, 1, DType::kI32, ReduceOp::kMax));
  if (any == 0) return notes;
  if (world.rank() == 0) {
    Result<RepairReport> fixed = RepairNativeCheckpoint(env, checkpoint.path(), {});
    if (fixed.ok()) {
      notes.rebuilt = fixed->rebuilt;
      notes.failed = fixed->failed;
    } else {
      notes.repair = fixed.status();
    }
  }
  RETURN_IF_ERROR(world.Barrier());
  return notes;
}

}  // namespace tessera
