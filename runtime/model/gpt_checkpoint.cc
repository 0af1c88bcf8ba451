#include "runtime/model/gpt_checkpoint.h"

#include "ckpt/native.h"
#include "formats/native_files.h"
#include "runtime/tensor.h"

namespace tessera {
namespace {

// The tensors of a checkpoint of `model`, in order, with where each one's
// floats live: parameters, then each parameter's two Adam moments.
struct Entry {
  std::string name;
  const ParamInfo* param;
  int which;  // 0 weights, 1 exp_avg, 2 exp_avg_sq
};

// The flat vector an entry's floats live in.
template <typename G>
auto& Values(G& model, int which) {
  return which == 0 ? model.weights() : which == 1 ? model.adam_m() : model.adam_v();
}

std::vector<Entry> Entries(const Gpt& model, bool optimizer_state = true) {
  std::vector<Entry> out;
  for (const ParamInfo& p : model.params()) out.push_back({p.name, &p, 0});
  if (!optimizer_state) return out;
  for (const ParamInfo& p : model.params()) {
    out.push_back({"optimizer." + p.name + ".exp_avg", &p, 1});
    out.push_back({"optimizer." + p.name + ".exp_avg_sq", &p, 2});
  }
  return out;
}

}  // namespace

Status SaveGpt(Env* env, const Gpt& model, const std::string& root, const std::string& name,
               const std::map<std::string, std::string>& metadata, const SaveGptOptions& options) {
  if (!IsFloatingPoint(options.weights_dtype)) {
    return InvalidArgumentError("GPT weights cannot be saved as " +
                                std::string(DTypeName(options.weights_dtype)));
  }
  if (model.stage().tp > 1) {
    return FailedPreconditionError("SaveGpt writes whole tensors: gather a tp slice first");
  }
  Strategy strategy;
  const std::vector<Entry> entries = Entries(model, options.optimizer_state);
  for (const Entry& e : entries) {
    const DType dtype = e.which == 0 ? options.weights_dtype : DType::kF32;
    RETURN_IF_ERROR(strategy.Add({e.name, Layout::Replicated(e.param->shape, dtype)}));
  }
  CheckpointMeta meta;
  meta.step = model.step();
  meta.metadata = metadata;
  meta.created_by = "tessera train_gpt";
  RETURN_IF_ERROR(env->CreateDirs(root));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer,
                   CreateNativeCheckpoint(env, root + "/" + name, strategy, meta,
                                          {.overwrite = options.overwrite}));
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const float* values = Values(model, e.which).data() + e.param->offset;
    if (e.which == 0 && options.weights_dtype != DType::kF32) {
      ASSIGN_OR_RETURN(Tensor t, Tensor::FromF32({values, static_cast<size_t>(e.param->numel)},
                                                 e.param->shape, options.weights_dtype));
      RETURN_IF_ERROR(writer->WritePiece(i, 0, Box::FromShape(e.param->shape), t.bytes()));
      continue;
    }
    RETURN_IF_ERROR(writer->WritePiece(i, 0, Box::FromShape(e.param->shape), values));
  }
  RETURN_IF_ERROR(writer->Commit());
  return SetLatest(env, root, name);
}

Status ReadGptRegion(const CheckpointReader& reader, const std::string& name, const ParamInfo& p,
                     const Box& region, float* out) {
  ASSIGN_OR_RETURN(size_t index, FindTensor(reader, name));
  const Layout& layout = reader.strategy().tensors()[index].layout;
  if (layout.shape != p.full_shape || !IsFloatingPoint(layout.dtype)) {
    return InvalidArgumentError("checkpoint '" + reader.path() + "': tensor '" + name + "' is " +
                                std::string(DTypeName(layout.dtype)) + ShapeToString(layout.shape) +
                                ", the model's is f32" + ShapeToString(p.full_shape));
  }
  // Just its byte ranges (the reader reads no more).
  if (layout.dtype == DType::kF32)
    return ReadRegionOver(reader, index, p.split_shape(), region, out);
  ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(layout.dtype, region.extents()));
  RETURN_IF_ERROR(ReadRegionOver(reader, index, p.split_shape(), region, t.bytes()));
  return t.CopyToF32({out, static_cast<size_t>(NumElements(region))});
}

bool HasOptimizerState(const CheckpointReader& reader) {
  for (const TensorStrategy& t : reader.strategy().tensors()) {
    if (t.name.starts_with("optimizer.")) return true;
  }
  return false;
}

Status LoadGpt(const CheckpointReader& reader, Gpt* model) {
  // An export has no optimizer state at all; a checkpoint with only some of
  // it is damaged and fails below on the first missing tensor.
  const bool optimizer_state = HasOptimizerState(reader);
  if (optimizer_state) {  // a ZeRO trainer may have released them
    model->adam_m().resize(model->num_params());
    model->adam_v().resize(model->num_params());
  }
  for (const Entry& e : Entries(*model, optimizer_state)) {
    float* values = Values(*model, e.which).data() + e.param->offset;
    RETURN_IF_ERROR(ReadGptRegion(reader, e.name, *e.param, e.param->box, values));
  }
  if (optimizer_state) {
    model->set_step(reader.meta().step);
  } else {
    std::fill(model->adam_m().begin(), model->adam_m().end(), 0.0f);
    std::fill(model->adam_v().begin(), model->adam_v().end(), 0.0f);
    model->set_step(0);
  }
  return Status::Ok();
}

}  // namespace tessera
