#include "runtime/comm/mesh_comms.h"

namespace tessera {

Result<MeshCommunicators> MeshCommunicators::Create(Communicator& world, const Mesh& mesh) {
  if (mesh.world_size() != world.size()) {
    return InvalidArgumentError("mesh " + mesh.ToString() + " has " +
                                std::to_string(mesh.world_size()) + " ranks but communicator '" +
                                world.name() + "' has " + std::to_string(world.size()));
  }
  if (mesh.ndim() > 6) {
    return InvalidArgumentError("mesh " + mesh.ToString() + " has more than 6 axes");
  }
  MeshCommunicators out;
  out.mesh_ = mesh;
  out.world_ = &world;
  out.coordinates_ = mesh.Coordinates(world.rank());
  const int n = mesh.ndim();
  out.by_mask_.resize(size_t{1} << n);
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    // color: row-major index over the axes outside the set; key: over those in it.
    int64_t color = 0, key = 0;
    std::string name;
    for (int a = 0; a < n; ++a) {
      if (mask & (1u << a)) {
        key = key * mesh.axis_size(a) + out.coordinates_[a];
        name += (name.empty() ? "" : "+") + mesh.axis_name(a);
      } else {
        color = color * mesh.axis_size(a) + out.coordinates_[a];
      }
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                     world.Split(static_cast<int>(color), static_cast<int>(key)));
    if (comm == nullptr) return InternalError("split for axes " + name + " returned no group");
    comm->set_name(name);
    out.by_mask_[mask] = std::move(comm);
  }
  return out;
}

int64_t MeshCommunicators::coordinate(std::string_view axis) const {
  const int a = mesh_.FindAxis(axis);
  return a < 0 ? -1 : coordinates_[a];
}

Result<Communicator*> MeshCommunicators::Along(const std::vector<std::string>& axes) const {
  uint32_t mask = 0;
  for (const std::string& name : axes) {
    const int a = mesh_.FindAxis(name);
    if (a < 0) {
      return InvalidArgumentError("axis '" + name + "' is not in mesh " + mesh_.ToString());
    }
    mask |= 1u << a;
  }
  if (mask == 0) return InvalidArgumentError("no axes named");
  return by_mask_[mask].get();
}

int MeshCommunicators::Prev(std::string_view axis) const {
  const int64_t c = coordinate(axis);
  return c <= 0 ? -1 : static_cast<int>(c - 1);
}

int MeshCommunicators::Next(std::string_view axis) const {
  const int a = mesh_.FindAxis(axis);
  if (a < 0 || coordinates_[a] + 1 >= mesh_.axis_size(a)) return -1;
  return static_cast<int>(coordinates_[a] + 1);
}

}  // namespace tessera
