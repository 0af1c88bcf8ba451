#include "ckpt/megatron_ckpt.h"

#include <cctype>
#include <cstdio>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "ckpt/torch_reader.h"
#include "core/strings.h"
#include "core/utf8.h"

namespace tessera {
namespace {

constexpr char kTracker[] = "latest_checkpointed_iteration.txt";
constexpr char kRankFile[] = "model_optim_rng.pt";

std::string RankDir(int64_t tp, int64_t pp, bool pipeline) {
  char name[64];
  if (pipeline) {
    std::snprintf(name, sizeof(name), "mp_rank_%02lld_%03lld", static_cast<long long>(tp),
                  static_cast<long long>(pp));
  } else {
    std::snprintf(name, sizeof(name), "mp_rank_%02lld", static_cast<long long>(tp));
  }
  return name;
}

// Whether `dir` holds rank (0, 0)'s file: with a pipeline (true), without
// (false), or not at all.
std::optional<bool> FirstRank(Env* env, const std::string& dir) {
  for (bool pipeline : {false, true}) {
    if (env->FileExists(JoinPath(JoinPath(dir, RankDir(0, 0, pipeline)), kRankFile))) {
      return pipeline;
    }
  }
  return std::nullopt;
}

// The iteration directory: `path` where it holds the rank directories,
// else the one the tracker file names.
Result<std::string> IterationDir(Env* env, const std::string& path) {
  if (FirstRank(env, path)) return path;
  if (env->FileExists(JoinPath(JoinPath(path, "mp_rank_00_000_000"), kRankFile))) {
    return UnimplementedError("Megatron checkpoint '" + path +
                              "': mp_rank_00_000_000: expert-parallel checkpoints are not read");
  }
  const std::string tracker = JoinPath(path, kTracker);
  if (!env->FileExists(tracker)) {
    return NotFoundError("Megatron checkpoint '" + path + "': no mp_rank_00/" + kRankFile +
                         " and no " + kTracker);
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, tracker));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  std::string dir = "release";
  if (text != "release") {
    char* end = nullptr;
    const long long iteration = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || iteration < 0) {
      return DataLossError("Megatron checkpoint '" + path + "': " + kTracker + " holds '" +
                           PrintableText(text.substr(0, 64)) + "', not an iteration or 'release'");
    }
    char name[32];
    std::snprintf(name, sizeof(name), "iter_%07lld", iteration);
    dir = name;
  }
  const std::string full = JoinPath(path, dir);
  if (env->FileExists(JoinPath(JoinPath(full, "mp_rank_00_000_000"), kRankFile))) {
    return UnimplementedError("Megatron checkpoint '" + path + "': " + dir +
                              "/mp_rank_00_000_000: expert-parallel checkpoints are not read");
  }
  if (!FirstRank(env, full)) {
    return NotFoundError("Megatron checkpoint '" + path + "': '" + dir + "' (from " + kTracker +
                         ") has no mp_rank_00/" + kRankFile);
  }
  return full;
}

enum class Cut { kReplicated, kRows, kGatedRows, kColumns, kUnknown };

// The table of ckpt/megatron_ckpt.h. Mamba mixers and MoE experts (cut
// by expert_tensor_parallel_size, not tp) are not in it.
Cut CutOf(const std::string& name, bool gated) {
  if (name.find(".mixer.") != std::string::npos || name.find(".experts.") != std::string::npos) {
    return Cut::kUnknown;
  }
  for (const char* s : {"layer_norm_weight", "layer_norm_bias", "norm.weight", "norm.bias",
                        "position_embeddings.weight", "self_attention.dense.bias",
                        "dense_4h_to_h.bias", "linear_proj.bias", "linear_fc2.bias"}) {
    if (EndsWith(name, s)) return Cut::kReplicated;
  }
  for (const char* s :
       {"dense_h_to_4h.weight", "dense_h_to_4h.bias", "linear_fc1.weight", "linear_fc1.bias"}) {
    if (EndsWith(name, s)) return gated ? Cut::kGatedRows : Cut::kRows;
  }
  for (const char* s :
       {"word_embeddings.weight", "word_embeddings_for_head.weight", "output_layer.weight",
        "query_key_value.weight", "query_key_value.bias", "linear_qkv.weight", "linear_qkv.bias"}) {
    if (EndsWith(name, s)) return Cut::kRows;
  }
  for (const char* s : {"self_attention.dense.weight", "linear_proj.weight", "dense_4h_to_h.weight",
                        "linear_fc2.weight"}) {
    if (EndsWith(name, s)) return Cut::kColumns;
  }
  return Cut::kUnknown;
}

