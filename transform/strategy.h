// Strategy: a mesh plus the layout of every tensor of a model, in order.
// Serialized as the human-readable JSON described in transform/strategy.md.
#ifndef TESSERA_TRANSFORM_STRATEGY_H_
#define TESSERA_TRANSFORM_STRATEGY_H_

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "transform/layout.h"
#include "transform/mesh.h"

namespace tessera {

struct TensorStrategy {
  std::string name;
  Layout layout;
  // A tensor may live on its own mesh (MindSpore strategies give each
  // parameter its own device matrix); otherwise the strategy's mesh.
  std::optional<Mesh> mesh;
};

class Strategy {
 public:
  Strategy() = default;
  explicit Strategy(Mesh mesh) : mesh_(std::move(mesh)) {}

  const Mesh& mesh() const { return mesh_; }
  const std::vector<TensorStrategy>& tensors() const { return tensors_; }
  const Mesh& MeshOf(const TensorStrategy& t) const { return t.mesh ? *t.mesh : mesh_; }
  // The largest world size over the strategy mesh and any per-tensor mesh.
  int64_t world_size() const;

  // Validates the layout on its mesh; errors name the tensor.
  Status Add(TensorStrategy tensor);
  const TensorStrategy* Find(std::string_view name) const;

 private:
  Mesh mesh_;
  std::vector<TensorStrategy> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

Result<Strategy> ParseStrategyJson(std::string_view json);
std::string StrategyToJson(const Strategy& strategy);
// Errors name the file.
Result<Strategy> LoadStrategyFile(Env* env, const std::string& path);
Status SaveStrategyFile(Env* env, const std::string& path, const Strategy& strategy);

// The same per-tensor split axes on another mesh (the everyday "change the
// TP / DP degree" case): axes keep their names, sizes come from `mesh`.
// Fails, naming the tensor, when a layout uses an axis `mesh` lacks.
Result<Strategy> WithMesh(const Strategy& strategy, const Mesh& mesh);

}  // namespace tessera

#endif  // TESSERA_TRANSFORM_STRATEGY_H_
