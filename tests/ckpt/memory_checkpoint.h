// A checkpoint held as whole tensors in memory: the reference the ckpt
// tests compare files against, and a reader to write test checkpoints from.
#ifndef TESSERA_TESTS_CKPT_MEMORY_CHECKPOINT_H_
#define TESSERA_TESTS_CKPT_MEMORY_CHECKPOINT_H_

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/ops.h"
#include "tests/transform/random_layout.h"

namespace tessera::testing {

class MemoryCheckpoint : public CheckpointReader {
 public:
  MemoryCheckpoint() : strategy_(*Mesh::Create({"r"}, {1})) {}

  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape,
           std::vector<uint8_t> bytes) {
    REQUIRE(strategy_.Add({name, Layout::Replicated(std::move(shape), dtype), {}}).ok());
    data_.push_back(std::move(bytes));
  }
  const std::vector<uint8_t>& data(size_t i) const { return data_[i]; }
  std::vector<uint8_t>& mutable_data(size_t i) { return data_[i]; }

  const std::string& path() const override { return path_; }
  std::string_view format() const override { return "memory"; }
  const Strategy& strategy() const override { return strategy_; }
  const CheckpointMeta& meta() const override { return meta_; }
  CheckpointMeta& mutable_meta() { return meta_; }
  TensorStorage Storage(size_t) const override { return {1, 0}; }
  Status ReadRegion(size_t index, const Box& region, void* dst,
                    const std::vector<int64_t>& dst_extents, const Box& dst_box) const override {
    const Layout& l = strategy_.tensors()[index].layout;
    if (!Contains(Box::FromShape(l.shape), region)) return OutOfRangeError("outside");
    CopyBox(data_[index].data(), l.shape, region, dst, dst_extents, dst_box, DTypeSize(l.dtype));
    return Status::Ok();
  }

 private:
  std::string path_ = "<memory>";
  Strategy strategy_;
  CheckpointMeta meta_;
  std::vector<std::vector<uint8_t>> data_;
};

// `count` tensors of random dtypes and odd shapes with low-entropy bytes
// (so that zstd has something to find); `big` adds one of about 2.5 MiB.
inline MemoryCheckpoint RandomModel(std::mt19937_64& rng, int count, bool big = false) {
  MemoryCheckpoint m;
  for (int t = 0; t < count; ++t) {
    DType dtype = static_cast<DType>(Uniform(rng, 0, kNumDTypes - 1));
    std::vector<int64_t> shape = RandomShape(rng, 3, 37);
    if (big && t == 0) {
      shape = {611, 1097};
      dtype = DType::kF32;
    }
    std::vector<uint8_t> bytes(ByteSize(Layout::Replicated(shape, dtype)));
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(Uniform(rng, 0, 5) * 37);
    m.Add("model.t" + std::to_string(t), dtype, shape, std::move(bytes));
  }
  m.mutable_meta().step = 42;
  m.mutable_meta().metadata["config"] = std::string("{\"layers\":2}\0bin", 16);
  return m;
}

// A random layout for every tensor of `model` on a random mesh.
inline Strategy RandomStrategy(std::mt19937_64& rng, const CheckpointReader& model,
                               int64_t max_world) {
  Strategy s(RandomMesh(rng, max_world));
  for (const TensorStrategy& t : model.strategy().tensors()) {
    REQUIRE(s.Add({t.name, RandomLayout(rng, s.mesh(), t.layout.shape, t.layout.dtype), {}}).ok());
  }
  return s;
}

// Every tensor of `r` equals `model`'s, bit for bit.
inline void RequireSameContents(const CheckpointReader& r, const MemoryCheckpoint& model) {
  REQUIRE(r.strategy().tensors().size() == model.strategy().tensors().size());
  for (size_t i = 0; i < model.strategy().tensors().size(); ++i) {
    INFO("tensor " << model.strategy().tensors()[i].name);
    REQUIRE(r.strategy().tensors()[i].name == model.strategy().tensors()[i].name);
    std::vector<uint8_t> got(model.data(i).size(), 0xEE);
    Status s = ReadTensor(r, i, got.data());
    INFO(s.ToString());
    REQUIRE(s.ok());
    REQUIRE(got == model.data(i));
  }
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_CKPT_MEMORY_CHECKPOINT_H_
