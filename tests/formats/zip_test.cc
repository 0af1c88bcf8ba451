// Zip archives as PyTorch writes them: PlanStoredZip's layouts read back by
// ZipArchive (names, sizes, CRC-32s, 64-byte-aligned data), including the
// Zip64 fields of a record over 4 GiB (a sparse file) and of more than
// 65,535 records.
#include "formats/zip.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

// Writes a planned archive: headers, the directory, and `data[i]` for the
// records that have it (the others stay holes of zeros).
void WriteArchive(const std::string& path, const ZipLayout& z,
                  const std::vector<std::string>& data) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(z.size)) == 0);
  auto put = [&](uint64_t at, const std::string& s) {
    REQUIRE(::pwrite(fd, s.data(), s.size(), static_cast<off_t>(at)) ==
            static_cast<ssize_t>(s.size()));
  };
  for (size_t i = 0; i < z.headers.size(); ++i) {
    put(z.header_offsets[i], z.headers[i]);
    if (i < data.size()) put(z.data_offsets[i], data[i]);
  }
  put(z.directory_offset, z.directory);
  REQUIRE(::close(fd) == 0);
}

TEST_CASE("stored archives read back: names, sizes, CRC-32s and 64-byte aligned data") {
  testing::TempDir tmp;
  std::vector<std::string> data = {"pickle bytes", std::string(1000, 'x'), "", "3\n"};
  std::vector<ZipRecordPlan> records;
  for (size_t i = 0; i < data.size(); ++i) {
    records.push_back(
        {"archive/r" + std::to_string(i), data[i].size(), Crc32(data[i].data(), data[i].size())});
  }
  const ZipLayout z = PlanStoredZip(records, 64);
  const std::string path = tmp.path + "/a.zip";
  WriteArchive(path, z, data);
  auto file = Env::Default()->NewRandomAccessFile(path);
  REQUIRE(file.ok());
  auto zip = ZipArchive::Open(**file, 0, z.size, path);
  REQUIRE(zip.ok());
  REQUIRE(zip->records().size() == data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const ZipRecord& r = zip->records()[i];
    CHECK(r.name == records[i].name);
    CHECK(r.size == data[i].size());
    CHECK(r.data_offset % 64 == 0);
    CHECK(r.data_offset == z.data_offsets[i]);
    CHECK(zip->VerifyRecord(**file, r).ok());
  }
  // A changed byte fails the record's CRC, naming it.
  std::string bad = data[1];
  bad[500] ^= 1;
  WriteArchive(path, z, {data[0], bad, data[2], data[3]});
  auto again = Env::Default()->NewRandomAccessFile(path);
  REQUIRE(again.ok());
  Status s = zip->VerifyRecord(**again, zip->records()[1]);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(s.message().find("archive/r1") != std::string::npos);
}

TEST_CASE("Zip64: a record over 4 GiB and more than 65,535 records") {
  testing::TempDir tmp;
  std::vector<ZipRecordPlan> records = {{"archive/data.pkl", 5, 0},
                                        {"archive/data/0", (uint64_t{5} << 30) + 3, 0}};
  for (int i = 0; i < 70000; ++i) records.push_back({"archive/data/s" + std::to_string(i), 1, 0});
  const ZipLayout z = PlanStoredZip(records, 64);
  const std::string path = tmp.path + "/big.zip";
  WriteArchive(path, z, {});
  auto file = Env::Default()->NewRandomAccessFile(path);
  REQUIRE(file.ok());
  auto zip = ZipArchive::Open(**file, 0, z.size, path);
  REQUIRE(zip.ok());
  REQUIRE(zip->records().size() == records.size());
  const ZipRecord* big = zip->Find("archive/data/0");
  REQUIRE(big);
  CHECK(big->size == (uint64_t{5} << 30) + 3);
  CHECK(big->data_offset == z.data_offsets[1]);
  const ZipRecord* last = zip->Find("archive/data/s69999");
  REQUIRE(last);
  CHECK(last->data_offset == z.data_offsets.back());
  CHECK(last->data_offset > (uint64_t{5} << 30));  // its local header's offset needs Zip64
}

}  // namespace
}  // namespace tessera
