#include "formats/mindspore_strategy.h"

#include <nlohmann/json.hpp>

#include "formats/mindspore_strategy.pb.h"

namespace tessera {
namespace {

constexpr uint64_t kMaxStrategyBytes = uint64_t{256} << 20;

Status Bad(const std::string& path, const std::string& what) {
  return DataLossError("MindSpore strategy file '" + path + "': " + what);
}

// "3-h.0.w" -> stage 3, "h.0.w" (merge_pipeline_strategys' naming); other
// names are left as they are.
bool SplitStagePrefix(std::string* name, int64_t* stage) {
  const size_t dash = name->find('-');
  if (dash == 0 || dash == std::string::npos || dash > 9) return false;
  for (size_t i = 0; i < dash; ++i) {
    if ((*name)[i] < '0' || (*name)[i] > '9') return false;
  }
  *stage = std::stoll(name->substr(0, dash));
  name->erase(0, dash + 1);
  return true;
}

// Stages and prefixes, once the file's items are read.
void AssignStages(MindSporeStrategyFile* f) {
  for (MindSporeParam& p : f->params) {
    p.stage = f->stage;
    if (SplitStagePrefix(&p.name, &p.stage)) f->merged_pipeline = true;
  }
}

Result<MindSporeStrategyFile> FromJson(const std::string& path, const nlohmann::json& j) {
  MindSporeStrategyFile out;
  if (j.contains("current_stage") && j["current_stage"].is_number_integer()) {
    out.current_stage = j["current_stage"].get<int64_t>();
  }
  out.stage = out.current_stage;
  if (j.contains("parallel_strategy_item") && j["parallel_strategy_item"].is_object() &&
      !j["parallel_strategy_item"].empty()) {
    const nlohmann::json& first = j["parallel_strategy_item"].begin().value();
    if (first.is_object() && first.contains("stage") && first["stage"].is_number_integer()) {
      out.stage = first["stage"].get<int64_t>();
    }
  }
  if (!j.contains("parallel_layout_item") || !j["parallel_layout_item"].is_object()) {
    return Bad(path, "no \"parallel_layout_item\" object");
  }
  for (auto it = j["parallel_layout_item"].begin(); it != j["parallel_layout_item"].end(); ++it) {
    const nlohmann::json& v = it.value();
    MindSporeParam p;
    p.name = it.key();
    try {
      p.layout.dev_matrix = v.at("dev_matrix").get<std::vector<int64_t>>();
      for (const nlohmann::json& d : v.at("tensor_map")) {
        if (d.is_array()) {
          p.layout.tensor_map.push_back(d.get<std::vector<int64_t>>());
        } else {
          p.layout.tensor_map.push_back({d.get<int64_t>()});
        }
      }
      if (v.contains("tensor_shape")) p.shape = v["tensor_shape"].get<std::vector<int64_t>>();
      p.field = v.value("field", int64_t{0});
      p.layout.opt_weight_shard_step = v.value("opt_weight_shard_step", int64_t{0});
      p.layout.opt_weight_shard_size = v.value("opt_weight_shard_size", int64_t{0});
    } catch (const nlohmann::json::exception& e) {
      return Bad(path, "parameter '" + p.name + "': " + e.what());
    }
    out.params.push_back(std::move(p));
  }
  AssignStages(&out);
  return out;
}

Result<MindSporeStrategyFile> FromProto(const std::string& path,
                                        const mindspore::straspb::ParallelStrategyMap& m) {
  MindSporeStrategyFile out;
  out.current_stage = m.current_stage();
  out.stage = m.parallel_strategy_item_size() > 0
                  ? m.parallel_strategy_item(0).parallel_strategys().stage()
                  : out.current_stage;
  for (const auto& item : m.parallel_layout_item()) {
    const auto& l = item.parallel_layouts();
    MindSporeParam p;
    p.name = item.param_name();
    if (l.dev_matrix_size() != 1 || l.tensor_map_size() != 1) {
      return Bad(path, "parameter '" + p.name + "' has " + std::to_string(l.dev_matrix_size()) +
                           " device matrices and " + std::to_string(l.tensor_map_size()) +
                           " tensor maps (one of each expected)");
    }
    for (uint32_t d : l.dev_matrix(0).dim()) p.layout.dev_matrix.push_back(d);
    for (int32_t k : l.tensor_map(0).dim()) p.layout.tensor_map.push_back({k});
    p.field = l.field();
    p.layout.opt_weight_shard_step = l.opt_weight_shard_step();
    p.layout.opt_weight_shard_size = l.opt_weight_shard_size();
    out.params.push_back(std::move(p));
  }
  AssignStages(&out);
  return out;
}

}  // namespace

Result<MindSporeStrategyFile> ReadMindSporeStrategy(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(uint64_t size, env->GetFileSize(path));
  if (size > kMaxStrategyBytes) return Bad(path, "larger than 256 MiB");
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path));
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && bytes[first] == '{') {
    nlohmann::json j = nlohmann::json::parse(bytes, nullptr, false);
    if (j.is_discarded()) return Bad(path, "not valid JSON");
    return FromJson(path, j);
  }
  // ParsePartial and our own check of the required fields: ParseFromString
  // would have libprotobuf log the missing ones to stderr.
  mindspore::straspb::ParallelStrategyMap m;
  if (!m.ParsePartialFromString(bytes)) return Bad(path, "not a ParallelStrategyMap message");
  if (!m.IsInitialized()) {
    return Bad(path, "a ParallelStrategyMap without its required fields (" +
                         m.InitializationErrorString() + ")");
  }
  return FromProto(path, m);
}

