#include "ckpt/deepspeed_ckpt.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "ckpt/torch_reader.h"
#include "core/strings.h"
#include "core/utf8.h"

namespace tessera {
namespace {

constexpr char kLatest[] = "latest";

std::string OptimName(const std::string& prefix, int64_t rank, int mp = 0) {
  char mp_text[16];
  std::snprintf(mp_text, sizeof(mp_text), "%02d", mp);
  return prefix + "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_" + mp_text +
         "_optim_states.pt";
}

std::string ModelName(int stage, int64_t rank) {
  if (stage <= 2) return "mp_rank_00_model_states.pt";
  return "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_model_states.pt";
}

// "bf16_" or "" where `dir` holds rank 0's optimizer file; nullopt if not.
std::optional<std::string> OptimPrefix(Env* env, const std::string& dir) {
  for (const char* prefix : {"", "bf16_"}) {
    if (env->FileExists(JoinPath(dir, OptimName(prefix, 0)))) return std::string(prefix);
  }
  return std::nullopt;
}

// The tag directory: `path` where it holds the optimizer files, else the
// one its `latest` file names.
Result<std::string> TagDir(Env* env, const std::string& path) {
  if (OptimPrefix(env, path)) return path;
  if (env->FileExists(JoinPath(path, "latest_universal"))) {
    return UnimplementedError("DeepSpeed checkpoint '" + path +
                              "': universal checkpoints (latest_universal, zero/<param>/) are "
                              "not read");
  }
  const std::string latest = JoinPath(path, kLatest);
  if (!env->FileExists(latest)) {
    return NotFoundError("DeepSpeed checkpoint '" + path + "': no " + OptimName("", 0) +
                         " and no 'latest' file naming a tag directory");
  }
  ASSIGN_OR_RETURN(std::string tag, ReadFileToString(env, latest));
  while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
  if (tag.empty() || tag.size() > 255 || tag.find('/') != std::string::npos || tag == "..") {
    return DataLossError("DeepSpeed checkpoint '" + path + "': its 'latest' file names '" +
                         PrintableText(tag.substr(0, 64)) + "', not a tag directory");
  }
  const std::string dir = JoinPath(path, tag);
  if (!OptimPrefix(env, dir)) {
    return NotFoundError("DeepSpeed checkpoint '" + path + "': tag '" + PrintableText(tag) +
                         "' (from 'latest') has no " + OptimName("", 0));
  }
  return dir;
}

// DeepSpeed's ZeroStageEnum member: an int, the IntEnum called with its
// value (Python < 3.11's pickle) or getattr(ZeroStageEnum, name) (3.11+).
std::optional<int64_t> ZeroStage(const Pickle& p, int32_t value) {
  if (auto v = p.AsInt(value)) return v;
  const std::string_view call = p.RecordName(value);
  if (call != "builtins.getattr" && call != "__builtin__.getattr") return std::nullopt;
  const PickleValue& args = p.at(p.at(value).items[1]);
  if (args.kind != PickleKind::kTuple || args.items.size() != 2) return std::nullopt;
  const PickleValue& cls = p.at(args.items[0]);
  const PickleValue& name = p.at(args.items[1]);
  if (cls.kind != PickleKind::kGlobal || !EndsWith(cls.text, "ZeroStageEnum") ||
      name.kind != PickleKind::kStr) {
    return std::nullopt;
  }
  static const std::map<std::string, int64_t> kStages = {
      {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};
  auto it = kStages.find(name.text);
  if (it == kStages.end()) return std::nullopt;
  return it->second;
}

struct DsParam {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

// Builds the checkpoint's entries from the files of one tag directory.
class DeepSpeedOpener {
 public:
  DeepSpeedOpener(Env* env, std::string path) : env_(env), path_(std::move(path)) {}

  Result<std::unique_ptr<CheckpointReader>> Open() {
    ASSIGN_OR_RETURN(dir_, TagDir(env_, path_));
    prefix_ = *OptimPrefix(env_, dir_);
    RETURN_IF_ERROR(OpenOptimizerFiles());
    RETURN_IF_ERROR(OpenModelFiles());
    const Pickle& model = sources_[model_[0]]->contents.pickle;
    ASSIGN_OR_RETURN(auto groups,
                     ParamShapes(model, model.Get(model.root(), "param_shapes"), "param_shapes"));
    RETURN_IF_ERROR(AddBuffers());
    RETURN_IF_ERROR(AddFrozen());
    if (stage_ <= 2) {
      RETURN_IF_ERROR(AddPartitioned(groups));
    } else {
      std::vector<DsParam> all;
      for (auto& g : groups) all.insert(all.end(), g.begin(), g.end());
      RETURN_IF_ERROR(AddZero3(all));
    }
    RETURN_IF_ERROR(AddShared());
    AddValues();
    return MakeTorchReader(path_, "deepspeed", std::move(sources_), std::move(entries_), values_);
  }

 private:
  Status Bad(const std::string& file, const std::string& what) const {
    return DataLossError("DeepSpeed checkpoint '" + path_ + "': '" + file + "': " + what);
  }
  const TorchSaveFile& Contents(size_t source) const { return sources_[source]->contents; }

  // A tensor of a source by its path, or -1.
  int64_t Find(size_t source, const std::string& name) {
    std::map<std::string, size_t>& names = names_[source];
    if (names.empty()) {
      const std::vector<TorchTensor>& tensors = Contents(source).tensors;
      for (size_t t = 0; t < tensors.size(); ++t) names.emplace(tensors[t].name, t);
    }
    auto it = names.find(name);
    return it == names.end() ? -1 : static_cast<int64_t>(it->second);
  }
  int64_t TensorNumel(size_t source, int64_t tensor) const {
    return Contents(source).tensors[tensor].Numel();
  }

  Result<size_t> AddSource(const std::string& name, bool keep_pickle) {
    ASSIGN_OR_RETURN(auto src, OpenTorchSource(env_, JoinPath(dir_, name), keep_pickle));
    sources_.push_back(std::move(src));
    names_.emplace_back();
    return sources_.size() - 1;
  }

  // Rank 0's optimizer file says the stage and the data-parallel size; the
  // others follow.
  Status OpenOptimizerFiles() {
    const std::string first = OptimName(prefix_, 0);
    ASSIGN_OR_RETURN(size_t s0, AddSource(first, true));
    const Pickle& p = Contents(s0).pickle;
    const int32_t osd = p.Get(p.root(), "optimizer_state_dict");
    if (osd < 0 || !p.Pairs(osd)) return Bad(first, "no optimizer_state_dict (not a ZeRO file)");
    const int32_t stage = p.Get(osd, "zero_stage");
    if (stage >= 0) {
      auto v = ZeroStage(p, stage);
      if (!v || *v < 1 || *v > 3) return Bad(first, "zero_stage is " + p.Repr(stage));
      stage_ = static_cast<int>(*v);
    } else if (prefix_ == "bf16_") {
      stage_ = 1;  // the bf16 optimizer (ZeRO-1) records no stage
    } else {
      return Bad(first, "no zero_stage (not a ZeRO file)");
    }
    const int32_t count = p.Get(osd, "partition_count");
    std::optional<std::vector<int64_t>> counts = count < 0 ? std::nullopt : p.AsInts(count);
    if (auto one = count < 0 ? std::nullopt : p.AsInt(count)) counts = std::vector<int64_t>{*one};
    if (!counts || counts->empty() || (*counts)[0] < 1 || (*counts)[0] > (1 << 20)) {
      return Bad(first, "partition_count is not a positive integer");
    }
    for (int64_t c : *counts) {
      if (c != (*counts)[0]) {
        return UnimplementedError("DeepSpeed checkpoint '" + path_ +
                                  "': parameter groups partitioned over different "
                                  "data-parallel sizes (MoE expert groups) are not read");
      }
    }
    world_ = (*counts)[0];
    if (env_->FileExists(JoinPath(dir_, OptimName(prefix_, world_)))) {
      return Bad(OptimName(prefix_, world_), "more optimizer files than partition_count " +
                                                 std::to_string(world_) +
                                                 " (a checkpoint overwritten by a larger job?)");
    }
    if (env_->FileExists(JoinPath(dir_, OptimName(prefix_, 0, 1)))) {
      return UnimplementedError("DeepSpeed checkpoint '" + path_ +
                                "': " + OptimName(prefix_, 0, 1) +
                                ": model-parallel checkpoints (tensor or pipeline parallel: "
                                "Megatron-DeepSpeed, PipelineEngine) are not read");
    }
    optim_.push_back(s0);
    for (int64_t r = 1; r < world_; ++r) {
      ASSIGN_OR_RETURN(size_t s, AddSource(OptimName(prefix_, r), false));
      optim_.push_back(s);
    }
    return Status::Ok();
  }

  Status OpenModelFiles() {
    const int64_t files = stage_ <= 2 ? 1 : world_;
    for (int64_t r = 0; r < files; ++r) {
      ASSIGN_OR_RETURN(size_t s, AddSource(ModelName(stage_, r), r == 0));
      model_.push_back(s);
    }
    const Pickle& p = Contents(model_[0]).pickle;
    if (p.Get(p.root(), "num_experts") >= 0 ||
        env_->FileExists(JoinPath(dir_, "expp_rank_0_mp_rank_00_optim_states.pt"))) {
      return UnimplementedError("DeepSpeed checkpoint '" + path_ +
                                "': mixture-of-experts checkpoints (expert files) are not read");
    }
    const int32_t module = p.Get(p.root(), "module");
    if (module >= 0 && p.at(module).kind == PickleKind::kNone) {
      return UnimplementedError("DeepSpeed checkpoint '" + path_ +
                                "': a PipelineEngine checkpoint (its layers in layer_XX-model_YY "
                                "files) is not read");
    }
    if (p.Get(p.root(), "buffer_names") < 0) {
      return Bad(ModelName(stage_, 0), "no buffer_names (not a DeepSpeed model states file)");
    }
    return Status::Ok();
  }

  // A list of OrderedDicts of name -> torch.Size (param_shapes), or one
  // dict of them (frozen_param_shapes).
  Result<std::vector<std::vector<DsParam>>> ParamShapes(const Pickle& p, int32_t value,
                                                        const std::string& what) const {
    std::vector<std::vector<DsParam>> out;
    if (value < 0 || p.at(value).kind == PickleKind::kNone) return out;
    std::vector<int32_t> groups = {value};
    if (p.at(value).kind == PickleKind::kList) groups = p.at(value).items;
    for (int32_t g : groups) {
      const std::vector<int32_t>* pairs = p.Pairs(g);
      if (!pairs) return Bad(ModelName(stage_, 0), what + " is not a list of dicts");
      out.emplace_back();
      for (size_t k = 0; k + 1 < pairs->size(); k += 2) {
        const PickleValue& key = p.at((*pairs)[k]);
        auto shape = p.AsInts((*pairs)[k + 1]);
        if (key.kind != PickleKind::kStr || !IsUtf8(key.text) || !shape) {
          return Bad(ModelName(stage_, 0), what + " has an entry that is not name: torch.Size");
        }
        DsParam param{key.text, *shape, 1};
        for (int64_t d : *shape) {
          // Bounded well below int64's end: offsets add partitions to it.
          if (d < 0 || __builtin_mul_overflow(param.numel, d, &param.numel) ||
              param.numel > (int64_t{1} << 60)) {
            return Bad(ModelName(stage_, 0),
                       what + ": '" + PrintableText(key.text) + "' has an impossible shape");
          }
        }
        out.back().push_back(std::move(param));
      }
    }
    return out;
  }

  // Names of the string list under `key` of the model file's object.
  Result<std::vector<std::string>> Strings(const std::string& key) const {
    const Pickle& p = Contents(model_[0]).pickle;
    std::vector<std::string> out;
    const int32_t v = p.Get(p.root(), key);
    if (v < 0 || p.at(v).kind == PickleKind::kNone) return out;
    if (p.at(v).kind != PickleKind::kList) return Bad(ModelName(stage_, 0), key + " is not a list");
    for (int32_t s : p.at(v).items) {
      if (p.at(s).kind != PickleKind::kStr) {
        return Bad(ModelName(stage_, 0), key + " holds a value that is not a name");
      }
      out.push_back(p.at(s).text);
    }
    return out;
  }

  // A tensor stored whole under `stored` in a model file, named `name`.
  Status AddWhole(const std::string& name, size_t source, const std::string& stored) {
    const int64_t t = Find(source, stored);
    if (t < 0) return Bad(sources_[source]->path, "no tensor '" + PrintableText(stored) + "'");
    const TorchTensor& tensor = Contents(source).tensors[t];
    TorchEntry e{name, tensor.dtype, tensor.shape, {}};
    e.pieces.push_back({source, static_cast<size_t>(t), Box::FromShape(tensor.shape)});
    entries_.push_back(std::move(e));
    return Status::Ok();
  }

  Status AddBuffers() {
    ASSIGN_OR_RETURN(std::vector<std::string> buffers, Strings("buffer_names"));
    for (const std::string& b : buffers) RETURN_IF_ERROR(AddWhole(b, model_[0], "module." + b));
    return Status::Ok();
  }

  // Frozen parameters: whole in the model file (stages 1/2), or cut as
  // stage 3 cuts parameters, one part per rank's model file.
  Status AddFrozen() {
    const Pickle& p = Contents(model_[0]).pickle;
    ASSIGN_OR_RETURN(auto frozen,
                     ParamShapes(p, p.Get(p.root(), "frozen_param_shapes"), "frozen_param_shapes"));
    for (auto& group : frozen) {
      for (const DsParam& f : group) {
        const std::string stored = "frozen_param_fragments." + f.name;
        if (stage_ <= 2) {
          RETURN_IF_ERROR(AddWhole(f.name, model_[0], stored));
          continue;
        }
        TorchEntry e{f.name, DType::kF32, f.shape, {}};
        const int64_t part = (f.numel + world_ - 1) / world_;
        for (int64_t r = 0; r < world_; ++r) {
          const int64_t t = Find(model_[r], stored);
          if (t < 0) return Bad(ModelName(3, r), "no tensor '" + PrintableText(stored) + "'");
          e.dtype = Contents(model_[r]).tensors[t].dtype;
          const int64_t begin = std::min(f.numel, r * part);
          const int64_t end = std::min(f.numel, begin + part);
          if (end > begin) e.pieces.push_back(Flat(model_[r], t, begin, 0, end - begin));
        }
        entries_.push_back(std::move(e));
      }
    }
    return Status::Ok();
  }

  static TorchPiece Flat(size_t source, int64_t tensor, int64_t flat_begin, int64_t src_begin,
                         int64_t count) {
    TorchPiece p;
    p.source = source;
    p.tensor = static_cast<size_t>(tensor);
    p.flat = true;
    p.flat_begin = flat_begin;
    p.src_begin = src_begin;
    p.count = count;
    return p;
  }

  // The flat fp32 partitions' key and the optimizer state's path of group g.
  std::string GroupsKey() const {
    return std::string("optimizer_state_dict.") +
           (stage_ <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups");
  }
  std::string StatePrefix(size_t source, size_t g) {
    if (stage_ == 3) return "optimizer_state_dict.optimizer_state_dict.state." + std::to_string(g);
    const std::string base = "optimizer_state_dict.base_optimizer_state.";
    const std::string rigid = base + "state." + std::to_string(g);
    for (const TorchTensor& t : Contents(source).tensors) {
      if (StartsWith(t.name, rigid + ".")) return rigid;
    }
    return base + std::to_string(g);  // an elastic checkpoint's list of group states
  }

  // One flat tensor per rank of group g under `name`: the tensors' indices.
  Result<std::vector<int64_t>> PerRank(const std::string& name) {
    std::vector<int64_t> out;
    for (int64_t r = 0; r < world_; ++r) {
      const int64_t t = Find(optim_[r], name);
      if (t < 0) {
        return Bad(OptimName(prefix_, r), "no tensor '" + PrintableText(name) + "'");
      }
      const TorchTensor& tensor = Contents(optim_[r]).tensors[t];
      if (tensor.shape.size() != 1 || !tensor.Contiguous()) {
        return Bad(OptimName(prefix_, r), "'" + PrintableText(name) + "' is not a flat tensor");
      }
      out.push_back(t);
    }
    return out;
  }

  // The optimizer's per-element states of group g (tensors in every rank
  // with at least as many elements as its fp32 partition): key -> the
  // tensor of each rank.
  Result<std::map<std::string, std::vector<int64_t>>> States(size_t g,
                                                             const std::vector<int64_t>& fp32) {
    std::map<std::string, std::vector<int64_t>> out;
    const std::string prefix = StatePrefix(optim_[0], g) + ".";
    for (const TorchTensor& t : Contents(optim_[0]).tensors) {
      if (!StartsWith(t.name, prefix)) continue;
      const std::string key = t.name.substr(prefix.size());
      if (key.find('.') != std::string::npos || t.shape.size() != 1 || !t.Contiguous()) continue;
      std::vector<int64_t> ranks;
      for (int64_t r = 0; r < world_; ++r) {
        const int64_t s = Find(optim_[r], StatePrefix(optim_[r], g) + "." + key);
        if (s < 0 || TensorNumel(optim_[r], s) < TensorNumel(optim_[r], fp32[r])) {
          return Bad(OptimName(prefix_, r), "the optimizer's '" + PrintableText(key) +
                                                "' of group " + std::to_string(g) +
                                                " is missing or shorter than the partition");
        }
        ranks.push_back(s);
      }
      if (TensorNumel(optim_[0], ranks[0]) >= TensorNumel(optim_[0], fp32[0])) out[key] = ranks;
    }
    return out;
  }

  // Stages 1/2: each group's parameters, in order, are the concatenation
  // of the ranks' partitions; what is left at the end is alignment padding
  // (zero_to_fp32's check: both ends round to the same multiple of 2 x dp).
  Status AddPartitioned(const std::vector<std::vector<DsParam>>& groups) {
    for (size_t g = 0; g < groups.size(); ++g) {
      ASSIGN_OR_RETURN(auto fp32, PerRank(GroupsKey() + "." + std::to_string(g)));
      ASSIGN_OR_RETURN(auto states, States(g, fp32));
      std::vector<int64_t> starts = {0};  // of each rank's partition
      for (int64_t r = 0; r < world_; ++r) {
        starts.push_back(starts.back() + TensorNumel(optim_[r], fp32[r]));
      }
      int64_t offset = 0;
      for (const DsParam& param : groups[g]) {
        if (param.numel > starts.back() - offset) {
          return Bad(OptimName(prefix_, 0), "group " + std::to_string(g) +
                                                "'s partitions end inside '" +
                                                PrintableText(param.name) + "'");
        }
        AddCut(param, "", fp32, starts, offset);
        for (const auto& [key, tensors] : states) {
          AddCut(param, key, tensors, starts, offset);
        }
        offset += param.numel;
      }
      const int64_t align = 2 * world_;
      if ((offset + align - 1) / align != (starts.back() + align - 1) / align) {
        return Bad(OptimName(prefix_, 0),
                   "group " + std::to_string(g) + "'s parameters take " + std::to_string(offset) +
                       " elements, its partitions hold " + std::to_string(starts.back()));
      }
    }
    return Status::Ok();
  }

  std::string StateName(const std::string& param, const std::string& key) const {
    return key.empty() ? param : "optimizer." + param + "." + key;
  }

  // Elements [offset, offset + numel) of a group's concatenated partitions.
  void AddCut(const DsParam& param, const std::string& key, const std::vector<int64_t>& tensors,
              const std::vector<int64_t>& starts, int64_t offset) {
    TorchEntry e{StateName(param.name, key), DType::kF32, param.shape, {}};
    for (int64_t r = 0; r < world_; ++r) {
      e.dtype = Contents(optim_[r]).tensors[tensors[r]].dtype;
      const int64_t lo = std::max(offset, starts[r]);
      const int64_t hi = std::min(offset + param.numel, starts[r + 1]);
      if (hi > lo)
        e.pieces.push_back(Flat(optim_[r], tensors[r], lo - offset, lo - starts[r], hi - lo));
    }
    entries_.push_back(std::move(e));
  }

  // Stage 3: every parameter is cut into dp parts of ceil(numel / dp)
  // elements (the last padded), rank r's part at the same offset of its
  // groups' concatenation as every other rank's.
  Status AddZero3(const std::vector<DsParam>& params) {
    std::vector<std::vector<int64_t>> fp32;  // [group][rank]
    std::vector<std::map<std::string, std::vector<int64_t>>> states;
    std::vector<int64_t> starts = {0};  // of each group in a rank's concatenation
    for (size_t g = 0; Find(optim_[0], GroupsKey() + "." + std::to_string(g)) >= 0; ++g) {
      ASSIGN_OR_RETURN(auto ranks, PerRank(GroupsKey() + "." + std::to_string(g)));
      for (int64_t r = 1; r < world_; ++r) {
        if (TensorNumel(optim_[r], ranks[r]) != TensorNumel(optim_[0], ranks[0])) {
          return Bad(OptimName(prefix_, r),
                     "flat group " + std::to_string(g) + " differs in size from rank 0's");
        }
      }
      ASSIGN_OR_RETURN(auto s, States(g, ranks));
      starts.push_back(starts.back() + TensorNumel(optim_[0], ranks[0]));
      fp32.push_back(std::move(ranks));
      states.push_back(std::move(s));
    }
    int64_t offset = 0;
    for (const DsParam& param : params) {
      const int64_t part = (param.numel + world_ - 1) / world_;
      if (part > starts.back() - offset) {
        return Bad(OptimName(prefix_, 0),
                   "the flat groups end inside '" + PrintableText(param.name) + "'");
      }
      RETURN_IF_ERROR(AddZero3Param(param, "", fp32, starts, offset));
      if (!states.empty()) {
        for (const auto& state : states[0]) {
          std::vector<std::vector<int64_t>> tensors;
          for (auto& s : states) {
            auto it = s.find(state.first);
            tensors.push_back(it == s.end() ? std::vector<int64_t>() : it->second);
          }
          RETURN_IF_ERROR(AddZero3Param(param, state.first, tensors, starts, offset));
        }
      }
      offset += part;
    }
    if (offset != starts.back()) {
      return Bad(OptimName(prefix_, 0), "the parameters take " + std::to_string(offset) +
                                            " elements of each rank's " +
                                            std::to_string(starts.back()));
    }
    return Status::Ok();
  }

  Status AddZero3Param(const DsParam& param, const std::string& key,
                       const std::vector<std::vector<int64_t>>& tensors,
                       const std::vector<int64_t>& starts, int64_t offset) {
    TorchEntry e{StateName(param.name, key), DType::kF32, param.shape, {}};
    const int64_t part = (param.numel + world_ - 1) / world_;
    for (int64_t r = 0; r < world_; ++r) {
      const int64_t begin = std::min(param.numel, r * part);
      const int64_t end = std::min(param.numel, begin + part);
      // [offset, offset + end - begin) of rank r's groups, group by group.
      for (size_t g = 0; g + 1 < starts.size() && end > begin; ++g) {
        const int64_t lo = std::max(offset, starts[g]);
        const int64_t hi = std::min(offset + end - begin, starts[g + 1]);
        if (hi <= lo) continue;
        if (tensors[g].empty()) {
          return Bad(OptimName(prefix_, 0),
                     "flat group " + std::to_string(g) + " has no '" + PrintableText(key) + "'");
        }
        e.dtype = Contents(optim_[r]).tensors[tensors[g][r]].dtype;
        e.pieces.push_back(
            Flat(optim_[r], tensors[g][r], begin + lo - offset, lo - starts[g], hi - lo));
      }
    }
    entries_.push_back(std::move(e));
    return Status::Ok();
  }

  // shared_params: {alias: the parameter holding the data}.
  Status AddShared() {
    const Pickle& p = Contents(model_[0]).pickle;
    const int32_t shared = p.Get(p.root(), "shared_params");
    const std::vector<int32_t>* pairs = shared < 0 ? nullptr : p.Pairs(shared);
    for (size_t k = 0; pairs && k + 1 < pairs->size(); k += 2) {
      const PickleValue& alias = p.at((*pairs)[k]);
      const PickleValue& target = p.at((*pairs)[k + 1]);
      if (alias.kind != PickleKind::kStr || target.kind != PickleKind::kStr ||
          !IsUtf8(alias.text)) {
        return Bad(ModelName(stage_, 0), "shared_params holds a value that is not a name");
      }
      auto it = std::find_if(entries_.begin(), entries_.end(),
                             [&](const TorchEntry& e) { return e.name == target.text; });
      if (it == entries_.end()) continue;  // zero_to_fp32 skips these too
      TorchEntry copy = *it;
      copy.name = alias.text;
      entries_.push_back(std::move(copy));
    }
    return Status::Ok();
  }

  // The model file's other leaves and rank 0's optimizer state's (its
  // copies of ds_config and ds_version are the model file's) as metadata.
  void AddValues() {
    static const std::set<std::string> kTensorsOwn = {"param_shapes", "frozen_param_shapes",
                                                      "shared_params", "buffer_names", "module"};
    for (const TorchValue& v : Contents(model_[0]).values) {
      if (kTensorsOwn.count(v.name.substr(0, v.name.find('.')))) continue;
      values_.emplace_back("deepspeed." + v.name, v.text);
    }
    for (const TorchValue& v : Contents(optim_[0]).values) {
      if (!StartsWith(v.name, "optimizer_state_dict.")) continue;
      values_.emplace_back("deepspeed." + v.name, v.text);
    }
    values_.emplace_back("deepspeed.zero_stage", std::to_string(stage_));
    values_.emplace_back("deepspeed.dp_world_size", std::to_string(world_));
  }

  Env* env_;
  std::string path_;
  std::string dir_;
  std::string prefix_;
  int stage_ = 0;
  int64_t world_ = 0;
  std::vector<std::unique_ptr<TorchSource>> sources_;
  std::vector<std::map<std::string, size_t>> names_;  // per source, filled on first use
  std::vector<size_t> optim_;                         // source of each rank's optimizer file
  std::vector<size_t> model_;                         // source of each model states file
  std::vector<TorchEntry> entries_;
  std::vector<std::pair<std::string, std::string>> values_;
};

}  // namespace

bool IsDeepSpeedCheckpoint(Env* env, const std::string& path) {
  // A universal checkpoint too, for the opener to refuse by name.
  return env->IsDirectory(path) &&
         (TagDir(env, path).ok() || env->FileExists(JoinPath(path, "latest_universal")));
}

Result<std::unique_ptr<CheckpointReader>> OpenDeepSpeedCheckpoint(Env* env,
                                                                  const std::string& path) {
  return DeepSpeedOpener(env, path).Open();
}

}  // namespace tessera
