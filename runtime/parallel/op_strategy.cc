#include "runtime/parallel/op_strategy.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/env.h"

namespace tessera {
namespace {

using Json = nlohmann::ordered_json;

std::string DimName(int d) { return "dimension " + std::to_string(d); }

// One dimension's entry: null, "-", 1, "tp", ["dp", "tp"], or a count.
Status ParseDim(const Json& j, DimAxes* axes, int64_t* count) {
  *count = 1;
  axes->clear();
  if (j.is_null()) return Status::Ok();
  if (j.is_number_integer()) {
    *count = j.get<int64_t>();
    if (*count < 1) return InvalidArgumentError("split count " + j.dump() + " is below 1");
    return Status::Ok();
  }
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s != "-" && s != "1" && !s.empty()) axes->push_back(s);
    return Status::Ok();
  }
  if (j.is_array()) {
    for (const Json& a : j) {
      if (!a.is_string())
        return InvalidArgumentError("axis list " + j.dump() + " holds a non-name");
      axes->push_back(a.get<std::string>());
    }
    return Status::Ok();
  }
  return InvalidArgumentError("dimension entry " + j.dump() +
                              " is not null, an axis name, a list of names or a split count");
}

Result<int> OptionalInt(const Json& root, const char* key, int min) {
  const Json& j = root.at(key);
  if (!j.is_number_integer() || j.get<int64_t>() < min) {
    return InvalidArgumentError(std::string("\"") + key +
                                "\" must be an integer >= " + std::to_string(min));
  }
  return j.get<int>();
}

// The axes (mesh order, pp excluded) whose sizes multiply to `count`.
std::vector<DimAxes> AxesWithProduct(const Mesh& mesh, int64_t count) {
  std::vector<int> candidates;
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (mesh.axis_name(a) != "pp" && mesh.axis_size(a) > 1) candidates.push_back(a);
  }
  std::vector<DimAxes> out;
  const int n = static_cast<int>(candidates.size());
  for (int mask = 1; mask < (1 << n); ++mask) {
    int64_t product = 1;
    DimAxes axes;
    for (int i = 0; i < n; ++i) {
      if (mask & (1 << i)) {
        product *= mesh.axis_size(candidates[i]);
        axes.push_back(mesh.axis_name(candidates[i]));
      }
    }
    if (product == count) out.push_back(std::move(axes));
  }
  return out;
}

std::string AxesText(const DimAxes& axes) {
  if (axes.empty()) return "-";
  std::string s;
  for (const std::string& a : axes) s += (s.empty() ? "" : "*") + a;
  return s;
}

}  // namespace

std::string OpStrategy::ToString() const {
  std::string s = "(";
  for (size_t i = 0; i < inputs.size(); ++i) {
    s += i ? ", (" : "(";
    for (size_t d = 0; d < inputs[i].size(); ++d) s += (d ? ", " : "") + AxesText(inputs[i][d]);
    s += inputs[i].size() == 1 ? ",)" : ")";
  }
  return s + (inputs.size() == 1 ? ",)" : ")");  // Python's one-element tuples
}

Result<Recompute> ParseRecompute(std::string_view text) {
  if (text == "none") return Recompute::kNone;
  if (text == "full") return Recompute::kFull;
  if (text == "selective") return Recompute::kSelective;
  return InvalidArgumentError("recompute '" + std::string(text) +
                              "' is not one of none, full, selective");
}

std::string_view RecomputeName(Recompute r) {
  return r == Recompute::kFull ? "full" : r == Recompute::kSelective ? "selective" : "none";
}

bool MatchesOpPattern(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return name.empty();
  if (pattern[0] != '*') {
    return !name.empty() && name[0] == pattern[0] &&
           MatchesOpPattern(pattern.substr(1), name.substr(1));
  }
  // '*': one or more characters other than '.'.
  for (size_t n = 1; n <= name.size() && name[n - 1] != '.'; ++n) {
    if (MatchesOpPattern(pattern.substr(1), name.substr(n))) return true;
  }
  return false;
}

