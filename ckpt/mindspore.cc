#include "ckpt/mindspore.h"

#include <algorithm>
#include <map>

#include "ckpt/dense.h"
#include "ckpt/meta_attributes.h"
#include "core/strings.h"
#include "core/utf8.h"
#include "formats/safetensors.h"
#include "transform/mindspore_layout.h"

namespace tessera {
namespace {

constexpr char kRankDirPrefix[] = "rank_";

struct Entry {
  const MindSporeParam* param = nullptr;
  PipelinePlacement placement;
};

// Name -> parameter and pipeline stages over all strategy files, as
// merge_pipeline_strategys sees them: a file's stage is that of its first
// strategy item, and a file of a stage already seen is skipped (every rank
// of a stage writes the same file); a merged file's "<stage>-" prefixes give
// each parameter its stage. A parameter on several stages (a shared
// embedding) is held by each of them, read from the lowest; its layouts
// must agree. Every stage 0..n-1 must be present.
struct ParamIndex {
  std::map<std::string, Entry> params;
  int64_t stages = 1;
};

Result<ParamIndex> IndexParams(const std::vector<MindSporeStrategyFile>& files) {
  ParamIndex index;
  std::map<int64_t, bool> seen;
  const bool pipeline = files.size() > 1 || (files.size() == 1 && files[0].merged_pipeline);
  for (const MindSporeStrategyFile& f : files) {
    if (!f.merged_pipeline) {
      const int64_t stage = pipeline ? f.stage : 0;
      if (seen.count(stage)) continue;
      seen[stage] = true;
    }
    for (const MindSporeParam& p : f.params) {
      const int64_t stage = pipeline ? p.stage : 0;
      if (stage < 0) return InvalidArgumentError("MindSpore strategy: negative stage");
      seen[stage] = true;
      auto [it, inserted] = index.params.emplace(p.name, Entry{&p, {stage, 1}});
      if (inserted) continue;
      if (!pipeline) {
        return InvalidArgumentError("MindSpore strategy: parameter '" + p.name + "' appears twice");
      }
      Entry& e = it->second;
      if (!(p.layout == e.param->layout)) {
        return InvalidArgumentError("MindSpore strategy: parameter '" + p.name +
                                    "' is laid out differently on stages " +
                                    std::to_string(std::min(stage, e.placement.stage)) + " and " +
                                    std::to_string(std::max(stage, e.placement.stage)) +
                                    "; Tessera holds a tensor on several stages with one layout");
      }
      std::vector<int64_t> all = e.placement.copy_stages;
      all.push_back(e.placement.stage);
      if (std::find(all.begin(), all.end(), stage) != all.end()) {
        return InvalidArgumentError("MindSpore strategy: parameter '" + p.name +
                                    "' appears twice on stage " + std::to_string(stage));
      }
      all.push_back(stage);
      std::sort(all.begin(), all.end());
      if (stage < e.placement.stage) e.param = &p;
      e.placement.stage = all[0];
      e.placement.copy_stages.assign(all.begin() + 1, all.end());
    }
  }
  index.stages = seen.empty() ? 1 : seen.rbegin()->first + 1;
  if (static_cast<int64_t>(seen.size()) != index.stages) {
    std::string have;
    for (const auto& [stage, _] : seen) have += (have.empty() ? "" : ", ") + std::to_string(stage);
    return InvalidArgumentError("MindSpore strategies: pipeline stages " + have +
                                " found, but not every stage 0.." +
                                std::to_string(index.stages - 1));
  }
  for (auto& [_, e] : index.params) e.placement.num_stages = index.stages;
  return index;
}

// The parameter a tensor follows: itself, or for "<state>.<param>" the
// parameter (optimizer states mirror their parameter's layout).
const Entry* Follow(const std::map<std::string, Entry>& params, const std::string& name) {
  auto it = params.find(name);
  if (it != params.end()) return &it->second;
  const size_t dot = name.find('.');
  if (dot == std::string::npos) return nullptr;
  it = params.find(name.substr(dot + 1));
  return it == params.end() ? nullptr : &it->second;
}

int64_t DevicesPerStage(const std::vector<MindSporeStrategyFile>& files) {
  for (const MindSporeStrategyFile& f : files) {
    for (const MindSporeParam& p : f.params) {
      int64_t n = 1;
      for (int64_t d : p.layout.dev_matrix) n *= d;
      return n;
    }
  }
  return 1;
}

// The global shape of a parameter whose slice on `rank` has `local` dims:
// the local dims times each dimension's device-axis sizes, and dimension 0
// times the optimizer-shard count when the slices say so.
Result<std::vector<int64_t>> GlobalShape(const std::string& name, const Entry& e, DType dtype,
                                         const std::vector<int64_t>& local, int64_t rank) {
  if (!e.param->shape.empty()) return e.param->shape;
  const MindSporeLayout& ms = e.param->layout;
  std::vector<int64_t> g = local;
  const int n = static_cast<int>(ms.dev_matrix.size());
  if (ms.tensor_map.size() != g.size()) {
    return InvalidArgumentError("tensor '" + name + "': the strategy's tensor_map has " +
                                std::to_string(ms.tensor_map.size()) + " entries, the slice " +
                                std::to_string(g.size()) + " dimensions");
  }
  for (size_t d = 0; d < g.size(); ++d) {
    for (int64_t k : ms.tensor_map[d]) {
      if (k >= 0 && k < n) g[d] *= ms.dev_matrix[n - 1 - k];
    }
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto ml = FromMindSpore(ms, g, dtype, e.placement);
    if (!ml.ok()) return ml.status().Annotate("tensor '" + name + "'");
    ASSIGN_OR_RETURN(std::optional<Box> box, ShardOf(ml->layout, ml->mesh, rank));
    if (box && box->extents() == local) return g;
    const int opt = ml->mesh.FindAxis("opt");
    if (attempt > 0 || opt < 0 || g.empty()) break;
    g[0] *= ml->mesh.axis_size(opt);
  }
  return DataLossError("tensor '" + name + "': rank " + std::to_string(rank) + " holds a slice " +
                       ShapeToString(local) + " that its strategy cannot produce");
}

struct Stored {
  std::string tag;
  DType dtype = DType::kF32;
  std::vector<int64_t> dims;  // as recorded ([0] for a scalar)
  std::vector<DenseSegment> segments;
  uint64_t bytes = 0;
  std::vector<int64_t> local;  // the shape the dims stand for (LocalShape)
  std::string map;             // the map tensor this is a part of
};

// A MapParameter's keys, values and status are three tensors under these
// suffixes of its name.
constexpr const char* kMapSuffixes[kMindSporeMapParts] = {".__map_keys__", ".__map_values__",
                                                          ".__map_status__"};

// Adds map tensor record `r` to `out`: its three parts, or with `more`
// (the record follows one of the same map, whose parts end `out`) their
// continuation along dimension 0.
Status AddMapRecord(const MindSporeRecord& r, bool more, uint32_t file_index,
                    const std::string& path, std::vector<Stored>* out) {
  auto bad = [&](const std::string& what) {
    return DataLossError("MindSpore checkpoint '" + path + "': map tensor '" + r.tag +
                         "': " + what);
  };
  const int64_t n = r.map[0].dims.empty() ? -1 : r.map[0].dims[0];
  for (size_t i = 0; i < kMindSporeMapParts; ++i) {
    const MindSporeRecord& part = r.map[i];
    if (part.dims.empty() || part.dims[0] != n || (i != 1 && part.dims.size() != 1)) {
      return bad(std::string("part ") + kMapSuffixes[i] + " has dims " + ShapeToString(part.dims) +
                 " (keys [n], values [n, ...] and status [n] expected)");
    }
  }
  for (size_t i = 0; i < kMindSporeMapParts; ++i) {
    const MindSporeRecord& part = r.map[i];
    auto dtype = ParseMindSporeNumpyDType(part.type);
    if (!dtype.ok()) return bad(dtype.status().message());
    const DenseSegment segment{file_index, part.content_offset, part.content_size};
    if (!more) {
      out->push_back(
          {r.tag + kMapSuffixes[i], *dtype, part.dims, {segment}, part.content_size, {}, r.tag});
      continue;
    }
    Stored& s = (*out)[out->size() - kMindSporeMapParts + i];
    if (s.dtype != *dtype ||
        !std::equal(s.dims.begin() + 1, s.dims.end(), part.dims.begin() + 1, part.dims.end())) {
      return bad("its records disagree on the type or trailing dims of part " +
                 std::string(kMapSuffixes[i]));
    }
    s.dims[0] += part.dims[0];
    s.segments.push_back(segment);
    s.bytes += part.content_size;
  }
  return Status::Ok();
}

// A rank's records, grouped by tag (a tag's records are consecutive); its
// strings (append_dict's) go to `strings`, tag -> text.
Result<std::vector<Stored>> GroupRecords(const RandomAccessFile& file, const MindSporeFile& f,
                                         uint32_t file_index, const std::string& path,
                                         std::map<std::string, std::string>* strings) {
  std::vector<Stored> out;
  std::map<std::string, bool> done;
  for (const MindSporeRecord& r : f.records) {
    if (r.type == kMindSporeStringType) {
      auto bad = [&](const std::string& what) {
        return DataLossError("MindSpore checkpoint '" + path + "': string '" + r.tag +
                             "': " + what);
      };
      if (done.count(r.tag) || strings->count(r.tag)) return bad("the tag appears twice");
      if (r.content_size > kMindSporeMaxStringBytes) {
        return bad(std::to_string(r.content_size) + " bytes, more than the " +
                   std::to_string(kMindSporeMaxStringBytes) + " Tessera reads");
      }
      std::string content(r.content_size, '\0');
      RETURN_IF_ERROR(file.Read(r.content_offset, r.content_size, content.data()));
      auto text = MindSporeStringValue(content);
      if (!text.ok()) return bad(text.status().message());
      (*strings)[r.tag] = std::move(*text);
      continue;
    }
    if (strings->count(r.tag)) {
      return DataLossError("MindSpore checkpoint '" + path + "': tag '" + r.tag +
                           "' is both a string and a tensor");
    }
    if (!r.map.empty()) {
      const bool more = !out.empty() && out.back().map == r.tag;
      if (!more && (done.count(r.tag) || done.count(r.tag + kMapSuffixes[0]))) {
        return DataLossError("MindSpore checkpoint '" + path + "': tensor '" + r.tag +
                             "' appears twice");
      }
      RETURN_IF_ERROR(AddMapRecord(r, more, file_index, path, &out));
      done[r.tag] = true;
      for (const char* suffix : kMapSuffixes) done[r.tag + suffix] = true;
      continue;
    }
    if (!out.empty() && out.back().tag == r.tag) {
      if (r.dims != out.back().dims || r.type != MindSporeDTypeName(out.back().dtype)) {
        return DataLossError("MindSpore checkpoint '" + path + "': the records of tensor '" +
                             r.tag + "' disagree on dims or type");
      }
      out.back().segments.push_back({file_index, r.content_offset, r.content_size});
      out.back().bytes += r.content_size;
      continue;
    }
    if (done.count(r.tag)) {
      return DataLossError("MindSpore checkpoint '" + path + "': tensor '" + r.tag +
                           "' appears twice");
    }
    done[r.tag] = true;
    auto dtype = ParseMindSporeDType(r.type);
    if (!dtype.ok()) {
      return DataLossError("MindSpore checkpoint '" + path + "': tensor '" + r.tag +
                           "': " + dtype.status().message());
    }
    out.push_back(
        {r.tag, *dtype, r.dims, {{file_index, r.content_offset, r.content_size}}, r.content_size});
  }
  return out;
}

// The shape a record's dims stand for: [0] with one element's bytes is a
// scalar. Checks the bytes against the shape.
Result<std::vector<int64_t>> LocalShape(const Stored& s, const std::string& path) {
  std::vector<int64_t> shape = s.dims;
  const uint64_t es = static_cast<uint64_t>(DTypeSize(s.dtype));
  if (s.map.empty() && shape == std::vector<int64_t>{0} && s.bytes == es) shape.clear();
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > (uint64_t{1} << 60) / static_cast<uint64_t>(d)) {
      return DataLossError("MindSpore checkpoint '" + path + "': tensor '" + s.tag +
                           "': dims overflow");
    }
    n *= static_cast<uint64_t>(d);
  }
  if (n * es != s.bytes) {
    return DataLossError("MindSpore checkpoint '" + path + "': tensor '" + s.tag + "' has " +
                         std::to_string(s.bytes) + " bytes of content for " +
                         std::string(DTypeName(s.dtype)) + ShapeToString(shape) + " (" +
                         std::to_string(n * es) + " expected)");
  }
  return shape;
}

