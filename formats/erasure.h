// Reed-Solomon erasure codes over whole files (--redundancy rs:K+M), with
// Intel ISA-L's erasure code (erasure.cc is the only file that includes
// its headers). A group is K member files and M parity files: each parity
// file is a combination over GF(2^8), with the coefficients of a Cauchy
// matrix (ISA-L's gf_gen_cauchy1_matrix, every square submatrix of which
// is invertible), of the members, each padded with zeros to the longest;
// so any M lost or corrupt files of the group are rebuilt from the other K.
// The native manifest records such a group as an ErasureGroup with code
// kRsCauchy (formats/native.md).
#ifndef TESSERA_FORMATS_ERASURE_H_
#define TESSERA_FORMATS_ERASURE_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "formats/manifest.h"
#include "formats/parity.h"

namespace tessera {

inline constexpr char kRsCauchy[] = "rs-cauchy";

// K data files, M parity files; K >= 1, M >= 1, K + M <= 255.
struct ErasureCode {
  int k = 0;
  int m = 0;
  // "rs:K+M", e.g. "rs:4+2".
  static Result<ErasureCode> Parse(std::string_view text);
  std::string ToString() const;
};

// Writes the M parity files of `members` (code.k of them) to
// `parity_paths` (created or truncated, synced), streaming a few MiB of
// each member at a time. Each parity file is the longest member's size;
// their XXH3 checksums go to `checksums`.
Status WriteErasureParity(Env* env, const ErasureCode& code,
                          const std::vector<ParityMember>& members,
                          const std::vector<std::string>& parity_paths,
                          std::vector<uint64_t>* checksums);

// The same for some of the parity files: parity file rows[i] (0 <= it < M)
// to parity_paths[i]. Ranks that each write one parity file of a group use
// it; the bytes are those WriteErasureParity writes.
Status WriteErasureParityRows(Env* env, const ErasureCode& code,
                              const std::vector<ParityMember>& members,
                              const std::vector<int>& rows,
                              const std::vector<std::string>& parity_paths,
                              std::vector<uint64_t>* checksums);

// The code of a manifest's erasure group: K = its members, M = its parity
// files; Unimplemented naming a code Tessera does not know.
Result<ErasureCode> ErasureCodeOf(const ErasureGroup& group);

// File `lost` of a group (`files`: its K members, then its M parity files,
// with their recorded sizes), read through K others: Read(offset, n) reads
// the same range of each of those (zeros past a member's end) and combines
// them. `good` says which files may be read (at least K besides `lost`;
// the first K good ones are used). Reads only what is asked, so a reader
// rebuilds just the byte ranges it needs.
Result<std::unique_ptr<RandomAccessFile>> OpenErasureRebuild(Env* env, const ErasureCode& code,
                                                             const std::vector<ParityMember>& files,
                                                             const std::vector<bool>& good,
                                                             size_t lost);

// File `lost` (a manifest file index) of `manifest`'s erasure group
// `group`, the checkpoint being in `dir`: OpenErasureRebuild over the
// group's files that `usable` says may be read.
Result<std::unique_ptr<RandomAccessFile>> OpenErasureGroupRebuild(
    Env* env, const std::string& dir, const Manifest& manifest, const ErasureGroup& group,
    uint32_t lost, const std::function<bool(uint32_t)>& usable);

}  // namespace tessera

#endif  // TESSERA_FORMATS_ERASURE_H_
