#include "ckpt/save_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "formats/parity.h"

namespace tessera {

Result<Redundancy> Redundancy::Parse(std::string_view text) {
  Redundancy r;
  if (text == "none" || text.empty()) return r;
  const std::string all(text);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("redundancy '" + all + "': " + why);
  };
  size_t at = 0;
  bool replicas_seen = false;
  while (at <= all.size()) {
    const size_t comma = std::min(all.find(',', at), all.size());
    const std::string item = all.substr(at, comma - at);
    at = comma + 1;
    if (item.rfind("rs:", 0) == 0) {
      if (r.has_groups()) return bad("give one of parity:G and rs:K+M");
      ASSIGN_OR_RETURN(r.erasure, ErasureCode::Parse(item));
      continue;
    }
    const size_t colon = item.find(':');
    const std::string kind = item.substr(0, colon);
    long long n = 0;
    size_t used = 0;
    try {
      if (colon != std::string::npos) n = std::stoll(item.substr(colon + 1), &used);
    } catch (...) {
      used = 0;
    }
    if (colon == std::string::npos || used == 0 || colon + 1 + used != item.size()) {
      return bad(
          "use none, replicas:K, parity:G or rs:K+M (replicas may be combined with one "
          "of the others, comma-separated)");
    }
    if (kind == "replicas" && n >= 1 && n <= 64 && !replicas_seen) {
      r.replicas = static_cast<int>(n);
      replicas_seen = true;
    } else if (kind == "parity" && n >= 2 && n <= 1024 && !r.has_groups()) {
      r.parity_group = static_cast<int>(n);
    } else if ((kind == "parity" && r.has_groups()) || (kind == "replicas" && replicas_seen)) {
      return bad("'" + item + "' repeats a kind (give one of parity:G and rs:K+M, replicas once)");
    } else {
      return bad("'" + item + "' (replicas:K takes K from 1 to 64, parity:G takes G from 2)");
    }
  }
  return r;
}

std::string Redundancy::ToString() const {
  std::string out;
  if (replicas > 1) out = "replicas:" + std::to_string(replicas);
  if (parity_group > 0) {
    out += (out.empty() ? "" : ",") + std::string("parity:") + std::to_string(parity_group);
  }
  if (erasure.k > 0) out += (out.empty() ? "" : ",") + erasure.ToString();
  return out.empty() ? "none" : out;
}

