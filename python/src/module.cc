// tessera._tessera: the C++ half of `import tessera`. A thin layer over
// ckpt/ (readers, transforms) and runtime/train's sliced saves; the Python
// half (python/tessera/) adds the conveniences. Every call that reads,
// writes or transforms releases the GIL; errors become the exceptions
// below, carrying the C++ message (which names the file, tensor or rank).
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/ops.h"
#include "core/buffer.h"
#include "core/byte_size.h"
#include "python/src/object_comm.h"
#include "runtime/train/async_checkpoint.h"
#include "runtime/train/sliced_checkpoint.h"
#include "transform/box.h"
#include "transform/layout.h"
#include "transform/strategy.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

// tessera.Error and its kinds; set up in the module init.
PyObject* g_error = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_not_found = nullptr;
PyObject* g_data_loss = nullptr;
PyObject* g_io = nullptr;

[[noreturn]] void Raise(const Status& s) {
  PyObject* type = g_error;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      type = g_invalid;
      break;
    case StatusCode::kNotFound:
      type = g_not_found;
      break;
    case StatusCode::kDataLoss:
      type = g_data_loss;
      break;
    case StatusCode::kIOError:
      type = g_io;
      break;
    default:
      break;
  }
  PyErr_SetString(type, s.message().c_str());
  throw py::error_already_set();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

template <class T>
T Unwrap(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(*r);
}

// numpy has no bfloat16: bf16 tensors are their raw bits as uint16.
py::dtype NumpyDType(DType d) {
  switch (d) {
    case DType::kF32:
      return py::dtype("float32");
    case DType::kF16:
      return py::dtype("float16");
    case DType::kBF16:
      return py::dtype("uint16");
    case DType::kF64:
      return py::dtype("float64");
    case DType::kI8:
      return py::dtype("int8");
    case DType::kU8:
      return py::dtype("uint8");
    case DType::kI16:
      return py::dtype("int16");
    case DType::kU16:
      return py::dtype("uint16");
    case DType::kI32:
      return py::dtype("int32");
    case DType::kU32:
      return py::dtype("uint32");
    case DType::kI64:
      return py::dtype("int64");
    case DType::kU64:
      return py::dtype("uint64");
    case DType::kBool:
      return py::dtype("bool");
  }
  return py::dtype("uint8");
}

std::vector<py::ssize_t> Extents(const Box& box) {
  std::vector<py::ssize_t> out;
  for (int64_t e : box.extents()) out.push_back(static_cast<py::ssize_t>(e));
  return out;
}

// A box from Python: a sequence of (start, stop) pairs.
Box ToBox(const std::vector<std::pair<int64_t, int64_t>>& dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank)) {
    Raise(InvalidArgumentError("a box of " + std::to_string(dims.size()) + " dimensions (at most " +
                               std::to_string(kMaxRank) + ")"));
  }
  Box box(static_cast<int>(dims.size()));
  for (size_t d = 0; d < dims.size(); ++d)
    box[static_cast<int>(d)] = {dims[d].first, dims[d].second};
  return box;
}

py::list FromBox(const Box& box) {
  py::list out;
  for (int d = 0; d < box.rank(); ++d) out.append(py::make_tuple(box[d].begin, box[d].end));
  return out;
}

// A file mapping lent by a reader: the base of every zero-copy array over
// it, which keeps it mapped for as long as the array (or any view of it)
// lives.
struct FileMapping {
  std::unique_ptr<FileView> view;
  std::string what;  // "tensor 'w' [0:4, 0:8] of checkpoint 'x'"
};

// `array`'s elements are `dtype` and there are `elements` of them, C-contiguous.
Status CheckArray(const py::array& array, DType dtype, int64_t elements, const std::string& what,
                  bool writable) {
  if (!array.dtype().attr("__eq__")(NumpyDType(dtype)).cast<bool>()) {
    return InvalidArgumentError(what + ": a " + py::str(array.dtype()).cast<std::string>() +
                                " array for a " + std::string(DTypeName(dtype)) + " tensor (give " +
                                py::str(NumpyDType(dtype)).cast<std::string>() +
                                (dtype == DType::kBF16 ? ", bf16's raw bits" : "") + ")");
  }
  if (array.size() != elements) {
    return InvalidArgumentError(what + ": an array of " + std::to_string(array.size()) +
                                " elements for a box of " + std::to_string(elements));
  }
  if (!(array.flags() & py::array::c_style)) {
    return InvalidArgumentError(what + ": the array is not C-contiguous");
  }
  if (writable && !array.writeable()) {
    return InvalidArgumentError(what + ": the array is read-only");
  }
  return Status::Ok();
}

