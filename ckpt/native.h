// The native format (formats/native.md) behind the ckpt interfaces.
#ifndef TESSERA_CKPT_NATIVE_H_
#define TESSERA_CKPT_NATIVE_H_

#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "formats/erasure.h"
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
  // Redundancy over the data files, written before the commit: Reed-Solomon
  // groups of `erasure.k` data files with `erasure.m` parity files
  // (rs-<group>-<j>.tsr) each, or XOR groups of `parity_group` data files
  // (parity-<group>.tsr). Groups take the data files in rank order; a last
  // group of fewer files joins the one before (XOR) or is a smaller group
  // (Reed-Solomon). Offline the files' hosts are unknown.
  ErasureCode erasure;  // k == 0: none
  int parity_group = 0;  // 0: none
};

// "none" (or "raw"), "zstd", "zstd:LEVEL" (1 to 19) into `options`.
Status ParseCompression(const std::string& text, NativeWriteOptions* options);
// "none", "rs:K+M" or "parity:G" (G >= 2) into `options`.
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
