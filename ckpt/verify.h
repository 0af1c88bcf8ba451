// Verify: recompute every checksum of a native checkpoint and check that
// its pieces tile each tensor exactly once; report every problem by file
// and tensor rather than stopping at the first.
#ifndef TESSERA_CKPT_VERIFY_H_
#define TESSERA_CKPT_VERIFY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/env.h"
#include "core/status.h"

namespace tessera {

struct VerifyProblem {
  std::string file;    // data file path, or empty
  std::string tensor;  // tensor name, or empty
  std::string what;
};

struct VerifyReport {
  std::string path;  // the checkpoint directory checked
  int64_t files = 0;
  int64_t pieces = 0;
  int64_t bytes = 0;  // stored bytes read and checked
  std::vector<VerifyProblem> problems;
  // Not damage: the copies of a tensor several pipeline stages hold that
  // differ from the lowest stage's (which is what readers read).
  std::vector<VerifyProblem> differing_copies;
  // Not damage either: redundancy groups that the loss of one host (as the
  // manifest records the files' hosts) would leave unrepairable
  // (HostLossRisks).
  std::vector<std::string> host_loss_risks;
  bool ok() const { return problems.empty(); }
};

struct VerifyOptions {
  int threads = 0;
  std::function<void(int64_t, int64_t)> progress;  // (bytes done, total)
};

// A manifest neither copy of which can be read (missing, corrupt, future
// version) is an error; everything else that is wrong is listed in the
// report, a damaged manifest.pb or manifest-copy.pb included.
// Reads every byte of every tensor of any checkpoint (in slabs of at most
// 64 MiB, on `threads` threads), so that the format's own checks run over
// all of it; returns the bytes read. Errors name the tensor.
Result<int64_t> ReadEverything(const CheckpointReader& reader, int threads);

Result<VerifyReport> VerifyNativeCheckpoint(Env* env, const std::string& path,
                                            const VerifyOptions& options);

}  // namespace tessera

#endif  // TESSERA_CKPT_VERIFY_H_