// ---- reading ---------------------------------------------------------------

// Reads `region` of tensor `index` into the dense buffer `dst`, without the GIL.
void ReadDense(const CheckpointReader& r, size_t index, const Box& region, void* dst) {
  Status s;
  {
    py::gil_scoped_release nogil;
    const std::vector<int64_t> ext = region.extents();
    s = r.ReadRegion(index, region, dst, ext, Box::FromShape(ext));
  }
  Check(s);
}

// OpenSource without the GIL; `flag` names the source strategy argument.
std::unique_ptr<CheckpointReader> OpenReader(const std::string& path,
                                             const std::string& src_strategy, const char* flag) {
  Result<std::unique_ptr<CheckpointReader>> r = std::unique_ptr<CheckpointReader>();
  {
    py::gil_scoped_release nogil;
    r = OpenSource(Env::Default(), path, src_strategy, flag);
  }
  return Unwrap(std::move(r));
}

class Reader {
 public:
  explicit Reader(std::shared_ptr<CheckpointReader> r) : r_(std::move(r)) {}

  const CheckpointReader& get() const { return *Keep(); }
  // The reader, kept alive by the caller across GIL releases (another
  // thread may close() meanwhile).
  std::shared_ptr<CheckpointReader> Keep() const {
    if (r_ == nullptr) Raise(FailedPreconditionError("the checkpoint reader is closed"));
    return r_;
  }
  void Close() { r_.reset(); }

  size_t Index(const std::string& name) const { return Unwrap(FindTensor(get(), name)); }

  py::tuple Info(const std::string& name) const {
    const Layout& l = get().strategy().tensors()[Index(name)].layout;
    return py::make_tuple(std::string(DTypeName(l.dtype)), py::tuple(py::cast(l.shape)),
                          py::tuple(py::cast(l.split_shape())), ToString(l), NumpyDType(l.dtype));
  }

  // `box` over the layout's split shape (the view, when it has one); None:
  // the whole tensor, shaped as the tensor.
  py::array Read(const std::string& name,
                 std::optional<std::vector<std::pair<int64_t, int64_t>>> dims, bool copy) const {
    const std::shared_ptr<CheckpointReader> keep = Keep();
    const CheckpointReader& r = *keep;
    const size_t index = Index(name);
    const Layout& layout = r.strategy().tensors()[index].layout;
    const Box region = dims ? ToBox(*dims) : Box::FromShape(layout.split_shape());
    Check(CheckReadRegion(r.strategy().tensors()[index], "checkpoint", r.path(), region));
    std::vector<py::ssize_t> shape = Extents(region);
    if (!dims) shape.assign(layout.shape.begin(), layout.shape.end());
    const py::dtype dt = NumpyDType(layout.dtype);
    if (!copy && NumElements(region) > 0) {
      Result<std::unique_ptr<FileView>> view = std::unique_ptr<FileView>();
      {
        py::gil_scoped_release nogil;
        view = r.ViewRegion(index, region);
      }
      if (!view.ok()) Raise(view.status());
      if (*view != nullptr) {
        const char* data = (*view)->data();
        auto* mapping =
            new FileMapping{std::move(*view),
                            "tensor '" + name + "' " + ToString(region) + " of '" + r.path() + "'"};
        py::object base = py::cast(mapping, py::return_value_policy::take_ownership);
        py::array out(dt, shape, {}, data, base);
        out.attr("setflags")(py::arg("write") = false);
        return out;
      }
    }
    py::array out(dt, shape);
    if (NumElements(region) == 0) return out;
    ReadDense(r, index, region, out.mutable_data());
    return out;
  }

