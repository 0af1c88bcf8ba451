#include "formats/hdf5_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

namespace tessera {
namespace {

constexpr char kDTypeAttr[] = "tessera.dtype";

// libhdf5 prints its error stack by default, per thread: library code
// never prints, so every entry point turns that off first.
void Quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// Closes an HDF5 handle with the right call when it goes out of scope.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

Status Fail(const std::string& path, const std::string& what) {
  return IOError("HDF5 file '" + path + "': " + what);
}

// The type a dtype is stored as in the file, and its in-memory twin.
hid_t NewFileType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kBF16:
      return H5Tcopy(H5T_IEEE_F32LE);
    case DType::kF64:
      return H5Tcopy(H5T_IEEE_F64LE);
    case DType::kF16: {
      // As h5py builds numpy's float16.
      hid_t t = H5Tcopy(H5T_IEEE_F32LE);
      H5Tset_fields(t, 15, 10, 5, 0, 10);
      H5Tset_size(t, 2);
      H5Tset_ebias(t, 15);
      return t;
    }
    case DType::kI8:
      return H5Tcopy(H5T_STD_I8LE);
    case DType::kU8:
      return H5Tcopy(H5T_STD_U8LE);
    case DType::kI16:
      return H5Tcopy(H5T_STD_I16LE);
    case DType::kU16:
      return H5Tcopy(H5T_STD_U16LE);
    case DType::kI32:
      return H5Tcopy(H5T_STD_I32LE);
    case DType::kU32:
      return H5Tcopy(H5T_STD_U32LE);
    case DType::kI64:
      return H5Tcopy(H5T_STD_I64LE);
    case DType::kU64:
      return H5Tcopy(H5T_STD_U64LE);
    case DType::kBool: {
      hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
      int8_t v = 0;
      H5Tenum_insert(t, "FALSE", &v);
      v = 1;
      H5Tenum_insert(t, "TRUE", &v);
      return t;
    }
  }
  return -1;
}

hid_t NewMemoryType(DType dtype) {
  if (dtype != DType::kBF16) return NewFileType(dtype);
  // bfloat16: sign 15, exponent 7..14 (bias 127), mantissa 0..6.
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 7, 8, 0, 7);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 127);
  return t;
}

Result<DType> DTypeOfFileType(hid_t t, const std::string& what) {
  const H5T_class_t cls = H5Tget_class(t);
  const size_t size = H5Tget_size(t);
  if (cls == H5T_FLOAT) {
    if (size == 4) return DType::kF32;
    if (size == 8) return DType::kF64;
    if (size == 2) return DType::kF16;
  } else if (cls == H5T_INTEGER) {
    const bool sign = H5Tget_sign(t) == H5T_SGN_2;
    switch (size) {
      case 1:
        return sign ? DType::kI8 : DType::kU8;
      case 2:
        return sign ? DType::kI16 : DType::kU16;
      case 4:
        return sign ? DType::kI32 : DType::kU32;
      case 8:
        return sign ? DType::kI64 : DType::kU64;
      default:
        break;
    }
  } else if (cls == H5T_ENUM && size == 1 && H5Tget_nmembers(t) == 2) {
    return DType::kBool;
  }
  return InvalidArgumentError(what + " has an element type Tessera does not read (class " +
                              std::to_string(static_cast<int>(cls)) + ", " + std::to_string(size) +
                              " bytes)");
}

// Selects `box` of a simple dataspace (a scalar one has nothing to select).
void SelectBox(hid_t space, const Box& box) {
  if (box.rank() == 0) return;
  std::vector<hsize_t> start, count;
  for (int d = 0; d < box.rank(); ++d) {
    start.push_back(static_cast<hsize_t>(box[d].begin));
    count.push_back(static_cast<hsize_t>(box[d].size()));
  }
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
}

// A dataspace over `extents` with `box` selected.
hid_t NewSelection(const std::vector<int64_t>& extents, const Box& box) {
  if (extents.empty()) return H5Screate(H5S_SCALAR);
  std::vector<hsize_t> dims(extents.begin(), extents.end());
  hid_t s = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  SelectBox(s, box);
  return s;
}

// A fixed-length, null-padded string attribute: any bytes, read by h5py as
// bytes.
bool WriteStringAttribute(hid_t obj, const std::string& key, const std::string& value) {
  const size_t size = std::max<size_t>(1, value.size());
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), size);
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle a(H5Acreate2(obj, key.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
           H5Aclose);
  std::string padded = value;
  padded.resize(size, '\0');
  return a.ok() && H5Awrite(a.get(), type.get(), padded.data()) >= 0;
}