// append_dict strings are the checkpoint's metadata; those Tessera wrote
// ("tessera.step", "tessera.meta.<key>", ...) are decoded as in the other
// formats' attributes.
constexpr char kTesseraPrefix[] = "tessera.";

Status StringsToMeta(const std::map<std::string, std::string>& strings, const std::string& where,
                     CheckpointMeta* meta) {
  std::map<std::string, std::string> ours;
  for (const auto& [tag, text] : strings) {
    if (tag.rfind(kTesseraPrefix, 0) == 0) {
      ours[tag] = text;
    } else {
      meta->metadata[tag] = text;
    }
  }
  return DecodeMetaAttributes(where, ours, meta);
}

// The string records of a whole-tensor .ckpt: the step (when not 0) and
// every metadata key, under its own name when that is free (not a tensor,
// not "tessera.*") and its value is UTF-8 text, else as its attribute
// (meta_attributes.h: "tessera.meta.<key>", or in hex when the value is
// not UTF-8 or ends in NUL, which numpy strips).
Result<std::vector<std::string>> MetaToStringRecords(const Strategy& strategy,
                                                     const CheckpointMeta& meta,
                                                     const std::string& where) {
  std::vector<std::pair<std::string, std::string>> strings;  // tag, text
  if (meta.step != 0) strings.push_back({kStepAttribute, std::to_string(meta.step)});
  for (const auto& [key, value] : meta.metadata) {
    // A string's trailing NULs do not survive numpy: such values go as hex.
    const bool text = IsUtf8(value) && (value.empty() || value.back() != '\0');
    if (text && key.rfind(kTesseraPrefix, 0) != 0 && strategy.Find(key) == nullptr) {
      strings.push_back({key, value});
    } else {
      strings.push_back(MetaAttribute(key, value, /*hex=*/!text));
    }
  }
  std::vector<std::string> out;
  for (const auto& [tag, text] : strings) {
    auto record = MindSporeStringRecord(tag, text);
    if (!record.ok()) return record.status().Annotate(where + ": metadata '" + tag + "'");
    out.push_back(std::move(*record));
  }
  return out;
}