// The layer number of a name in the decoder's stack (megatron.core
// "decoder.layers.<n>.", legacy "language_model.{encoder,decoder}.layers.<n>."):
// where n starts and ends.
std::optional<std::pair<size_t, size_t>> LayerNumber(const std::string& name) {
  for (const char* stack :
       {"decoder.layers.", "language_model.encoder.layers.", "language_model.decoder.layers."}) {
    if (!StartsWith(name, stack)) continue;
    const size_t at = std::string_view(stack).size();
    size_t end = at;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end > at && end < name.size() && name[end] == '.' && end - at < 10) {
      return std::make_pair(at, end);
    }
  }
  return std::nullopt;
}

// Another stack of layers ("mtp.layers.0.", a vision model's
// "vision_model.decoder.layers.0."), numbered per pipeline stage in ways
// the decoder's rule does not cover.
bool OtherLayerStack(const std::string& name) {
  return !LayerNumber(name) &&
         (StartsWith(name, "layers.") || name.find(".layers.") != std::string::npos);
}

// A tensor of a rank file: its source and index there.
struct Held {
  size_t source = 0;
  size_t tensor = 0;
};

// Builds the checkpoint's entries from the rank files of one iteration.
class MegatronOpener {
 public:
  MegatronOpener(Env* env, std::string path) : env_(env), path_(std::move(path)) {}

  Result<std::unique_ptr<CheckpointReader>> Open() {
    ASSIGN_OR_RETURN(dir_, IterationDir(env_, path_));
    pipeline_ = *FirstRank(env_, dir_);
    RETURN_IF_ERROR(ReadSizes());
    files_[{0, 0}] = rank0_;
    for (int64_t p = 0; p < pp_; ++p) {
      for (int64_t t = p == 0 ? 1 : 0; t < tp_; ++t) {
        ASSIGN_OR_RETURN(size_t s, AddSource(RankDir(t, p, pipeline_), false));
        files_[{t, p}] = s;
      }
    }
    RETURN_IF_ERROR(CheckNoOtherRanks());
    RETURN_IF_ERROR(Collect());
    for (const std::string& name : order_) RETURN_IF_ERROR(AddEntry(name));
    AddValues();
    return MakeTorchReader(path_, "megatron", std::move(sources_), std::move(entries_), values_);
  }

 private:
  Status Bad(const std::string& what) const {
    return DataLossError("Megatron checkpoint '" + path_ + "': " + what);
  }
  const TorchSaveFile& Contents(size_t s) const { return sources_[s]->contents; }

  Result<size_t> AddSource(const std::string& rank_dir, bool keep_pickle) {
    ASSIGN_OR_RETURN(auto src, OpenTorchSource(env_, JoinPath(JoinPath(dir_, rank_dir), kRankFile),
                                               keep_pickle));
    sources_.push_back(std::move(src));
    return sources_.size() - 1;
  }

  // Sizes from rank (0, 0)'s args (argparse.Namespace: its BUILD state).
  Status ReadSizes() {
    ASSIGN_OR_RETURN(size_t s0, AddSource(RankDir(0, 0, pipeline_), true));
    const Pickle& p = Contents(s0).pickle;
    const int32_t args = p.Get(p.root(), "args");
    const int32_t state =
        args < 0 || p.at(args).kind != PickleKind::kRecord ? -1 : p.at(args).state;
    if (state < 0) return Bad(RankDir(0, 0, pipeline_) + ": no args (not a Megatron-LM file)");
    auto size = [&](const char* key) -> int64_t {
      const int32_t v = p.Get(state, key);
      auto n = v < 0 ? std::nullopt : p.AsInt(v);
      return n ? *n : 1;
    };
    tp_ = size("tensor_model_parallel_size");
    pp_ = size("pipeline_model_parallel_size");
    // fc1 holds [gate; up] on each rank for every gated linear unit.
    for (const char* flag : {"swiglu", "quick_geglu", "gated_linear_unit"}) {
      const int32_t v = p.Get(state, flag);
      gated_ = gated_ || (v >= 0 && p.at(v).kind == PickleKind::kBool && p.at(v).boolean);
    }
    if (size("expert_model_parallel_size") != 1) {
      return UnimplementedError("Megatron checkpoint '" + path_ +
                                "': expert-parallel checkpoints are not read");
    }
    if (tp_ < 1 || pp_ < 1 || tp_ > 4096 || pp_ > 4096) {
      return Bad("args give tensor/pipeline sizes " + std::to_string(tp_) + "/" +
                 std::to_string(pp_));
    }
    if (pp_ > 1 && !pipeline_)
      return Bad("pipeline size " + std::to_string(pp_) + " but no mp_rank_00_000");
    // Megatron reads a missing version as 0.
    const int32_t version = p.Get(p.root(), "checkpoint_version");
    double number = 0;
    if (version >= 0 && p.at(version).kind == PickleKind::kFloat) number = p.at(version).number;
    if (version >= 0 && p.at(version).kind == PickleKind::kInt) number = p.at(version).integer;
    if (tp_ > 1 && number < 1.0) {
      return UnimplementedError("Megatron checkpoint '" + path_ +
                                "': checkpoint_version 0 stores QKV as [3, heads, dim], which "
                                "tensor-parallel ranks cut across q, k and v; not merged");
    }
    rank0_ = s0;
    return Status::Ok();
  }

