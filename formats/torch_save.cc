#include "formats/torch_save.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>

#include "core/endian.h"
#include "core/strings.h"
#include "core/utf8.h"
#include "formats/zip.h"

namespace tessera {
namespace {

constexpr uint64_t kMaxPickleBytes = uint64_t{1} << 30;

// The legacy format's first pickle: LONG1 of 0x1950a86a20f9469cfc6c.
constexpr char kLegacyMagic[] = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
constexpr size_t kLegacyMagicSize = sizeof(kLegacyMagic) - 1;

struct TorchDTypeRow {
  DType dtype;
  std::string_view name;
  std::string_view alias;
  std::string_view storage;
};
constexpr TorchDTypeRow kTorchDTypes[] = {
    {DType::kF32, "float32", "float", "FloatStorage"},
    {DType::kF64, "float64", "double", "DoubleStorage"},
    {DType::kF16, "float16", "half", "HalfStorage"},
    {DType::kBF16, "bfloat16", "", "BFloat16Storage"},
    {DType::kI64, "int64", "long", "LongStorage"},
    {DType::kI32, "int32", "int", "IntStorage"},
    {DType::kI16, "int16", "short", "ShortStorage"},
    {DType::kI8, "int8", "", "CharStorage"},
    {DType::kU8, "uint8", "", "ByteStorage"},
    {DType::kBool, "bool", "", "BoolStorage"},
};

Result<DType> StorageDType(std::string_view type) {
  std::optional<DType> dtype;
  if (StartsWith(type, "torch.")) dtype = DTypeOfTorchStorage(type.substr(6));
  if (!dtype) {
    return UnimplementedError("storage type " + PrintableText(type) +
                              " has no Tessera dtype (complex, quantized and untyped storages "
                              "are not read)");
  }
  return *dtype;
}

// Walks the pickled object, collecting tensors and other leaves by path.
class TensorFinder {
 public:
  TensorFinder(const Pickle& p, const std::string& where, TorchSaveFile* out)
      : p_(p), where_(where), out_(out), budget_(p) {}

  Status Run() {
    RETURN_IF_ERROR(Walk(p_.root(), "", 0));
    std::set<std::string> names;
    for (const TorchTensor& t : out_->tensors) {
      if (!names.insert(t.name).second) {
        return DataLossError(where_ + ": two tensors are named '" + PrintableText(t.name) + "'");
      }
    }
    return Status::Ok();
  }

 private:
  // Names are bounded: a key shared through the memo would otherwise be
  // copied into every path that uses it.
  Result<std::string> Join(const std::string& path, const std::string& key) {
    std::string joined = path.empty() ? key : path + "." + key;
    name_bytes_ += joined.size();
    if (joined.size() > kMaxName || name_bytes_ > kMaxNameBytes) {
      return DataLossError(where_ + ": names longer than a checkpoint's (" +
                           PrintableText(joined.substr(0, 64)) + "...)");
    }
    return joined;
  }
  std::string KeyText(int32_t key) const {
    const PickleValue& k = p_.at(key);
    if (k.kind == PickleKind::kStr || k.kind == PickleKind::kBytes) return k.text;
    if (k.kind == PickleKind::kInt) return std::to_string(k.integer);
    return p_.Repr(key);
  }
  Status Bad(const std::string& path, const std::string& what) const {
    return DataLossError(where_ + ": '" + PrintableText(path.empty() ? "<root>" : path) +
                         "': " + what);
  }
  Result<int64_t> Int(int32_t i, const std::string& path, const char* what) const {
    const PickleValue& v = p_.at(i);
    if (v.kind != PickleKind::kInt) return Bad(path, std::string(what) + " is not an integer");
    return v.integer;
  }
  // A tuple of integers, or torch.Size of one.
  Result<std::vector<int64_t>> Ints(int32_t i, const std::string& path, const char* what) const {
    auto ints = p_.AsInts(i);
    if (!ints) return Bad(path, std::string(what) + " is not a tuple of integers");
    return *std::move(ints);
  }
  const std::vector<int32_t>& Args(int32_t record) const {
    return p_.at(p_.at(record).items[1]).items;
  }

