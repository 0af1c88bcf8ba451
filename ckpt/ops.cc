#include "ckpt/ops.h"

#include "ckpt/deepspeed_ckpt.h"
#include "ckpt/hdf5_ckpt.h"
#include "ckpt/megatron_ckpt.h"
#include "ckpt/safetensors_ckpt.h"
#include "ckpt/torch_ckpt.h"
#include "core/strings.h"
#include "formats/native_files.h"

namespace tessera {
namespace {

// Every tensor whole on every rank.
bool IsMerged(const Strategy& strategy) {
  for (const TensorStrategy& t : strategy.tensors()) {
    if (t.layout != Layout::Replicated(t.layout.shape, t.layout.dtype)) return false;
  }
  return true;
}

bool IsMindSporeStrategy(Env* env, const std::string& path) {
  return env->IsDirectory(path) || IsMindSporeStrategyFile(env, path);
}

}  // namespace

Result<Format> ParseFormat(const std::string& name) {
  if (name == "native") return Format::kNative;
  if (name == "safetensors") return Format::kSafetensors;
  if (name == "mindspore") return Format::kMindSpore;
  if (name == "mindspore-safetensors") return Format::kMindSporeSafetensors;
  if (name == "hdf5") return Format::kHdf5;
  if (name == "torch") return Format::kTorch;
  if (name == "dcp") return Format::kDcp;
  return InvalidArgumentError("format '" + name +
                              "': use native, safetensors, mindspore, mindspore-safetensors, "
                              "hdf5 or torch");
}

std::string_view FormatName(Format format) {
  switch (format) {
    case Format::kNative:
      return "native";
    case Format::kSafetensors:
      return "safetensors";
    case Format::kMindSpore:
      return "mindspore";
    case Format::kMindSporeSafetensors:
      return "mindspore-safetensors";
    case Format::kHdf5:
      return "hdf5";
    case Format::kTorch:
      return "torch";
    case Format::kDcp:
      return "dcp";
  }
  return "?";
}

Result<std::unique_ptr<CheckpointReader>> OpenCheckpoint(Env* env, const std::string& path,
                                                         const OpenOptions& options) {
  if (!env->FileExists(path)) return NotFoundError("'" + path + "' does not exist");
  if (env->IsDirectory(path)) {
    // Before the native reader: DeepSpeed also writes a 'latest' file.
    if (IsDeepSpeedCheckpoint(env, path)) return OpenDeepSpeedCheckpoint(env, path);
    if (IsMegatronCheckpoint(env, path)) return OpenMegatronCheckpoint(env, path);
    if (HasManifest(env, path) || env->FileExists(JoinPath(path, kLatestName))) {
      return OpenNativeCheckpoint(env, path);
    }
    if (IsSafetensorsCheckpoint(env, path)) return OpenSafetensorsCheckpoint(env, path);
    if (IsTorchCheckpoint(env, path)) return OpenTorchCheckpoint(env, path);
    if (IsDcpCheckpoint(env, path)) return OpenDcpCheckpoint(env, path);
    if (IsMindSporeCheckpoint(env, path)) {
      return OpenMindSporeCheckpoint(env, path, options.mindspore_strategy, options.strategy_hint);
    }
    // Let the native reader say what is missing (an incomplete checkpoint).
    return OpenNativeCheckpoint(env, path);
  }
  if (IsHdf5Checkpoint(path)) return OpenHdf5Checkpoint(path);
  if (EndsWith(path, kTorchIndexName)) return OpenTorchCheckpoint(env, path);
  if (IsSafetensorsCheckpoint(env, path)) return OpenSafetensorsCheckpoint(env, path);
  if (IsTorchCheckpoint(env, path)) return OpenTorchCheckpoint(env, path);
  {
    ASSIGN_OR_RETURN(auto file, env->NewRandomAccessFile(path));
    if (LooksLikeMindSporeCkpt(*file)) {
      return OpenMindSporeCheckpoint(env, path, options.mindspore_strategy, options.strategy_hint);
    }
  }
  return InvalidArgumentError("'" + path +
                              "' is not a checkpoint this Tessera can read (native directory, "
                              "safetensors, MindSpore .ckpt, HDF5, torch.save, DCP, DeepSpeed or "
                              "Megatron-LM)");
}

Result<TransformStats> WriteTransformed(Env* env, const CheckpointReader& src, const Strategy& dst,
                                        const std::string& out_path, const WriteOptions& options) {
  if (options.format != Format::kNative && options.native.codec != Codec::kRaw) {
    return InvalidArgumentError("compression is a native-format option; " +
                                std::string(FormatName(options.format)) + " stores raw bytes");
  }
  if (options.format != Format::kNative && options.native.redundancy.has_groups()) {
    return InvalidArgumentError("redundancy is a native-format option; " +
                                std::string(FormatName(options.format)) +
                                " has no place for parity");
  }
  if (options.format != Format::kSafetensors && options.format != Format::kMindSporeSafetensors &&
      options.format != Format::kTorch && options.max_shard_size > 0) {
    return InvalidArgumentError("--max-shard-size applies to safetensors and torch output only");
  }
  ASSIGN_OR_RETURN(Strategy complete, CompleteStrategy(src.strategy(), dst));
  if (options.format != Format::kNative) {
    RETURN_IF_ERROR(CheckNoViews(complete, "output '" + out_path + "'"));
  }
  CheckpointMeta meta = src.meta();
  meta.created_by = "tessera ckpt";
  std::unique_ptr<CheckpointWriter> writer;
  // The layout the data moves in: whole tensors for the formats that store
  // them whole (the recorded strategy is metadata there).
  Strategy flow = complete;
  switch (options.format) {
    case Format::kNative: {
      ASSIGN_OR_RETURN(
          writer, CreateNativeCheckpoint(env, out_path, complete, std::move(meta), options.native));
      break;
    }
    case Format::kSafetensors: {
      SafetensorsWriteOptions o;
      o.max_shard_size = options.max_shard_size;
      o.overwrite = options.native.overwrite;
      ASSIGN_OR_RETURN(writer, CreateSafetensorsCheckpoint(env, out_path, complete, meta, o));
      flow = MergedStrategy(complete);
      break;
    }
    case Format::kTorch: {
      TorchWriteOptions o;
      o.max_shard_size = options.max_shard_size;
      o.overwrite = options.native.overwrite;
      ASSIGN_OR_RETURN(writer, CreateTorchCheckpoint(env, out_path, complete, o));
      flow = MergedStrategy(complete);
      break;
    }
    case Format::kDcp: {
      // The destination's pieces are DCP's chunks.
      ASSIGN_OR_RETURN(writer,
                       CreateDcpCheckpoint(env, out_path, complete, options.native.overwrite));
      break;
    }
    case Format::kHdf5: {
      ASSIGN_OR_RETURN(
          writer, CreateHdf5Checkpoint(env, out_path, complete, meta, options.native.overwrite));
      flow = MergedStrategy(complete);
      break;
    }
    case Format::kMindSporeSafetensors:
      if (!EndsWith(out_path, ".safetensors") && IsMerged(complete)) {
        // Merged: unified_safetensors' layout.
        SafetensorsWriteOptions o;
        o.max_shard_size = options.max_shard_size;
        o.overwrite = options.native.overwrite;
        o.mindspore_unified = true;
        ASSIGN_OR_RETURN(writer, CreateSafetensorsCheckpoint(env, out_path, complete, meta, o));
        flow = MergedStrategy(complete);
        break;
      }
      [[fallthrough]];
    case Format::kMindSpore: {
      MindSporeWriteOptions o = options.mindspore;
      o.overwrite = options.native.overwrite;
      o.safetensors = options.format == Format::kMindSporeSafetensors;
      // Records in the order MindSpore's transform writes them from this source.
      const StoredOrder order = src.Order();
      const auto& tensors = src.strategy().tensors();
      for (const auto& file : order.files) {
        std::vector<std::string>& names = o.order.rank_files.emplace_back();
        for (size_t i : file) names.push_back(tensors[i].name);
      }
      for (size_t i : order.unplaced) o.order.unnamed.insert(tensors[i].name);
      ASSIGN_OR_RETURN(writer, CreateMindSporeCheckpoint(env, out_path, complete, meta, o));
      break;
    }
  }
  auto stats = Transform(src, flow, *writer, options.transform);
  if (!stats.ok()) {
    writer->Abort();
    return stats.status();
  }
  Status s = writer->Commit();
  if (!s.ok()) {
    writer->Abort();
    return s;
  }
  return stats;
}

Result<std::unique_ptr<CheckpointReader>> OpenSource(Env* env, const std::string& path,
                                                     const std::string& src_strategy,
                                                     const std::string& flag) {
  OpenOptions options;
  const bool mindspore = !src_strategy.empty() && IsMindSporeStrategy(env, src_strategy);
  if (mindspore) options.mindspore_strategy = src_strategy;
  options.strategy_hint = flag;
  ASSIGN_OR_RETURN(auto reader, OpenCheckpoint(env, path, options));
  if (src_strategy.empty() || (mindspore && reader->format() == "mindspore")) return reader;
  Strategy given;
  if (mindspore) {
    ASSIGN_OR_RETURN(auto files, ReadMindSporeStrategies(env, src_strategy));
    ASSIGN_OR_RETURN(given, MindSporeToStrategy(files, reader->strategy()));
  } else {
    ASSIGN_OR_RETURN(given, LoadStrategyFile(env, src_strategy));
  }
  const Strategy& recorded = reader->strategy();
  for (const TensorStrategy& t : given.tensors()) {
    const TensorStrategy* r = recorded.Find(t.name);
    if (r == nullptr) {
      return NotFoundError(flag + " '" + src_strategy + "' names tensor '" + t.name + "', which '" +
                           path + "' does not have");
    }
    ASSIGN_OR_RETURN(bool same,
                     Equivalent(recorded.MeshOf(*r), r->layout, given.MeshOf(t), t.layout));
    if (!same) {
      return InvalidArgumentError("tensor '" + t.name + "': '" + path + "' records " +
                                  ToString(r->layout) + ", " + flag + " says " +
                                  ToString(t.layout));
    }
  }
  return reader;
}

Result<Strategy> DestinationStrategy(Env* env, const CheckpointReader& src, const std::string& file,
                                     const std::string& mesh, std::set<std::string>* unnamed,
                                     const DestinationFlags& flags) {
  if (!file.empty() && !mesh.empty()) {
    return InvalidArgumentError("give either " + flags.strategy + " or " + flags.mesh +
                                ", not both");
  }
  if (!file.empty() && IsMindSporeStrategy(env, file)) {
    ASSIGN_OR_RETURN(auto files, ReadMindSporeStrategies(env, file));
    std::vector<size_t> missing;
    ASSIGN_OR_RETURN(Strategy dst, MindSporeToStrategy(files, src.strategy(), &missing));
    for (size_t i : missing) {
      if (unnamed != nullptr) unnamed->insert(dst.tensors()[i].name);
    }
    return dst;
  }
  if (!file.empty()) return LoadStrategyFile(env, file);
  if (mesh.empty())
    return InvalidArgumentError("give " + flags.strategy + " or " + flags.mesh +
                                " (axis=size,...)");
  ASSIGN_OR_RETURN(Mesh m, Mesh::Parse(mesh));
  return WithMesh(src.strategy(), m);
}

}  // namespace tessera
