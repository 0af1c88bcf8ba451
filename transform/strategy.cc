#include "transform/strategy.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace tessera {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kFormat = "tessera.strategy";
constexpr int kVersion = 1;

Json MeshToJson(const Mesh& mesh) {
  return Json{{"axes", mesh.axis_names()}, {"shape", mesh.axis_sizes()}};
}

Result<Mesh> MeshFromJson(const Json& j) {
  if (!j.is_object() || !j.contains("axes") || !j.contains("shape")) {
    return InvalidArgumentError("mesh must be {\"axes\": [...], \"shape\": [...]}");
  }
  return Mesh::Create(j.at("axes").get<std::vector<std::string>>(),
                      j.at("shape").get<std::vector<int64_t>>());
}

// An axis list may be written as null, "tp" or ["dp", "tp"].
std::vector<std::string> AxesFromJson(const Json& j) {
  if (j.is_null()) return {};
  if (j.is_string()) return {j.get<std::string>()};
  return j.get<std::vector<std::string>>();
}

Json AxesToJson(const std::vector<std::string>& axes) {
  if (axes.empty()) return nullptr;
  if (axes.size() == 1) return axes[0];
  return axes;
}

Result<Strategy> ParseImpl(const Json& root) {
  if (!root.is_object()) return InvalidArgumentError("top level must be a JSON object");
  if (root.value("format", std::string()) == "tessera.op_strategy") {
    return InvalidArgumentError(
        "this is an operator strategy file (per-operator shard "
        "strategies, for train_gpt --op-strategy), not a layout strategy "
        "(\"format\": \"" +
        std::string(kFormat) + "\")");
  }
  if (root.value("format", std::string(kFormat)) != kFormat) {
    return InvalidArgumentError("\"format\" is '" + root.value("format", std::string()) +
                                "', expected '" + std::string(kFormat) + "'");
  }
  const int version = root.value("version", kVersion);
  if (version > kVersion) {
    return InvalidArgumentError("strategy version " + std::to_string(version) +
                                " is newer than this Tessera reads (" + std::to_string(kVersion) +
                                ")");
  }
  Mesh mesh;
  if (root.contains("mesh")) {
    auto m = MeshFromJson(root.at("mesh"));
    if (!m.ok()) return m.status();
    mesh = *m;
  }
  Strategy strategy(mesh);
  if (!root.contains("tensors")) return strategy;
  const Json& tensors = root.at("tensors");
  if (!tensors.is_object()) return InvalidArgumentError("\"tensors\" must be an object");
  for (const auto& [name, t] : tensors.items()) {
    auto fail = [&](const Status& s) { return s.Annotate("tensor '" + name + "'"); };
    if (!t.is_object()) return fail(InvalidArgumentError("must be an object"));
    TensorStrategy ts;
    ts.name = name;
    auto dtype = ParseDType(t.value("dtype", std::string("f32")));
    if (!dtype.ok()) return fail(dtype.status());
    ts.layout.dtype = *dtype;
    if (!t.contains("shape")) return fail(InvalidArgumentError("has no \"shape\""));
    ts.layout.shape = t.at("shape").get<std::vector<int64_t>>();
    if (t.contains("view")) ts.layout.view = t.at("view").get<std::vector<int64_t>>();
    if (t.contains("split")) {
      const Json& split = t.at("split");
      if (!split.is_array()) return fail(InvalidArgumentError("\"split\" must be a list"));
      for (const Json& axes : split) ts.layout.dim_axes.push_back(AxesFromJson(axes));
    }
    if (t.contains("opt_shard")) ts.layout.opt_axes = AxesFromJson(t.at("opt_shard"));
    if (t.contains("stage")) {
      const Json& st = t.at("stage");
      if (!st.is_object() || !st.contains("axis") || !st.contains("index")) {
        return fail(InvalidArgumentError("\"stage\" must be {\"axis\": ..., \"index\": ...}"));
      }
      ts.layout.stage_axis = st.at("axis").get<std::string>();
      const Json& index = st.at("index");
      if (index.is_array()) {  // several stages: the lowest is read, the others hold copies
        if (index.empty())
          return fail(InvalidArgumentError("\"stage\" \"index\" is an empty list"));
        std::vector<int64_t> stages = index.get<std::vector<int64_t>>();
        std::sort(stages.begin(), stages.end());
        ts.layout.stage = stages[0];
        ts.layout.copy_stages.assign(stages.begin() + 1, stages.end());
      } else {
        ts.layout.stage = index.get<int64_t>();
      }
    }
    if (t.contains("mesh")) {
      auto m = MeshFromJson(t.at("mesh"));
      if (!m.ok()) return fail(m.status());
      ts.mesh = *m;
    }
    RETURN_IF_ERROR(strategy.Add(std::move(ts)));
  }
  return strategy;
}

}  // namespace

