// HDF5 files through libhdf5 (the only file including hdf5.h is
// hdf5_file.cc). One dataset per tensor at the path of its name ("h.0.w" at
// the root, "a/b" in group a), chunked; tensor bytes move as hyperslabs, so
// a reader of one box reads only the chunks it touches.
//
// Element types are the ones h5py understands: IEEE floats (f16 as h5py
// builds it), little-endian integers, and bool as h5py's enum {FALSE, TRUE}
// over int8. bf16, which HDF5 and numpy lack, is stored as f32 (exact) with
// the attribute "tessera.dtype" = "bf16", and converted back by HDF5 on
// read. libhdf5 does its own POSIX I/O: these files do not go through Env.
#ifndef TESSERA_FORMATS_HDF5_FILE_H_
#define TESSERA_FORMATS_HDF5_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "transform/box.h"

namespace tessera {

struct Hdf5Dataset {
  std::string name;  // tensor name ('/'-separated groups)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

class Hdf5File {
 public:
  ~Hdf5File();
  Hdf5File(Hdf5File&&) noexcept;
  Hdf5File& operator=(Hdf5File&&) = delete;

  // Creates (truncating) or opens read-only.
  static Result<Hdf5File> Create(const std::string& path);
  static Result<Hdf5File> Open(const std::string& path);
  // Whether the file starts with the HDF5 signature.
  static bool IsHdf5(const std::string& path);

  const std::string& path() const { return path_; }

  // A chunked dataset (chunk extents <= shape, > 0) with string attributes.
  Status CreateDataset(const Hdf5Dataset& d, const std::vector<int64_t>& chunk,
                       const std::map<std::string, std::string>& attributes);
  // Every dataset, in name order (groups descended).
  Result<std::vector<Hdf5Dataset>> List() const;

  // Writes `box` of dataset `name` from the dense buffer `data` (box extents).
  Status WriteBox(const std::string& name, DType dtype, const Box& box, const void* data);
  // Reads `region` of dataset `name` into `dst_box` of the dense buffer of
  // shape `dst_extents`.
  Status ReadBox(const std::string& name, DType dtype, const Box& region, void* dst,
                 const std::vector<int64_t>& dst_extents, const Box& dst_box) const;

  // String attributes of the root group (any bytes: fixed-length,
  // null-padded strings, which h5py returns as bytes).
  Status SetRootAttribute(const std::string& key, const std::string& value);
  Result<std::map<std::string, std::string>> RootAttributes() const;

  // Flushes, closes and fsyncs the file.
  Status Close();

 private:
  Hdf5File() = default;
  struct Impl;
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera

#endif  // TESSERA_FORMATS_HDF5_FILE_H_
