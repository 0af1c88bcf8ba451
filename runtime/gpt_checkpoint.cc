#include "runtime/gpt_checkpoint.h"

#include "ckpt/native.h"
#include "formats/native_files.h"

namespace tessera {
namespace {

// The tensors of a checkpoint of `model`, in order, with where each one's
// floats live: parameters, then each parameter's two Adam moments.
struct Entry {
  std::string name;
  const ParamInfo* param;
  int which;  // 0 weights, 1 exp_avg, 2 exp_avg_sq
};

std::vector<Entry> Entries(const Gpt& model) {
  std::vector<Entry> out;
  for (const ParamInfo& p : model.params()) out.push_back({p.name, &p, 0});
  for (const ParamInfo& p : model.params()) {
    out.push_back({"optimizer." + p.name + ".exp_avg", &p, 1});
    out.push_back({"optimizer." + p.name + ".exp_avg_sq", &p, 2});
  }
  return out;
}

}  // namespace

Status SaveGpt(Env* env, const Gpt& model, const std::string& root, const std::string& name,
               const std::map<std::string, std::string>& metadata) {
  Strategy strategy;
  const std::vector<Entry> entries = Entries(model);
  for (const Entry& e : entries) {
    RETURN_IF_ERROR(strategy.Add({e.name, Layout::Replicated(e.param->shape, DType::kF32)}));
  }
  CheckpointMeta meta;
  meta.step = model.step();
  meta.metadata = metadata;
  meta.created_by = "tessera train_gpt";
  RETURN_IF_ERROR(env->CreateDirs(root));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer,
                   CreateNativeCheckpoint(env, root + "/" + name, strategy, meta, {}));
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const std::vector<float>& src = e.which == 0   ? model.weights()
                                    : e.which == 1 ? model.adam_m()
                                                   : model.adam_v();
    RETURN_IF_ERROR(writer->WritePiece(i, 0, Box::FromShape(e.param->shape),
                                       src.data() + e.param->offset));
  }
  RETURN_IF_ERROR(writer->Commit());
  return SetLatest(env, root, name);
}

Status LoadGpt(const CheckpointReader& reader, Gpt* model) {
  for (const Entry& e : Entries(*model)) {
    ASSIGN_OR_RETURN(size_t index, FindTensor(reader, e.name));
    const Layout& layout = reader.strategy().tensors()[index].layout;
    if (layout.shape != e.param->shape || layout.dtype != DType::kF32) {
      return InvalidArgumentError("checkpoint '" + reader.path() + "': tensor '" + e.name +
                                  "' has another shape or dtype than the model's");
    }
    std::vector<float>& dst = e.which == 0   ? model->weights()
                              : e.which == 1 ? model->adam_m()
                                             : model->adam_v();
    RETURN_IF_ERROR(ReadTensor(reader, index, dst.data() + e.param->offset));
  }
  model->set_step(reader.meta().step);
  return Status::Ok();
}

}  // namespace tessera
