#include "formats/dcp.h"

#include <map>
#include <optional>
#include <utility>

#include "core/strings.h"
#include "core/utf8.h"
#include "formats/pickle.h"
#include "formats/torch_save.h"

namespace tessera {
namespace {

Result<DType> DTypeOfGlobal(std::string_view name) {
  std::optional<DType> dtype;
  if (StartsWith(name, "torch.")) dtype = DTypeOfTorchDType(name.substr(6));
  if (!dtype) return UnimplementedError("dtype " + PrintableText(name) + " has no Tessera dtype");
  return *dtype;
}

// Reads the dataclass records of a `.metadata` pickle.
class MetadataReader {
 public:
  MetadataReader(const Pickle& p, const std::string& where) : p_(p), where_(where) {}

  Result<DcpMetadata> Run() {
    const int32_t root = p_.root();
    if (!EndsWith(p_.RecordName(root), ".metadata.Metadata")) {
      return Bad("the pickle holds " + PrintableText(p_.Repr(root, 2)) +
                 ", not a checkpoint Metadata");
    }
    ASSIGN_OR_RETURN(int32_t sdm, Field(root, "state_dict_metadata"));
    ASSIGN_OR_RETURN(int32_t storage, Field(root, "storage_data"));
    RETURN_IF_ERROR(ReadStorage(storage));
    auto planner = Field(root, "planner_data");
    if (planner.ok()) ReadPlannerData(*planner);
    const PickleValue& items = p_.at(sdm);
    if (items.kind != PickleKind::kDict) return Bad("state_dict_metadata is not a dict");
    DcpMetadata out;
    for (size_t k = 0; k + 1 < items.items.size(); k += 2) {
      const std::string fqn = Text(items.items[k]);
      auto planned = planned_.find(fqn);
      const std::string name = planned == planned_.end() ? fqn : planned->second;
      if (!IsUtf8(name)) return Bad("item '" + PrintableText(name) + "': a name that is not UTF-8");
      RETURN_IF_ERROR(AddItem(fqn, name, items.items[k + 1], &out));
    }
    return out;
  }

