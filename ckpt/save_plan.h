// Who writes what in a native checkpoint, and the redundancy it carries
// (`--redundancy`): the one plan behind training's sliced and async saves
// (runtime/train/sliced_checkpoint.h) and `ckpt convert` / `ckpt split`
// (ckpt/native.cc), so both place copies and parity the same way.
#ifndef TESSERA_CKPT_SAVE_PLAN_H_
#define TESSERA_CKPT_SAVE_PLAN_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "formats/erasure.h"
#include "formats/manifest.h"
#include "transform/strategy.h"

namespace tessera {

// How much redundancy a save adds:
//   replicas:K  every piece stored in K data files written by K different
//               ranks, on different hosts when there are enough (sliced
//               saves only).
//   parity:G    the data files in groups of G (members on different hosts
//               first), each group with `parity-<g>.tsr`, the XOR of its
//               members: any one lost file of a group is rebuilt.
//   rs:K+M      Reed-Solomon groups of K data files with M parity files
//               `rs-<g>-<j>.tsr` (ISA-L): any M lost files of a group are
//               rebuilt. Placed host-aware (PlanGroups).
// replicas may be combined with one of the others ("replicas:2,rs:4+2");
// "none" is the default.
struct Redundancy {
  int replicas = 1;
  int parity_group = 0;  // 0: no XOR parity
  ErasureCode erasure;   // k == 0: no Reed-Solomon
  static Result<Redundancy> Parse(std::string_view text);
  std::string ToString() const;
  bool none() const { return replicas <= 1 && !has_groups(); }
  bool has_groups() const { return parity_group > 0 || erasure.k > 0; }
};

// A redundancy group over data files (data file r is rank r's): its
// members, and the rank that writes each of its parity files (XOR: one;
// Reed-Solomon: M, parity file j by writers[j]).
struct PlannedGroup {
  std::vector<int64_t> members;
  std::vector<int64_t> writers;
};

// The groups of `redundancy` over data files 0 .. hosts.size() - 1,
// `hosts[r]` being the host of data file r (any ids; equal ids, same host).
//   - Members are taken from the hosts in turn, so a group's members sit on
//     as many hosts as there are.
//   - Each parity file is written by a rank on the host holding the fewest
//     files of the group so far (then preferring a non-member, then the
//     least loaded rank).
//   - Reed-Solomon over two or more hosts: no host holds more than M files
//     of a group, so losing any one host leaves every group repairable, and
//     at most one where there are K + M hosts. Where K data files a group
//     cannot meet that (too few hosts, or ranks spread unevenly), the
//     groups get fewer data files (`groups[i].members.size()` < K): more
//     parity bytes, never a group a host failure takes down. On one host
//     nothing can survive the host; the groups guard against lost files.
//   - A last group may be smaller (Reed-Solomon); a last XOR group of one
//     joins the one before.
Result<std::vector<PlannedGroup>> PlanGroups(const std::vector<int64_t>& hosts,
                                             const Redundancy& redundancy);

// A sliced save: who writes each piece, and the groups.
struct PlannedPiece {
  size_t tensor = 0;
  Box box;  // over the layout's split shape
  // writers[0] stores the piece, the others copies of it. The first
  // `from_memory` of them hold the piece and write it during the data
  // phase; the rest copy writers[0]'s stored bytes afterwards.
  std::vector<int64_t> writers;
  int64_t from_memory = 1;
  int64_t bytes = 0;
};
struct SavePlan {
  std::vector<PlannedPiece> pieces;
  std::vector<PlannedGroup> groups;  // XOR or Reed-Solomon, per `redundancy`
  Redundancy redundancy;
  int64_t world = 0;
  // Copies made after the data phase, or parity: the ranks must exchange
  // their records and write the redundancy before the commit.
  bool needs_redundancy_phase() const;
  // "rs:4+2 in 2 groups (2+2 files: a host holds at most 2 of a group)",
  // "none", ...: what the plan does, for a log line.
  std::string Describe() const;
};
// `hosts[r]`: the host rank r runs on. With replicas 1 each piece is
// written once, by its holders in turn (piece i of the strategy by holder
// i mod holders) so replicas share the writing.
Result<SavePlan> PlanSave(const Strategy& strategy, const std::vector<int64_t>& hosts,
                          const Redundancy& redundancy);

// The pieces rank `rank` writes from memory under `plan`.
struct PieceToWrite {
  size_t tensor = 0;
  Box box;  // over the layout's split shape
};
std::vector<PieceToWrite> PiecesToWrite(const SavePlan& plan, int64_t rank);
// The same without redundancy, every rank on one host.
Result<std::vector<PieceToWrite>> PiecesToWrite(const Strategy& strategy, int64_t rank);

// "rs-<group>-<j>.tsr": parity file j of Reed-Solomon group `group`.
std::string ErasureFileName(int64_t group, int j);

// Writes parity files `rows` of group `group` over its `members` (paths
// and sizes) into `dir`: with XOR parity the one file `xor_name` (rows
// {0}), with Reed-Solomon ErasureFileName(group, j) for each j in rows (K
// being the group's members). Returns them (name, size, checksum) in rows'
// order; training's ranks each write their rows, ckpt convert all of them.
Result<std::vector<FileInfo>> WriteGroupParity(Env* env, const std::string& dir,
                                               const Redundancy& redundancy, int64_t group,
                                               const std::vector<ParityMember>& members,
                                               const std::vector<int>& rows,
                                               const std::string& xor_name);

// Dense host ids for host names ("a", "b", "a" -> 0, 1, 0).
std::vector<int64_t> HostIds(const std::vector<std::string>& names);

// Where a committed manifest's groups could not survive the loss of one
// host, as lines naming the group, the host and its files ("erasure group
// 0: host 'n1' holds 3 of its 6 files; 2 can be rebuilt"). A file with no
// recorded host counts as on a host of its own: only recorded placements
// are judged.
std::vector<std::string> HostLossRisks(const Manifest& manifest);

}  // namespace tessera

#endif  // TESSERA_CKPT_SAVE_PLAN_H_