// The .ckpt file transform_checkpoints takes of a rank directory's `files`
// (ModelCheckpoint keeps the last few): the last in lexicographic order;
// empty when there is none.
std::string LastCkpt(const std::vector<std::string>& files) {
  std::string last;
  for (const std::string& f : files) {
    if (EndsWith(f, ".ckpt") && f > last) last = f;
  }
  return last;
}

// The .safetensors file MindSpore's transform takes of a rank directory's
// `files` (_collect_safetensor_files): the one whose path's last two
// numbers are largest, compared as a list (net-3_200 over net-3_100 over
// net-2_900); of equal ones the last by name. Empty when there is none.
std::string LastSafetensors(const std::string& dir, const std::vector<std::string>& files) {
  auto numbers = [](const std::string& path) {
    std::vector<uint64_t> all;
    for (size_t i = 0; i < path.size();) {
      if (path[i] < '0' || path[i] > '9') {
        ++i;
        continue;
      }
      uint64_t v = 0;
      for (; i < path.size() && path[i] >= '0' && path[i] <= '9'; ++i) {
        v = v < (uint64_t{1} << 59) ? v * 10 + static_cast<uint64_t>(path[i] - '0') : v;
      }
      all.push_back(v);
    }
    if (all.size() > 2) all.erase(all.begin(), all.end() - 2);
    return all;
  };
  std::string last;
  std::vector<uint64_t> best;
  for (const std::string& f : files) {
    if (!EndsWith(f, ".safetensors")) continue;
    const std::vector<uint64_t> key = numbers(JoinPath(dir, f));
    if (last.empty() || key > best || (key == best && f > last)) {
      last = f;
      best = key;
    }
  }
  return last;
}

