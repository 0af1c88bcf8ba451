// Reed-Solomon parity (formats/erasure.h, ISA-L) beside XOR parity
// (formats/parity.h) on the same member files, and rebuilding two lost
// files of an rs:4+2 group beside copying the same bytes. Files sit in a
// directory (argv[1]) in the page cache; parity files are synced, as in a
// save. Medians of 5.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "formats/erasure.h"
#include "formats/parity.h"

using namespace tessera;

namespace {

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename Fn>
double Median(Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!fn()) return -1;
    t.push_back(Seconds(t0));
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: erasure_bench DIR [MiB per member]\n");
    return 2;
  }
  Env* env = Env::Default();
  const std::string dir = argv[1];
  const uint64_t mib = argc > 2 ? std::stoull(argv[2]) : 64;
  const uint64_t size = mib << 20;
  if (!env->CreateDirs(dir).ok()) return 1;
  std::mt19937_64 rng(7);
  std::vector<ParityMember> members;
  std::string bytes(size, '\0');
  for (int i = 0; i < 8; ++i) {
    for (char& c : bytes) c = static_cast<char>(rng());
    members.push_back({dir + "/member-" + std::to_string(i), size});
    if (!WriteFileAtomically(env, members.back().path, bytes).ok()) return 1;
  }
  std::printf("%-28s %10s %12s %12s %8s\n", "encode", "members", "seconds", "GB/s in", "vs XOR");
  for (int k : {4, 8}) {
    const std::vector<ParityMember> group(members.begin(), members.begin() + k);
    const double xor_s = Median([&] {
      uint64_t sum = 0;
      return WriteParityFile(env, group, dir + "/xor", &sum).ok();
    });
    for (int m : {1, 2, 3}) {
      const ErasureCode code{k, m};
      std::vector<std::string> paths;
      for (int j = 0; j < m; ++j) paths.push_back(dir + "/rs-" + std::to_string(j));
      std::vector<uint64_t> sums;
      const double rs_s =
          Median([&] { return WriteErasureParity(env, code, group, paths, &sums).ok(); });
      std::printf("%-28s %10d %12.3f %12.2f %7.2fx\n", code.ToString().c_str(), k, rs_s,
                  static_cast<double>(k * size) / rs_s / 1e9, rs_s / xor_s);
    }
    std::printf("%-28s %10d %12.3f %12.2f %7.2fx\n",
                ("xor (parity:" + std::to_string(k) + ")").c_str(), k, xor_s,
                static_cast<double>(k * size) / xor_s / 1e9, 1.0);
  }
  // Rebuilding two lost members of rs:4+2, beside copying two files.
  const ErasureCode code{4, 2};
  std::vector<ParityMember> files(members.begin(), members.begin() + 4);
  std::vector<std::string> paths{dir + "/rs-0", dir + "/rs-1"};
  std::vector<uint64_t> sums;
  if (!WriteErasureParity(env, code, files, paths, &sums).ok()) return 1;
  files.push_back({paths[0], size});
  files.push_back({paths[1], size});
  std::vector<bool> good{false, false, true, true, true, true};
  std::vector<char> buf(4 << 20);
  auto rebuild_to = [&](size_t lost, const std::string& out_path) {
    auto src = OpenErasureRebuild(env, code, files, good, lost);
    if (!src.ok()) return false;
    auto out = env->NewWritableFile(out_path);
    if (!out.ok()) return false;
    for (uint64_t at = 0; at < size; at += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - at));
      if (!(*src)->Read(at, n, buf.data()).ok() || !(*out)->Append(buf.data(), n).ok())
        return false;
    }
    return (*out)->Sync().ok() && (*out)->Close().ok();
  };
  const double repair_s =
      Median([&] { return rebuild_to(0, dir + "/r0") && rebuild_to(1, dir + "/r1"); });
  auto copy_to = [&](const std::string& from, const std::string& to) {
    auto in = env->NewRandomAccessFile(from);
    auto out = env->NewWritableFile(to);
    if (!in.ok() || !out.ok()) return false;
    for (uint64_t at = 0; at < size; at += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - at));
      if (!(*in)->Read(at, n, buf.data()).ok() || !(*out)->Append(buf.data(), n).ok()) return false;
    }
    return (*out)->Sync().ok() && (*out)->Close().ok();
  };
  const double copy_s = Median([&] {
    return copy_to(members[0].path, dir + "/c0") && copy_to(members[1].path, dir + "/c1");
  });
  std::printf(
      "\nrebuild 2 lost files of rs:4+2 (%llu MiB each): %.3f s; copying the same bytes "
      "(read + write + sync): %.3f s; ratio %.2fx\n",
      static_cast<unsigned long long>(mib), repair_s, copy_s, repair_s / copy_s);
  return DeleteRecursively(env, dir).ok() ? 0 : 1;
}
