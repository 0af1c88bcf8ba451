// PyTorch's torch.save files, read without running their pickles
// (formats/pickle.h): the zip format of torch >= 1.6 (records
// "<archive>/data.pkl", "<archive>/data/<key>", "<archive>/byteorder") and
// the legacy format before it (five pickles, then each storage as an
// 8-byte element count and its bytes).
//
// The tensors are found at any depth of the pickled object: dicts,
// OrderedDicts, lists, tuples, Parameters, and the state of other objects
// (argparse.Namespace, an optimizer's state), each named by its path of
// keys and indices joined with '.' ("model.h.0.attn.c_attn.weight",
// "optimizer.state.3.exp_avg"). A tensor is a view of a typed storage: an
// element offset, a shape and strides (views, transposes and storages
// shared by several tensors are kept as such). Every other leaf is kept as
// its Python-like text ("optimizer.param_groups.0.lr" -> "0.001"); lists
// and tuples without tensors are one leaf.
//
// What is interpreted (PyTorch's weights_only set, as far as files hold
// tensors): torch._utils._rebuild_tensor(_v2), _rebuild_parameter(
// _with_state), torch._tensor._rebuild_from_type_v2, the typed storages
// (torch.FloatStorage, ...), torch.Size and collections.OrderedDict. Any
// other object is an inert record shown by name; nothing is imported or
// called.
#ifndef TESSERA_FORMATS_TORCH_SAVE_H_
#define TESSERA_FORMATS_TORCH_SAVE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/env.h"
#include "core/status.h"
#include "formats/pickle.h"

namespace tessera {

struct TorchStorage {
  std::string key;
  DType dtype = DType::kF32;
  int64_t numel = 0;
  uint64_t offset = 0;  // of its first byte in the file
  // The zip record holding it and its CRC-32 (none in the legacy format).
  std::string record;
  bool has_crc = false;
  uint32_t crc32 = 0;
};

struct TorchTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements
  int64_t storage_offset = 0;    // in elements
  size_t storage = 0;            // index into TorchSaveFile::storages
  // Row-major with no gaps (a dense run of its storage).
  bool Contiguous() const;
  // Its element count (the reader checked that it does not overflow).
  int64_t Numel() const;
};

// A leaf that is not a tensor, as text.
struct TorchValue {
  std::string name;
  std::string text;
};

struct TorchSaveFile {
  std::string kind;  // "zip" or "legacy"
  std::vector<TorchStorage> storages;
  std::vector<TorchTensor> tensors;  // in the pickle's order
  std::vector<TorchValue> values;
  // The object's pickle, for readers of formats built on torch.save
  // (DeepSpeed's shapes and partition counts) to walk.
  Pickle pickle;
};

// Reads the torch.save file occupying [base, base + size) of `file`
// (a window: DCP stores items inside larger files); `where` names it in
// errors. Only the pickles are read, not the tensors' bytes.
Result<TorchSaveFile> ReadTorchSave(const RandomAccessFile& file, uint64_t base, uint64_t size,
                                    const std::string& where);

// Whether the window starts like a torch.save file (a zip archive, or the
// legacy format's magic number).
bool LooksLikeTorchSave(const RandomAccessFile& file, uint64_t base, uint64_t size);

// The tensors of a pickled object whose storages are persistent ids
// ('storage', torch.<Type>Storage, key, location, numel[, view]), named by
// path from `root`. `storages` receives each storage key once (offset 0,
// for the caller to place). Used for torch.save's data.pkl and for DCP's
// items.
Status FindTorchTensors(const Pickle& pickle, const std::string& where, TorchSaveFile* out);

// Writing: the data.pkl of torch.save(OrderedDict(name -> tensor)) for
// contiguous tensors, tensor i on storage key "i" (a record
// "<archive>/data/<i>" of its bytes). Protocol 2, names only from
// PyTorch's weights_only set (collections.OrderedDict,
// torch._utils._rebuild_tensor_v2, the typed storages), so torch.load reads
// it with weights_only=True too. Unsigned 16/32/64-bit tensors have no
// torch 1.13 dtype and are refused by name.
// PyTorch's names for a Tessera dtype, from one table: torch.<dtype>
// ("float32") and its typed storage torch.<storage> ("FloatStorage");
// empty where torch has none (unsigned 16/32/64-bit).
struct TorchDTypeNames {
  std::string_view dtype;
  std::string_view storage;
};
TorchDTypeNames TorchNamesOf(DType dtype);
// The dtype of a torch dtype's name ("float32", or an alias such as
// "float", "half", "long") or of a typed storage's ("FloatStorage"), the
// "torch." prefix removed; nullopt for anything else.
std::optional<DType> DTypeOfTorchDType(std::string_view name);
std::optional<DType> DTypeOfTorchStorage(std::string_view name);

struct TorchWriteTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};
Result<std::string> TorchStateDictPickle(const std::vector<TorchWriteTensor>& tensors);
// The data.pkl of torch.save(tensor) for one contiguous tensor on storage
// key "0" (a DCP item).
Result<std::string> TorchTensorPickle(const TorchWriteTensor& tensor);

}  // namespace tessera

#endif  // TESSERA_FORMATS_TORCH_SAVE_H_
