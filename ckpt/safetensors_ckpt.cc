#include "ckpt/safetensors_ckpt.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "ckpt/dense.h"
#include "ckpt/meta_attributes.h"
#include "core/endian.h"
#include "core/strings.h"
#include "formats/safetensors.h"

namespace tessera {
namespace {

constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

std::map<std::string, std::string> MetadataOf(const Strategy& strategy,
                                              const CheckpointMeta& meta) {
  std::map<std::string, std::string> m = EncodeMetaAttributes(strategy, meta, /*text_only=*/true);
  m["format"] = "pt";
  return m;
}

constexpr char kUnifiedMapName[] = "param_name_map.json";
constexpr char kHyperParamName[] = "hyper_param.safetensors";

// The name map of a MindSpore unified_safetensors directory: its one .json
// file (MindSpore's loader takes any one), beside .safetensors files; ""
// when `dir` is not one.
std::string UnifiedMap(Env* env, const std::string& dir) {
  auto children = env->GetChildren(dir);
  if (!children.ok()) return "";
  std::string json;
  int jsons = 0;
  bool safetensors = false;
  for (const std::string& c : *children) {
    if (EndsWith(c, ".json")) {
      ++jsons;
      json = c;
    }
    safetensors |= EndsWith(c, ".safetensors");
  }
  return jsons == 1 && safetensors ? JoinPath(dir, json) : "";
}

// MindSpore's unified_safetensors layout (SafetensorsWriteOptions).
Result<std::unique_ptr<CheckpointWriter>> CreateUnifiedSafetensors(
    Env* env, const std::string& path, const Strategy& strategy,
    const SafetensorsWriteOptions& options) {
  const std::vector<TensorStrategy>& tensors = strategy.tensors();
  const int64_t limit = options.max_shard_size > 0 ? options.max_shard_size : int64_t{3} << 30;
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  std::vector<std::vector<SafetensorsEntry>> parts;
  int64_t used = 0;
  for (size_t i : order) {
    const int64_t bytes = ByteSize(tensors[i].layout);
    if (parts.empty() || (used > 0 && used + bytes > limit)) {
      parts.emplace_back();
      used = 0;
    }
    parts.back().push_back(
        {tensors[i].name, tensors[i].layout.dtype, tensors[i].layout.shape, 0, 0});
    used += bytes;
  }
  DensePlan plan;
  plan.directory = true;
  plan.blocks.resize(tensors.size());
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (size_t p = 0; p < parts.size(); ++p) {
    const std::string name = "part" + std::to_string(p) + ".safetensors";
    for (const SafetensorsEntry& e : parts[p]) map[e.name] = name;  // in chunk order
    PackAsSafetensorsLibrary(&parts[p]);
    auto header = SafetensorsHeader(parts[p], {});
    if (!header.ok()) return header.status().Annotate("output '" + path + "'");
    for (const SafetensorsEntry& e : parts[p]) {
      const size_t i = static_cast<size_t>(strategy.Find(e.name) - tensors.data());
      plan.blocks[i].push_back(
          {static_cast<uint32_t>(p), header->size() + e.begin, Box::FromShape(e.shape)});
    }
    const uint64_t data = parts[p].empty() ? 0 : parts[p].back().end;
    plan.files.push_back({name, header->size() + data, {{0, *header}}});
  }
  // As Python's json.dumps(indent=4): ASCII, no newline at the end.
  const std::string text = map.dump(4, ' ', /*ensure_ascii=*/true);
  plan.files.push_back({kUnifiedMapName, text.size(), {{0, text}}});
  return CreateDenseCheckpoint(env, path, strategy, std::move(plan), options.overwrite);
}

}  // namespace

Result<WeightMapIndex> ReadWeightMapIndex(Env* env, const std::string& path, bool flat) {
  auto bad = [&](const std::string& what) {
    return DataLossError("index '" + path + "': " + what);
  };
  ASSIGN_OR_RETURN(uint64_t size, env->GetFileSize(path));
  if (size > kMaxIndexBytes) return bad("larger than " + std::to_string(kMaxIndexBytes) + " bytes");
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (flat ? !j.is_object()
           : (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())) {
    return bad(flat ? "not a JSON object" : "not a JSON object with a \"weight_map\" object");
  }
  const nlohmann::ordered_json& map = flat ? j : j["weight_map"];
  WeightMapIndex index;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it.value().is_string())
      return bad("the file of tensor '" + it.key() + "' is not a string");
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return bad("tensor '" + it.key() + "' names file '" + file +
                 "', which is not a plain file name beside the index");
    }
    if (!index.map.emplace(it.key(), file).second) return bad("tensor '" + it.key() + "' repeats");
    bool known = false;
    for (const std::string& f : index.files) known = known || f == file;
    if (!known) index.files.push_back(file);
  }
  return index;
}