std::string OffloadKinds::Name() const {
  if (!optimizer && !params) return "none";
  return optimizer && params ? "optimizer,params" : optimizer ? "optimizer" : "params";
}

Result<OffloadKinds> ParseOffload(const std::string& text) {
  OffloadKinds kinds;
  if (text == "none") return kinds;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string kind = text.substr(at, comma - at);
    if (kind == "optimizer") {
      kinds.optimizer = true;
    } else if (kind == "params") {
      kinds.params = true;
    } else {
      return InvalidArgumentError("offload '" + text +
                                  "': expected none, optimizer (Adam's moments on disk) or "
                                  "optimizer,params (the weights too)");
    }
    at = comma + 1;
  }
  return kinds;
}

Result<OpStrategyFile> OpStrategyFile::Parse(std::string_view text, const std::string& source) {
  auto fail = [&](const std::string& what) {
    return InvalidArgumentError("operator strategy file " + source + ": " + what);
  };
  Json root;
  try {
    root = Json::parse(text);
  } catch (const std::exception& e) {
    return fail(std::string("not JSON: ") + e.what());
  }
  if (!root.is_object()) return fail("the top level must be a JSON object");
  if (!root.contains("format") || !root.at("format").is_string()) {
    return fail("no \"format\" key (expected \"" + std::string(kOpStrategyFormat) + "\")");
  }
  const std::string format = root.at("format").get<std::string>();
  if (format == "tessera.strategy") {
    return fail(
        "this is a layout strategy file (tensor layouts, for ckpt --strategy), not an "
        "operator strategy file (\"format\": \"" +
        std::string(kOpStrategyFormat) + "\")");
  }
  if (format != kOpStrategyFormat) {
    return fail("\"format\" is '" + format + "', expected '" + std::string(kOpStrategyFormat) +
                "'");
  }
  if (root.value("version", 1) != 1) {
    return fail("version " + root.at("version").dump() + " is not 1, the version this reads");
  }
  OpStrategyFile file;
  file.source = source;
  for (const auto& [key, value] : root.items()) {
    if (key == "format" || key == "version" || key == "operators") continue;
    if (key == "mesh") {
      if (!value.is_object()) return fail("\"mesh\" must be an object like {\"dp\": 2, \"tp\": 2}");
      for (const auto& [axis, size] : value.items()) {
        if (!size.is_number_integer() || size.get<int64_t>() < 1) {
          return fail("mesh axis '" + axis + "' must have a size >= 1");
        }
        const int v = size.get<int>();
        if (axis == "pp") {
          file.pp = v;
        } else if (axis == "dp") {
          file.dp = v;
        } else if (axis == "tp") {
          file.tp = v;
        } else if (axis == "cp") {
          file.cp = v;
        } else {
          return fail("mesh axis '" + axis + "' is not one of pp, dp, cp, tp");
        }
      }
    } else if (key == "cp_algo") {
      const std::string a = value.is_string() ? value.get<std::string>() : value.dump();
      const Result<CpAlgo> algo = ParseCpAlgo(a);
      if (!algo.ok()) return fail(algo.status().message());
      file.cp_algo = *algo;
    } else if (key == "offload") {
      const std::string o = value.is_string() ? value.get<std::string>() : value.dump();
      const Result<OffloadKinds> kinds = ParseOffload(o);
      if (!kinds.ok()) return fail(kinds.status().message());
      file.offload = *kinds;
    } else if (key == "offload_dir") {
      if (!value.is_string() || value.get<std::string>().empty()) {
        return fail("\"offload_dir\" must be a directory's path");
      }
      file.offload_dir = value.get<std::string>();
    } else if (key == "ps_servers") {
      auto n = OptionalInt(root, "ps_servers", 0);
      if (!n.ok()) return fail(n.status().message());
      file.ps_servers = *n;
    } else if (key == "ps_params") {
      if (!value.is_string() || value.get<std::string>().empty()) {
        return fail(
            "\"ps_params\" must be \"all\" or parameter names and patterns, "
            "comma-separated");
      }
      file.ps_params = value.get<std::string>();
    } else if (key == "ps_staleness") {
      auto k = OptionalInt(root, "ps_staleness", 0);
      if (!k.ok()) return fail(k.status().message());
      file.ps_staleness = *k;
    } else if (key == "zero") {
      auto z = OptionalInt(root, "zero", 0);
      if (!z.ok() || *z > 1) return fail("\"zero\" must be 0 or 1");
      file.zero = *z;
    } else if (key == "micro_batches") {
      auto m = OptionalInt(root, "micro_batches", 1);
      if (!m.ok()) return fail(m.status().message());
      file.micro_batches = *m;
    } else if (key == "virtual_stages") {
      auto v = OptionalInt(root, "virtual_stages", 1);
      if (!v.ok()) return fail(v.status().message());
      file.virtual_stages = *v;
    } else if (key == "micro_batch_interleave") {
      auto n = OptionalInt(root, "micro_batch_interleave", 1);
      if (!n.ok()) return fail(n.status().message());
      file.micro_batch_interleave = *n;
    } else if (key == "stage_layers") {
      if (!value.is_array()) return fail("\"stage_layers\" must be a list of layer counts");
      for (const Json& n : value) {
        if (!n.is_number_integer() || n.get<int64_t>() < 1) {
          return fail("\"stage_layers\" entries must be layer counts >= 1");
        }
        file.stage_layers.push_back(n.get<int>());
      }
    } else if (key == "dataset_strategy") {
      if (value.is_string()) {
        file.dataset_strategy = value.get<std::string>();
        if (file.dataset_strategy != "data_parallel" && file.dataset_strategy != "full_batch" &&
            file.dataset_strategy != "sequence") {
          return fail("dataset_strategy '" + file.dataset_strategy +
                      "' is not data_parallel, full_batch, sequence or a layout like [[\"dp\", "
                      "1], [\"dp\", 1]]");
        }
        continue;
      }
      // The inputs' layouts: each [batch, sequence], the batch over dp, the
      // sequence whole or over cp (MindSpore's model-parallel import).
      const std::string bad = "dataset_strategy " + value.dump() +
                              ": the batch may be cut over dp and the sequence over cp "
                              "([[\"dp\", \"cp\"], [\"dp\", \"cp\"]] or [[\"dp\", 1], "
                              "[\"dp\", 1]]), or full_batch";
      if (!value.is_array() || value.empty()) return fail(bad);
      std::optional<bool> by_sequence;
      for (const Json& input : value) {
        DimAxes batch, seq;
        int64_t bc = 1, sc = 1;
        if (!input.is_array() || input.size() != 2 || !ParseDim(input[0], &batch, &bc).ok() ||
            !ParseDim(input[1], &seq, &sc).ok() ||
            !(batch == DimAxes{"dp"} || (batch.empty() && bc >= 1)) ||
            !(seq == DimAxes{"cp"} || (seq.empty() && sc >= 1))) {
          return fail(bad);
        }
        const bool cut = !seq.empty() || sc > 1;
        if (by_sequence.has_value() && *by_sequence != cut) {
          return fail("dataset_strategy " + value.dump() +
                      ": the inputs (tokens and targets) must be cut alike");
        }
        by_sequence = cut;
        if (batch.empty()) file.dataset_count = static_cast<int>(bc);
        if (seq.empty() && sc > 1) file.dataset_seq_count = static_cast<int>(sc);
      }
      file.dataset_strategy = *by_sequence ? "sequence" : "data_parallel";
    } else if (key == "recompute") {
      if (!value.is_object()) return fail("\"recompute\" must map blocks (\"h.*\") to modes");
      for (const auto& [block, mode] : value.items()) {
        const std::string m = mode.is_string() ? mode.get<std::string>() : mode.dump();
        const Result<Recompute> r = ParseRecompute(m);
        if (!r.ok()) {
          return fail("recompute of '" + block + "' is " + m + ", not none, full or selective");
        }
        file.recompute.emplace_back(block, *r);
      }
    } else {
      return fail("unknown key \"" + key + "\"");
    }
  }
  if (root.contains("operators")) {
    const Json& ops = root.at("operators");
    if (!ops.is_object()) return fail("\"operators\" must map operator names to strategies");
    for (const auto& [pattern, strategy] : ops.items()) {
      Entry e;
      e.pattern = pattern;
      if (!strategy.is_array()) {
        return fail("operator '" + pattern + "': a strategy is a list with one entry per input");
      }
      for (const Json& input : strategy) {
        if (!input.is_array()) {
          return fail("operator '" + pattern + "': input " + std::to_string(e.axes.size()) +
                      " must be a list with one entry per dimension");
        }
        std::vector<DimAxes> axes;
        std::vector<int64_t> counts;
        for (const Json& dim : input) {
          DimAxes a;
          int64_t c = 1;
          const Status s = ParseDim(dim, &a, &c);
          if (!s.ok()) {
            return fail("operator '" + pattern + "' input " + std::to_string(e.axes.size()) + " " +
                        DimName(static_cast<int>(axes.size())) + ": " + s.message());
          }
          axes.push_back(std::move(a));
          counts.push_back(c);
        }
        e.axes.push_back(std::move(axes));
        e.counts.push_back(std::move(counts));
      }
      file.operators.push_back(std::move(e));
    }
  }
  return file;
}