  void ReadInto(const std::string& name, const std::vector<std::pair<int64_t, int64_t>>& dims,
                py::array out) const {
    const std::shared_ptr<CheckpointReader> keep = Keep();
    const CheckpointReader& r = *keep;
    const size_t index = Index(name);
    const Layout& layout = r.strategy().tensors()[index].layout;
    const Box region = ToBox(dims);
    Check(CheckReadRegion(r.strategy().tensors()[index], "checkpoint", r.path(), region));
    Check(CheckArray(out, layout.dtype, NumElements(region), "tensor '" + name + "'", true));
    if (NumElements(region) == 0) return;
    ReadDense(r, index, region, out.mutable_data());
  }

  py::dict Metadata() const {
    py::dict out;
    for (const auto& [k, v] : get().meta().metadata) out[py::str(k)] = py::bytes(v);
    return out;
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const TensorStrategy& t : get().strategy().tensors()) out.push_back(t.name);
    return out;
  }

 private:
  std::shared_ptr<CheckpointReader> r_;
};

Reader Open(const std::string& path, const std::string& src_strategy) {
  return Reader(std::shared_ptr<CheckpointReader>(OpenReader(path, src_strategy, "strategy=")));
}

// ---- transforming ----------------------------------------------------------

int64_t ByteSizeArg(const py::object& value, const char* what) {
  if (py::isinstance<py::int_>(value)) return value.cast<int64_t>();
  Result<int64_t> r = ParseByteSize(py::str(value).cast<std::string>());
  if (!r.ok()) Raise(r.status().Annotate(what));
  return *r;
}

py::dict Transform(const std::string& src, const std::string& out, const std::string& src_strategy,
                   const std::string& strategy_file, const std::optional<Strategy>& strategy,
                   const std::string& mesh, const std::string& format, const std::string& compress,
                   const std::string& redundancy, const py::object& memory_budget,
                   const py::object& max_shard_size, int threads, bool overwrite,
                   const std::string& prefix, py::object progress) {
  std::unique_ptr<CheckpointReader> reader = OpenReader(src, src_strategy, "src_strategy=");
  WriteOptions o;
  Strategy dst;
  const int given = (strategy_file.empty() ? 0 : 1) + (strategy ? 1 : 0) + (mesh.empty() ? 0 : 1);
  if (given > 1) Raise(InvalidArgumentError("give one of strategy= and mesh=, not both"));
  if (strategy) {
    dst = *strategy;
  } else if (!strategy_file.empty() || !mesh.empty()) {
    std::set<std::string> unnamed;
    dst = Unwrap(DestinationStrategy(Env::Default(), *reader, strategy_file, mesh, &unnamed,
                                     {"strategy=", "mesh="}));
    o.mindspore.order.unnamed = unnamed;
  } else {
    dst = MergedStrategy(reader->strategy());  // merge
  }
  Check(ParseCompression(compress, &o.native).Annotate("compress="));
  Check(ParseRedundancy(redundancy, &o.native).Annotate("redundancy="));
  o.native.overwrite = overwrite;
  o.format = Unwrap(ParseFormat(format));
  if (!max_shard_size.is_none()) o.max_shard_size = ByteSizeArg(max_shard_size, "max_shard_size=");
  if (!prefix.empty()) o.mindspore.prefix = prefix;
  if (!memory_budget.is_none())
    o.transform.memory_budget = ByteSizeArg(memory_budget, "memory_budget=");
  o.transform.threads = threads;
  // The callback runs on a worker thread (never two at once): it takes the
  // GIL; an exception it raises is kept and raised once the transform ends.
  std::shared_ptr<py::error_already_set> callback_error;
  if (!progress.is_none()) {
    o.transform.progress = [&progress, &callback_error](int64_t done, int64_t total) {
      py::gil_scoped_acquire gil;
      if (callback_error) return;
      try {
        progress(done, total);
      } catch (py::error_already_set& e) {
        callback_error = std::make_shared<py::error_already_set>(std::move(e));
      }
    };
  }
  Result<TransformStats> stats = TransformStats{};
  {
    py::gil_scoped_release nogil;
    stats = WriteTransformed(Env::Default(), *reader, dst, out, o);
  }
  if (callback_error) throw *callback_error;
  const TransformStats s = Unwrap(std::move(stats));
  py::dict d;
  d["tensors"] = s.tensors;
  d["pieces"] = s.pieces;
  d["bytes"] = s.bytes;
  d["seconds"] = s.seconds;
  return d;
}