bool IsSafetensorsCheckpoint(Env* env, const std::string& path) {
  if (env->IsDirectory(path)) {
    return env->FileExists(JoinPath(path, kSafetensorsIndexName)) ||
           env->FileExists(JoinPath(path, "model.safetensors")) || !UnifiedMap(env, path).empty();
  }
  auto file = env->NewRandomAccessFile(path);
  if (!file.ok()) return false;
  auto size = (*file)->Size();
  if (!size.ok()) return false;
  if (EndsWith(path, ".index.json")) return true;
  if (*size < 10) return false;
  char head[9];
  if (!(*file)->Read(0, 9, head).ok()) return false;
  const uint64_t n = GetLittleEndian<uint64_t>(head);
  // The reader names what is wrong with a bad length.
  return head[8] == '{' && n >= 2;
}

Result<std::unique_ptr<CheckpointReader>> OpenSafetensorsCheckpoint(Env* env,
                                                                    const std::string& path) {
  // The files, and which tensors each must hold (empty: all of its own).
  std::vector<std::string> paths;
  WeightMapIndex index;
  std::string index_path;
  bool flat = false;  // a MindSpore unified_safetensors name map
  std::string hyper;  // and its hyper_param.safetensors (tensors not in the map)
  if (env->IsDirectory(path)) {
    if (env->FileExists(JoinPath(path, kSafetensorsIndexName))) {
      index_path = JoinPath(path, kSafetensorsIndexName);
    } else if (env->FileExists(JoinPath(path, "model.safetensors"))) {
      paths.push_back(JoinPath(path, "model.safetensors"));
    } else if (index_path = UnifiedMap(env, path); !index_path.empty()) {
      flat = true;
      if (env->FileExists(JoinPath(path, kHyperParamName))) hyper = JoinPath(path, kHyperParamName);
    } else {
      paths.push_back(JoinPath(path, "model.safetensors"));  // named as missing below
    }
  } else if (EndsWith(path, ".index.json")) {
    index_path = path;
  } else {
    paths.push_back(path);
  }
  if (!index_path.empty()) {
    ASSIGN_OR_RETURN(index, ReadWeightMapIndex(env, index_path, flat));
    for (const std::string& f : index.files) paths.push_back(JoinPath(Dirname(index_path), f));
    if (!hyper.empty() && std::find(paths.begin(), paths.end(), hyper) == paths.end()) {
      paths.push_back(hyper);
    }
  }

  DenseCheckpoint c;
  c.path = path;
  c.format = "safetensors";
  c.files = paths;
  struct Found {
    SafetensorsEntry entry;
    uint32_t file;
    uint64_t offset;
  };
  std::vector<Found> found;  // file order
  std::map<std::string, size_t> by_name;
  std::map<std::string, std::string> metadata;
  for (uint32_t f = 0; f < paths.size(); ++f) {
    if (!env->FileExists(paths[f])) {
      return NotFoundError("safetensors checkpoint '" + path + "': file '" + paths[f] +
                           "' is missing");
    }
    ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(env, paths[f]));
    if (f == 0) metadata = file.metadata();
    for (const SafetensorsEntry& e : file.entries()) {
      if (!index_path.empty()) {
        auto it = index.map.find(e.name);
        const bool unmapped_hyper = it == index.map.end() && paths[f] == hyper;
        if (!unmapped_hyper &&
            (it == index.map.end() || JoinPath(Dirname(index_path), it->second) != paths[f])) {
          continue;  // the index maps it elsewhere (or not at all): not ours here
        }
      }
      if (!by_name.emplace(e.name, found.size()).second) {
        return DataLossError("safetensors checkpoint '" + path + "': tensor '" + e.name +
                             "' is stored twice");
      }
      found.push_back({e, f, file.data_offset() + e.begin});
    }
  }
  for (const auto& [name, file] : index.map) {
    if (by_name.count(name) == 0) {
      return DataLossError("safetensors index '" + index_path + "' maps tensor '" + name +
                           "' to '" + file + "', which does not hold it");
    }
  }
  RETURN_IF_ERROR(DecodeMetaAttributes("safetensors checkpoint '" + path + "'", metadata, &c.meta));

  // The recorded strategy when there is one and it matches the files.
  auto recorded = metadata.count(kStrategyAttribute)
                      ? ParseStrategyJson(metadata[kStrategyAttribute])
                      : Result<Strategy>(NotFoundError(""));
  if (recorded.ok() && recorded->tensors().size() == found.size()) {
    for (const TensorStrategy& t : recorded->tensors()) {
      auto it = by_name.find(t.name);
      if (it == by_name.end()) {
        return DataLossError("safetensors checkpoint '" + path + "': its strategy names tensor '" +
                             t.name + "', which no file holds");
      }
      const SafetensorsEntry& e = found[it->second].entry;
      if (e.shape != t.layout.shape || e.dtype != t.layout.dtype) {
        return DataLossError("safetensors checkpoint '" + path + "': tensor '" + t.name +
                             "' is stored as " + std::string(DTypeName(e.dtype)) +
                             ShapeToString(e.shape) + ", its strategy says " + ToString(t.layout));
      }
      const Found& at = found[it->second];
      c.blocks.push_back({{at.file, at.offset, Box::FromShape(e.shape)}});
    }
    c.strategy = std::move(*recorded);
  } else {
    c.strategy = Strategy(*Mesh::Create({"r"}, {1}));
    for (const Found& at : found) {
      RETURN_IF_ERROR(
          c.strategy.Add({at.entry.name, Layout::Replicated(at.entry.shape, at.entry.dtype), {}})
              .Annotate("safetensors checkpoint '" + path + "'"));
      c.blocks.push_back({{at.file, at.offset, Box::FromShape(at.entry.shape)}});
    }
  }
  return OpenDenseCheckpoint(env, std::move(c));
}