int64_t Strategy::world_size() const {
  int64_t w = mesh_.world_size();
  for (const TensorStrategy& t : tensors_) {
    if (t.mesh) w = std::max(w, t.mesh->world_size());
  }
  return w;
}

Status Strategy::Add(TensorStrategy tensor) {
  const std::string context = "tensor '" + tensor.name + "'";
  if (tensor.name.empty()) return InvalidArgumentError("a tensor has an empty name");
  if (index_.count(tensor.name)) return InvalidArgumentError(context + " appears twice");
  RETURN_IF_ERROR(ValidateLayout(tensor.layout, MeshOf(tensor)).Annotate(context));
  index_.emplace(tensor.name, tensors_.size());
  tensors_.push_back(std::move(tensor));
  return Status::Ok();
}

const TensorStrategy* Strategy::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<Strategy> ParseStrategyJson(std::string_view json) {
  Json root = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgumentError("not valid JSON");
  try {
    return ParseImpl(root);
  } catch (const Json::exception& e) {
    // A field of the wrong JSON type (a string where a number belongs).
    return InvalidArgumentError(std::string("malformed strategy: ") + e.what());
  }
}

std::string StrategyToJson(const Strategy& strategy) {
  Json root;
  root["format"] = kFormat;
  root["version"] = kVersion;
  root["mesh"] = MeshToJson(strategy.mesh());
  Json tensors = Json::object();
  for (const TensorStrategy& t : strategy.tensors()) {
    Json j;
    j["dtype"] = DTypeName(t.layout.dtype);
    j["shape"] = t.layout.shape;
    if (!t.layout.view.empty()) j["view"] = t.layout.view;
    bool split = false;
    for (int d = 0; d < t.layout.rank(); ++d) split |= !t.layout.AxesOf(d).empty();
    if (split) {
      Json s = Json::array();
      for (int d = 0; d < t.layout.rank(); ++d) s.push_back(AxesToJson(t.layout.AxesOf(d)));
      j["split"] = s;
    }
    if (!t.layout.opt_axes.empty()) j["opt_shard"] = AxesToJson(t.layout.opt_axes);
    if (!t.layout.stage_axis.empty()) {
      Json index = t.layout.stage;
      if (!t.layout.copy_stages.empty()) {
        index = Json::array({t.layout.stage});
        for (int64_t c : t.layout.copy_stages) index.push_back(c);
      }
      j["stage"] = Json{{"axis", t.layout.stage_axis}, {"index", index}};
    }
    if (t.mesh) j["mesh"] = MeshToJson(*t.mesh);
    tensors[t.name] = std::move(j);
  }
  root["tensors"] = std::move(tensors);
  return root.dump(2) + "\n";
}

Result<Strategy> LoadStrategyFile(Env* env, const std::string& path) {
  auto text = ReadFileToString(env, path);
  if (!text.ok()) return text.status();
  auto s = ParseStrategyJson(*text);
  if (!s.ok()) return s.status().Annotate("strategy file '" + path + "'");
  return s;
}

Status SaveStrategyFile(Env* env, const std::string& path, const Strategy& strategy) {
  return WriteFileAtomically(env, path, StrategyToJson(strategy));
}

Result<Strategy> WithMesh(const Strategy& strategy, const Mesh& mesh) {
  Strategy out(mesh);
  for (const TensorStrategy& t : strategy.tensors()) {
    TensorStrategy copy{t.name, t.layout, std::nullopt};
    RETURN_IF_ERROR(out.Add(std::move(copy)));
  }
  return out;
}

}  // namespace tessera
