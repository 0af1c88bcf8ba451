#include "runtime/model/ps_placement.h"

#include <algorithm>
#include <numeric>

#include "core/byte_size.h"
#include "runtime/parallel/op_strategy.h"

namespace tessera {

Result<PsPlacement> PsPlacement::Create(const std::vector<ParamInfo>& params, int servers,
                                        const std::string& patterns) {
  if (servers < 1) return InvalidArgumentError("--ps-servers must be >= 1");
  PsPlacement out;
  out.servers_ = servers;
  out.on_servers_.assign(params.size(), false);
  for (const ParamInfo& p : params) out.param_floats_.push_back(p.numel);
  // 1. The parameters named.
  if (patterns.empty() || patterns == "all") {
    out.on_servers_.assign(params.size(), true);
  } else {
    size_t start = 0;
    while (start <= patterns.size()) {
      size_t end = patterns.find(',', start);
      if (end == std::string::npos) end = patterns.size();
      std::string pattern = patterns.substr(start, end - start);
      pattern.erase(0, pattern.find_first_not_of(' '));
      pattern.erase(pattern.find_last_not_of(' ') + 1);
      start = end + 1;
      if (pattern.empty()) {
        return InvalidArgumentError("--ps-params '" + patterns + "': an empty pattern");
      }
      bool any = false;
      for (size_t i = 0; i < params.size(); ++i) {
        if (MatchesOpPattern(pattern, params[i].name)) out.on_servers_[i] = any = true;
      }
      if (!any) {
        return InvalidArgumentError("--ps-params: pattern '" + pattern +
                                    "' names no parameter of the model (names are as in "
                                    "checkpoints: wte, h.0.mlp.c_fc.weight, ...; '*' is one "
                                    "dot-free part)");
      }
    }
  }
  int64_t named = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (out.on_servers_[i])
      named += params[i].numel;
    else
      out.local_.push_back(i);
  }
  // 2. Parameters above the fair share cut by rows over every server
  // (torch.chunk's cut; only where it gives each server rows).
  std::vector<int64_t> load(servers, 0);
  std::vector<size_t> whole;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!out.on_servers_[i]) continue;
    const ParamInfo& p = params[i];
    const int64_t rows = p.shape.empty() ? 0 : p.shape[0];
    const int64_t chunk = rows > 0 ? (rows + servers - 1) / servers : 0;
    const bool cut = servers > 1 && p.shape.size() >= 2 && p.numel * servers > named &&
                     chunk * (servers - 1) < rows;
    if (!cut) {
      whole.push_back(i);
      continue;
    }
    const int64_t row = p.numel / rows;
    for (int k = 0; k < servers; ++k) {
      PsPiece piece;
      piece.param = i;
      piece.name = p.name;
      piece.row_begin = k * chunk;
      piece.row_end = std::min(rows, (k + 1) * chunk);
      piece.offset = p.offset + piece.row_begin * row;
      piece.count = (piece.row_end - piece.row_begin) * row;
      piece.decay = p.decay;
      piece.server = k;
      piece.whole = false;
      load[k] += piece.count;
      out.pieces_.push_back(piece);
    }
  }
  // 3. The rest whole, largest first, each onto the least loaded server.
  std::stable_sort(whole.begin(), whole.end(),
                   [&](size_t a, size_t b) { return params[a].numel > params[b].numel; });
  for (size_t i : whole) {
    const int s = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    const ParamInfo& p = params[i];
    PsPiece piece;
    piece.param = i;
    piece.name = p.name;
    piece.row_end = p.shape.empty() ? 1 : p.shape[0];
    piece.offset = p.offset;
    piece.count = p.numel;
    piece.decay = p.decay;
    piece.server = s;
    load[s] += p.numel;
    out.pieces_.push_back(piece);
  }
  std::stable_sort(out.pieces_.begin(), out.pieces_.end(), [](const PsPiece& a, const PsPiece& b) {
    return a.param != b.param ? a.param < b.param : a.row_begin < b.row_begin;
  });
  for (int s = 0; s < servers; ++s) {
    if (load[s] == 0) {
      return InvalidArgumentError(
          "--ps-servers " + std::to_string(servers) + ": server " + std::to_string(s) +
          " would hold nothing (" + std::to_string(out.pieces_.size()) +
          " pieces of parameters to place" +
          (patterns.empty() || patterns == "all" ? std::string()
                                                 : " from --ps-params '" + patterns + "'") +
          "); use at most as many servers as pieces");
    }
  }
  return out;
}

