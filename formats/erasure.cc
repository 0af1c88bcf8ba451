#include "formats/erasure.h"

#include <isa-l/erasure_code.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "core/checksum.h"

namespace tessera {
namespace {

constexpr uint64_t kChunk = 1 << 20;   // bytes of each file per step
constexpr uint64_t kWindow = 8 << 20;  // bytes of a member mapped at a time

// Reads [offset, offset + n) of a file `size` bytes long into dst, zeros
// past its end.
Status ReadPadded(const RandomAccessFile& file, uint64_t size, uint64_t offset, size_t n,
                  char* dst) {
  const size_t have =
      offset >= size ? 0 : static_cast<size_t>(std::min<uint64_t>(n, size - offset));
  if (have > 0) RETURN_IF_ERROR(file.Read(offset, have, dst));
  std::memset(dst + have, 0, n - have);
  return Status::Ok();
}

// The (K + M) x K encoding matrix: the identity over a Cauchy matrix.
std::vector<unsigned char> EncodeMatrix(const ErasureCode& code) {
  std::vector<unsigned char> a(static_cast<size_t>((code.k + code.m) * code.k));
  gf_gen_cauchy1_matrix(a.data(), code.k + code.m, code.k);
  return a;
}

// out (n bytes) = the combination `coefs` (rows x k, row-major) of the k
// inputs, one output per row.
void Combine(int k, int rows, const std::vector<unsigned char>& coefs,
             const std::vector<unsigned char*>& in, const std::vector<unsigned char*>& out,
             size_t n) {
  std::vector<unsigned char> tables(static_cast<size_t>(k * rows * 32));
  ec_init_tables(k, rows, const_cast<unsigned char*>(coefs.data()), tables.data());
  ec_encode_data(static_cast<int>(n), k, rows, tables.data(),
                 const_cast<unsigned char**>(in.data()), const_cast<unsigned char**>(out.data()));
}

class ErasureRebuild : public RandomAccessFile {
 public:
  ErasureRebuild(std::vector<std::unique_ptr<RandomAccessFile>> from, std::vector<uint64_t> sizes,
                 std::vector<unsigned char> coefs, uint64_t lost_size)
      : from_(std::move(from)),
        sizes_(std::move(sizes)),
        coefs_(std::move(coefs)),
        lost_size_(lost_size) {}

  Status Read(uint64_t offset, size_t size, void* dst) const override {
    if (offset + size > lost_size_ || offset + size < offset) {
      return DataLossError("rebuilt file: range [" + std::to_string(offset) + ", " +
                           std::to_string(offset + size) + ") is past its end " +
                           std::to_string(lost_size_));
    }
    const int k = static_cast<int>(from_.size());
    const size_t step = static_cast<size_t>(std::min<uint64_t>(kChunk, size));
    std::vector<std::vector<unsigned char>> bufs(k, std::vector<unsigned char>(step));
    std::vector<unsigned char*> in;
    for (auto& b : bufs) in.push_back(b.data());
    unsigned char* out = static_cast<unsigned char*>(dst);
    for (uint64_t done = 0; done < size; done += step) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(step, size - done));
      for (int i = 0; i < k; ++i) {
        RETURN_IF_ERROR(
            ReadPadded(*from_[i], sizes_[i], offset + done, n, reinterpret_cast<char*>(in[i])));
      }
      Combine(k, 1, coefs_, in, {out + done}, n);
    }
    return Status::Ok();
  }
  Result<uint64_t> Size() const override { return lost_size_; }

 private:
  std::vector<std::unique_ptr<RandomAccessFile>> from_;  // K good files of the group
  std::vector<uint64_t> sizes_;
  std::vector<unsigned char> coefs_;  // 1 x K: the lost file over them
  uint64_t lost_size_;
};

}  // namespace

Result<ErasureCode> ErasureCode::Parse(std::string_view text) {
  auto bad = [&] {
    return InvalidArgumentError("redundancy '" + std::string(text) +
                                "': use rs:K+M (K data files, M parity files, K + M <= 255)");
  };
  if (text.substr(0, 3) != "rs:") return bad();
  const std::string_view rest = text.substr(3);
  const size_t plus = rest.find('+');
  if (plus == std::string_view::npos) return bad();
  ErasureCode c;
  auto number = [](std::string_view s, int* v) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
    return ec == std::errc() && p == s.data() + s.size();
  };
  if (!number(rest.substr(0, plus), &c.k) || !number(rest.substr(plus + 1), &c.m) || c.k < 1 ||
      c.m < 1 || c.k + c.m > 255) {
    return bad();
  }
  return c;
}