// A rank's tensors in a .safetensors file (MindSpore's format="safetensors"),
// by name, the order MindSpore's load_file yields them; its __metadata__
// (but crc_num, MindSpore's own) goes to `strings`.
Result<std::vector<Stored>> SafetensorsRecords(Env* env, const std::string& path,
                                               uint32_t file_index,
                                               std::map<std::string, std::string>* strings) {
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(env, path));
  std::vector<Stored> out;
  for (const SafetensorsEntry& e : file.entries()) {
    const uint64_t n = e.end - e.begin;
    out.push_back({e.name, e.dtype, e.shape, {{file_index, file.data_offset() + e.begin, n}}, n});
  }
  std::sort(out.begin(), out.end(), [](const Stored& a, const Stored& b) { return a.tag < b.tag; });
  for (const auto& [key, value] : file.metadata()) {
    if (key != "crc_num") (*strings)[key] = value;
  }
  return out;
}

// rank -> the .ckpt (or .safetensors) file of rank_<rank>/ (the last, when
// several).
Result<std::map<int64_t, std::string>> RankFiles(Env* env, const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> children, env->GetChildren(dir));
  std::map<int64_t, std::string> out;
  for (const std::string& c : children) {
    if (c.rfind(kRankDirPrefix, 0) != 0) continue;
    const std::string digits = c.substr(sizeof(kRankDirPrefix) - 1);
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const std::string sub = JoinPath(dir, c);
    if (!env->IsDirectory(sub)) continue;
    ASSIGN_OR_RETURN(std::vector<std::string> files, env->GetChildren(sub));
    const std::string ckpt = LastCkpt(files), safetensors = LastSafetensors(sub, files);
    if (!ckpt.empty() && !safetensors.empty()) {
      return InvalidArgumentError("MindSpore checkpoint '" + dir + "': '" + sub +
                                  "' holds both .ckpt and .safetensors files (MindSpore's "
                                  "transform refuses such a directory too)");
    }
    if (ckpt.empty() && safetensors.empty()) {
      return NotFoundError("MindSpore checkpoint '" + dir + "': '" + sub +
                           "' holds no .ckpt or .safetensors file");
    }
    out[std::stoll(digits)] = JoinPath(sub, ckpt.empty() ? safetensors : ckpt);
  }
  if (out.empty()) {
    return NotFoundError("MindSpore checkpoint '" + dir + "': no rank_<r>/ directories");
  }
  int64_t expect = 0;
  for (const auto& [rank, file] : out) {
    if (rank != expect++) {
      return NotFoundError("MindSpore checkpoint '" + dir + "': rank_" +
                           std::to_string(expect - 1) + "/ is missing");
    }
  }
  return out;
}

}  // namespace

Result<std::vector<MindSporeStrategyFile>> ReadMindSporeStrategies(Env* env,
                                                                   const std::string& path) {
  std::vector<MindSporeStrategyFile> out;
  if (!env->IsDirectory(path)) {
    ASSIGN_OR_RETURN(MindSporeStrategyFile f, ReadMindSporeStrategy(env, path));
    out.push_back(std::move(f));
    return out;
  }
  ASSIGN_OR_RETURN(std::vector<std::string> children, env->GetChildren(path));
  for (const std::string& c : children) {
    const std::string p = JoinPath(path, c);
    if (env->IsDirectory(p)) continue;
    ASSIGN_OR_RETURN(MindSporeStrategyFile f, ReadMindSporeStrategy(env, p));
    out.push_back(std::move(f));
  }
  if (out.empty()) return NotFoundError("MindSpore strategy directory '" + path + "' is empty");
  return out;
}