  // A rank directory beyond the sizes (a leftover of a larger job).
  Status CheckNoOtherRanks() const {
    const bool pipeline = pipeline_;
    for (const auto& [t, p] : {std::pair{tp_, int64_t{0}}, std::pair{int64_t{0}, pp_}}) {
      if (p > 0 && !pipeline) continue;
      const std::string extra = RankDir(t, p, pipeline);
      if (env_->FileExists(JoinPath(JoinPath(dir_, extra), kRankFile))) {
        return Bad(extra + " is beyond the sizes args give (tensor " + std::to_string(tp_) +
                   ", pipeline " + std::to_string(pp_) + ")");
      }
    }
    return Status::Ok();
  }

  // The model's tensors of every chunk, renumbered: chunks in the order
  // virtual stage, then pipeline rank, each numbering its layers after
  // the layers of the chunks before it.
  Status Collect() {
    int64_t chunks = 0;
    while (HasModel(rank0_, "model" + std::to_string(chunks) + ".")) ++chunks;
    const bool virtual_stages = chunks > 0;
    virtual_ = virtual_stages;
    if (!virtual_stages) chunks = 1;
    int64_t offset = 0;
    for (int64_t v = 0; v < chunks; ++v) {
      for (int64_t p = 0; p < pp_; ++p) {
        const std::string prefix = virtual_stages ? "model" + std::to_string(v) + "." : "model.";
        int64_t layers = 0;
        for (int64_t t = 0; t < tp_; ++t) {
          ASSIGN_OR_RETURN(int64_t n, CollectChunk(files_.at({t, p}), prefix, t, offset));
          layers = std::max(layers, n);
        }
        offset += layers;
      }
    }
    return Status::Ok();
  }
  bool HasModel(size_t source, const std::string& prefix) const {
    for (const TorchTensor& t : Contents(source).tensors) {
      if (StartsWith(t.name, prefix)) return true;
    }
    return false;
  }