// ---- saving from trainers --------------------------------------------------

// This rank's arrays, by tensor index, checked against the strategy.
struct LocalArrays {
  std::map<size_t, std::pair<Box, py::array>> by_tensor;
};

Status LocalFromDict(const Strategy& strategy, int rank, const py::dict& tensors,
                     LocalArrays* out) {
  for (const auto& [key, value] : tensors) {
    const std::string name = py::str(key).cast<std::string>();
    const TensorStrategy* t = strategy.Find(name);
    if (t == nullptr) {
      return NotFoundError("tensor '" + name + "' is not in the strategy");
    }
    const size_t index = static_cast<size_t>(t - strategy.tensors().data());
    ASSIGN_OR_RETURN(std::optional<Box> held, ShardOf(t->layout, strategy.MeshOf(*t), rank));
    const std::string what = "tensor '" + name + "' on rank " + std::to_string(rank);
    if (!held) {
      return InvalidArgumentError(what + ": the strategy places it on another pipeline stage");
    }
    auto pair = value.cast<py::tuple>();
    if (!pair[0].is_none()) {
      const Box given = ToBox(pair[0].cast<std::vector<std::pair<int64_t, int64_t>>>());
      if (given != *held) {
        return InvalidArgumentError(what + ": the strategy gives this rank " + ToString(*held) +
                                    ", the box given is " + ToString(given));
      }
    }
    py::array array = pair[1].cast<py::array>();
    RETURN_IF_ERROR(CheckArray(array, t->layout.dtype, NumElements(*held), what, false));
    out->by_tensor[index] = {*held, std::move(array)};
  }
  // Every tensor this rank holds a non-empty part of must be given.
  for (size_t i = 0; i < strategy.tensors().size(); ++i) {
    const TensorStrategy& t = strategy.tensors()[i];
    if (out->by_tensor.count(i)) continue;
    ASSIGN_OR_RETURN(std::optional<Box> held, ShardOf(t.layout, strategy.MeshOf(t), rank));
    if (held && NumElements(*held) > 0) {
      return InvalidArgumentError("tensor '" + t.name + "': rank " + std::to_string(rank) +
                                  " holds " + ToString(*held) + " of it but gave no array");
    }
  }
  return Status::Ok();
}

// Collective: OK when every rank's `local` is; else each rank fails, with
// its own error or one naming the first rank that failed.
Status Agree(ObjectCommunicator& comm, const Status& local) {
  const std::string mine = local.ok() ? "" : local.message();
  int64_t length = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lengths(comm.size());
  RETURN_IF_ERROR(comm.AllGather(&length, 1, lengths.data(), DType::kI64));
  int64_t total = 0;
  for (int64_t l : lengths) total += l;
  if (total == 0) return Status::Ok();
  std::string all(static_cast<size_t>(total), '\0');
  RETURN_IF_ERROR(comm.AllGatherV(mine.data(), length, all.data(), lengths, DType::kU8));
  if (!local.ok()) return local;
  int64_t at = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (lengths[r] > 0) {
      return AbortedError("rank " + std::to_string(r) + " failed: " + all.substr(at, lengths[r]));
    }
  }
  return Status::Ok();
}