Result<Strategy> MindSporeToStrategy(const std::vector<MindSporeStrategyFile>& files,
                                     const Strategy& tensors, std::vector<size_t>* unnamed) {
  ASSIGN_OR_RETURN(ParamIndex index, IndexParams(files));
  const auto& params = index.params;
  const int64_t world = DevicesPerStage(files) * index.stages;
  ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create({"rank"}, {world}));
  Strategy out(mesh);
  for (const TensorStrategy& t : tensors.tensors()) {
    if (unnamed != nullptr && !params.count(t.name)) unnamed->push_back(out.tensors().size());
    const Entry* e = Follow(params, t.name);
    if (e != nullptr && e->param->layout.tensor_map.size() == t.layout.shape.size() &&
        (e->param->shape.empty() || e->param->shape == t.layout.shape || params.count(t.name))) {
      auto ml = FromMindSpore(e->param->layout, t.layout.shape, t.layout.dtype, e->placement);
      if (!ml.ok()) return ml.status().Annotate("MindSpore strategy: tensor '" + t.name + "'");
      if (ml->mesh.world_size() != world) {
        return InvalidArgumentError("MindSpore strategy: tensor '" + t.name + "' is laid out on " +
                                    std::to_string(ml->mesh.world_size()) + " devices, others on " +
                                    std::to_string(world));
      }
      RETURN_IF_ERROR(out.Add({t.name, ml->layout, ml->mesh}));
    } else {
      RETURN_IF_ERROR(out.Add({t.name, Layout::Replicated(t.layout.shape, t.layout.dtype), {}}));
    }
  }
  return out;
}

Result<MindSporeStrategyFile> StrategyToMindSpore(const Strategy& strategy) {
  MindSporeStrategyFile out;
  bool staged = false, unstaged = false;
  for (const TensorStrategy& t : strategy.tensors()) {
    auto ms = ToMindSpore(strategy.MeshOf(t), t.layout);
    if (!ms.ok()) return ms.status().Annotate("tensor '" + t.name + "'");
    (t.layout.stage_axis.empty() ? unstaged : staged) = true;
    if (staged && unstaged) {
      return InvalidArgumentError("tensor '" + t.name +
                                  "': MindSpore places every parameter of "
                                  "a pipeline on a stage, but this strategy mixes staged and "
                                  "unstaged tensors");
    }
    out.params.push_back({t.name, *ms, t.layout.shape, 0, t.layout.stage});
    for (int64_t c : t.layout.copy_stages)
      out.params.push_back({t.name, *ms, t.layout.shape, 0, c});
  }
  // Stage by stage, as merge_pipeline_strategys concatenates stage files.
  std::stable_sort(
      out.params.begin(), out.params.end(),
      [](const MindSporeParam& a, const MindSporeParam& b) { return a.stage < b.stage; });
  if (staged) {
    // What merge_pipeline_strategys writes: "<stage>-<name>", current_stage 1.
    out.merged_pipeline = true;
    out.current_stage = 1;
  }
  return out;
}

