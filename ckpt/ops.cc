#include "ckpt/ops.h"

namespace tessera {

Result<std::unique_ptr<CheckpointReader>> OpenCheckpoint(Env* env, const std::string& path) {
  if (!env->FileExists(path)) return NotFoundError("'" + path + "' does not exist");
  if (env->IsDirectory(path)) return OpenNativeCheckpoint(env, path);
  return InvalidArgumentError("'" + path + "' is not a checkpoint this Tessera can read");
}

Result<TransformStats> WriteTransformed(Env* env, const CheckpointReader& src, const Strategy& dst,
                                        const std::string& out_path, const WriteOptions& options) {
  ASSIGN_OR_RETURN(Strategy complete, CompleteStrategy(src.strategy(), dst));
  CheckpointMeta meta = src.meta();
  meta.created_by = "tessera ckpt";
  ASSIGN_OR_RETURN(auto writer, CreateNativeCheckpoint(env, out_path, complete, std::move(meta),
                                                       options.native));
  auto stats = Transform(src, complete, *writer, options.transform);
  if (!stats.ok()) {
    writer->Abort();
    return stats.status();
  }
  Status s = writer->Commit();
  if (!s.ok()) {
    writer->Abort();
    return s;
  }
  return stats;
}

}  // namespace tessera