std::string OpStrategyFile::ToJson() const {
  Json root;
  root["format"] = kOpStrategyFormat;
  root["version"] = 1;
  Json mesh = Json::object();
  for (auto [name, v] : {std::pair{"pp", pp}, {"dp", dp}, {"cp", cp}, {"tp", tp}}) {
    if (v.has_value()) mesh[name] = *v;
  }
  if (!mesh.empty()) root["mesh"] = mesh;
  if (cp_algo.has_value()) root["cp_algo"] = CpAlgoName(*cp_algo);
  if (offload.has_value()) root["offload"] = offload->Name();
  if (!offload_dir.empty()) root["offload_dir"] = offload_dir;
  if (zero.has_value()) root["zero"] = *zero;
  if (ps_servers.has_value()) root["ps_servers"] = *ps_servers;
  if (!ps_params.empty()) root["ps_params"] = ps_params;
  if (ps_staleness.has_value()) root["ps_staleness"] = *ps_staleness;
  if (micro_batches.has_value()) root["micro_batches"] = *micro_batches;
  if (virtual_stages.has_value()) root["virtual_stages"] = *virtual_stages;
  if (micro_batch_interleave.has_value()) {
    root["micro_batch_interleave"] = *micro_batch_interleave;
  }
  if (!stage_layers.empty()) root["stage_layers"] = stage_layers;
  if (!recompute.empty()) {
    Json r = Json::object();
    for (const auto& [block, mode] : recompute) r[block] = RecomputeName(mode);
    root["recompute"] = r;
  }
  if (!dataset_strategy.empty()) root["dataset_strategy"] = dataset_strategy;
  Json ops = Json::object();
  for (const Entry& e : operators) {
    Json inputs = Json::array();
    for (size_t i = 0; i < e.axes.size(); ++i) {
      Json dims = Json::array();
      for (size_t d = 0; d < e.axes[i].size(); ++d) {
        const DimAxes& a = e.axes[i][d];
        const int64_t count = i < e.counts.size() && d < e.counts[i].size() ? e.counts[i][d] : 1;
        if (a.empty()) {
          dims.push_back(count > 1 ? Json(count) : Json(nullptr));
        } else if (a.size() == 1) {
          dims.push_back(a[0]);
        } else {
          dims.push_back(a);
        }
      }
      inputs.push_back(dims);
    }
    ops[e.pattern] = inputs;
  }
  root["operators"] = ops;
  // One operator per line: the strategies stay readable.
  std::string out = "{\n";
  bool first = true;
  for (const auto& [key, value] : root.items()) {
    out += first ? "" : ",\n";
    first = false;
    if (key != "operators") {
      out += "  " + Json(key).dump() + ": " + value.dump();
      continue;
    }
    out += "  \"operators\": {";
    bool first_op = true;
    for (const auto& [name, st] : value.items()) {
      out += std::string(first_op ? "\n" : ",\n") + "    " + Json(name).dump() + ": " + st.dump();
      first_op = false;
    }
    out += "\n  }";
  }
  return out + "\n}\n";
}