  Status Walk(int32_t i, const std::string& path, int depth) {
    RETURN_IF_ERROR(budget_.Visit(depth, where_ + ": '" + PrintableText(path) + "'"));
    const PickleValue& v = p_.at(i);
    switch (v.kind) {
      case PickleKind::kDict:
        return WalkPairs(v.items, path, depth);
      case PickleKind::kList:
      case PickleKind::kTuple:
      case PickleKind::kSet:
        return WalkSequence(i, v.items, path, depth);
      case PickleKind::kRecord:
        return WalkRecord(i, path, depth);
      default:
        out_->values.push_back({path, p_.Repr(i)});
        return Status::Ok();
    }
  }
  Status WalkPairs(const std::vector<int32_t>& items, const std::string& path, int depth) {
    for (size_t k = 0; k + 1 < items.size(); k += 2) {
      ASSIGN_OR_RETURN(std::string name, Join(path, KeyText(items[k])));
      RETURN_IF_ERROR(Walk(items[k + 1], name, depth + 1));
    }
    return Status::Ok();
  }
  // A sequence without tensors is one leaf (an optimizer's parameter ids).
  Status WalkSequence(int32_t i, const std::vector<int32_t>& items, const std::string& path,
                      int depth) {
    const size_t tensors = out_->tensors.size(), values = out_->values.size();
    for (size_t k = 0; k < items.size(); ++k) {
      ASSIGN_OR_RETURN(std::string name, Join(path, std::to_string(k)));
      RETURN_IF_ERROR(Walk(items[k], name, depth + 1));
    }
    if (out_->tensors.size() == tensors) {
      out_->values.resize(values);
      out_->values.push_back({path, p_.Repr(i)});
    }
    return Status::Ok();
  }
  Status WalkRecord(int32_t i, const std::string& path, int depth) {
    const std::string_view name = p_.RecordName(i);
    const std::vector<int32_t>& args = Args(i);
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
      return AddTensor(args, path);
    }
    if ((name == "torch._utils._rebuild_parameter" ||
         name == "torch._utils._rebuild_parameter_with_state") &&
        !args.empty()) {
      return Walk(args[0], path, depth + 1);
    }
    if (name == "torch._tensor._rebuild_from_type_v2" && args.size() >= 3) {
      // (func, type, args, state): the tensor func(*args) makes.
      const PickleValue& f = p_.at(args[0]);
      if (f.kind == PickleKind::kGlobal && (f.text == "torch._utils._rebuild_tensor_v2" ||
                                            f.text == "torch._utils._rebuild_tensor")) {
        return AddTensor(p_.at(args[2]).items, path);
      }
    }
    if (name == "collections.OrderedDict" || name == "collections.defaultdict") {
      return WalkPairs(p_.at(i).set_items, path, depth);
    }
    // Any other object: its name, and what its state holds.
    out_->values.push_back({path, name.empty() ? "<object>" : PrintableText(name)});
    const PickleValue& v = p_.at(i);
    if (v.state >= 0) {
      const PickleValue& s = p_.at(v.state);
      if (s.kind == PickleKind::kDict) return WalkPairs(s.items, path, depth);
      ASSIGN_OR_RETURN(std::string name, Join(path, "__state__"));
      return Walk(v.state, name, depth + 1);
    }
    if (!args.empty()) {
      ASSIGN_OR_RETURN(std::string name, Join(path, "__args__"));
      return Walk(p_.at(i).items[1], name, depth + 1);
    }
    return Status::Ok();
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, ...).
  Status AddTensor(const std::vector<int32_t>& args, const std::string& path) {
    if (args.size() < 4) return Bad(path, "a tensor rebuilt from fewer than 4 arguments");
    ASSIGN_OR_RETURN(size_t storage, Storage(args[0], path));
    if (!IsUtf8(path)) return Bad(path, "a tensor name that is not UTF-8");
    TorchTensor t;
    t.name = path.empty() ? "tensor" : path;
    t.storage = storage;
    t.dtype = out_->storages[storage].dtype;
    ASSIGN_OR_RETURN(t.storage_offset, Int(args[1], path, "the storage offset"));
    ASSIGN_OR_RETURN(t.shape, Ints(args[2], path, "the size"));
    ASSIGN_OR_RETURN(t.strides, Ints(args[3], path, "the stride"));
    RETURN_IF_ERROR(CheckBounds(t, out_->storages[storage].numel));
    out_->tensors.push_back(std::move(t));
    return Status::Ok();
  }
  Status CheckBounds(const TorchTensor& t, int64_t numel) const {
    if (t.shape.size() != t.strides.size()) return Bad(t.name, "size and stride differ in rank");
    if (t.storage_offset < 0) return Bad(t.name, "a negative storage offset");
    int64_t last = t.storage_offset, elements = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] < 0 || t.strides[d] < 0) return Bad(t.name, "a negative size or stride");
      int64_t reach = 0;
      if (__builtin_mul_overflow(t.shape[d], elements, &elements) ||
          (t.shape[d] > 0 && (__builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &reach) ||
                              __builtin_add_overflow(last, reach, &last)))) {
        return Bad(t.name, "its size and strides overflow");
      }
    }
    if (elements > 0 && last >= numel) {
      return Bad(t.name, "its view reaches element " + std::to_string(last) + " of a storage of " +
                             std::to_string(numel));
    }
    return Status::Ok();
  }
  // A persistent id ('storage', type, key, location, numel[, view]).
  Result<size_t> Storage(int32_t i, const std::string& path) {
    const PickleValue& pid = p_.at(i);
    if (pid.kind != PickleKind::kPersistentId) return Bad(path, "a tensor without a storage");
    const PickleValue& id = p_.at(pid.items[0]);
    if (id.kind != PickleKind::kTuple || id.items.size() < 5 ||
        p_.at(id.items[0]).text != "storage" || p_.at(id.items[1]).kind != PickleKind::kGlobal ||
        (p_.at(id.items[2]).kind != PickleKind::kStr &&
         p_.at(id.items[2]).kind != PickleKind::kBytes)) {
      return Bad(path, "a storage reference that is not ('storage', type, key, location, size)");
    }
    if (id.items.size() > 5 && p_.at(id.items[5]).kind != PickleKind::kNone) {
      return Bad(path, "a storage view (torch < 0.4) is not read");
    }
    const std::string& key = p_.at(id.items[2]).text;
    ASSIGN_OR_RETURN(int64_t numel, Int(id.items[4], path, "the storage size"));
    auto dtype = StorageDType(p_.at(id.items[1]).text);
    if (!dtype.ok()) return Bad(path, dtype.status().message());
    int64_t bytes = 0;
    if (numel < 0 || __builtin_mul_overflow(numel, DTypeSize(*dtype), &bytes)) {
      return Bad(path, "storage '" + PrintableText(key) + "' has an impossible size");
    }
    auto [it, added] = storage_index_.emplace(key, out_->storages.size());
    if (added) {
      TorchStorage s;
      s.key = key;
      s.dtype = *dtype;
      s.numel = numel;
      out_->storages.push_back(std::move(s));
    } else if (out_->storages[it->second].dtype != *dtype ||
               out_->storages[it->second].numel != numel) {
      return Bad(path,
                 "storage '" + PrintableText(key) + "' is referred to with two types or sizes");
    }
    return it->second;
  }

  static constexpr size_t kMaxName = 64 << 10;
  static constexpr size_t kMaxNameBytes = size_t{256} << 20;
  const Pickle& p_;
  const std::string& where_;
  TorchSaveFile* out_;
  PickleWalkBudget budget_;
  size_t name_bytes_ = 0;
  std::map<std::string, size_t> storage_index_;
};

