// The native format (formats/native.md) behind the ckpt interfaces.
#ifndef TESSERA_CKPT_NATIVE_H_
#define TESSERA_CKPT_NATIVE_H_

#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/save_plan.h"
#include "formats/manifest.h"

namespace tessera {

// Opens a committed checkpoint directory, or a checkpoint root holding a
// `latest` pointer (then the checkpoint it names).
Result<std::unique_ptr<CheckpointReader>> OpenNativeCheckpoint(Env* env, const std::string& path);

struct NativeWriteOptions {
  Codec codec = Codec::kRaw;
  int level = 3;
  // Replace an existing checkpoint at the path (only at commit time).
  bool overwrite = false;
  // Redundancy over the data files, written before the commit: XOR
  // (parity:G, parity-<group>.tsr) or Reed-Solomon (rs:K+M,
  // rs-<group>-<j>.tsr) groups, planned by PlanGroups as training's saves
  // are. Offline the files' hosts are unknown, each counts as its own, so
  // groups take the data files in rank order. replicas:K is for training's
  // sliced saves and is refused here.
  Redundancy redundancy;
};

// "none" (or "raw"), "zstd", "zstd:LEVEL" (1 to 19) into `options`.
Status ParseCompression(const std::string& text, NativeWriteOptions* options);
// "none", "rs:K+M" or "parity:G" (G >= 2) into `options`; replicas:K is
// refused (an offline writer stores each piece once).
Status ParseRedundancy(const std::string& text, NativeWriteOptions* options);

// Writes a checkpoint of `strategy`'s tensors at `path`: built in the
// sibling directory `<path>.tmp-<pid>`, renamed to `path` by Commit. Data
// file `data-<rank>.tsr` holds the pieces WritePiece gave for that rank.
Result<std::unique_ptr<CheckpointWriter>> CreateNativeCheckpoint(Env* env, const std::string& path,
                                                                 Strategy strategy,
                                                                 CheckpointMeta meta,
                                                                 const NativeWriteOptions& options);

}  // namespace tessera

#endif  // TESSERA_CKPT_NATIVE_H_
