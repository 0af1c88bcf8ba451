// Mesh: named device axes with sizes. Ranks are numbered row-major: the
// first axis is outermost, the last varies fastest (as MindSpore's
// dev_matrix and Megatron's rank order).
#ifndef TESSERA_TRANSFORM_MESH_H_
#define TESSERA_TRANSFORM_MESH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace tessera {

class Mesh {
 public:
  // A single rank, no axes.
  Mesh() = default;
  // Names must be unique identifiers ([A-Za-z_][A-Za-z0-9_]*), sizes >= 1.
  static Result<Mesh> Create(std::vector<std::string> names, std::vector<int64_t> sizes);
  // "dp=2,tp=4,pp=1" (the CLI's --mesh form).
  static Result<Mesh> Parse(std::string_view text);

  int ndim() const { return static_cast<int>(names_.size()); }
  const std::string& axis_name(int i) const { return names_[i]; }
  int64_t axis_size(int i) const { return sizes_[i]; }
  const std::vector<std::string>& axis_names() const { return names_; }
  const std::vector<int64_t>& axis_sizes() const { return sizes_; }
  // Index of the axis, or -1.
  int FindAxis(std::string_view name) const;
  int64_t world_size() const { return world_size_; }

  // Coordinates of `rank` (0 <= rank < world_size()).
  std::vector<int64_t> Coordinates(int64_t rank) const;
  int64_t Coordinate(int64_t rank, int axis) const;
  // How far apart in rank two neighbours along `axis` are.
  int64_t Stride(int axis) const { return strides_[axis]; }
  int64_t RankOf(const std::vector<int64_t>& coordinates) const;

  // "[dp=2, tp=4]".
  std::string ToString() const;

  bool operator==(const Mesh& o) const { return names_ == o.names_ && sizes_ == o.sizes_; }
  bool operator!=(const Mesh& o) const { return !(*this == o); }

 private:
  std::vector<std::string> names_;
  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;  // rank stride of each axis
  int64_t world_size_ = 1;
};

// The largest world size a mesh may describe.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 24;

}  // namespace tessera

#endif  // TESSERA_TRANSFORM_MESH_H_