std::string ErasureCode::ToString() const {
  return "rs:" + std::to_string(k) + "+" + std::to_string(m);
}

Result<ErasureCode> ErasureCodeOf(const ErasureGroup& group) {
  if (group.code != kRsCauchy) {
    return UnimplementedError("erasure code '" + group.code + "' is not one Tessera reads (" +
                              kRsCauchy + ")");
  }
  ErasureCode c{static_cast<int>(group.members.size()), static_cast<int>(group.parity.size())};
  if (c.k < 1 || c.m < 1 || c.k + c.m > 255) {
    return DataLossError("an erasure group of " + std::to_string(c.k) + " members and " +
                         std::to_string(c.m) + " parity files");
  }
  return c;
}

Status WriteErasureParity(Env* env, const ErasureCode& code,
                          const std::vector<ParityMember>& members,
                          const std::vector<std::string>& parity_paths,
                          std::vector<uint64_t>* checksums) {
  std::vector<int> rows;
  for (int j = 0; j < code.m; ++j) rows.push_back(j);
  if (static_cast<int>(parity_paths.size()) != code.m) {
    return InvalidArgumentError(code.ToString() + ": " + std::to_string(parity_paths.size()) +
                                " parity files given");
  }
  return WriteErasureParityRows(env, code, members, rows, parity_paths, checksums);
}

Status WriteErasureParityRows(Env* env, const ErasureCode& code,
                              const std::vector<ParityMember>& members,
                              const std::vector<int>& rows,
                              const std::vector<std::string>& parity_paths,
                              std::vector<uint64_t>* checksums) {
  if (static_cast<int>(members.size()) != code.k || parity_paths.size() != rows.size() ||
      rows.empty() ||
      std::any_of(rows.begin(), rows.end(), [&](int j) { return j < 0 || j >= code.m; })) {
    return InvalidArgumentError(code.ToString() + ": " + std::to_string(members.size()) +
                                " members and " + std::to_string(parity_paths.size()) +
                                " parity files given");
  }
  ASSIGN_OR_RETURN(auto files, OpenParityMembers(env, members));
  uint64_t size = 0;
  for (const ParityMember& m : members) size = std::max(size, m.size);
  std::vector<std::unique_ptr<WritableFile>> outs;
  for (const std::string& p : parity_paths) {
    ASSIGN_OR_RETURN(auto out, env->NewWritableFile(p));
    outs.push_back(std::move(out));
  }
  const std::vector<unsigned char> a = EncodeMatrix(code);
  // The matrix rows of the parity files asked for.
  std::vector<unsigned char> coefs;
  for (int j : rows) {
    coefs.insert(coefs.end(), a.begin() + (code.k + j) * code.k,
                 a.begin() + (code.k + j + 1) * code.k);
  }
  const int outputs = static_cast<int>(rows.size());
  const size_t step = static_cast<size_t>(std::min<uint64_t>(kChunk, std::max<uint64_t>(size, 1)));
  // Members read in place through views (mappings) of kWindow bytes where
  // the file system lends them: no copy through a buffer. Else, or for a
  // step past a member's end (zero padding), through in_bufs.
  std::vector<std::unique_ptr<FileView>> views(code.k);
  std::vector<uint64_t> view_at(code.k, 0);
  std::vector<bool> lends(code.k, true);
  std::vector<std::vector<unsigned char>> in_bufs(code.k, std::vector<unsigned char>(step));
  std::vector<std::vector<unsigned char>> out_bufs(outputs, std::vector<unsigned char>(step));
  std::vector<unsigned char*> in, out;
  for (auto& b : in_bufs) in.push_back(b.data());
  for (auto& b : out_bufs) out.push_back(b.data());
  std::vector<Xxh3Hasher> hashes(outputs);
  for (uint64_t offset = 0; offset < size; offset += step) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(step, size - offset));
    for (int i = 0; i < code.k; ++i) {
      if (lends[i] && offset + n <= members[i].size) {
        if (!views[i] || offset < view_at[i] || offset + n > view_at[i] + views[i]->size()) {
          views[i].reset();
          view_at[i] = offset;
          const uint64_t length = std::min<uint64_t>(kWindow, members[i].size - offset);
          Result<std::unique_ptr<FileView>> v = files[i]->View(offset, static_cast<size_t>(length));
          if (v.ok() && *v) {
            views[i] = std::move(*v);
          } else {
            lends[i] = false;  // a file system without views: read from here on
          }
        }
        if (views[i]) {
          in[i] = reinterpret_cast<unsigned char*>(
              const_cast<char*>(views[i]->data() + (offset - view_at[i])));
          continue;
        }
      }
      in[i] = in_bufs[i].data();
      RETURN_IF_ERROR(
          ReadPadded(*files[i], members[i].size, offset, n, reinterpret_cast<char*>(in[i])));
    }
    Combine(code.k, outputs, coefs, in, out, n);
    for (int j = 0; j < outputs; ++j) {
      hashes[j].Update(out[j], n);
      RETURN_IF_ERROR(outs[j]->Append(out[j], n).Annotate("parity file '" + parity_paths[j] + "'"));
    }
  }
  checksums->clear();
  for (int j = 0; j < outputs; ++j) {
    RETURN_IF_ERROR(outs[j]->Sync());
    RETURN_IF_ERROR(outs[j]->Close());
    checksums->push_back(hashes[j].Digest());
  }
  return Status::Ok();
}

