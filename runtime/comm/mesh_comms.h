// MeshCommunicators: for a Mesh over a world communicator, the communicator
// along each axis and along every set of axes: the tp group (ranks that
// differ only in their tp coordinate), the dp group, dp+tp, and so on, plus
// pipeline neighbours along an axis.
#ifndef TESSERA_RUNTIME_COMM_MESH_COMMS_H_
#define TESSERA_RUNTIME_COMM_MESH_COMMS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/comm/communicator.h"
#include "transform/mesh.h"

namespace tessera {

class MeshCommunicators {
 public:
  // Collective over `world`, whose size must be mesh.world_size(): splits
  // one communicator for every non-empty set of axes (2^ndim - 1 splits;
  // meshes have at most 6 axes). `world` must outlive the result.
  static Result<MeshCommunicators> Create(Communicator& world, const Mesh& mesh);

  const Mesh& mesh() const { return mesh_; }
  Communicator& world() const { return *world_; }
  // This rank's coordinates in the mesh.
  const std::vector<int64_t>& coordinates() const { return coordinates_; }
  int64_t coordinate(std::string_view axis) const;

  // The ranks that agree on every coordinate except those of `axes`,
  // ranked row-major over `axes` in mesh order (whatever order they are
  // named in). Its rank along a single axis equals this rank's coordinate.
  Result<Communicator*> Along(const std::vector<std::string>& axes) const;
  Result<Communicator*> Along(std::string_view axis) const {
    return Along(std::vector<std::string>{std::string(axis)});
  }

  // Neighbours along `axis` (no wrap-around): the rank in Along(axis) of the
  // previous / next coordinate, or -1 at the ends.
  int Prev(std::string_view axis) const;
  int Next(std::string_view axis) const;

 private:
  Mesh mesh_;
  Communicator* world_ = nullptr;
  std::vector<int64_t> coordinates_;
  std::vector<std::shared_ptr<Communicator>> by_mask_;  // index: bit i = axis i
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_MESH_COMMS_H_
