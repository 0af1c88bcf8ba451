#include "samples/gpt_strategy.h"

namespace tessera::samples {

Result<Strategy> GptStrategy(const GptShape& g, const Mesh& mesh, bool zero) {
  Strategy s(mesh);
  const bool has_tp = mesh.FindAxis("tp") >= 0, has_pp = mesh.FindAxis("pp") >= 0;
  const int64_t stages = has_pp ? mesh.axis_size(mesh.FindAxis("pp")) : 1;
  const std::vector<std::string> tp =
      has_tp ? std::vector<std::string>{"tp"} : std::vector<std::string>{};
  auto add = [&](const std::string& name, std::vector<int64_t> shape,
                 std::vector<std::vector<std::string>> split, int64_t stage) -> Status {
    Layout l;
    l.shape = std::move(shape);
    l.dim_axes = std::move(split);
    if (has_pp) {
      l.stage_axis = "pp";
      l.stage = stage;
    }
    if (zero && mesh.FindAxis("dp") >= 0) l.opt_axes = {"dp"};
    return s.Add({name, std::move(l), std::nullopt});
  };
  const int64_t c = g.embed;
  RETURN_IF_ERROR(add("wte", {g.vocab, c}, {tp, {}}, 0));
  RETURN_IF_ERROR(add("wpe", {g.context, c}, {{}, {}}, 0));
  for (int64_t i = 0; i < g.layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const int64_t st = i * stages / g.layers;
    RETURN_IF_ERROR(add(p + "ln_1.weight", {c}, {{}}, st));
    RETURN_IF_ERROR(add(p + "ln_1.bias", {c}, {{}}, st));
    RETURN_IF_ERROR(add(p + "attn.c_attn.weight", {c, 3 * c}, {{}, tp}, st));
    RETURN_IF_ERROR(add(p + "attn.c_attn.bias", {3 * c}, {tp}, st));
    RETURN_IF_ERROR(add(p + "attn.c_proj.weight", {c, c}, {tp, {}}, st));
    RETURN_IF_ERROR(add(p + "attn.c_proj.bias", {c}, {{}}, st));
    RETURN_IF_ERROR(add(p + "ln_2.weight", {c}, {{}}, st));
    RETURN_IF_ERROR(add(p + "ln_2.bias", {c}, {{}}, st));
    RETURN_IF_ERROR(add(p + "mlp.c_fc.weight", {c, 4 * c}, {{}, tp}, st));
    RETURN_IF_ERROR(add(p + "mlp.c_fc.bias", {4 * c}, {tp}, st));
    RETURN_IF_ERROR(add(p + "mlp.c_proj.weight", {4 * c, c}, {tp, {}}, st));
    RETURN_IF_ERROR(add(p + "mlp.c_proj.bias", {c}, {{}}, st));
  }
  RETURN_IF_ERROR(add("ln_f.weight", {c}, {{}}, stages - 1));
  RETURN_IF_ERROR(add("ln_f.bias", {c}, {{}}, stages - 1));
  return s;
}

}  // namespace tessera::samples