 private:
  Status Bad(const std::string& what) const { return DataLossError(where_ + ": " + what); }
  std::string Text(int32_t i) const {
    const PickleValue& v = p_.at(i);
    return v.kind == PickleKind::kStr || v.kind == PickleKind::kBytes ? v.text.substr(0, 64 << 10)
                                                                      : p_.Repr(i);
  }
  // A dataclass field: from the BUILD state's dict, or the dict of a
  // (dict, slots) state.
  Result<int32_t> Field(int32_t record, std::string_view name) const {
    const PickleValue& r = p_.at(record);
    if (r.kind == PickleKind::kRecord && r.state >= 0) {
      std::vector<int32_t> dicts = {r.state};
      const PickleValue& s = p_.at(r.state);
      if (s.kind == PickleKind::kTuple) dicts = s.items;
      for (int32_t d : dicts) {
        const PickleValue& dict = p_.at(d);
        if (dict.kind != PickleKind::kDict) continue;
        for (size_t k = 0; k + 1 < dict.items.size(); k += 2) {
          if (p_.at(dict.items[k]).text == name) return dict.items[k + 1];
        }
      }
    }
    return Bad("a " + PrintableText(p_.RecordName(record)) + " without its field '" +
               std::string(name) + "'");
  }
  Result<int64_t> Int(int32_t i, const char* what) const {
    const PickleValue& v = p_.at(i);
    if (v.kind != PickleKind::kInt) return Bad(std::string(what) + " is not an integer");
    return v.integer;
  }
  // torch.Size((...)) or a plain tuple of integers, none negative.
  Result<std::vector<int64_t>> Ints(int32_t i, const char* what) const {
    auto ints = p_.AsInts(i);
    if (!ints) return Bad(std::string(what) + " is not a tuple of integers");
    for (int64_t x : *ints) {
      if (x < 0) return Bad(std::string(what) + " has a negative value");
    }
    return *std::move(ints);
  }
  // storage_data: {MetadataIndex(fqn, offset, index): _StorageInfo}.
  Status ReadStorage(int32_t storage) {
    const PickleValue& d = p_.at(storage);
    if (d.kind != PickleKind::kDict) return Bad("storage_data is not a dict");
    for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
      ASSIGN_OR_RETURN(int32_t fqn, Field(d.items[k], "fqn"));
      // A MetadataIndex without an offset (a bytes item's) may omit it.
      auto offset = Field(d.items[k], "offset");
      std::vector<int64_t> offsets;
      if (offset.ok() && p_.at(*offset).kind != PickleKind::kNone) {
        ASSIGN_OR_RETURN(offsets, Ints(*offset, "a MetadataIndex offset"));
      }
      ASSIGN_OR_RETURN(DcpItem item, Item(d.items[k + 1], Text(fqn)));
      storage_[{Text(fqn), offsets}] = item;
    }
    return Status::Ok();
  }
  Result<DcpItem> Item(int32_t info, const std::string& fqn) const {
    DcpItem item;
    ASSIGN_OR_RETURN(int32_t path, Field(info, "relative_path"));
    ASSIGN_OR_RETURN(int32_t offset, Field(info, "offset"));
    ASSIGN_OR_RETURN(int32_t length, Field(info, "length"));
    item.file = Text(path);
    if (item.file.empty() || item.file.find('/') != std::string::npos || item.file == "." ||
        item.file == "..") {
      return Bad("item '" + PrintableText(fqn) + "' names file '" + PrintableText(item.file) +
                 "', which is not a plain file name in the checkpoint directory");
    }
    ASSIGN_OR_RETURN(int64_t o, Int(offset, "an item offset"));
    ASSIGN_OR_RETURN(int64_t n, Int(length, "an item length"));
    if (o < 0 || n < 0) return Bad("item '" + PrintableText(fqn) + "' has a negative place");
    item.offset = static_cast<uint64_t>(o);
    item.length = static_cast<uint64_t>(n);
    auto transforms = Field(info, "transform_descriptors");
    if (transforms.ok() && p_.at(*transforms).kind != PickleKind::kNone &&
        !p_.at(*transforms).items.empty()) {
      const std::vector<int32_t>& list = p_.at(*transforms).items;
      if (list.size() == 1 && p_.at(list[0]).kind == PickleKind::kStr &&
          p_.at(list[0]).text == "stream.zstd") {
        item.zstd = true;
        return item;
      }
      return UnimplementedError(where_ + ": item '" + PrintableText(fqn) +
                                "' is stored through the transforms " +
                                PrintableText(p_.Repr(*transforms)) +
                                ", which this reader lacks (it undoes \"stream.zstd\")");
    }
    return item;
  }

  // planner_data {fqn: (key, key, ...)}: the nested path a flattened key
  // stood for, joined with '.'.
  void ReadPlannerData(int32_t planner) {
    const PickleValue& d = p_.at(planner);
    if (d.kind != PickleKind::kDict) return;
    for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
      const PickleValue& path = p_.at(d.items[k + 1]);
      if (path.kind != PickleKind::kTuple && path.kind != PickleKind::kList) continue;
      std::string name;
      for (int32_t e : path.items) {
        const PickleValue& key = p_.at(e);
        name += (name.empty() ? "" : ".") +
                (key.kind == PickleKind::kInt ? std::to_string(key.integer) : Text(e));
        if (name.size() > (64 << 10)) break;  // a hostile path; the fqn stays
      }
      if (!name.empty() && name.size() <= (64 << 10)) planned_[Text(d.items[k])] = name;
    }
  }