// The bytes of `piece` from this rank's arrays: its own array when the
// piece is the whole box it holds, else a copy into `scratch`.
Result<LocalPiece> PieceFrom(const LocalArrays& local, const Strategy& strategy,
                             const PieceToWrite& piece,
                             std::vector<std::unique_ptr<char[]>>* scratch) {
  const TensorStrategy& t = strategy.tensors()[piece.tensor];
  auto it = local.by_tensor.find(piece.tensor);
  const int64_t es = DTypeSize(t.layout.dtype);
  if (it == local.by_tensor.end() || !Contains(it->second.first, piece.box)) {
    return InternalError("tensor '" + t.name + "': the save plan gives this rank " +
                         ToString(piece.box) + ", which it does not hold");
  }
  const auto& [held, array] = it->second;
  LocalPiece out{piece.tensor, piece.box, array.data(), NumElements(piece.box) * es};
  if (piece.box != held) {
    ASSIGN_OR_RETURN(auto copy,
                     AllocateBytes(static_cast<size_t>(out.bytes), "a piece of '" + t.name + "'"));
    CopyBox(array.data(), held.extents(), RelativeTo(piece.box, held), copy.get(),
            piece.box.extents(), Box::FromShape(piece.box.extents()), es);
    out.data = copy.get();
    scratch->push_back(std::move(copy));
  }
  return out;
}

struct SaveArgs {
  std::string path;
  CheckpointMeta meta;
  SlicedWriteOptions options;
};

SaveArgs MakeSaveArgs(const std::string& path, int64_t step, const py::dict& metadata,
                      const std::string& redundancy, const std::string& compress,
                      const std::vector<std::string>& hosts, bool overwrite) {
  SaveArgs a;
  a.path = path;
  a.meta.step = step;
  a.meta.created_by = "tessera python";
  for (const auto& [k, v] : metadata) {
    a.meta.metadata[py::str(k).cast<std::string>()] =
        py::isinstance<py::bytes>(v) ? v.cast<std::string>() : py::str(v).cast<std::string>();
  }
  a.options.redundancy = Unwrap(Redundancy::Parse(redundancy.empty() ? "none" : redundancy));
  Check(ParseCompression(compress.empty() ? "none" : compress, &a.options.native)
            .Annotate("compress="));
  a.options.native.overwrite = overwrite;
  a.options.hosts = hosts;
  return a;
}

// A save in flight (save_shards(..., async_=True)).
class SaveHandle {
 public:
  SaveHandle(std::unique_ptr<ObjectCommunicator> comm, std::unique_ptr<AsyncSlicedSave> save,
             std::string path)
      : comm_(std::move(comm)), save_(std::move(save)), path_(std::move(path)) {}
  ~SaveHandle() {
    py::gil_scoped_release nogil;  // joins the writer thread, if still running
    save_.reset();
  }

  // Collective, like every step of the save: whether it is committed.
  bool Done() { return Advance(false); }
  void Wait() {
    while (!Advance(true)) {
    }
  }
  const std::string& path() const { return path_; }

 private:
  bool Advance(bool wait) {
    if (!error_.ok()) Raise(error_);
    if (committed_) return true;
    Result<bool> r = false;
    {
      py::gil_scoped_release nogil;
      r = save_->Poll(wait);
    }
    if (!r.ok()) {
      error_ = r.status();
      Raise(error_);
    }
    committed_ = *r || !save_->in_flight();
    return committed_;
  }

  std::unique_ptr<ObjectCommunicator> comm_;
  std::unique_ptr<AsyncSlicedSave> save_;
  std::string path_;
  bool committed_ = false;
  Status error_;
};