Result<std::unique_ptr<CheckpointReader>> OpenMindSporeCheckpoint(
    Env* env, const std::string& path, const std::string& strategy_path,
    const std::string& strategy_hint) {
  std::map<int64_t, std::string> rank_files;
  if (env->IsDirectory(path)) {
    ASSIGN_OR_RETURN(rank_files, RankFiles(env, path));
  } else {
    rank_files[0] = path;
  }
  if (rank_files.size() > 1 && strategy_path.empty()) {
    return InvalidArgumentError("MindSpore checkpoint '" + path + "' has " +
                                std::to_string(rank_files.size()) +
                                " ranks: give its strategy file" +
                                (strategy_hint.empty() ? "" : " (" + strategy_hint + ")"));
  }
  DenseCheckpoint c;
  c.path = path;
  c.format = "mindspore";
  std::vector<std::vector<Stored>> stored;     // per rank
  std::map<std::string, std::string> strings;  // of the lowest rank holding each
  size_t with_crc = 0;                         // .ckpt files with MindSpore's CRC trailer
  for (const auto& [rank, file] : rank_files) {
    std::map<std::string, std::string> rank_strings;
    const uint32_t index = static_cast<uint32_t>(c.files.size());
    std::vector<Stored> groups;
    if (EndsWith(file, ".safetensors")) {
      ASSIGN_OR_RETURN(groups, SafetensorsRecords(env, file, index, &rank_strings));
    } else {
      ASSIGN_OR_RETURN(auto f, env->NewRandomAccessFile(file));
      ASSIGN_OR_RETURN(MindSporeFile scanned, ScanMindSporeCkpt(*f, file));
      with_crc += scanned.has_crc ? 1 : 0;
      ASSIGN_OR_RETURN(groups, GroupRecords(*f, scanned, index, file, &rank_strings));
    }
    strings.insert(rank_strings.begin(), rank_strings.end());
    c.files.push_back(file);
    stored.push_back(std::move(groups));
  }
  RETURN_IF_ERROR(StringsToMeta(strings, "MindSpore checkpoint '" + path + "'", &c.meta));
  if (with_crc > 0) {
    c.checksums = "MindSpore's CRC-32 of each .ckpt file (checked at open)";
    if (with_crc < rank_files.size()) {
      c.checksums += ", " + std::to_string(with_crc) + " of " + std::to_string(rank_files.size()) +
                     " files having one";
    }
  }
  if (rank_files.size() > 1) {
    for (size_t r = 0; r < stored.size(); ++r) {
      for (const Stored& s : stored[r]) {
        if (s.map.empty()) continue;
        return InvalidArgumentError(
            "MindSpore checkpoint '" + path + "': '" + c.files[r] + "' holds map tensor '" + s.map +
            "' (a MapParameter): each rank's map has its own keys, which no strategy describes; "
            "Tessera reads map tensors from a single .ckpt only");
      }
    }
  }
  // Every tensor once, in order of first appearance, with a rank holding it.
  Strategy tensors(*Mesh::Create({"r"}, {1}));
  std::map<std::string, std::pair<int64_t, std::vector<int64_t>>> first;  // rank, local shape
  for (size_t r = 0; r < stored.size(); ++r) {
    for (Stored& s : stored[r]) {
      ASSIGN_OR_RETURN(s.local, LocalShape(s, c.files[r]));
      if (first.count(s.tag)) continue;
      first[s.tag] = {static_cast<int64_t>(r), s.local};
      RETURN_IF_ERROR(tensors.Add({s.tag, Layout::Replicated(s.local, s.dtype), {}}));
    }
  }
  if (strategy_path.empty()) {
    c.strategy = std::move(tensors);
  } else {
    ASSIGN_OR_RETURN(auto files, ReadMindSporeStrategies(env, strategy_path));
    ASSIGN_OR_RETURN(ParamIndex index, IndexParams(files));
    const auto& params = index.params;
    const int64_t world = DevicesPerStage(files) * index.stages;
    if (world != static_cast<int64_t>(rank_files.size())) {
      return InvalidArgumentError("MindSpore checkpoint '" + path + "' has " +
                                  std::to_string(rank_files.size()) + " ranks, strategy '" +
                                  strategy_path + "' describes " + std::to_string(world));
    }
    Strategy global(*Mesh::Create({"r"}, {1}));
    for (const TensorStrategy& t : tensors.tensors()) {
      const Entry* e = Follow(params, t.name);
      std::vector<int64_t> shape = t.layout.shape;
      if (e != nullptr && e->param->layout.tensor_map.size() == shape.size()) {
        const auto& [rank, local] = first[t.name];
        auto global_shape = GlobalShape(t.name, *e, t.layout.dtype, local, rank);
        if (!global_shape.ok()) {
          return global_shape.status().Annotate("MindSpore checkpoint '" + c.files[rank] + "'");
        }
        shape = std::move(*global_shape);
      }
      RETURN_IF_ERROR(global.Add({t.name, Layout::Replicated(shape, t.layout.dtype), {}}));
    }
    ASSIGN_OR_RETURN(c.strategy, MindSporeToStrategy(files, global, &c.order.unplaced));
  }
  c.blocks.resize(c.strategy.tensors().size());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < c.strategy.tensors().size(); ++i) index[c.strategy.tensors()[i].name] = i;
  c.order.files.resize(stored.size());
  for (size_t r = 0; r < stored.size(); ++r) {
    for (Stored& s : stored[r]) {
      const size_t i = index[s.tag];
      c.order.files[r].push_back(i);
      const TensorStrategy& t = c.strategy.tensors()[i];
      ASSIGN_OR_RETURN(std::optional<Box> box,
                       ShardOf(t.layout, c.strategy.MeshOf(t), static_cast<int64_t>(r)));
      const std::vector<int64_t>& local = s.local;
      if (!box || box->extents() != local || s.dtype != t.layout.dtype) {
        return DataLossError("MindSpore checkpoint '" + path + "': rank " + std::to_string(r) +
                             " ('" + c.files[r] + "') stores tensor '" + s.tag + "' as " +
                             std::string(DTypeName(s.dtype)) + ShapeToString(local) +
                             ", its strategy gives that rank " +
                             (box ? ToString(*box) : std::string("no slice")));
      }
      c.blocks[i].push_back(
          {s.segments[0].file, s.segments[0].offset, *box, std::move(s.segments)});
    }
  }
  return OpenDenseCheckpoint(env, std::move(c));
}