Result<std::string> ReadStringAttribute(hid_t obj, const std::string& key) {
  Handle attr(H5Aopen(obj, key.c_str(), H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) return NotFoundError(key);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) return InvalidArgumentError(key + " is not a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    char* s = nullptr;
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    if (H5Aread(attr.get(), mem.get(), &s) < 0) return InvalidArgumentError(key + ": unreadable");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  std::string out(H5Tget_size(type.get()), '\0');
  if (H5Aread(attr.get(), type.get(), out.data()) < 0)
    return InvalidArgumentError(key + ": unreadable");
  return out;
}

herr_t CollectDatasets(hid_t, const char* name, const H5O_info_t* info, void* data) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}

}  // namespace

struct Hdf5File::Impl {
  hid_t file = -1;
  bool writable = false;
  std::mutex mu;
};

Hdf5File::~Hdf5File() {
  if (impl_ && impl_->file >= 0) H5Fclose(impl_->file);
}
Hdf5File::Hdf5File(Hdf5File&&) noexcept = default;

Result<Hdf5File> Hdf5File::Create(const std::string& path) {
  Quiet();
  Hdf5File f;
  f.path_ = path;
  f.impl_ = std::make_unique<Impl>();
  f.impl_->file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f.impl_->file < 0) return Fail(path, "cannot be created");
  f.impl_->writable = true;
  return f;
}

Result<Hdf5File> Hdf5File::Open(const std::string& path) {
  Quiet();
  if (!IsHdf5(path)) return DataLossError("'" + path + "' is not an HDF5 file");
  Hdf5File f;
  f.path_ = path;
  f.impl_ = std::make_unique<Impl>();
  f.impl_->file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f.impl_->file < 0)
    return DataLossError("HDF5 file '" + path + "' cannot be opened (corrupt?)");
  return f;
}

bool Hdf5File::IsHdf5(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  unsigned char sig[8] = {};
  const bool ok = ::pread(fd, sig, 8, 0) == 8;
  ::close(fd);
  static const unsigned char kSig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  return ok && std::memcmp(sig, kSig, 8) == 0;
}