Result<std::unique_ptr<RandomAccessFile>> OpenErasureRebuild(Env* env, const ErasureCode& code,
                                                             const std::vector<ParityMember>& files,
                                                             const std::vector<bool>& good,
                                                             size_t lost) {
  const size_t n = static_cast<size_t>(code.k + code.m);
  if (files.size() != n || good.size() != n || lost >= n) {
    return InvalidArgumentError(code.ToString() + ": a group of " + std::to_string(files.size()) +
                                " files");
  }
  std::vector<int> use;  // the first K good files but the lost one
  for (size_t i = 0; i < n && static_cast<int>(use.size()) < code.k; ++i) {
    if (good[i] && i != lost) use.push_back(static_cast<int>(i));
  }
  if (static_cast<int>(use.size()) < code.k) {
    return DataLossError(
        "'" + files[lost].path + "' cannot be rebuilt: " + std::to_string(use.size()) +
        (use.size() == 1 ? " good file" : " good files") + " of its " + code.ToString() +
        " group " + (use.size() == 1 ? "remains, " : "remain, ") + std::to_string(code.k) +
        " are needed");
  }
  // The data is B^-1 times the used files, B their rows of the matrix; the
  // lost file's row times B^-1 gives it from them.
  const std::vector<unsigned char> a = EncodeMatrix(code);
  const int k = code.k;
  std::vector<unsigned char> b(static_cast<size_t>(k * k)), inv(static_cast<size_t>(k * k));
  for (int r = 0; r < k; ++r) std::memcpy(&b[r * k], &a[use[r] * k], k);
  if (gf_invert_matrix(b.data(), inv.data(), k) != 0) {
    return InternalError(code.ToString() + ": a singular submatrix (not a Cauchy code?)");
  }
  std::vector<unsigned char> coefs(static_cast<size_t>(k), 0);
  for (int j = 0; j < k; ++j) {
    unsigned char c = 0;
    for (int t = 0; t < k; ++t) c ^= gf_mul(a[lost * k + t], inv[t * k + j]);
    coefs[j] = c;
  }
  std::vector<ParityMember> from;
  std::vector<uint64_t> sizes;
  for (int i : use) {
    from.push_back(files[i]);
    sizes.push_back(files[i].size);
  }
  ASSIGN_OR_RETURN(auto opened, OpenParityMembers(env, from));
  return std::unique_ptr<RandomAccessFile>(
      new ErasureRebuild(std::move(opened), std::move(sizes), std::move(coefs), files[lost].size));
}

Result<std::unique_ptr<RandomAccessFile>> OpenErasureGroupRebuild(
    Env* env, const std::string& dir, const Manifest& manifest, const ErasureGroup& group,
    uint32_t lost, const std::function<bool(uint32_t)>& usable) {
  ASSIGN_OR_RETURN(ErasureCode code, ErasureCodeOf(group));
  std::vector<uint32_t> all = group.members;
  all.insert(all.end(), group.parity.begin(), group.parity.end());
  std::vector<ParityMember> files;
  std::vector<bool> good;
  size_t at = all.size();
  for (size_t i = 0; i < all.size(); ++i) {
    files.push_back({JoinPath(dir, manifest.files[all[i]].name), manifest.files[all[i]].size});
    good.push_back(all[i] != lost && usable(all[i]));
    if (all[i] == lost) at = i;
  }
  if (at == all.size()) {
    return InternalError("file '" + manifest.files[lost].name + "' is not in this erasure group");
  }
  return OpenErasureRebuild(env, code, files, good, at);
}

}  // namespace tessera