  // One chunk of one tensor-parallel rank; returns how many layers it has.
  Result<int64_t> CollectChunk(size_t source, const std::string& prefix, int64_t t,
                               int64_t offset) {
    int64_t layers = 0;
    const std::vector<TorchTensor>& tensors = Contents(source).tensors;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!StartsWith(tensors[i].name, prefix)) continue;
      std::string name = tensors[i].name.substr(prefix.size());
      if (EndsWith(name, "_extra_state")) continue;
      if ((pp_ > 1 || virtual_) && OtherLayerStack(name)) {
        return UnimplementedError("Megatron checkpoint '" + path_ + "': tensor '" +
                                  PrintableText(name) +
                                  "' is in a layer stack other than the decoder's (multi-token "
                                  "prediction, a vision model); across pipeline stages it is not "
                                  "merged");
      }
      if (auto n = LayerNumber(name)) {
        const int64_t local = std::stoll(name.substr(n->first, n->second - n->first));
        layers = std::max(layers, local + 1);
        name = name.substr(0, n->first) + std::to_string(offset + local) + name.substr(n->second);
      }
      auto [it, added] = held_.emplace(name, std::vector<std::optional<Held>>(tp_));
      if (added) order_.push_back(name);
      if (it->second[t]) {
        return Bad("'" + PrintableText(name) + "' is held twice by tensor-parallel rank " +
                   std::to_string(t) + " (layer numbering across pipeline stages?)");
      }
      it->second[t] = Held{source, i};
    }
    return layers;
  }

  // A view of rows [begin, end) of a stored tensor, added to its source.
  size_t RowView(const Held& h, int64_t begin, int64_t end) {
    std::vector<TorchTensor>& tensors = sources_[h.source]->contents.tensors;
    TorchTensor v = tensors[h.tensor];
    v.storage_offset += begin * v.strides[0];
    v.shape[0] = end - begin;
    tensors.push_back(std::move(v));
    return tensors.size() - 1;
  }

  Status AddEntry(const std::string& name) {
    const std::vector<std::optional<Held>>& ranks = held_.at(name);
    for (int64_t t = 0; t < tp_; ++t) {
      if (!ranks[t]) {
        return Bad("'" + PrintableText(name) + "' is missing from tensor-parallel rank " +
                   std::to_string(t));
      }
    }
    // A copy: RowView adds tensors to the sources.
    const TorchTensor first = Contents(ranks[0]->source).tensors[ranks[0]->tensor];
    Cut cut = tp_ == 1 ? Cut::kReplicated : CutOf(name, gated_);
    if (cut == Cut::kUnknown) {
      return UnimplementedError("Megatron checkpoint '" + path_ + "': tensor '" +
                                PrintableText(name) +
                                "' is not in the tensor-parallel split table "
                                "(ckpt/megatron_ckpt.h); not merged");
    }
    const int dim = cut == Cut::kColumns ? 1 : 0;
    if (cut != Cut::kReplicated && first.shape.size() <= static_cast<size_t>(dim)) {
      return Bad("'" + PrintableText(name) + "' has no dimension " + std::to_string(dim) +
                 " to merge");
    }
    TorchEntry e{name, first.dtype, first.shape, {}};
    if (cut == Cut::kReplicated) {
      e.pieces.push_back({ranks[0]->source, ranks[0]->tensor, Box::FromShape(first.shape)});
      entries_.push_back(std::move(e));
      return Status::Ok();
    }
    const int64_t part = first.shape[dim];
    if (__builtin_mul_overflow(part, tp_, &e.shape[dim])) {
      return Bad("'" + PrintableText(name) + "' has an impossible size");
    }
    if (cut == Cut::kGatedRows && part % 2 != 0) {
      return Bad("'" + PrintableText(name) +
                 "' (gated: args.swiglu, quick_geglu or gated_linear_unit) has an odd row count");
    }
    for (int64_t t = 0; t < tp_; ++t) {
      const TorchTensor& mine = Contents(ranks[t]->source).tensors[ranks[t]->tensor];
      if (mine.shape != first.shape || mine.dtype != first.dtype) {
        return Bad("'" + PrintableText(name) +
                   "' differs in shape or dtype between tensor-parallel ranks 0 and " +
                   std::to_string(t));
      }
      Box box = Box::FromShape(e.shape);
      if (cut == Cut::kGatedRows) {  // [gate; up] per rank -> [gate; up] whole
        const int64_t half = part / 2;
        for (int k = 0; k < 2; ++k) {
          box[0] = {k * half * tp_ + t * half, k * half * tp_ + (t + 1) * half};
          e.pieces.push_back({ranks[t]->source, RowView(*ranks[t], k * half, (k + 1) * half), box});
        }
        continue;
      }
      box[dim] = {t * part, (t + 1) * part};
      e.pieces.push_back({ranks[t]->source, ranks[t]->tensor, box});
    }
    entries_.push_back(std::move(e));
    return Status::Ok();
  }

  void AddValues() {
    int64_t skipped = 0;
    for (const TorchTensor& t : Contents(rank0_).tensors) {
      if (!StartsWith(t.name, "model")) ++skipped;
    }
    for (const TorchValue& v : Contents(rank0_).values) {
      const std::string head = v.name.substr(0, v.name.find('.'));
      if (StartsWith(head, "model")) continue;
      values_.emplace_back("megatron." + v.name, v.text);
    }
    values_.emplace_back("megatron.tensor_parallel", std::to_string(tp_));
    values_.emplace_back("megatron.pipeline_parallel", std::to_string(pp_));
    if (skipped > 0) {
      values_.emplace_back(
          "megatron.not_read",
          std::to_string(skipped) + " tensors of rank 0 outside the model (optimizer, RNG state)");
    }
  }

  Env* env_;
  std::string path_;
  std::string dir_;
  bool pipeline_ = false;
  bool gated_ = false;  // args.swiglu, quick_geglu or gated_linear_unit
  int64_t tp_ = 1;
  int64_t pp_ = 1;
  bool virtual_ = false;  // model0..model<k> chunks
  size_t rank0_ = 0;
  std::vector<std::unique_ptr<TorchSource>> sources_;
  std::map<std::pair<int64_t, int64_t>, size_t> files_;  // (tp, pp) -> source
  std::map<std::string, std::vector<std::optional<Held>>> held_;
  std::vector<std::string> order_;
  std::vector<TorchEntry> entries_;
  std::vector<std::pair<std::string, std::string>> values_;
};

}  // namespace

bool IsMegatronCheckpoint(Env* env, const std::string& path) {
  // The tracker file alone is Megatron's (the opener names what is missing).
  return env->IsDirectory(path) &&
         (FirstRank(env, path).has_value() || env->FileExists(JoinPath(path, kTracker)) ||
          env->FileExists(JoinPath(JoinPath(path, "mp_rank_00_000_000"), kRankFile)));
}

Result<std::unique_ptr<CheckpointReader>> OpenMegatronCheckpoint(Env* env,
                                                                 const std::string& path) {
  return MegatronOpener(env, path).Open();
}

}  // namespace tessera