Status PlaceZipStorages(const RandomAccessFile& file, const ZipArchive& zip,
                        const std::string& prefix, TorchSaveFile* out) {
  (void)file;
  for (TorchStorage& s : out->storages) {
    const ZipRecord* r = zip.Find(prefix + "data/" + s.key);
    if (!r)
      return DataLossError(zip.where() + ": storage '" + PrintableText(s.key) + "' has no record");
    RETURN_IF_ERROR(zip.CheckStored(*r));
    const uint64_t bytes = static_cast<uint64_t>(s.numel) * DTypeSize(s.dtype);
    if (r->size != bytes) {
      return DataLossError(zip.where() + ": record '" + PrintableText(r->name) + "' has " +
                           std::to_string(r->size) + " bytes for a storage of " +
                           std::to_string(bytes));
    }
    s.offset = zip.FileOffset(*r);
    s.record = r->name;
    s.has_crc = true;
    s.crc32 = r->crc32;
  }
  return Status::Ok();
}

Result<TorchSaveFile> ReadZip(const RandomAccessFile& file, uint64_t base, uint64_t size,
                              const std::string& where) {
  ASSIGN_OR_RETURN(ZipArchive zip, ZipArchive::Open(file, base, size, where));
  const ZipRecord* pkl = nullptr;
  for (const ZipRecord& r : zip.records()) {
    const size_t slash = r.name.find('/');
    if (slash != std::string::npos && r.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      pkl = &r;
      break;
    }
  }
  if (!pkl)
    return DataLossError(where + ": a zip archive without a data.pkl record (not torch.save)");
  const std::string prefix = pkl->name.substr(0, pkl->name.size() - 8);  // "<archive>/"
  if (const ZipRecord* order = zip.Find(prefix + "byteorder")) {
    ASSIGN_OR_RETURN(std::string text, zip.ReadRecord(file, *order, 64));
    if (text != "little") {
      return UnimplementedError(where + ": stored " + PrintableText(text) +
                                "-endian; only little-endian is read");
    }
  }
  ASSIGN_OR_RETURN(std::string bytes, zip.ReadRecord(file, *pkl, kMaxPickleBytes));
  ASSIGN_OR_RETURN(Pickle pickle,
                   ParsePickle(bytes, where + " record '" + PrintableText(pkl->name) + "'"));
  TorchSaveFile out;
  out.kind = "zip";
  RETURN_IF_ERROR(FindTorchTensors(pickle, where, &out));
  RETURN_IF_ERROR(PlaceZipStorages(file, zip, prefix, &out));
  out.pickle = std::move(pickle);
  return out;
}