namespace {

// Group sizes over n data files: groups of k, a smaller last one; for XOR
// (`xor_parity`) a last group of one joins the one before, and one file
// alone has no group.
std::vector<int64_t> GroupSizes(int64_t n, int64_t k, bool xor_parity) {
  std::vector<int64_t> sizes;
  if (xor_parity && n < 2) return sizes;
  for (int64_t at = 0; at < n; at += k) sizes.push_back(std::min(k, n - at));
  if (xor_parity && sizes.size() > 1 && sizes.back() == 1) {
    sizes.pop_back();
    ++sizes.back();
  }
  return sizes;
}

// Groups of the given sizes with `parity` writers each, placed as PlanGroups
// says.
std::vector<PlannedGroup> BuildGroups(const std::vector<int64_t>& hosts,
                                      const std::vector<int64_t>& sizes, int parity) {
  const int64_t n = static_cast<int64_t>(hosts.size());
  std::map<int64_t, int64_t> remaining;  // host -> ranks not in a group yet
  for (int64_t h : hosts) ++remaining[h];
  std::vector<bool> used(n, false);
  std::vector<int64_t> parity_load(n, 0);
  std::vector<PlannedGroup> groups;
  for (int64_t size : sizes) {
    PlannedGroup g;
    std::map<int64_t, int64_t> in_group;  // host -> files of this group
    for (int64_t pick = 0; pick < size; ++pick) {
      // The host with the fewest members so far, then the most ranks left.
      int64_t best = -1;
      for (int64_t r = 0; r < n; ++r) {
        if (used[r]) continue;
        if (best < 0) {
          best = r;
          continue;
        }
        const auto key = [&](int64_t x) {
          return std::make_tuple(in_group[hosts[x]], -remaining[hosts[x]], x);
        };
        if (key(r) < key(best)) best = r;
      }
      used[best] = true;
      --remaining[hosts[best]];
      ++in_group[hosts[best]];
      g.members.push_back(best);
    }
    std::sort(g.members.begin(), g.members.end());
    for (int j = 0; j < parity; ++j) {
      int64_t best = -1;
      const auto key = [&](int64_t x) {
        const bool member = std::binary_search(g.members.begin(), g.members.end(), x);
        return std::make_tuple(in_group[hosts[x]], member ? 1 : 0, parity_load[x], x);
      };
      for (int64_t r = 0; r < n; ++r) {
        if (std::find(g.writers.begin(), g.writers.end(), r) != g.writers.end()) continue;
        if (best < 0 || key(r) < key(best)) best = r;
      }
      if (best < 0) best = g.members[0];  // fewer ranks than parity files: one writes several
      ++in_group[hosts[best]];
      ++parity_load[best];
      g.writers.push_back(best);
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

// The most files of one group any host holds.
int64_t MostOnOneHost(const std::vector<int64_t>& hosts, const std::vector<PlannedGroup>& groups) {
  int64_t most = 0;
  for (const PlannedGroup& g : groups) {
    std::map<int64_t, int64_t> count;
    for (int64_t r : g.members) most = std::max(most, ++count[hosts[r]]);
    for (int64_t r : g.writers) most = std::max(most, ++count[hosts[r]]);
  }
  return most;
}

}  // namespace

Result<std::vector<PlannedGroup>> PlanGroups(const std::vector<int64_t>& hosts,
                                             const Redundancy& redundancy) {
  if (!redundancy.has_groups() || hosts.empty()) return std::vector<PlannedGroup>();
  const bool rs = redundancy.erasure.k > 0;
  if (rs && redundancy.parity_group > 0) {
    return InvalidArgumentError("redundancy " + redundancy.ToString() +
                                ": give one of parity:G and rs:K+M");
  }
  const int m = rs ? redundancy.erasure.m : 1;
  const int64_t n = static_cast<int64_t>(hosts.size());
  const size_t host_count = std::set<int64_t>(hosts.begin(), hosts.end()).size();
  for (int64_t k = std::min<int64_t>(n, rs ? redundancy.erasure.k : redundancy.parity_group);;
       --k) {
    std::vector<PlannedGroup> groups = BuildGroups(hosts, GroupSizes(n, k, !rs), m);
    if (!rs || host_count < 2 || k == 1 || MostOnOneHost(hosts, groups) <= m) return groups;
  }
}

bool SavePlan::needs_redundancy_phase() const {
  if (!groups.empty()) return true;
  for (const PlannedPiece& p : pieces) {
    if (static_cast<int64_t>(p.writers.size()) > p.from_memory) return true;
  }
  return false;
}

std::string SavePlan::Describe() const {
  std::string out = redundancy.ToString();
  if (groups.empty()) return out;
  size_t widest = 0;
  for (const PlannedGroup& g : groups) widest = std::max(widest, g.members.size());
  out += ": " + std::to_string(groups.size()) + (groups.size() == 1 ? " group" : " groups") +
         " of up to " + std::to_string(widest) + " data files";
  if (redundancy.erasure.k > 0 && static_cast<int>(widest) < redundancy.erasure.k &&
      static_cast<int64_t>(widest) < world) {
    out += " (fewer than " + std::to_string(redundancy.erasure.k) +
           " so that no host holds more than " + std::to_string(redundancy.erasure.m) +
           " files of a group)";
  }
  return out;
}

namespace {

// Adds to `writers` (up to `want`) candidates in order, first those on a
// host not used yet, then any not already in.
void Pick(const std::vector<int64_t>& candidates, const std::vector<int64_t>& hosts, size_t want,
          std::vector<int64_t>* writers) {
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t c : candidates) {
      if (writers->size() >= want) return;
      if (std::find(writers->begin(), writers->end(), c) != writers->end()) continue;
      const bool host_used = std::any_of(writers->begin(), writers->end(),
                                         [&](int64_t w) { return hosts[w] == hosts[c]; });
      if (pass == 0 && host_used) continue;
      writers->push_back(c);
    }
  }
}

}  // namespace

Result<SavePlan> PlanSave(const Strategy& strategy, const std::vector<int64_t>& hosts,
                          const Redundancy& redundancy) {
  SavePlan plan;
  const int64_t world = strategy.mesh().world_size();
  plan.world = world;
  plan.redundancy = redundancy;
  if (static_cast<int64_t>(hosts.size()) != world) {
    return InvalidArgumentError("save plan: " + std::to_string(hosts.size()) + " host ids for " +
                                std::to_string(world) + " ranks");
  }
  if (redundancy.replicas > world) {
    return InvalidArgumentError("redundancy replicas:" + std::to_string(redundancy.replicas) +
                                " needs that many ranks; the job has " + std::to_string(world));
  }
  const size_t want = static_cast<size_t>(std::max(1, redundancy.replicas));
  std::vector<int64_t> load(world, 0);  // bytes each rank writes, for the copies' placement
  int64_t turn = 0;  // over the whole strategy: small replicated tensors spread too
  for (size_t i = 0; i < strategy.tensors().size(); ++i) {
    const TensorStrategy& t = strategy.tensors()[i];
    const Mesh& mesh = t.mesh.has_value() ? *t.mesh : strategy.mesh();
    ASSIGN_OR_RETURN(std::vector<ReplicaGroup> groups, ReplicaGroups(t.layout, mesh));
    for (const ReplicaGroup& g : groups) {
      if (IsEmpty(g.box) || g.ranks.empty()) continue;
      PlannedPiece p{i, g.box, {}, 0, NumElements(g.box) * DTypeSize(t.layout.dtype)};
      // Holders in turn, from this piece's turn on; then the least loaded
      // others.
      const int64_t n = static_cast<int64_t>(g.ranks.size()), first = turn++ % n;
      std::vector<int64_t> holders;
      for (int64_t k = 0; k < n; ++k) holders.push_back(g.ranks[(first + k) % n]);
      Pick(holders, hosts, want, &p.writers);
      p.from_memory = static_cast<int64_t>(p.writers.size());
      if (p.writers.size() < want) {
        std::vector<int64_t> others;
        for (int64_t r = 0; r < world; ++r) {
          if (!std::binary_search(g.ranks.begin(), g.ranks.end(), r)) others.push_back(r);
        }
        std::stable_sort(others.begin(), others.end(),
                         [&](int64_t a, int64_t b) { return load[a] < load[b]; });
        Pick(others, hosts, want, &p.writers);
      }
      for (int64_t w : p.writers) load[w] += p.bytes;
      plan.pieces.push_back(std::move(p));
    }
  }
  ASSIGN_OR_RETURN(plan.groups, PlanGroups(hosts, redundancy));
  return plan;
}

std::vector<PieceToWrite> PiecesToWrite(const SavePlan& plan, int64_t rank) {
  std::vector<PieceToWrite> out;
  for (const PlannedPiece& p : plan.pieces) {
    for (int64_t k = 0; k < p.from_memory; ++k) {
      if (p.writers[k] == rank) out.push_back({p.tensor, p.box});
    }
  }
  return out;
}

Result<std::vector<PieceToWrite>> PiecesToWrite(const Strategy& strategy, int64_t rank) {
  ASSIGN_OR_RETURN(SavePlan plan,
                   PlanSave(strategy, std::vector<int64_t>(strategy.mesh().world_size(), 0), {}));
  return PiecesToWrite(plan, rank);
}

std::string ErasureFileName(int64_t group, int j) {
  return "rs-" + std::to_string(group) + "-" + std::to_string(j) + ".tsr";
}

Result<std::vector<FileInfo>> WriteGroupParity(Env* env, const std::string& dir,
                                               const Redundancy& redundancy, int64_t group,
                                               const std::vector<ParityMember>& members,
                                               const std::vector<int>& rows,
                                               const std::string& xor_name) {
  if (redundancy.erasure.k == 0) {
    FileInfo info{xor_name, 0, 0};
    ASSIGN_OR_RETURN(info.size,
                     WriteParityFile(env, members, JoinPath(dir, xor_name), &info.checksum));
    return std::vector<FileInfo>{std::move(info)};
  }
  ErasureCode code = redundancy.erasure;
  code.k = static_cast<int>(members.size());
  std::vector<std::string> paths;
  std::vector<FileInfo> out;
  uint64_t longest = 0;
  for (const ParityMember& m : members) longest = std::max(longest, m.size);
  for (int j : rows) {
    out.push_back({ErasureFileName(group, j), longest, 0});
    paths.push_back(JoinPath(dir, out.back().name));
  }
  std::vector<uint64_t> checksums;
  RETURN_IF_ERROR(WriteErasureParityRows(env, code, members, rows, paths, &checksums));
  for (size_t i = 0; i < out.size(); ++i) out[i].checksum = checksums[i];
  return out;
}

std::vector<int64_t> HostIds(const std::vector<std::string>& names) {
  std::map<std::string, int64_t> ids;
  std::vector<int64_t> out;
  for (const std::string& n : names) {
    out.push_back(ids.emplace(n, static_cast<int64_t>(ids.size())).first->second);
  }
  return out;
}

std::vector<std::string> HostLossRisks(const Manifest& manifest) {
  std::vector<std::string> out;
  auto judge = [&](const std::string& what, const std::vector<uint32_t>& files, size_t rebuilds) {
    std::map<std::string, std::vector<std::string>> by_host;
    for (uint32_t f : files) {
      if (f >= manifest.files.size() || manifest.files[f].host.empty()) continue;
      by_host[manifest.files[f].host].push_back(manifest.files[f].name);
    }
    for (const auto& [host, names] : by_host) {
      if (names.size() <= rebuilds) continue;
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "'" : ", '") + n + "'";
      out.push_back(what + ": host '" + host + "' holds " + std::to_string(names.size()) +
                    " of its " + std::to_string(files.size()) + " files (" + list + "); " +
                    std::to_string(rebuilds) + " can be rebuilt");
    }
  };
  for (size_t g = 0; g < manifest.erasure_groups.size(); ++g) {
    const ErasureGroup& e = manifest.erasure_groups[g];
    std::vector<uint32_t> files = e.members;
    files.insert(files.end(), e.parity.begin(), e.parity.end());
    judge("erasure group " + std::to_string(g), files, e.parity.size());
  }
  for (size_t g = 0; g < manifest.parity_groups.size(); ++g) {
    std::vector<uint32_t> files = manifest.parity_groups[g].members;
    files.push_back(manifest.parity_groups[g].parity);
    judge("parity group " + std::to_string(g), files, 1);
  }
  return out;
}

}  // namespace tessera
