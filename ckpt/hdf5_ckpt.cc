#include "ckpt/hdf5_ckpt.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "ckpt/meta_attributes.h"
#include "ckpt/output.h"
#include "formats/hdf5_file.h"
#include "transform/layout.h"

namespace tessera {
namespace {

constexpr int64_t kMaxChunkBytes = int64_t{4} << 20;

// The extents of the largest shard of the layout, then halved (outer
// dimensions first) until a chunk holds at most kMaxChunkBytes.
std::vector<int64_t> ChunkOf(const Mesh& mesh, const Layout& layout) {
  std::vector<int64_t> chunk = layout.shape;
  auto grid = ShardGrid::Create(mesh, layout);
  if (grid.ok()) {
    for (int d = 0; d < layout.rank(); ++d) {
      int64_t most = 1;
      for (const Interval& piece : grid->pieces(d)) most = std::max(most, piece.size());
      chunk[d] = std::max<int64_t>(1, std::min(chunk[d], most));
    }
  }
  for (int64_t& c : chunk) c = std::max<int64_t>(1, c);
  auto bytes = [&] {
    int64_t n = DTypeSize(layout.dtype);
    for (int64_t c : chunk) n *= c;
    return n;
  };
  for (int d = 0; d < static_cast<int>(chunk.size()) && bytes() > kMaxChunkBytes; ++d) {
    while (chunk[d] > 1 && bytes() > kMaxChunkBytes) chunk[d] = (chunk[d] + 1) / 2;
  }
  return chunk;
}

class Hdf5Reader : public CheckpointReader {
 public:
  Hdf5Reader(std::string path, Hdf5File file, Strategy strategy, CheckpointMeta meta)
      : path_(std::move(path)),
        file_(std::move(file)),
        strategy_(std::move(strategy)),
        meta_(std::move(meta)) {}

  const std::string& path() const override { return path_; }
  std::string_view format() const override { return "hdf5"; }
  const Strategy& strategy() const override { return strategy_; }
  const CheckpointMeta& meta() const override { return meta_; }
  TensorStorage Storage(size_t index) const override {
    return {1, ByteSize(strategy_.tensors()[index].layout)};
  }
  Status ReadRegion(size_t index, const Box& region, void* dst,
                    const std::vector<int64_t>& dst_extents, const Box& dst_box) const override {
    const TensorStrategy& t = strategy_.tensors()[index];
    RETURN_IF_ERROR(CheckReadRegion(t, "HDF5 checkpoint", path_, region));
    if (IsEmpty(region) && region.rank() > 0) return Status::Ok();
    return file_.ReadBox(t.name, t.layout.dtype, region, dst, dst_extents, dst_box);
  }

 private:
  std::string path_;
  Hdf5File file_;
  Strategy strategy_;
  CheckpointMeta meta_;
};

class Hdf5Writer : public CheckpointWriter {
 public:
  Hdf5Writer(Env* env, OutputPaths out, Strategy strategy, Hdf5File file, bool overwrite)
      : env_(env),
        out_(std::move(out)),
        strategy_(std::move(strategy)),
        file_(std::move(file)),
        overwrite_(overwrite),
        written_(strategy_.tensors().size(), 0) {}
  ~Hdf5Writer() override {
    if (!committed_) Abort();
  }

  Status WritePiece(size_t index, int64_t, const Box& box, const void* data) override {
    ASSIGN_OR_RETURN(const TensorStrategy* t,
                     CheckWritePiece(strategy_, "output", out_.path, index, box));
    RETURN_IF_ERROR(file_->WriteBox(t->name, t->layout.dtype, box, data));
    std::lock_guard<std::mutex> lock(mu_);
    written_[index] += NumElements(box);
    return Status::Ok();
  }

  Status Commit() override {
    for (size_t i = 0; i < written_.size(); ++i) {
      const TensorStrategy& t = strategy_.tensors()[i];
      if (written_[i] != NumElements(t.layout)) {
        return InternalError("output '" + out_.path + "': tensor '" + t.name +
                             "': " + std::to_string(written_[i]) + " of " +
                             std::to_string(NumElements(t.layout)) + " elements written");
      }
    }
    RETURN_IF_ERROR(file_->Close());
    file_.reset();
    RETURN_IF_ERROR(CommitOutput(env_, out_, overwrite_));
    committed_ = true;
    return Status::Ok();
  }