  Status AddItem(const std::string& fqn, const std::string& name, int32_t md, DcpMetadata* out) {
    const std::string_view kind = p_.RecordName(md);
    if (EndsWith(kind, "BytesStorageMetadata")) {
      auto it = storage_.find({fqn, {}});
      if (it == storage_.end())
        return Bad("bytes item '" + PrintableText(fqn) + "' has no storage");
      out->bytes.push_back({name, it->second});
      return Status::Ok();
    }
    if (!EndsWith(kind, "TensorStorageMetadata")) {
      return Bad("item '" + PrintableText(fqn) + "' is a " + PrintableText(kind) +
                 ", neither tensor nor bytes metadata");
    }
    DcpTensor t;
    t.name = name;
    ASSIGN_OR_RETURN(int32_t props, Field(md, "properties"));
    ASSIGN_OR_RETURN(int32_t size, Field(md, "size"));
    ASSIGN_OR_RETURN(int32_t chunks, Field(md, "chunks"));
    ASSIGN_OR_RETURN(t.size, Ints(size, "a tensor size"));
    int64_t elements = 1;
    for (int64_t e : t.size) {
      if (__builtin_mul_overflow(elements, e, &elements)) {
        return Bad("tensor '" + PrintableText(fqn) + "' has an impossible size");
      }
    }
    ASSIGN_OR_RETURN(int32_t dtype, DTypeField(props));
    auto dt = DTypeOfGlobal(p_.at(dtype).text);
    if (!dt.ok()) return Bad("tensor '" + PrintableText(fqn) + "': " + dt.status().message());
    t.dtype = *dt;
    for (int32_t c : p_.at(chunks).items) {
      DcpChunk chunk;
      ASSIGN_OR_RETURN(int32_t offsets, Field(c, "offsets"));
      ASSIGN_OR_RETURN(int32_t sizes, Field(c, "sizes"));
      ASSIGN_OR_RETURN(chunk.offsets, Ints(offsets, "chunk offsets"));
      ASSIGN_OR_RETURN(chunk.sizes, Ints(sizes, "chunk sizes"));
      for (size_t d = 0; d < chunk.offsets.size() && d < chunk.sizes.size(); ++d) {
        int64_t end = 0;
        if (chunk.offsets.size() != t.size.size() || chunk.sizes.size() != t.size.size() ||
            __builtin_add_overflow(chunk.offsets[d], chunk.sizes[d], &end) || end > t.size[d]) {
          return Bad("tensor '" + PrintableText(fqn) + "': a chunk lies outside it");
        }
      }
      if (chunk.offsets.size() != t.size.size() || chunk.sizes.size() != t.size.size()) {
        return Bad("tensor '" + PrintableText(fqn) + "': a chunk of another rank");
      }
      auto it = storage_.find({fqn, chunk.offsets});
      if (it == storage_.end()) {
        return Bad("tensor '" + PrintableText(fqn) + "': a chunk has no storage entry");
      }
      chunk.item = it->second;
      t.chunks.push_back(std::move(chunk));
    }
    out->tensors.push_back(std::move(t));
    return Status::Ok();
  }
  // TensorProperties' dtype: a field of its state dict (1.13), or the
  // first element of the tuple its __getstate__ returns (2.x).
  Result<int32_t> DTypeField(int32_t props) const {
    const PickleValue& r = p_.at(props);
    if (r.kind == PickleKind::kRecord && r.state >= 0) {
      const PickleValue& s = p_.at(r.state);
      if (s.kind == PickleKind::kTuple && !s.items.empty() &&
          p_.at(s.items[0]).kind == PickleKind::kGlobal) {
        return s.items[0];
      }
    }
    ASSIGN_OR_RETURN(int32_t dtype, Field(props, "dtype"));
    if (p_.at(dtype).kind != PickleKind::kGlobal) return Bad("a tensor dtype that is not torch's");
    return dtype;
  }

  const Pickle& p_;
  const std::string& where_;
  std::map<std::pair<std::string, std::vector<int64_t>>, DcpItem> storage_;
  std::map<std::string, std::string> planned_;
};

}  // namespace

bool LooksLikeDcpMetadata(std::string_view head) {
  return !head.empty() && static_cast<unsigned char>(head[0]) == 0x80 &&
         head.find("checkpoint.metadata") != std::string_view::npos;
}

Result<DcpMetadata> ParseDcpMetadata(std::string_view data, const std::string& where) {
  ASSIGN_OR_RETURN(Pickle pickle, ParsePickle(data, where));
  return MetadataReader(pickle, where).Run();
}

