#include "ckpt/checkpoint.h"

namespace tessera {

Status ReadTensor(const CheckpointReader& reader, size_t index, void* dst) {
  const Layout& layout = reader.strategy().tensors()[index].layout;
  if (NumElements(layout) == 0) return Status::Ok();
  const Box whole = Box::FromShape(layout.shape);
  return reader.ReadRegion(index, whole, dst, layout.shape, whole);
}

Result<size_t> FindTensor(const CheckpointReader& reader, std::string_view name) {
  const auto& tensors = reader.strategy().tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return i;
  }
  return NotFoundError("checkpoint '" + reader.path() + "' has no tensor '" + std::string(name) +
                       "'");
}

}  // namespace tessera