Result<std::unique_ptr<CheckpointWriter>> CreateSafetensorsCheckpoint(
    Env* env, const std::string& path, const Strategy& strategy, const CheckpointMeta& meta,
    const SafetensorsWriteOptions& options) {
  if (options.mindspore_unified) return CreateUnifiedSafetensors(env, path, strategy, options);
  const std::vector<TensorStrategy>& tensors = strategy.tensors();
  // Shards: tensors in order, a new shard when the next would overflow.
  std::vector<size_t> shard_of(tensors.size(), 0);
  size_t shards = 1;
  if (options.max_shard_size > 0) {
    int64_t used = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int64_t bytes = ByteSize(tensors[i].layout);
      if (used > 0 && used + bytes > options.max_shard_size) {
        ++shards;
        used = 0;
      }
      used += bytes;
      shard_of[i] = shards - 1;
    }
  }
  const bool directory = options.max_shard_size > 0;
  auto shard_name = [&](size_t s) {
    if (shards == 1) return std::string("model.safetensors");
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards);
    return std::string(name);
  };
  const std::map<std::string, std::string> metadata = MetadataOf(strategy, meta);
  DensePlan plan;
  plan.directory = directory;
  std::vector<std::vector<SafetensorsEntry>> entries(shards);
  std::vector<std::vector<size_t>> members(shards);
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<SafetensorsEntry>& e = entries[shard_of[i]];
    const uint64_t begin = e.empty() ? 0 : e.back().end;
    e.push_back({tensors[i].name, tensors[i].layout.dtype, tensors[i].layout.shape, begin,
                 begin + static_cast<uint64_t>(ByteSize(tensors[i].layout))});
    members[shard_of[i]].push_back(i);
  }
  plan.blocks.resize(tensors.size());
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (size_t s = 0; s < shards; ++s) {
    auto header = SafetensorsHeader(entries[s], metadata);
    if (!header.ok()) return header.status().Annotate("output '" + path + "'");
    const uint64_t data = entries[s].empty() ? 0 : entries[s].back().end;
    plan.files.push_back({directory ? shard_name(s) : "", header->size() + data, {{0, *header}}});
    for (size_t k = 0; k < members[s].size(); ++k) {
      const size_t i = members[s][k];
      plan.blocks[i].push_back({static_cast<uint32_t>(s), header->size() + entries[s][k].begin,
                                Box::FromShape(tensors[i].layout.shape)});
      weight_map[tensors[i].name] = shard_name(s);
      total += ByteSize(tensors[i].layout);
    }
  }
  if (directory && shards > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                    {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    plan.files.push_back({kSafetensorsIndexName, text.size(), {{0, text}}});
  }
  return CreateDenseCheckpoint(env, path, strategy, std::move(plan), options.overwrite);
}

}  // namespace tessera