Result<OpStrategyFile> OpStrategyFile::Load(const std::string& path) {
  auto text = ReadFileToString(Env::Default(), path);
  if (!text.ok()) {
    return Status(text.status().code(),
                  "operator strategy file " + path + ": " + text.status().message());
  }
  return Parse(*text, path);
}

Status CheckOpStrategy(const OpSignature& op, const OpStrategy& s, const Mesh& mesh,
                       const std::string& where) {
  auto fail = [&](const std::string& what) {
    return InvalidArgumentError(where + ": operator '" + op.name + "': " + what);
  };
  if (s.inputs.size() != op.inputs.size()) {
    return fail("a " + op.kind + " has " + std::to_string(op.inputs.size()) +
                " inputs; the strategy gives " + std::to_string(s.inputs.size()));
  }
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const OpSignature::Input& in = op.inputs[i];
    if (s.inputs[i].size() != in.shape.size()) {
      return fail("input " + std::to_string(i) + " (" + in.name + ") has " +
                  std::to_string(in.shape.size()) + " dimensions; the strategy gives " +
                  std::to_string(s.inputs[i].size()));
    }
    std::vector<std::string> used;
    for (size_t d = 0; d < in.shape.size(); ++d) {
      const std::string at =
          "input " + std::to_string(i) + " (" + in.name + ") " + DimName(static_cast<int>(d));
      int64_t ways = 1;
      for (const std::string& a : s.inputs[i][d]) {
        const int axis = mesh.FindAxis(a);
        if (axis < 0)
          return fail(at + ": the mesh " + mesh.ToString() + " has no axis '" + a + "'");
        if (a == "pp")
          return fail(at + ": 'pp' is the pipeline's axis; stages are set by stage_layers");
        if (std::find(used.begin(), used.end(), a) != used.end()) {
          return fail(at + ": axis '" + a + "' cuts two dimensions of one input");
        }
        used.push_back(a);
        ways *= mesh.axis_size(axis);
      }
      const int64_t size = in.shape[d];
      const bool uneven = std::find(in.uneven.begin(), in.uneven.end(), d) != in.uneven.end();
      if (size >= 0 && !uneven && size % ways != 0) {
        return fail(at + " of size " + std::to_string(size) + " is not divisible by " +
                    AxesText(s.inputs[i][d]) + " = " + std::to_string(ways));
      }
      if (size >= 0 && uneven && size < ways) {
        return fail(at + " of size " + std::to_string(size) + " cannot be cut " +
                    std::to_string(ways) + " ways");
      }
    }
  }
  return Status::Ok();
}