std::unique_ptr<SaveHandle> SaveShards(const std::string& path, int64_t step,
                                       const Strategy& strategy, int rank, const py::dict& tensors,
                                       py::object comm_object, const std::string& redundancy,
                                       bool async, const py::dict& metadata,
                                       const std::vector<std::string>& hosts, bool overwrite,
                                       const std::string& compress) {
  std::unique_ptr<ObjectCommunicator> comm = Unwrap(ObjectCommunicator::Create(comm_object, rank));
  // Whatever fails here must still reach the agreement below, so that
  // every rank raises instead of waiting for this one.
  LocalArrays local;
  SaveArgs a;
  Status checked;
  try {
    checked = LocalFromDict(strategy, rank, tensors, &local);
    if (checked.ok())
      a = MakeSaveArgs(path, step, metadata, redundancy, compress, hosts, overwrite);
  } catch (py::error_already_set& e) {
    checked = InvalidArgumentError(e.what());
    e.restore();
    PyErr_Clear();
  } catch (py::cast_error& e) {
    checked = InvalidArgumentError(std::string("tensors: ") + e.what() +
                                   " (give {name: array} or {name: (box, array)})");
  }
  {
    Status agreed;
    {
      py::gil_scoped_release nogil;
      agreed = Agree(*comm, checked);
    }
    Check(agreed);
  }
  if (async) {
    auto save = std::make_unique<AsyncSlicedSave>(Env::Default(), *comm);
    Status s;
    std::vector<std::unique_ptr<char[]>> scratch;  // Start copies every piece before it returns
    {
      py::gil_scoped_release nogil;
      s = save->Start(
          path, "", strategy, a.meta, a.options,
          [&](const std::vector<PieceToWrite>& pieces) -> Result<std::vector<LocalPiece>> {
            std::vector<LocalPiece> out;
            for (const PieceToWrite& p : pieces) {
              ASSIGN_OR_RETURN(LocalPiece lp, PieceFrom(local, strategy, p, &scratch));
              out.push_back(lp);
            }
            return out;
          });
    }
    Check(s);
    return std::make_unique<SaveHandle>(std::move(comm), std::move(save), path);
  }
  Status s;
  {
    py::gil_scoped_release nogil;
    s = [&]() -> Status {
      ASSIGN_OR_RETURN(auto writer, SlicedCheckpointWriter::Create(Env::Default(), *comm, path,
                                                                   strategy, a.meta, a.options));
      Status wrote;
      std::vector<std::unique_ptr<char[]>> scratch;
      for (const PieceToWrite& p : writer->Pieces()) {
        Result<LocalPiece> lp = PieceFrom(local, strategy, p, &scratch);
        wrote = lp.ok() ? writer->WritePiece(p.tensor, p.box, lp->data) : lp.status();
        scratch.clear();
        if (!wrote.ok()) break;  // the writer remembers it and fails the commit everywhere
      }
      const Status committed = writer->Commit();
      RETURN_IF_ERROR(wrote);
      return committed;
    }();
  }
  Check(s);
  return nullptr;
}

// ---- loading in trainers ---------------------------------------------------

py::dict LoadShards(const std::string& path, const std::string& src_strategy,
                    const std::optional<Strategy>& strategy_arg, int rank, py::object out) {
  std::unique_ptr<CheckpointReader> reader = OpenReader(path, src_strategy, "src_strategy=");
  const Strategy& strategy = strategy_arg ? *strategy_arg : reader->strategy();
  if (rank < 0 || rank >= strategy.world_size()) {
    Raise(InvalidArgumentError("rank " + std::to_string(rank) + " is outside the strategy's " +
                               std::to_string(strategy.world_size()) + " ranks"));
  }
  py::dict given = out.is_none() ? py::dict() : out.cast<py::dict>();
  for (const auto& [key, value] : given) {
    const std::string name = py::str(key).cast<std::string>();
    if (strategy.Find(name) == nullptr) {
      Raise(NotFoundError("out['" + name + "']: tensor '" + name + "' is not in the strategy"));
    }
  }
  struct Job {
    size_t src_index;
    std::vector<int64_t> coords;
    Box box;
    void* dst;
  };
  std::vector<Job> jobs;
  py::dict result;
  for (const TensorStrategy& t : strategy.tensors()) {
    const size_t index = Unwrap(FindTensor(*reader, t.name));
    const Layout& have = reader->strategy().tensors()[index].layout;
    if (have.shape != t.layout.shape || have.dtype != t.layout.dtype) {
      Raise(InvalidArgumentError("tensor '" + t.name + "': '" + path + "' has " + ToString(have) +
                                 ", the strategy asks for " + ToString(t.layout)));
    }
    std::optional<Box> box = Unwrap(ShardOf(t.layout, strategy.MeshOf(t), rank));
    if (!box) continue;  // not on this rank's pipeline stage
    py::array array;
    if (given.contains(t.name)) {
      array = given[py::str(t.name)].cast<py::array>();
      const std::string what = "out['" + t.name + "'] on rank " + std::to_string(rank);
      Check(CheckArray(array, t.layout.dtype, NumElements(*box), what, true));
      const std::vector<py::ssize_t> want = Extents(*box);
      if (!std::equal(want.begin(), want.end(), array.shape(), array.shape() + array.ndim()) ||
          static_cast<size_t>(array.ndim()) != want.size()) {
        std::string shape;
        for (py::ssize_t d = 0; d < array.ndim(); ++d)
          shape += (d ? ", " : "") + std::to_string(array.shape(d));
        Raise(InvalidArgumentError(what + ": an array of shape (" + shape + ") for the box " +
                                   ToString(*box)));
      }
    } else {
      array = py::array(NumpyDType(t.layout.dtype), Extents(*box));
    }
    if (NumElements(*box) > 0)
      jobs.push_back({index, t.layout.split_shape(), *box, array.mutable_data()});
    result[py::str(t.name)] = array;
  }
  Status s;
  {
    py::gil_scoped_release nogil;
    for (const Job& j : jobs) {
      s = ReadRegionOver(*reader, j.src_index, j.coords, j.box, j.dst);
      if (!s.ok()) break;
    }
  }
  Check(s);
  return result;
}

}  // namespace
}  // namespace tessera::python

