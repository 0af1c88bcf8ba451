#include "formats/safetensors.h"

#include <catch2/catch.hpp>
#include <cstring>

namespace tessera {
namespace {

// Writes raw bytes: an 8-byte length, the header text, then `data_bytes` zeros.
void WriteRaw(Env* env, const std::string& path, uint64_t declared_len, const std::string& header,
              size_t data_bytes) {
  auto out = env->NewWritableFile(path).value();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(declared_len >> (8 * i));
  REQUIRE(out->Append(len, 8).ok());
  REQUIRE(out->Append(header.data(), header.size()).ok());
  std::string zeros(data_bytes, '\0');
  REQUIRE(out->Append(zeros.data(), zeros.size()).ok());
  REQUIRE(out->Close().ok());
}

Status OpenRaw(const std::string& header, size_t data_bytes, uint64_t declared_len = 0) {
  auto env = NewMemEnv();
  WriteRaw(env.get(), "x.safetensors", declared_len ? declared_len : header.size(), header,
           data_bytes);
  return SafetensorsFile::Open(env.get(), "x.safetensors").status();
}

TEST_CASE("safetensors: round trip of every dtype, metadata and an empty tensor") {
  auto env = NewMemEnv();
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<uint16_t> b = {0x3c00, 0x4000};
  std::vector<int64_t> c = {-1, 1LL << 40};
  uint8_t flags[3] = {1, 0, 1};
  REQUIRE(WriteSafetensors(env.get(), "m.safetensors",
                           {{"a", DType::kF32, {2, 3}, a.data()},
                            {"b", DType::kBF16, {2}, b.data()},
                            {"c", DType::kI64, {2}, c.data()},
                            {"empty", DType::kF16, {0, 4}, nullptr},
                            {"flags", DType::kBool, {3}, flags}},
                           {{"format", "pt"}, {"tessera.step", "10"}})
              .ok());
  CHECK_FALSE(env->FileExists("m.safetensors.tmp"));
  auto f = SafetensorsFile::Open(env.get(), "m.safetensors");
  REQUIRE(f.ok());
  CHECK(f->entries().size() == 5);
  CHECK(f->metadata().at("tessera.step") == "10");
  const SafetensorsEntry* e = f->Find("a");
  REQUIRE(e != nullptr);
  CHECK(e->shape == std::vector<int64_t>{2, 3});
  std::vector<float> back(6);
  REQUIRE(f->Read(*e, 0, 24, back.data()).ok());
  CHECK(back == a);
  float second_row[3];
  REQUIRE(f->Read(*e, 12, 12, second_row).ok());
  CHECK(second_row[2] == 8.0f);
  CHECK_FALSE(f->Read(*e, 20, 8, second_row).ok());  // past the tensor
  int64_t cc[2];
  REQUIRE(f->Read(*f->Find("c"), 0, 16, cc).ok());
  CHECK(cc[1] == (1LL << 40));
  CHECK(f->Find("empty")->begin == f->Find("empty")->end);
  CHECK(f->Find("flags")->dtype == DType::kBool);
  CHECK_FALSE(
      WriteSafetensors(env.get(), "n.safetensors",
                       {{"a", DType::kF32, {1}, a.data()}, {"a", DType::kF32, {1}, a.data()}})
          .ok());
}

TEST_CASE("safetensors: hostile headers are refused by name, without huge allocations") {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK(OpenRaw(ok, 8).ok());
  auto fails = [](const Status& s, const std::string& text) {
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains(text));
  };
  fails(OpenRaw(ok, 8, uint64_t{1} << 62), "exceeds the limit");
  fails(OpenRaw(ok, 8, 90'000'000), "exceeds the file size");
  fails(OpenRaw("{not json", 0), "not a JSON object");
  fails(OpenRaw("[1,2]", 0), "not a JSON object");
  fails(OpenRaw(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8),
        "tensor 'w': data_offsets [0, 16] outside the 8 data bytes");
  fails(OpenRaw(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
        "tensor 'w': 8 bytes for 3 f32 elements");
  fails(OpenRaw(R"({"w":{"dtype":"F32","shape":[-3],"data_offsets":[0,8]}})", 8), "shape");
  fails(
      OpenRaw(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", 8),
      "shape overflows");
  fails(OpenRaw(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8), "Q7");
  fails(OpenRaw(R"({"w":{"dtype":"F32","shape":[2]}})", 8), "data_offsets");
  fails(OpenRaw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                12),
        "overlap");
  fails(OpenRaw(R"({"__metadata__":{"k":1}})", 0), "__metadata__");
  auto env = NewMemEnv();
  auto out = env->NewWritableFile("tiny").value();
  REQUIRE(out->Append("abc", 3).ok());
  REQUIRE(out->Close().ok());
  fails(SafetensorsFile::Open(env.get(), "tiny").status(), "shorter than");
}

}  // namespace
}  // namespace tessera