// The legacy format: pickles of the magic number, the protocol version
// (1001), the system's description, the object and the storage keys; then
// the storages in the keys' order, each an int64 element count and the
// bytes. The pickles are read from a prefix of the file that grows until
// they parse.
Result<TorchSaveFile> ReadLegacy(const RandomAccessFile& file, uint64_t base, uint64_t size,
                                 const std::string& where) {
  char magic[kLegacyMagicSize];
  if (size < kLegacyMagicSize || !file.Read(base, kLegacyMagicSize, magic).ok() ||
      std::string_view(magic, kLegacyMagicSize) !=
          std::string_view(kLegacyMagic, kLegacyMagicSize)) {
    return InvalidArgumentError(where +
                                ": not a torch.save file (neither a zip archive nor the "
                                "legacy format's magic number)");
  }
  for (uint64_t prefix = std::min<uint64_t>(size, 1 << 20);;
       prefix = std::min({size, prefix * 8, kMaxPickleBytes})) {
    std::string head(prefix, '\0');
    RETURN_IF_ERROR(file.Read(base, prefix, head.data()));
    std::string_view rest = head;
    std::vector<Pickle> pickles;
    Status s;
    for (int k = 0; k < 5 && s.ok(); ++k) {
      auto p = ParsePickle(rest, where + " (legacy format) pickle " + std::to_string(k + 1));
      if (!p.ok()) {
        s = p.status();
        break;
      }
      rest.remove_prefix(p->consumed());
      pickles.push_back(std::move(*p));
    }
    if (!s.ok()) {
      if (prefix < size && prefix < kMaxPickleBytes) continue;
      return s;
    }
    const PickleValue& version = pickles[1].at(pickles[1].root());
    if (version.kind != PickleKind::kInt || version.integer != 1001) {
      return UnimplementedError(where + ": legacy protocol version " +
                                pickles[1].Repr(pickles[1].root()) + " (1001 is read)");
    }
    const Pickle& info = pickles[2];
    const PickleValue& sys = info.at(info.root());
    for (size_t k = 0; sys.kind == PickleKind::kDict && k + 1 < sys.items.size(); k += 2) {
      const PickleValue& v = info.at(sys.items[k + 1]);
      if (info.at(sys.items[k]).text == "little_endian" && v.kind == PickleKind::kBool &&
          !v.boolean) {
        return UnimplementedError(where + ": stored big-endian; only little-endian is read");
      }
    }
    TorchSaveFile out;
    out.kind = "legacy";
    RETURN_IF_ERROR(FindTorchTensors(pickles[3], where, &out));
    const PickleValue& keys = pickles[4].at(pickles[4].root());
    if (keys.kind != PickleKind::kList)
      return DataLossError(where + ": the storage keys are not a list");
    uint64_t at = prefix - rest.size();
    std::vector<bool> placed(out.storages.size(), false);
    for (int32_t k : keys.items) {
      const std::string& key = pickles[4].at(k).text;
      auto it = std::find_if(out.storages.begin(), out.storages.end(),
                             [&](const TorchStorage& st) { return st.key == key; });
      if (it == out.storages.end()) {
        return DataLossError(where + ": storage '" + PrintableText(key) +
                             "' is stored but no tensor uses it");
      }
      char count[8];
      if (at + 8 > size)
        return DataLossError(where + ": storage '" + PrintableText(key) + "' is cut off");
      RETURN_IF_ERROR(file.Read(base + at, 8, count));
      const uint64_t bytes = GetLittleEndian<uint64_t>(count) * DTypeSize(it->dtype);
      if (GetLittleEndian<uint64_t>(count) != static_cast<uint64_t>(it->numel) ||
          bytes > size - at - 8) {
        return DataLossError(where + ": storage '" + PrintableText(key) +
                             "' has the wrong size or is cut off");
      }
      if (placed[it - out.storages.begin()]) {
        return DataLossError(where + ": storage '" + PrintableText(key) + "' is stored twice");
      }
      placed[it - out.storages.begin()] = true;
      it->offset = base + at + 8;
      at += 8 + bytes;
    }
    for (size_t i = 0; i < placed.size(); ++i) {
      if (!placed[i]) {
        return DataLossError(where + ": storage '" + PrintableText(out.storages[i].key) +
                             "' is used but not stored");
      }
    }
    out.pickle = std::move(pickles[3]);
    return out;
  }
}