PYBIND11_MODULE(_tessera, m) {
  using namespace tessera;
  using namespace tessera::python;
  m.doc() = "Tessera's C++ core: checkpoints, layouts and transforms (use the tessera package)";
  m.attr("__version__") = "0.1.0";

  g_error = PyErr_NewExceptionWithDoc("tessera.Error", "A Tessera operation failed.",
                                      PyExc_RuntimeError, nullptr);
  g_invalid = PyErr_NewExceptionWithDoc(
      "tessera.InvalidArgumentError", "Bad input: a strategy, box, array or option.",
      py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError)).release().ptr(), nullptr);
  g_not_found = PyErr_NewExceptionWithDoc(
      "tessera.NotFoundError", "A file, tensor or rank that should exist does not.",
      py::make_tuple(py::handle(g_error), py::handle(PyExc_LookupError)).release().ptr(), nullptr);
  g_data_loss = PyErr_NewExceptionWithDoc("tessera.DataLossError",
                                          "A checksum mismatch, a truncated or corrupt file.",
                                          g_error, nullptr);
  g_io = PyErr_NewExceptionWithDoc(
      "tessera.IOError", "The operating system refused an operation.",
      py::make_tuple(py::handle(g_error), py::handle(PyExc_OSError)).release().ptr(), nullptr);
  m.attr("Error") = py::handle(g_error);
  m.attr("InvalidArgumentError") = py::handle(g_invalid);
  m.attr("NotFoundError") = py::handle(g_not_found);
  m.attr("DataLossError") = py::handle(g_data_loss);
  m.attr("IOError") = py::handle(g_io);

  py::class_<FileMapping>(m, "FileMapping",
                          "Part of a checkpoint file mapped read-only: the base of the arrays "
                          "read without a copy, kept mapped while they live.")
      .def_property_readonly("size", [](const FileMapping& f) { return f.view->size(); })
      .def("__repr__", [](const FileMapping& f) {
        return "<tessera.FileMapping of " + f.what + ", " + std::to_string(f.view->size()) +
               " bytes>";
      });

  py::class_<Strategy>(m, "Strategy",
                       "A mesh and the layout of every tensor (transform/strategy.md).")
      .def_static(
          "from_json", [](const std::string& json) { return Unwrap(ParseStrategyJson(json)); },
          py::arg("json"))
      .def_static(
          "load",
          [](const std::string& path) { return Unwrap(LoadStrategyFile(Env::Default(), path)); },
          py::arg("path"))
      .def("to_json", [](const Strategy& s) { return StrategyToJson(s); })
      .def(
          "save",
          [](const Strategy& s, const std::string& path) {
            Check(SaveStrategyFile(Env::Default(), path, s));
          },
          py::arg("path"))
      .def_property_readonly("mesh",
                             [](const Strategy& s) {
                               py::dict d;
                               for (int i = 0; i < s.mesh().ndim(); ++i)
                                 d[py::str(s.mesh().axis_name(i))] = s.mesh().axis_size(i);
                               return d;
                             })
      .def_property_readonly("world_size", &Strategy::world_size)
      .def_property_readonly("names",
                             [](const Strategy& s) {
                               std::vector<std::string> out;
                               for (const TensorStrategy& t : s.tensors()) out.push_back(t.name);
                               return out;
                             })
      .def("__len__", [](const Strategy& s) { return s.tensors().size(); })
      .def("__contains__",
           [](const Strategy& s, const std::string& n) { return s.Find(n) != nullptr; })
      .def(
          "layout",
          [](const Strategy& s, const std::string& name) {
            const TensorStrategy* t = s.Find(name);
            if (t == nullptr) Raise(NotFoundError("tensor '" + name + "' is not in the strategy"));
            return ToString(t->layout);
          },
          py::arg("name"))
      .def(
          "box",
          [](const Strategy& s, const std::string& name, int64_t rank) -> py::object {
            const TensorStrategy* t = s.Find(name);
            if (t == nullptr) Raise(NotFoundError("tensor '" + name + "' is not in the strategy"));
            std::optional<Box> b = Unwrap(ShardOf(t->layout, s.MeshOf(*t), rank));
            if (!b) return py::none();
            return FromBox(*b);
          },
          py::arg("name"), py::arg("rank"),
          "The box (one (start, stop) per dimension of the split shape) `rank` holds, or None "
          "when the tensor is on another pipeline stage.")
      .def("__repr__", [](const Strategy& s) {
        return "<tessera.Strategy " + std::to_string(s.tensors().size()) + " tensors on mesh " +
               s.mesh().ToString() + ">";
      });

  py::class_<Reader>(m, "_Reader")
      .def_property_readonly("path", [](const Reader& r) { return r.get().path(); })
      .def_property_readonly("format",
                             [](const Reader& r) { return std::string(r.get().format()); })
      .def_property_readonly("step", [](const Reader& r) { return r.get().meta().step; })
      .def_property_readonly("created_by",
                             [](const Reader& r) { return r.get().meta().created_by; })
      .def_property_readonly("metadata", &Reader::Metadata)
      .def_property_readonly("strategy", [](const Reader& r) { return r.get().strategy(); })
      .def("names", &Reader::Names)
      .def("has", [](const Reader& r,
                     const std::string& n) { return r.get().strategy().Find(n) != nullptr; })
      .def("info", &Reader::Info)
      .def("read", &Reader::Read, py::arg("name"), py::arg("box") = py::none(),
           py::arg("copy") = false)
      .def("read_into", &Reader::ReadInto)
      .def("recoveries", [](const Reader& r) { return r.get().Recoveries(); })
      .def("close", &Reader::Close);

  m.def("open", &tessera::python::Open, py::arg("path"), py::arg("strategy") = "");
  m.def("transform", &tessera::python::Transform, py::arg("src"), py::arg("out"),
        py::arg("src_strategy"), py::arg("strategy_file"), py::arg("strategy"), py::arg("mesh"),
        py::arg("format"), py::arg("compress"), py::arg("redundancy"), py::arg("memory_budget"),
        py::arg("max_shard_size"), py::arg("threads"), py::arg("overwrite"), py::arg("prefix"),
        py::arg("progress"));

  py::class_<SaveHandle>(m, "SaveHandle",
                         "An asynchronous save_shards in flight. done() and wait() are "
                         "collective: call them on every rank, at the same points.")
      .def("done", &SaveHandle::Done,
           "Moves the save on; True once it is committed. Raises the save's error.")
      .def("wait", &SaveHandle::Wait, "Blocks until the save is committed; raises its error.")
      .def_property_readonly("path", &SaveHandle::path);
  m.def("save_shards", &tessera::python::SaveShards, py::arg("path"), py::arg("step"),
        py::arg("strategy"), py::arg("rank"), py::arg("tensors"), py::arg("comm"),
        py::arg("redundancy"), py::arg("async_"), py::arg("metadata"), py::arg("hosts"),
        py::arg("overwrite"), py::arg("compress"));
  m.def("load_shards", &tessera::python::LoadShards, py::arg("path"), py::arg("src_strategy"),
        py::arg("strategy"), py::arg("rank"), py::arg("out"));
}