namespace {

constexpr char kMetadataModule[] = "torch.distributed._shard.checkpoint.metadata";

Result<std::string_view> TorchDTypeName(const DcpTensor& t) {
  const std::string_view name = TorchNamesOf(t.dtype).dtype;
  if (!name.empty()) return name;
  return UnimplementedError("tensor '" + PrintableText(t.name) + "': PyTorch has no " +
                            std::string(DTypeName(t.dtype)) + " tensors");
}

// A dataclass instance: cls.__new__(cls), then BUILD with a dict whose
// items the caller writes between Object() and EndObject().
void Object(PickleWriter* p, std::string_view module, std::string_view cls) {
  p->Global(module, cls);
  p->Op(")\x81}(");
}
void EndObject(PickleWriter* p) { p->Op("ub"); }

void Size(PickleWriter* p, const std::vector<int64_t>& dims) {
  p->Global("torch", "Size");
  p->Op("((");
  for (int64_t d : dims) p->Int(d);
  p->Op("ttR");
}

Status TensorStorage(PickleWriter* p, const DcpTensor& t) {
  ASSIGN_OR_RETURN(std::string_view dtype, TorchDTypeName(t));
  Object(p, kMetadataModule, "TensorStorageMetadata");
  p->Str("properties");
  // TensorProperties' __getstate__ tuple: dtype, layout, requires_grad,
  // memory format (as its MEM_FORMAT_ENCODING member), pin_memory.
  p->Global("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties");
  p->Op(")\x81(");
  p->Global("torch", dtype);
  p->Global("torch.serialization", "_get_layout");
  p->Op("(");
  p->Str("torch.strided");
  p->Op("tR");
  p->Bool(false);
  p->Global("builtins", "getattr");
  p->Op("(");
  p->Global("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING");
  p->Str("TORCH_CONTIGUOUS_FORMAT");
  p->Op("tR");
  p->Bool(false);
  p->Op("tb");
  p->Str("size");
  Size(p, t.size);
  p->Str("chunks");
  p->Op("](");
  for (const DcpChunk& c : t.chunks) {
    Object(p, kMetadataModule, "ChunkStorageMetadata");
    p->Str("offsets");
    Size(p, c.offsets);
    p->Str("sizes");
    Size(p, c.sizes);
    EndObject(p);
  }
  p->Op("e");
  EndObject(p);
  return Status::Ok();
}

}  // namespace

Result<std::string> DcpMetadataPickle(const std::vector<DcpTensor>& tensors) {
  PickleWriter p;
  Object(&p, kMetadataModule, "Metadata");
  p.Str("state_dict_metadata");
  p.Op("}(");
  for (const DcpTensor& t : tensors) {
    if (!IsUtf8(t.name)) {
      return InvalidArgumentError("tensor '" + PrintableText(t.name) +
                                  "': PyTorch's names are text, this one is not UTF-8");
    }
    p.Str(t.name);
    RETURN_IF_ERROR(TensorStorage(&p, t));
  }
  p.Op("u");
  p.Str("planner_data");
  p.None();
  p.Str("storage_data");
  p.Op("}(");
  for (const DcpTensor& t : tensors) {
    for (size_t k = 0; k < t.chunks.size(); ++k) {
      const DcpChunk& c = t.chunks[k];
      Object(&p, kMetadataModule, "MetadataIndex");
      p.Str("fqn");
      p.Str(t.name);
      p.Str("index");
      p.Int(static_cast<int64_t>(k));
      p.Str("offset");
      Size(&p, c.offsets);
      EndObject(&p);
      Object(&p, "torch.distributed._shard.checkpoint.filesystem", "_StorageInfo");
      p.Str("relative_path");
      p.Str(c.item.file);
      p.Str("offset");
      p.Int(static_cast<int64_t>(c.item.offset));
      p.Str("length");
      p.Int(static_cast<int64_t>(c.item.length));
      EndObject(&p);
    }
  }
  p.Op("u");
  EndObject(&p);
  return p.Take();
}

}  // namespace tessera