Result<std::string_view> StorageTypeOf(const TorchWriteTensor& t) {
  const std::string_view storage = TorchNamesOf(t.dtype).storage;
  if (!storage.empty()) return storage;
  return UnimplementedError("tensor '" + PrintableText(t.name) + "': PyTorch has no " +
                            std::string(DTypeName(t.dtype)) + " tensors");
}

}  // namespace

namespace {

// _rebuild_tensor_v2 of a contiguous tensor on storage key `key`.
Status WriteTensor(const TorchWriteTensor& t, const std::string& key, PickleWriter* p) {
  ASSIGN_OR_RETURN(std::string_view storage, StorageTypeOf(t));
  p->Global("torch._utils", "_rebuild_tensor_v2");
  p->Op("(");
  p->Op("(");  // the persistent id
  p->Str("storage");
  p->Global("torch", storage);
  p->Str(key);
  p->Str("cpu");
  int64_t numel = 1;
  for (int64_t e : t.shape) numel *= e;
  p->Int(numel);
  p->Op("tQ");
  p->Int(0);  // storage offset
  p->Op("(");
  for (int64_t e : t.shape) p->Int(e);
  p->Op("t(");
  int64_t stride = 1;
  std::vector<int64_t> strides(t.shape.size());
  for (size_t d = t.shape.size(); d-- > 0; stride *= t.shape[d]) strides[d] = stride;
  for (int64_t e : strides) p->Int(e);
  p->Op("t\x89");  // requires_grad False
  p->Global("collections", "OrderedDict");
  p->Op(")R");  // backward hooks
  p->Op("tR");
  return Status::Ok();
}

}  // namespace