  void Abort() override {
    if (file_) (void)file_->Close();
    file_.reset();
    RemoveOutput(env_, out_);
  }

 private:
  Env* env_;
  OutputPaths out_;
  Strategy strategy_;
  std::optional<Hdf5File> file_;
  bool overwrite_;
  std::mutex mu_;
  std::vector<int64_t> written_;
  bool committed_ = false;
};

}  // namespace

bool IsHdf5Checkpoint(const std::string& path) { return Hdf5File::IsHdf5(path); }

Result<std::unique_ptr<CheckpointReader>> OpenHdf5Checkpoint(const std::string& path) {
  ASSIGN_OR_RETURN(Hdf5File file, Hdf5File::Open(path));
  ASSIGN_OR_RETURN(std::vector<Hdf5Dataset> datasets, file.List());
  ASSIGN_OR_RETURN(auto attrs, file.RootAttributes());
  CheckpointMeta meta;
  RETURN_IF_ERROR(DecodeMetaAttributes("HDF5 checkpoint '" + path + "'", attrs, &meta));
  std::map<std::string, const Hdf5Dataset*> by_name;
  for (const Hdf5Dataset& d : datasets) by_name[d.name] = &d;
  Strategy strategy;
  auto recorded = attrs.count(kStrategyAttribute) ? ParseStrategyJson(attrs[kStrategyAttribute])
                                                  : Result<Strategy>(NotFoundError(""));
  if (recorded.ok() && recorded->tensors().size() == datasets.size()) {
    for (const TensorStrategy& t : recorded->tensors()) {
      auto it = by_name.find(t.name);
      if (it == by_name.end() || it->second->shape != t.layout.shape ||
          it->second->dtype != t.layout.dtype) {
        return DataLossError("HDF5 checkpoint '" + path + "': tensor '" + t.name +
                             "' is missing or not stored as its strategy says (" +
                             ToString(t.layout) + ")");
      }
    }
    strategy = std::move(*recorded);
  } else {
    strategy = Strategy(*Mesh::Create({"r"}, {1}));
    for (const Hdf5Dataset& d : datasets) {
      RETURN_IF_ERROR(strategy.Add({d.name, Layout::Replicated(d.shape, d.dtype), {}})
                          .Annotate("HDF5 checkpoint '" + path + "'"));
    }
  }
  return std::unique_ptr<CheckpointReader>(
      new Hdf5Reader(path, std::move(file), std::move(strategy), std::move(meta)));
}

Result<std::unique_ptr<CheckpointWriter>> CreateHdf5Checkpoint(Env* env, const std::string& path,
                                                               const Strategy& strategy,
                                                               const CheckpointMeta& meta,
                                                               bool overwrite) {
  ASSIGN_OR_RETURN(OutputPaths out, PrepareOutput(env, path, overwrite, false));
  auto fail = [&](const Status& s) {
    RemoveOutput(env, out);
    return s;
  };
  auto file = Hdf5File::Create(out.tmp);
  if (!file.ok()) return fail(file.status());
  for (const TensorStrategy& t : strategy.tensors()) {
    if (t.name.empty() || t.name[0] == '/' || t.name.find("//") != std::string::npos ||
        t.name.back() == '/') {
      return fail(InvalidArgumentError("tensor name '" + t.name + "' is not a valid HDF5 path"));
    }
    Status s = file->CreateDataset({t.name, t.layout.dtype, t.layout.shape},
                                   ChunkOf(strategy.MeshOf(t), t.layout),
                                   {{"tessera.layout", ToString(t.layout)}});
    if (!s.ok()) return fail(s);
  }
  // HDF5 attributes hold any bytes: nothing needs hex.
  for (const auto& [key, value] : EncodeMetaAttributes(strategy, meta, /*text_only=*/false)) {
    Status s = file->SetRootAttribute(key, value);
    if (!s.ok()) return fail(s);
  }
  return std::unique_ptr<CheckpointWriter>(
      new Hdf5Writer(env, std::move(out), strategy, std::move(*file), overwrite));
}

}  // namespace tessera
