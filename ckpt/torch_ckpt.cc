#include "ckpt/torch_ckpt.h"

#include <atomic>
#include <cstring>
#include <map>

#include "ckpt/safetensors_ckpt.h"
#include "core/checksum.h"
#include "core/utf8.h"
#include "formats/torch_save.h"

namespace tessera {
namespace {

// One torch.save file: its contents and which storages were verified.
struct TorchSource {
  std::string path;
  std::unique_ptr<RandomAccessFile> file;
  TorchSaveFile contents;
  std::unique_ptr<std::atomic<bool>[]> verified;
};

// Copies the elements of `extents` from `src` (byte strides `src_strides`)
// to `dst` (byte strides `dst_strides`), `elem` bytes each; runs that are
// dense on both sides are one memcpy.
void StridedCopy(const char* src, const std::vector<int64_t>& src_strides, char* dst,
                 const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& extents,
                 int64_t elem) {
  const size_t rank = extents.size();
  if (rank == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  for (int64_t e : extents) {
    if (e == 0) return;
  }
  const int64_t inner = extents[rank - 1];
  const bool dense = src_strides[rank - 1] == elem && dst_strides[rank - 1] == elem;
  std::vector<int64_t> idx(rank - 1, 0);
  while (true) {
    const char* s = src;
    char* d = dst;
    for (size_t k = 0; k + 1 < rank; ++k) {
      s += idx[k] * src_strides[k];
      d += idx[k] * dst_strides[k];
    }
    if (dense) {
      std::memcpy(d, s, inner * elem);
    } else {
      for (int64_t j = 0; j < inner; ++j) {
        std::memcpy(d + j * dst_strides[rank - 1], s + j * src_strides[rank - 1], elem);
      }
    }
    size_t k = rank - 1;
    while (k > 0 && ++idx[k - 1] == extents[k - 1]) idx[--k] = 0;
    if (k == 0) return;
  }
}

class TorchReader : public CheckpointReader {
 public:
  TorchReader(std::string path, std::vector<std::unique_ptr<TorchSource>> sources)
      : path_(std::move(path)), sources_(std::move(sources)) {}

  Status Init() {
    strategy_ = Strategy(*Mesh::Create({"r"}, {1}));
    for (size_t s = 0; s < sources_.size(); ++s) {
      TorchSource& src = *sources_[s];
      src.verified.reset(new std::atomic<bool>[src.contents.storages.size()]());
      for (size_t t = 0; t < src.contents.tensors.size(); ++t) {
        const TorchTensor& tensor = src.contents.tensors[t];
        if (tensor.shape.size() > static_cast<size_t>(kMaxRank)) {
          return UnimplementedError(
              "torch checkpoint '" + src.path + "': tensor '" + PrintableText(tensor.name) +
              "' has " + std::to_string(tensor.shape.size()) + " dimensions, more than the " +
              std::to_string(kMaxRank) + " Tessera handles");
        }
        RETURN_IF_ERROR(
            strategy_.Add({tensor.name, Layout::Replicated(tensor.shape, tensor.dtype), {}})
                .Annotate("torch checkpoint '" + src.path + "'"));
        entries_.push_back({s, t});
      }
      for (const TorchValue& v : src.contents.values) AddValue(v);
    }
    return Status::Ok();
  }

  const std::string& path() const override { return path_; }
  std::string_view format() const override { return "torch"; }
  const Strategy& strategy() const override { return strategy_; }
  const CheckpointMeta& meta() const override { return meta_; }
  TensorStorage Storage(size_t index) const override {
    const TorchTensor& t = Tensor(index);
    int64_t bytes = DTypeSize(t.dtype);
    for (int64_t e : t.shape) bytes *= e;
    return {1, bytes};
  }

  Status ReadRegion(size_t index, const Box& region, void* dst,
                    const std::vector<int64_t>& dst_extents, const Box& dst_box) const override {
    const TensorStrategy& ts = strategy_.tensors()[index];
    RETURN_IF_ERROR(CheckReadRegion(ts, "torch checkpoint", path_, region));
    const TorchSource& src = *sources_[entries_[index].source];
    const TorchTensor& t = Tensor(index);
    RETURN_IF_ERROR(Verify(src, t.storage));
    const int64_t elem = DTypeSize(t.dtype);
    const size_t rank = t.shape.size();
    std::vector<int64_t> extents(rank), src_strides(rank), dst_strides(rank);
    int64_t lo = t.storage_offset, hi = t.storage_offset, dst_at = 0, step = elem;
    for (size_t d = rank; d-- > 0;) {
      extents[d] = region[d].size();
      src_strides[d] = t.strides[d] * elem;
      dst_strides[d] = step;
      dst_at += dst_box[d].begin * step;
      step *= dst_extents[d];
      lo += region[d].begin * t.strides[d];
      hi += (region[d].end - 1) * t.strides[d];
      if (extents[d] == 0) return Status::Ok();
    }
    const TorchStorage& st = src.contents.storages[t.storage];
    const uint64_t span = static_cast<uint64_t>(hi - lo + 1) * elem;
    const uint64_t at = st.offset + static_cast<uint64_t>(lo) * elem;
    char* out = static_cast<char*>(dst) + dst_at;
    ASSIGN_OR_RETURN(auto view, span >= kViewAtLeast ? src.file->View(at, span)
                                                     : Result<std::unique_ptr<FileView>>(nullptr));
    std::unique_ptr<char[]> staged;
    const char* bytes = view ? view->data() : nullptr;
    if (!bytes) {
      staged.reset(new char[span]);
      RETURN_IF_ERROR(src.file->Read(at, span, staged.get()));
      bytes = staged.get();
    }
    StridedCopy(bytes, src_strides, out, dst_strides, extents, elem);
    return Status::Ok();
  }

  Result<std::unique_ptr<FileView>> ViewRegion(size_t index, const Box& region) const override {
    const TensorStrategy& ts = strategy_.tensors()[index];
    RETURN_IF_ERROR(CheckReadRegion(ts, "torch checkpoint", path_, region));
    const TorchTensor& t = Tensor(index);
    if (!t.Contiguous() || t.shape.empty()) return std::unique_ptr<FileView>();
    // Dense when only the first dimension is cut.
    int64_t row = DTypeSize(t.dtype);
    for (size_t d = 1; d < t.shape.size(); ++d) {
      if (region[d].begin != 0 || region[d].end != t.shape[d]) {
        return std::unique_ptr<FileView>();
      }
      row *= t.shape[d];
    }
    const uint64_t bytes = static_cast<uint64_t>(region[0].size()) * row;
    if (bytes < kViewAtLeast) return std::unique_ptr<FileView>();
    const TorchSource& src = *sources_[entries_[index].source];
    RETURN_IF_ERROR(Verify(src, t.storage));
    const TorchStorage& st = src.contents.storages[t.storage];
    return src.file->View(st.offset + t.storage_offset * DTypeSize(t.dtype) + region[0].begin * row,
                          bytes);
  }

 private:
  struct Entry {
    size_t source = 0;
    size_t tensor = 0;
  };

  const TorchTensor& Tensor(size_t index) const {
    const Entry& e = entries_[index];
    return sources_[e.source]->contents.tensors[e.tensor];
  }
  void AddValue(const TorchValue& v) {
    meta_.metadata["torch." + v.name] = v.text;
    if (v.name == "iteration" || v.name == "global_steps" || v.name == "step") {
      char* end = nullptr;
      long long step = std::strtoll(v.text.c_str(), &end, 10);
      if (!v.text.empty() && *end == '\0') meta_.step = step;
    }
  }
  // The storage's zip record against its CRC-32, the first time.
  static Status Verify(const TorchSource& src, size_t storage) {
    const TorchStorage& st = src.contents.storages[storage];
    if (!st.has_crc || src.verified[storage].load(std::memory_order_acquire)) return Status::Ok();
    const uint64_t bytes = static_cast<uint64_t>(st.numel) * DTypeSize(st.dtype);
    std::unique_ptr<char[]> buf(new char[std::min<uint64_t>(bytes + 1, uint64_t{4} << 20)]);
    uint32_t crc = 0;
    for (uint64_t at = 0; at < bytes; at += uint64_t{4} << 20) {
      const uint64_t n = std::min<uint64_t>(uint64_t{4} << 20, bytes - at);
      RETURN_IF_ERROR(src.file->Read(st.offset + at, n, buf.get()));
      crc = Crc32(buf.get(), n, crc);
    }
    if (crc != st.crc32) {
      return DataLossError("torch checkpoint '" + src.path + "': record '" +
                           PrintableText(st.record) + "' (storage of the tensors that use key '" +
                           PrintableText(st.key) + "') fails its CRC-32");
    }
    src.verified[storage].store(true, std::memory_order_release);
    return Status::Ok();
  }

  std::string path_;
  std::vector<std::unique_ptr<TorchSource>> sources_;
  std::vector<Entry> entries_;
  Strategy strategy_;
  CheckpointMeta meta_;
};

Result<std::unique_ptr<TorchSource>> OpenSource(Env* env, const std::string& path) {
  auto src = std::make_unique<TorchSource>();
  src->path = path;
  ASSIGN_OR_RETURN(src->file, env->NewRandomAccessFile(path));
  ASSIGN_OR_RETURN(uint64_t size, src->file->Size());
  ASSIGN_OR_RETURN(src->contents, ReadTorchSave(*src->file, 0, size, "'" + path + "'"));
  return src;
}

}  // namespace

bool IsTorchCheckpoint(Env* env, const std::string& path) {
  if (env->IsDirectory(path)) {
    return env->FileExists(JoinPath(path, kTorchIndexName)) ||
           env->FileExists(JoinPath(path, "pytorch_model.bin"));
  }
  auto file = env->NewRandomAccessFile(path);
  if (!file.ok()) return false;
  auto size = (*file)->Size();
  return size.ok() && LooksLikeTorchSave(**file, 0, *size);
}

Result<std::unique_ptr<CheckpointReader>> OpenTorchCheckpoint(Env* env, const std::string& path) {
  std::vector<std::unique_ptr<TorchSource>> sources;
  std::string index_path = path;
  if (env->IsDirectory(path)) {
    index_path = JoinPath(path, kTorchIndexName);
    if (!env->FileExists(index_path)) index_path = JoinPath(path, "pytorch_model.bin");
  }
  const bool is_index =
      index_path.size() > 5 && index_path.compare(index_path.size() - 5, 5, ".json") == 0;
  if (!is_index) {
    ASSIGN_OR_RETURN(auto src, OpenSource(env, index_path));
    sources.push_back(std::move(src));
  } else {
    ASSIGN_OR_RETURN(WeightMapIndex index, ReadWeightMapIndex(env, index_path, false));
    const std::string dir = index_path.substr(0, index_path.find_last_of('/') + 1);
    size_t found = 0;
    for (const std::string& f : index.files) {
      ASSIGN_OR_RETURN(auto src, OpenSource(env, dir + f));
      for (const TorchTensor& t : src->contents.tensors) {
        auto it = index.map.find(t.name);
        if (it == index.map.end() || it->second != f) {
          return DataLossError("torch checkpoint '" + path + "': tensor '" + PrintableText(t.name) +
                               "' of '" + f + "' is not the index's");
        }
      }
      found += src->contents.tensors.size();
      sources.push_back(std::move(src));
    }
    if (found != index.map.size()) {
      return DataLossError("torch checkpoint '" + path + "': the index names " +
                           std::to_string(index.map.size()) + " tensors, its files hold " +
                           std::to_string(found));
    }
  }
  auto reader = std::make_unique<TorchReader>(path, std::move(sources));
  RETURN_IF_ERROR(reader->Init());
  return std::unique_ptr<CheckpointReader>(std::move(reader));
}

}  // namespace tessera