Result<std::string> TorchStateDictPickle(const std::vector<TorchWriteTensor>& tensors) {
  PickleWriter p;
  p.Global("collections", "OrderedDict");
  p.Op(")R");  // OrderedDict()
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TorchWriteTensor& t = tensors[i];
    if (!IsUtf8(t.name)) {
      return InvalidArgumentError("tensor '" + PrintableText(t.name) +
                                  "': PyTorch's names are text, this one is not UTF-8");
    }
    if (i % 1000 == 0) p.Op("(");  // SETITEMS in batches, as pickle does
    p.Str(t.name);
    RETURN_IF_ERROR(WriteTensor(t, std::to_string(i), &p));
    if (i % 1000 == 999 || i + 1 == tensors.size()) p.Op("u");
  }
  return p.Take();
}

Result<std::string> TorchTensorPickle(const TorchWriteTensor& tensor) {
  PickleWriter p;
  RETURN_IF_ERROR(WriteTensor(tensor, "0", &p));
  return p.Take();
}

bool TorchTensor::Contiguous() const {
  int64_t expect = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && strides[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

int64_t TorchTensor::Numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Status FindTorchTensors(const Pickle& pickle, const std::string& where, TorchSaveFile* out) {
  return TensorFinder(pickle, where, out).Run();
}

bool LooksLikeTorchSave(const RandomAccessFile& file, uint64_t base, uint64_t size) {
  if (size >= kLegacyMagicSize) {
    char head[kLegacyMagicSize];
    if (file.Read(base, kLegacyMagicSize, head).ok() &&
        std::string_view(head, kLegacyMagicSize) ==
            std::string_view(kLegacyMagic, kLegacyMagicSize)) {
      return true;
    }
  }
  if (!LooksLikeZip(file, base)) return false;
  auto zip = ZipArchive::Open(file, base, size, "");
  if (!zip.ok()) return true;  // a damaged zip: the torch reader names what is wrong
  for (const ZipRecord& r : zip->records()) {
    const size_t slash = r.name.find('/');
    if (slash != std::string::npos && r.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      return true;
    }
  }
  return false;
}

Result<TorchSaveFile> ReadTorchSave(const RandomAccessFile& file, uint64_t base, uint64_t size,
                                    const std::string& where) {
  if (LooksLikeZip(file, base)) return ReadZip(file, base, size, where);
  return ReadLegacy(file, base, size, where);
}

TorchDTypeNames TorchNamesOf(DType dtype) {
  for (const TorchDTypeRow& row : kTorchDTypes) {
    if (row.dtype == dtype) return {row.name, row.storage};
  }
  return {};
}

std::optional<DType> DTypeOfTorchDType(std::string_view name) {
  for (const TorchDTypeRow& row : kTorchDTypes) {
    if (!name.empty() && (row.name == name || row.alias == name)) return row.dtype;
  }
  return std::nullopt;
}

std::optional<DType> DTypeOfTorchStorage(std::string_view name) {
  for (const TorchDTypeRow& row : kTorchDTypes) {
    if (row.storage == name) return row.dtype;
  }
  return std::nullopt;
}

}  // namespace tessera