Result<std::map<std::string, OpStrategy>> ResolveOpStrategies(const OpStrategyFile& file,
                                                              const std::vector<OpSignature>& ops,
                                                              const Mesh& mesh, bool named_only) {
  const std::string where = file.source.empty() ? "operator strategy" : file.source;
  auto fail = [&](const std::string& op, const std::string& what) {
    return InvalidArgumentError(where + ": operator '" + op + "': " + what);
  };
  // Which entry gives each operator its strategy.
  std::map<std::string, const OpStrategyFile::Entry*> chosen;
  for (const OpStrategyFile::Entry& e : file.operators) {
    const bool exact = e.pattern.find('*') == std::string::npos;
    bool matched = false;
    for (const OpSignature& op : ops) {
      if (!MatchesOpPattern(e.pattern, op.name)) continue;
      matched = true;
      const OpStrategyFile::Entry*& c = chosen[op.name];
      if (c == nullptr || exact) {
        c = &e;
      } else if (c->pattern.find('*') != std::string::npos &&
                 (c->axes != e.axes || c->counts != e.counts)) {
        return fail(op.name, "patterns '" + c->pattern + "' and '" + e.pattern +
                                 "' give it different strategies");
      }
    }
    if (!matched) {
      std::string known;
      for (size_t i = 0; i < ops.size() && i < 6; ++i) known += (i ? ", " : "") + ops[i].name;
      return InvalidArgumentError(where + ": '" + e.pattern +
                                  "' names no operator of the model (operators: " + known +
                                  (ops.size() > 6 ? ", ...)" : ")"));
    }
  }
  DimAxes all;  // data parallel: every axis but the pipeline's
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (mesh.axis_name(a) != "pp" && mesh.axis_size(a) > 1) all.push_back(mesh.axis_name(a));
  }
  std::map<std::string, OpStrategy> out;
  // A parameter's layout and the operator that gave it first.
  std::map<std::string, std::pair<InputStrategy, std::string>> params;
  for (const OpSignature& op : ops) {
    OpStrategy s;
    auto it = chosen.find(op.name);
    if (it == chosen.end() && named_only) continue;
    if (it == chosen.end()) {
      for (size_t i = 0; i < op.inputs.size(); ++i) {
        InputStrategy in(op.inputs[i].shape.size());
        if (!in.empty() && op.inputs[i].shape[0] < 0) in[0] = all;  // the rows
        s.inputs.push_back(std::move(in));
      }
    } else {
      const OpStrategyFile::Entry& e = *it->second;
      if (e.axes.size() != op.inputs.size()) {
        return fail(op.name, "a " + op.kind + " has " + std::to_string(op.inputs.size()) +
                                 " inputs; the strategy gives " + std::to_string(e.axes.size()));
      }
      for (size_t i = 0; i < op.inputs.size(); ++i) {
        const OpSignature::Input& in = op.inputs[i];
        if (e.axes[i].size() != in.shape.size()) {
          return fail(op.name, "input " + std::to_string(i) + " (" + in.name + ") has " +
                                   std::to_string(in.shape.size()) +
                                   " dimensions; the strategy gives " +
                                   std::to_string(e.axes[i].size()));
        }
        InputStrategy dims;
        for (size_t d = 0; d < in.shape.size(); ++d) {
          DimAxes axes = e.axes[i][d];
          if (const int64_t count = e.counts[i][d]; count > 1) {
            std::vector<DimAxes> c = AxesWithProduct(mesh, count);
            const std::string at = "input " + std::to_string(i) + " (" + in.name + ") " +
                                   DimName(static_cast<int>(d)) + ": split count " +
                                   std::to_string(count);
            if (c.empty())
              return fail(op.name, at + " is no product of the mesh's axes " + mesh.ToString());
            if (c.size() > 1) {
              std::string options;
              for (const DimAxes& a : c) options += (options.empty() ? "" : " or ") + AxesText(a);
              return fail(op.name, at + " is ambiguous on mesh " + mesh.ToString() + " (" +
                                       options + "): name the axes instead");
            }
            axes = c[0];
          }
          dims.push_back(std::move(axes));
        }
        s.inputs.push_back(std::move(dims));
      }
    }
    RETURN_IF_ERROR(CheckOpStrategy(op, s, mesh, where));
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const OpSignature::Input& in = op.inputs[i];
      if (!in.param.empty()) {
        auto [p, inserted] = params.emplace(in.param, std::pair{s.inputs[i], op.name});
        if (!inserted && p->second.first != s.inputs[i]) {
          OpStrategy a{{p->second.first}}, b{{s.inputs[i]}};
          return InvalidArgumentError(where + ": parameter '" + in.param + "' is cut " +
                                      a.ToString() + " by operator '" + p->second.second +
                                      "' but " + b.ToString() + " by operator '" + op.name +
                                      "': one parameter needs one layout");
        }
      }
    }
    out.emplace(op.name, std::move(s));
  }
  return out;
}

}  // namespace tessera