Status WriteMindSporeStrategy(Env* env, const std::string& path, const MindSporeStrategyFile& s) {
  mindspore::straspb::ParallelStrategyMap m;
  m.set_current_stage(static_cast<uint32_t>(s.current_stage));
  for (const MindSporeParam& p : s.params) {
    const std::string name = s.merged_pipeline ? std::to_string(p.stage) + "-" + p.name : p.name;
    auto* strategy = m.add_parallel_strategy_item();
    strategy->set_node_name(p.name);
    strategy->mutable_parallel_strategys()->set_stage(static_cast<uint32_t>(p.stage));
    auto* counts = strategy->mutable_parallel_strategys()->add_parallel_strategy();
    for (const auto& axes : p.layout.tensor_map) {
      int64_t n = 1;  // device-axis sizes, counted from the right of dev_matrix
      for (int64_t k : axes) {
        const int64_t at = static_cast<int64_t>(p.layout.dev_matrix.size()) - 1 - k;
        if (k >= 0 && at >= 0) n *= p.layout.dev_matrix[at];
      }
      counts->add_dim(static_cast<uint32_t>(n));
    }
    auto* item = m.add_parallel_layout_item();
    item->set_param_name(name);
    auto* l = item->mutable_parallel_layouts();
    auto* dm = l->add_dev_matrix();
    for (int64_t d : p.layout.dev_matrix) dm->add_dim(static_cast<uint32_t>(d));
    auto* tm = l->add_tensor_map();
    for (const auto& axes : p.layout.tensor_map) {
      if (axes.size() > 1) {
        return InvalidArgumentError("MindSpore strategy file '" + path + "': parameter '" + p.name +
                                    "' splits a dimension by several device axes, which the "
                                    "protobuf form cannot record");
      }
      tm->add_dim(axes.empty() ? -1 : static_cast<int32_t>(axes[0]));
    }
    l->add_param_split_shape();
    l->add_indices_offset();
    l->set_field(static_cast<int32_t>(p.field));
    l->set_opt_weight_shard_step(static_cast<int32_t>(p.layout.opt_weight_shard_step));
    l->set_opt_weight_shard_size(static_cast<int32_t>(p.layout.opt_weight_shard_size));
  }
  std::string bytes;
  if (!m.SerializeToString(&bytes)) return InternalError("serializing '" + path + "'");
  return WriteFileAtomically(env, path, bytes);
}

bool IsMindSporeStrategyFile(Env* env, const std::string& path) {
  if (env->IsDirectory(path)) return false;
  auto bytes = ReadFileToString(env, path);
  if (!bytes.ok()) return false;
  const size_t first = bytes->find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (*bytes)[first] == '{') {
    return bytes->find("\"parallel_layout_item\"") != std::string::npos;
  }
  mindspore::straspb::ParallelStrategyMap m;
  return m.ParsePartialFromString(*bytes) && m.IsInitialized();
}

}  // namespace tessera
