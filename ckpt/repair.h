// Repair: rebuilds the missing or corrupt files of a native checkpoint
// saved with redundancy (`--redundancy replicas:K` copies, `parity:G`
// XOR groups), bit for bit, each written to a temporary name, checked and
// renamed into place.
#ifndef TESSERA_CKPT_REPAIR_H_
#define TESSERA_CKPT_REPAIR_H_

#include <string>
#include <vector>

#include "ckpt/verify.h"
#include "core/env.h"
#include "core/status.h"

namespace tessera {

struct RepairReport {
  std::string path;                  // the checkpoint directory
  std::vector<std::string> rebuilt;  // "data-00003.tsr: from parity-00000.tsr with ..."
  // Files that could not be rebuilt, each with why ("data-00002.tsr: ...").
  std::vector<std::string> failed;
  // Problems that are not a file's (a tensor's pieces do not tile it).
  std::vector<std::string> other;
  bool ok() const { return failed.empty() && other.empty(); }
};

// Verifies the checkpoint (VerifyNativeCheckpoint), then rebuilds each bad
// file: a data file from copies of all its pieces in good files, else from
// its parity group (the parity and every other member good); a parity
// file from its members. Rebuilding one file can make another rebuildable;
// it goes on until nothing more can be done. A file that cannot be rebuilt
// is listed in `failed`, naming what else it needed (the other lost files
// of its parity group).
Result<RepairReport> RepairNativeCheckpoint(Env* env, const std::string& path,
                                            const VerifyOptions& options);

}  // namespace tessera

#endif  // TESSERA_CKPT_REPAIR_H_
