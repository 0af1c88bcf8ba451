// XOR parity over the data files of a native checkpoint
// (--redundancy parity:G): the parity file of a group is the byte-wise XOR
// of its member files, each padded with zeros to the longest, so any one
// member is the XOR of the parity and the others (its recorded size long).
#ifndef TESSERA_FORMATS_PARITY_H_
#define TESSERA_FORMATS_PARITY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace tessera {

// A file of a parity group: its path and its recorded size.
struct ParityMember {
  std::string path;
  uint64_t size = 0;
};

// Writes the XOR of `members` to `path` (created or truncated; synced),
// streaming a few MiB at a time. Returns its size (the longest member's)
// and the XXH3 of its bytes in `checksum`.
Result<uint64_t> WriteParityFile(Env* env, const std::vector<ParityMember>& members,
                                 const std::string& path, uint64_t* checksum);

// The same, appended to the open `out` (`path` names it in errors).
Result<uint64_t> AppendParity(Env* env, const std::vector<ParityMember>& members, WritableFile& out,
                              const std::string& path, uint64_t* checksum);

// Opens every file of `members`, each of its recorded size (NotFound
// naming a missing one, DataLoss naming one of another size).
Result<std::vector<std::unique_ptr<RandomAccessFile>>> OpenParityMembers(
    Env* env, const std::vector<ParityMember>& members);

// XXH3 of a whole file, read a few MiB at a time.
Result<uint64_t> FileChecksum(Env* env, const std::string& path);

// The lost member, read through the others and the parity: Read(offset, n)
// reads the same range of every other member (zeros past its end) and of
// the parity file, and XORs them. Reading only what is asked, so a reader
// rebuilds just the byte ranges it needs. `others` excludes the lost one.
Result<std::unique_ptr<RandomAccessFile>> OpenParityRebuild(Env* env,
                                                            const std::vector<ParityMember>& others,
                                                            const ParityMember& parity,
                                                            uint64_t lost_size);

}  // namespace tessera

#endif  // TESSERA_FORMATS_PARITY_H_