namespace {

// Tensor index -> map name, for the tensors that form a map tensor: all
// three parts present, keys [n], values [n, ...], status [n], in types
// MindSpore's loader decodes, and no tensor of the map's own name (others
// stay plain tensors).
std::map<size_t, std::string> MapParts(const Strategy& strategy) {
  std::map<size_t, std::string> out;
  const auto& tensors = strategy.tensors();
  const std::string keys = kMapSuffixes[0];
  for (const TensorStrategy& t : tensors) {
    if (!EndsWith(t.name, keys)) continue;
    const std::string name = t.name.substr(0, t.name.size() - keys.size());
    if (strategy.Find(name) != nullptr) continue;
    std::vector<size_t> parts;
    for (size_t k = 0; k < kMindSporeMapParts; ++k) {
      const TensorStrategy* p = strategy.Find(name + kMapSuffixes[k]);
      if (p == nullptr || p->layout.shape.empty() || p->layout.shape[0] != t.layout.shape[0] ||
          !MindSporeLoadsMapPart(p->layout.dtype) || (k != 1 && p->layout.shape.size() != 1)) {
        break;
      }
      parts.push_back(static_cast<size_t>(p - tensors.data()));
    }
    if (parts.size() != kMindSporeMapParts) continue;
    for (size_t i : parts) out[i] = name;
  }
  return out;
}

// Plans map tensor `name`'s record in `file` at `*pos`: one record holding
// its three parts, as _write_mapparameter writes a map exported at once.
void PlanMapRecord(const Strategy& strategy, const std::string& name, uint32_t f,
                   DenseFilePlan* file, uint64_t* pos, DensePlan* plan) {
  std::vector<MindSporeMapPart> parts;
  std::vector<size_t> index;
  for (const char* suffix : kMapSuffixes) {
    const TensorStrategy* t = strategy.Find(name + suffix);
    index.push_back(static_cast<size_t>(t - strategy.tensors().data()));
    parts.push_back({t->layout.shape, std::string(MindSporeNumpyDTypeName(t->layout.dtype)),
                     static_cast<uint64_t>(ByteSize(t->layout))});
  }
  std::vector<std::string> headers = MindSporeMapRecordHeaders(name, parts);
  for (size_t k = 0; k < kMindSporeMapParts; ++k) {
    const uint64_t n = headers[k].size();
    file->fixed.push_back({*pos, std::move(headers[k])});
    *pos += n;
    const Box box = Box::FromShape(parts[k].dims);
    plan->blocks[index[k]].push_back({f, 0, box, {{f, *pos, parts[k].content_size}}});
    *pos += parts[k].content_size;
  }
}

// A tensor rank file holds: its index in the strategy and its box.
using HeldBox = std::pair<size_t, Box>;

// What rank `rank` holds, in strategy order; every tensor whole when -1.
Result<std::vector<HeldBox>> HeldBoxes(const Strategy& strategy, int64_t rank) {
  std::vector<HeldBox> out;
  for (size_t i = 0; i < strategy.tensors().size(); ++i) {
    const TensorStrategy& t = strategy.tensors()[i];
    std::optional<Box> box = Box::FromShape(t.layout.shape);
    if (rank >= 0) {
      const Mesh& mesh = strategy.MeshOf(t);
      if (rank >= mesh.world_size()) continue;
      ASSIGN_OR_RETURN(box, ShardOf(t.layout, mesh, rank));
    }
    if (box) out.emplace_back(i, std::move(*box));  // else not on this rank's pipeline stage
  }
  return out;
}

// Plans file `f` of a safetensors output holding `held` (with the step and
// metadata as attributes when the file holds every tensor whole and there
// are any), in the safetensors library's order.
Status PlanSafetensorsRankFile(const Strategy& strategy, const CheckpointMeta& meta, bool whole,
                               const std::vector<HeldBox>& held, uint32_t f, DenseFilePlan* file,
                               DensePlan* plan) {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, const HeldBox*> boxes;  // name -> tensor, box
  for (const HeldBox& h : held) {
    const TensorStrategy& t = strategy.tensors()[h.first];
    entries.push_back({t.name, t.layout.dtype, h.second.extents(), 0, 0});
    boxes.emplace(t.name, &h);
  }
  PackAsSafetensorsLibrary(&entries);
  std::map<std::string, std::string> attributes;
  if (whole && (meta.step != 0 || !meta.metadata.empty())) {
    CheckpointMeta m = meta;
    m.created_by.clear();
    attributes = EncodeMetaAttributes(Strategy(), m, /*text_only=*/true);
    attributes.erase(kStrategyAttribute);  // whole tensors: nothing to record
  }
  ASSIGN_OR_RETURN(std::string header, SafetensorsHeader(entries, attributes));
  for (const SafetensorsEntry& e : entries) {
    const auto& [i, box] = *boxes.at(e.name);
    plan->blocks[i].push_back({f, header.size() + e.begin, box, {}});
  }
  file->size = header.size() + (entries.empty() ? 0 : entries.back().end);
  file->fixed.push_back({0, std::move(header)});
  return Status::Ok();
}

// `held` in the order of its file's records: see MindSporeRecordOrder.
std::vector<HeldBox> RecordOrder(const Strategy& strategy, std::vector<HeldBox> held,
                                 const MindSporeRecordOrder& order) {
  std::vector<size_t> seen_order;  // every held tensor once: source order, then the rest
  std::vector<bool> seen(strategy.tensors().size(), false);
  for (auto f = order.rank_files.rbegin(); f != order.rank_files.rend(); ++f) {
    for (const std::string& name : *f) {
      const TensorStrategy* t = strategy.Find(name);
      if (t == nullptr) continue;
      const size_t i = static_cast<size_t>(t - strategy.tensors().data());
      if (!seen[i]) seen_order.push_back(i);
      seen[i] = true;
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) seen_order.push_back(i);
  }
  std::vector<const HeldBox*> by_tensor(strategy.tensors().size(), nullptr);
  for (const HeldBox& h : held) by_tensor[h.first] = &h;
  std::vector<HeldBox> out;
  for (bool unnamed : {false, true}) {
    for (size_t i : seen_order) {
      if (by_tensor[i] && order.unnamed.count(strategy.tensors()[i].name) == unnamed) {
        out.push_back(std::move(held[by_tensor[i] - held.data()]));
      }
    }
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<CheckpointWriter>> CreateMindSporeCheckpoint(
    Env* env, const std::string& path, const Strategy& strategy, const CheckpointMeta& meta,
    const MindSporeWriteOptions& options) {
  if (options.chunk_bytes == 0) return InvalidArgumentError("MindSpore output: chunk size 0");
  if (options.prefix.find('/') != std::string::npos) {
    return InvalidArgumentError("MindSpore output: prefix '" + options.prefix + "' contains '/'");
  }
  const std::string extension = options.safetensors ? ".safetensors" : ".ckpt";
  const bool single = EndsWith(path, extension);
  const std::map<size_t, std::string> map_parts = MapParts(strategy);
  int64_t world = 1;
  for (const TensorStrategy& t : strategy.tensors()) {
    const Mesh& mesh = strategy.MeshOf(t);
    world = std::max(world, mesh.world_size());
    if ((!single || options.safetensors) &&
        map_parts.count(static_cast<size_t>(&t - strategy.tensors().data()))) {
      return InvalidArgumentError("MindSpore output '" + path + "': tensor '" + t.name +
                                  "' is part of a map tensor (MapParameter), which rank "
                                  "directories cannot hold (write one .ckpt)");
    }
    if (single && t.layout != Layout::Replicated(t.layout.shape, t.layout.dtype)) {
      return InvalidArgumentError("output '" + path +
                                  "' is one .ckpt file of whole tensors, but "
                                  "tensor '" +
                                  t.name + "' is laid out " + ToString(t.layout) +
                                  " (write a directory, or merge)");
    }
    if (!single) {
      auto ms = ToMindSpore(mesh, t.layout);
      if (!ms.ok())
        return ms.status().Annotate("MindSpore output '" + path + "': tensor '" + t.name + "'");
    }
  }
  if (single) world = 1;
  DensePlan plan;
  plan.directory = !single;
  plan.blocks.resize(strategy.tensors().size());
  for (int64_t r = 0; r < world; ++r) {
    DenseFilePlan file;
    if (!single) {
      const std::string rank = std::to_string(r);
      file.name = kRankDirPrefix + rank + "/" + options.prefix + rank + extension;
    }
    const uint32_t f = static_cast<uint32_t>(plan.files.size());
    ASSIGN_OR_RETURN(std::vector<HeldBox> held, HeldBoxes(strategy, single ? -1 : r));
    if (options.safetensors) {
      RETURN_IF_ERROR(PlanSafetensorsRankFile(strategy, meta, single, held, f, &file, &plan)
                          .Annotate("MindSpore output '" + path + "'"));
      plan.files.push_back(std::move(file));
      continue;
    }
    uint64_t pos = 0;
    // One file of whole tensors in the order transform_checkpoints gives
    // rank 0 when merging (no destination strategy).
    for (const auto& [i, box] : RecordOrder(strategy, std::move(held), options.order)) {
      const TensorStrategy& t = strategy.tensors()[i];
      if (auto m = map_parts.find(i); m != map_parts.end()) {
        if (plan.blocks[i].empty()) PlanMapRecord(strategy, m->second, f, &file, &pos, &plan);
        continue;
      }
      const std::vector<int64_t> dims = box.extents();  // none for a scalar
      const std::string_view type = MindSporeDTypeName(t.layout.dtype);
      const uint64_t bytes = static_cast<uint64_t>(NumElements(box) * DTypeSize(t.layout.dtype));
      DenseBlock block{f, 0, box, {}};
      uint64_t done = 0;
      do {  // records of at most chunk_bytes (one, possibly empty, for small tensors)
        const uint64_t n = std::min(options.chunk_bytes, bytes - done);
        std::string header = MindSporeRecordHeader(t.name, dims, type, n);
        file.fixed.push_back({pos, header});
        pos += header.size();
        block.segments.push_back({f, pos, n});
        pos += n;
        done += n;
      } while (done < bytes);
      plan.blocks[i].push_back(std::move(block));
    }
    if (single) {  // after the tensors, as save_checkpoint appends append_dict
      ASSIGN_OR_RETURN(std::vector<std::string> strings,
                       MetaToStringRecords(strategy, meta, "MindSpore output '" + path + "'"));
      for (std::string& record : strings) {
        const uint64_t n = record.size();
        file.fixed.push_back({pos, std::move(record)});
        pos += n;
      }
    }
    file.size = pos;
    plan.files.push_back(std::move(file));
  }
  return CreateDenseCheckpoint(env, path, strategy, std::move(plan), options.overwrite);
}

bool IsMindSporeCheckpoint(Env* env, const std::string& path) {
  std::string file = path;
  if (env->IsDirectory(path)) {
    // rank_0/ with a .ckpt or .safetensors: the reader names whatever else
    // is wrong.
    const std::string rank0 = JoinPath(path, std::string(kRankDirPrefix) + "0");
    auto files = env->GetChildren(rank0);
    if (!files.ok()) return false;
    const std::string last = LastCkpt(*files);
    if (last.empty()) {
      const std::string safetensors = LastSafetensors(rank0, *files);
      return !safetensors.empty() && SafetensorsFile::Open(env, JoinPath(rank0, safetensors)).ok();
    }
    file = JoinPath(rank0, last);
  }
  auto f = env->NewRandomAccessFile(file);
  return f.ok() && LooksLikeMindSporeCkpt(**f);
}

}  // namespace tessera