std::vector<size_t> PsPlacement::PiecesOf(int s) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (pieces_[i].server == s) out.push_back(i);
  }
  return out;
}

int64_t PsPlacement::ServerFloats(int s) const {
  int64_t n = 0;
  for (const PsPiece& p : pieces_) {
    if (p.server == s) n += p.count;
  }
  return n;
}

int64_t PsPlacement::LocalFloats() const {
  int64_t n = 0;
  for (size_t i : local_) n += param_floats_[i];
  return n;
}

std::string PsPlacement::Describe() const {
  std::string out;
  for (int s = 0; s < servers_; ++s) {
    std::string names;
    int n = 0;
    for (const PsPiece& p : pieces_) {
      if (p.server != s) continue;
      if (++n <= 4) {
        names += (names.empty() ? "" : ", ") + p.name;
        if (!p.whole) {
          names += "[" + std::to_string(p.row_begin) + ":" + std::to_string(p.row_end) + ")";
        }
      }
    }
    if (n > 4) names += ", ... (" + std::to_string(n) + " pieces)";
    out += "server " + std::to_string(s) + ": " + names + " (" +
           HumanBytes(ServerFloats(s) * static_cast<int64_t>(sizeof(float))) + ")\n";
  }
  out +=
      "workers: " +
      (local_.empty() ? std::string("no parameter of their own")
                      : std::to_string(local_.size()) + " parameters of their own (" +
                            HumanBytes(LocalFloats() * static_cast<int64_t>(sizeof(float))) + ")") +
      "\n";
  return out;
}

int64_t PsMessageFloats(const PsPlacement& placement) {
  // Messages are tags 7 + 2 i (push and pull): at most 16,000 keep them
  // under MPI's smallest tag bound (32,767). A piece's last message may be
  // short, so each piece may add one.
  constexpr int64_t kMessageFloats = int64_t{1} << 20, kMaxMessages = 16000;
  int64_t total = 0;
  for (const PsPiece& p : placement.pieces()) total += p.count;
  const int64_t budget =
      std::max<int64_t>(1000, kMaxMessages - static_cast<int64_t>(placement.pieces().size()));
  return std::max(kMessageFloats, (total + budget - 1) / budget + 1);
}

Result<Strategy> PsStrategy(const std::vector<ParamInfo>& params, const PsPlacement& placement,
                            int world) {
  const int S = placement.servers();
  // (The servers alone when they hold everything: their own saves.)
  if (world < S || (world == S && !placement.local().empty())) {
    return InvalidArgumentError("a parameter-server job of " + std::to_string(world) +
                                " ranks with " + std::to_string(S) + " servers has no worker");
  }
  ASSIGN_OR_RETURN(Mesh ranks, Mesh::Create({"rank"}, {world}));
  ASSIGN_OR_RETURN(Mesh servers, Mesh::Create({"server"}, {S}));
  std::vector<TensorStrategy> tensors;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    TensorStrategy t{p.name, Layout::Replicated(p.full_shape, DType::kF32), std::nullopt};
    if (!placement.OnServers(i)) {
      t.layout.stage_axis = "rank";
      t.layout.stage = S;
      for (int r = S + 1; r < world; ++r) t.layout.copy_stages.push_back(r);
    } else {
      t.mesh = servers;
      const PsPiece* first = nullptr;
      for (const PsPiece& piece : placement.pieces()) {
        if (piece.param == i && first == nullptr) first = &piece;
      }
      if (first->whole) {
        t.layout.stage_axis = "server";
        t.layout.stage = first->server;
      } else {
        t.layout.dim_axes.assign(p.full_shape.size(), {});
        t.layout.dim_axes[0] = {"server"};
      }
    }
    tensors.push_back(std::move(t));
  }
  Strategy strategy(ranks);
  for (const TensorStrategy& t : tensors) RETURN_IF_ERROR(strategy.Add(t));
  for (const TensorStrategy& t : tensors) {
    for (const char* which : {".exp_avg", ".exp_avg_sq"}) {
      TensorStrategy m = t;
      m.name = "optimizer." + t.name + which;
      RETURN_IF_ERROR(strategy.Add(std::move(m)));
    }
  }
  return strategy;
}

}  // namespace tessera