Status Hdf5File::CreateDataset(const Hdf5Dataset& d, const std::vector<int64_t>& chunk,
                               const std::map<std::string, std::string>& attributes) {
  Quiet();
  std::lock_guard<std::mutex> lock(impl_->mu);
  const std::string what = "dataset '" + d.name + "'";
  Handle type(NewFileType(d.dtype), H5Tclose);
  std::vector<hsize_t> dims(d.shape.begin(), d.shape.end());
  Handle space(d.shape.empty()
                   ? H5Screate(H5S_SCALAR)
                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
               H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  bool empty = false;
  for (int64_t n : d.shape) empty = empty || n == 0;
  if (!d.shape.empty() && !empty) {
    std::vector<hsize_t> c(chunk.begin(), chunk.end());
    if (H5Pset_chunk(dcpl.get(), static_cast<int>(c.size()), c.data()) < 0) {
      return Fail(path_, what + ": bad chunk shape");
    }
  }
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Handle ds(H5Dcreate2(impl_->file, d.name.c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(),
                       H5P_DEFAULT),
            H5Dclose);
  if (!ds.ok()) return Fail(path_, what + " cannot be created (is the name valid in HDF5?)");
  std::map<std::string, std::string> attrs = attributes;
  if (d.dtype == DType::kBF16) attrs[kDTypeAttr] = "bf16";
  for (const auto& [key, value] : attrs) {
    if (!WriteStringAttribute(ds.get(), key, value)) {
      return Fail(path_, what + ": attribute '" + key + "' cannot be written");
    }
  }
  return Status::Ok();
}

Result<std::vector<Hdf5Dataset>> Hdf5File::List() const {
  Quiet();
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> names;
  if (H5Ovisit(impl_->file, H5_INDEX_NAME, H5_ITER_INC, CollectDatasets, &names) < 0) {
    return DataLossError("HDF5 file '" + path_ + "': its groups cannot be listed");
  }
  std::vector<Hdf5Dataset> out;
  for (const std::string& name : names) {
    const std::string what = "HDF5 file '" + path_ + "': dataset '" + name + "'";
    Handle ds(H5Dopen2(impl_->file, name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) return DataLossError(what + " cannot be opened");
    Handle type(H5Dget_type(ds.get()), H5Tclose);
    ASSIGN_OR_RETURN(DType dtype, DTypeOfFileType(type.get(), what));
    auto tag = ReadStringAttribute(ds.get(), kDTypeAttr);
    if (tag.ok() && tag->rfind("bf16", 0) == 0) {
      if (dtype != DType::kF32) return DataLossError(what + ": marked bf16 but not stored as f32");
      dtype = DType::kBF16;
    }
    Handle space(H5Dget_space(ds.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || rank > 32) return DataLossError(what + ": bad dataspace");
    std::vector<hsize_t> dims(rank);
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    Hdf5Dataset d{name, dtype, {}};
    for (hsize_t n : dims) d.shape.push_back(static_cast<int64_t>(n));
    out.push_back(std::move(d));
  }
  return out;
}

Status Hdf5File::WriteBox(const std::string& name, DType dtype, const Box& box, const void* data) {
  Quiet();
  std::lock_guard<std::mutex> lock(impl_->mu);
  Handle ds(H5Dopen2(impl_->file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) return Fail(path_, "dataset '" + name + "' is missing");
  Handle fspace(H5Dget_space(ds.get()), H5Sclose);
  SelectBox(fspace.get(), box);
  const std::vector<int64_t> ext = box.extents();
  Handle mspace(NewSelection(ext, Box::FromShape(ext)), H5Sclose);
  Handle mtype(NewMemoryType(dtype), H5Tclose);
  if (H5Dwrite(ds.get(), mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, data) < 0) {
    return Fail(path_, "dataset '" + name + "': writing " + ToString(box) + " failed");
  }
  return Status::Ok();
}

Status Hdf5File::ReadBox(const std::string& name, DType dtype, const Box& region, void* dst,
                         const std::vector<int64_t>& dst_extents, const Box& dst_box) const {
  Quiet();
  std::lock_guard<std::mutex> lock(impl_->mu);
  Handle ds(H5Dopen2(impl_->file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok())
    return DataLossError("HDF5 file '" + path_ + "': dataset '" + name + "' is missing");
  Handle fspace(H5Dget_space(ds.get()), H5Sclose);
  SelectBox(fspace.get(), region);
  Handle mspace(NewSelection(dst_extents, dst_box), H5Sclose);
  Handle mtype(NewMemoryType(dtype), H5Tclose);
  if (H5Dread(ds.get(), mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, dst) < 0) {
    return DataLossError("HDF5 file '" + path_ + "': dataset '" + name + "': reading " +
                         ToString(region) + " failed (corrupt chunk?)");
  }
  return Status::Ok();
}

Status Hdf5File::SetRootAttribute(const std::string& key, const std::string& value) {
  Quiet();
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!WriteStringAttribute(impl_->file, key, value)) {
    return Fail(path_, "attribute '" + key + "' cannot be written");
  }
  return Status::Ok();
}

Result<std::map<std::string, std::string>> Hdf5File::RootAttributes() const {
  Quiet();
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::map<std::string, std::string> out;
  H5O_info_t info;
  if (H5Oget_info2(impl_->file, &info, H5O_INFO_NUM_ATTRS) < 0) {
    return DataLossError("HDF5 file '" + path_ + "': root group unreadable");
  }
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    char name[1024] = {};
    if (H5Aget_name_by_idx(impl_->file, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof(name),
                           H5P_DEFAULT) < 0) {
      continue;
    }
    auto value = ReadStringAttribute(impl_->file, name);
    if (value.ok()) out[name] = std::move(*value);
  }
  return out;
}

Status Hdf5File::Close() {
  Quiet();
  if (!impl_ || impl_->file < 0) return Status::Ok();
  const bool writable = impl_->writable;
  const herr_t flushed = writable ? H5Fflush(impl_->file, H5F_SCOPE_GLOBAL) : 0;
  const herr_t closed = H5Fclose(impl_->file);
  impl_->file = -1;
  if (flushed < 0 || closed < 0) return Fail(path_, "flush or close failed");
  if (writable) {
    const int fd = ::open(path_.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) {
      if (fd >= 0) ::close(fd);
      return Fail(path_, "fsync failed");
    }
    ::close(fd);
  }
  return Status::Ok();
}

}  // namespace tessera
