#include "ckpt/checkpoint.h"

namespace tessera {

Status CheckNoViews(const Strategy& strategy, const std::string& where) {
  for (const TensorStrategy& t : strategy.tensors()) {
    if (!t.layout.view.empty()) {
      return UnimplementedError(where + ": tensor '" + t.name + "' is laid out over view " +
                                ShapeToString(t.layout.view) +
                                ", which checkpoint formats cannot store yet");
    }
  }
  return Status::Ok();
}

Status CheckReadRegion(const TensorStrategy& t, const std::string& where, const Box& region) {
  if (Contains(Box::FromShape(t.layout.shape), region)) return Status::Ok();
  return OutOfRangeError(where + ": tensor '" + t.name + "': box " + ToString(region) +
                         " lies outside shape " + ShapeToString(t.layout.shape));
}

Result<const TensorStrategy*> CheckWritePiece(const Strategy& strategy, const std::string& where,
                                              size_t index, const Box& box) {
  if (index >= strategy.tensors().size()) {
    return InvalidArgumentError(where + ": no tensor #" + std::to_string(index));
  }
  const TensorStrategy& t = strategy.tensors()[index];
  if (IsEmpty(box) || !Contains(Box::FromShape(t.layout.shape), box)) {
    return InvalidArgumentError(where + ": tensor '" + t.name + "': box " + ToString(box) +
                                " is empty or outside shape " + ShapeToString(t.layout.shape));
  }
  return &t;
}

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
