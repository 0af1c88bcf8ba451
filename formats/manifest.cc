#include "formats/manifest.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <set>
#include <thread>

#include "core/checksum.h"
#include "core/endian.h"
#include "core/thread_pool.h"
#include "formats/native.pb.h"

namespace tessera {
namespace {

void ToProto(const Mesh& m, native::MeshProto* p) {
  for (int i = 0; i < m.ndim(); ++i) {
    p->add_axes(m.axis_name(i));
    p->add_shape(m.axis_size(i));
  }
}

Result<Mesh> FromProto(const native::MeshProto& p) {
  return Mesh::Create({p.axes().begin(), p.axes().end()}, {p.shape().begin(), p.shape().end()});
}

void ToProto(const Layout& l, native::LayoutProto* p) {
  for (int64_t s : l.shape) p->add_shape(s);
  p->set_dtype(std::string(DTypeName(l.dtype)));
  for (int d = 0; d < static_cast<int>(l.dim_axes.size()); ++d) {
    auto* list = p->add_dim_axes();
    for (const std::string& a : l.dim_axes[d]) list->add_axes(a);
  }
  for (const std::string& a : l.opt_axes) p->add_opt_axes(a);
  p->set_stage_axis(l.stage_axis);
  p->set_stage(l.stage);
  for (int64_t v : l.view) p->add_view(v);
  for (int64_t s : l.copy_stages) p->add_copy_stages(s);
}

Result<Layout> FromProto(const native::LayoutProto& p) {
  Layout l;
  l.shape.assign(p.shape().begin(), p.shape().end());
  ASSIGN_OR_RETURN(l.dtype, ParseDType(p.dtype()));
  for (const auto& list : p.dim_axes())
    l.dim_axes.emplace_back(list.axes().begin(), list.axes().end());
  l.opt_axes.assign(p.opt_axes().begin(), p.opt_axes().end());
  l.stage_axis = p.stage_axis();
  l.stage = p.stage();
  l.view.assign(p.view().begin(), p.view().end());
  l.copy_stages.assign(p.copy_stages().begin(), p.copy_stages().end());
  return l;
}

Result<PieceInfo> PieceFromProto(const native::PieceProto& pp, const TensorEntry& t,
                                 const Box& whole, const std::vector<FileInfo>& files,
                                 const std::string& ctx) {
  PieceInfo pc;
  if (pp.begin_size() != t.layout.rank() || pp.end_size() != t.layout.rank()) {
    return DataLossError(ctx + ": a piece has a box of " + std::to_string(pp.begin_size()) +
                         " dimensions");
  }
  Box box(t.layout.rank());
  for (int d = 0; d < t.layout.rank(); ++d) box[d] = {pp.begin(d), pp.end(d)};
  pc.box = box;
  // Built only for an error: a manifest can hold half a million pieces.
  auto bad = [&](const std::string& what) {
    return DataLossError(ctx + ": piece " + ToString(box) + what);
  };
  if (!Contains(whole, box) || IsEmpty(box)) return bad(" is empty or outside the shape");
  if (pp.file() >= files.size()) {
    return bad(" names file #" + std::to_string(pp.file()) + " of " + std::to_string(files.size()));
  }
  pc.file = pp.file();
  pc.offset = pp.offset();
  pc.length = pp.length();
  if (pc.offset + pc.length > files[pc.file].size || pc.offset + pc.length < pc.offset) {
    return bad(" lies past the end of file '" + files[pc.file].name + "'");
  }
  if (pp.codec() != native::RAW && pp.codec() != native::ZSTD) {
    return bad(" has unknown codec " + std::to_string(pp.codec()));
  }
  pc.codec = static_cast<Codec>(pp.codec());
  pc.raw_length = pp.raw_length();
  if (pc.raw_length != static_cast<uint64_t>(NumElements(box) * DTypeSize(t.layout.dtype))) {
    return bad(" records " + std::to_string(pc.raw_length) +
               " raw bytes, which does not match its box");
  }
  // A zstd block holds at most 128 KiB and costs at least 4 bytes (an
  // RLE block), so no frame expands more than 32768-fold; a piece that
  // claims more is hostile or corrupt and is refused before a reader
  // allocates its raw bytes.
  if (pc.codec == Codec::kZstd && pc.raw_length / 32768 > pc.length) {
    return bad(" claims " + std::to_string(pc.raw_length) + " raw bytes from " +
               std::to_string(pc.length) + " stored: more than zstd can expand");
  }
  if (pc.codec == Codec::kRaw && pc.length != pc.raw_length) {
    return bad(" is raw but stores " + std::to_string(pc.length) + " of " +
               std::to_string(pc.raw_length) + " bytes");
  }
  pc.checksum = pp.checksum();
  if (pp.stage() < 0 || pp.stage() > INT32_MAX) {
    return bad(" is of stage " + std::to_string(pp.stage()) + ", not a pipeline stage");
  }
  pc.stage = static_cast<int32_t>(pp.stage());
  pc.block_checksums = BlockChecksums(pp.block_checksums().data(),
                                      pp.block_checksums().data() + pp.block_checksums_size());
  uint64_t blocks = CeilDiv(pc.length, kChecksumBlock);
  if (pp.tile_rows() != 0 || pp.tile_columns() != 0) {
    const int64_t last = box.rank() > 0 ? box[box.rank() - 1].size() : 0;
    if (pp.tile_rows() == 0 || pp.tile_rows() > UINT16_MAX || pp.tile_columns() == 0 ||
        static_cast<int64_t>(pp.tile_columns()) > last || box.rank() < 2 ||
        pc.codec != Codec::kRaw || pc.length <= kChecksumBlock) {
      return bad(" has tiles of " + std::to_string(pp.tile_rows()) + " rows by " +
                 std::to_string(pp.tile_columns()) +
                 " columns, which a raw piece of two or more dimensions longer than 1 MiB "
                 "may have only with both from 1 (rows up to 65535, columns up to its last "
                 "dimension's " +
                 std::to_string(last) + ")");
    }
    pc.tile_rows = static_cast<uint16_t>(pp.tile_rows());
    pc.tile_columns = pp.tile_columns();
    const TileGrid g = GridOf(pc);
    blocks = g.row_tiles() * g.column_tiles();
  }
  // Row blocks are optional; a tiled piece has a checksum for every tile.
  if ((pc.tiled() || !pc.block_checksums.empty()) && pc.block_checksums.size() != blocks) {
    return bad(" has " + std::to_string(pc.block_checksums.size()) + " block checksums for " +
               std::to_string(blocks) + (pc.tiled() ? " tiles" : " blocks"));
  }
  return pc;
}

void PieceToProto(const PieceInfo& pc, native::PieceProto* pp) {
  pp->set_file(pc.file);
  pp->set_offset(pc.offset);
  pp->set_length(pc.length);
  for (int d = 0; d < pc.box.rank(); ++d) {
    pp->add_begin(pc.box[d].begin);
    pp->add_end(pc.box[d].end);
  }
  pp->set_codec(static_cast<native::Codec>(pc.codec));
  pp->set_raw_length(pc.raw_length);
  pp->set_checksum(pc.checksum);
  for (uint64_t c : pc.block_checksums) pp->add_block_checksums(c);
  pp->set_stage(pc.stage);
  pp->set_tile_rows(pc.tile_rows);
  pp->set_tile_columns(pc.tile_columns);
}

}  // namespace

TileGrid GridOf(const PieceInfo& piece) {
  TileGrid g;
  if (!piece.tiled()) return g;
  const int n = piece.box.rank();
  const int64_t last = piece.box[n - 1].size();
  g.row_bytes = piece.raw_length / NumElements(piece.box) * last;
  g.rows = piece.raw_length / g.row_bytes;
  g.tile_rows = piece.tile_rows;
  g.tile_bytes = g.row_bytes / last * piece.tile_columns;
  return g;
}

TileGrid ChooseTiles(const Box& box, uint64_t size) {
  constexpr uint64_t kMinRowBytes = 4 << 10;      // two tiles of 2 KiB
  constexpr uint64_t kMaxRowBytes = 2 << 20;      // wider: 1 MiB blocks cut across rows
  constexpr uint64_t kMinTileRowBytes = 2 << 10;  // streaming XXH3 slows below
  constexpr uint64_t kMaxColumnTiles = 64;
  constexpr uint64_t kBandBytes = 4 << 20;
  TileGrid g;
  const int n = box.rank();
  if (n < 2 || size <= kChecksumBlock) return g;
  const int64_t volume = NumElements(box);
  const uint64_t last = static_cast<uint64_t>(box[n - 1].size());
  if (volume <= 0 || last == 0 || size % static_cast<uint64_t>(volume) != 0) return g;
  const uint64_t row_bytes = size / static_cast<uint64_t>(volume) * last;
  if (row_bytes < kMinRowBytes || row_bytes >= kMaxRowBytes) return g;
  uint64_t k = 1;
  while (k * 2 <= kMaxColumnTiles && row_bytes / (k * 2) >= kMinTileRowBytes) k *= 2;
  const uint64_t columns = CeilDiv(last, k);
  g.rows = size / row_bytes;
  g.row_bytes = row_bytes;
  g.tile_rows = std::min<uint64_t>(UINT16_MAX, std::max<uint64_t>(1, kBandBytes / row_bytes));
  g.tile_bytes = row_bytes / last * columns;
  return g;
}

namespace {

constexpr char kManifestMagic[8] = {'T', 'S', 'R', 'M', 'N', 'F', 'S', 'T'};

// The checksum of a framed manifest: its first 24 bytes, then the protobuf.
uint64_t FrameChecksum(std::string_view header, std::string_view payload) {
  Xxh3Hasher h;
  h.Update(header.data(), 24);
  h.Update(payload.data(), payload.size());
  return h.Digest();
}

// Copy `pc` of tensor `t` (its pieces parsed): a redundancy copy equals one
// of the pieces; a stage copy has a piece's box on one of its copy stages.
Status CheckCopy(const TensorEntry& t, const PieceInfo& pc, const std::string& file,
                 const std::string& tctx) {
  const std::string what = tctx + ": copy " + ToString(pc.box) + " in file '" + file + "'";
  if (pc.stage != 0) {
    const auto& stages = t.layout.copy_stages;
    if (std::find(stages.begin(), stages.end(), pc.stage) == stages.end()) {
      return DataLossError(what + " is of stage " + std::to_string(pc.stage) +
                           ", which is not one of the tensor's copy stages");
    }
    const bool box = std::any_of(t.pieces.begin(), t.pieces.end(),
                                 [&](const PieceInfo& q) { return q.box == pc.box; });
    if (!box)
      return DataLossError(what + " is of stage " + std::to_string(pc.stage) +
                           " but has the box of no piece");
    return Status::Ok();
  }
  const bool matches = std::any_of(t.pieces.begin(), t.pieces.end(), [&](const PieceInfo& q) {
    return q.box == pc.box && q.checksum == pc.checksum && q.length == pc.length &&
           q.codec == pc.codec;
  });
  if (!matches) return DataLossError(what + " is a copy of no piece");
  return Status::Ok();
}

// Checks that files named by redundancy groups exist and belong to at most
// one group.
Status GroupFile(uint32_t f, const std::vector<FileInfo>& files, std::set<uint32_t>* grouped,
                 const std::string& where) {
  if (f >= files.size()) {
    return DataLossError(where + ": a redundancy group names file #" + std::to_string(f) + " of " +
                         std::to_string(files.size()));
  }
  if (!grouped->insert(f).second) {
    return DataLossError(where + ": file '" + files[f].name +
                         "' is in more than one redundancy group");
  }
  return Status::Ok();
}

}  // namespace

std::vector<DifferingCopy> DifferingStageCopies(const Manifest& m) {
  std::vector<DifferingCopy> out;
  for (const TensorEntry& t : m.tensors) {
    for (const PieceInfo& c : t.copies) {
      if (c.stage == 0) continue;
      for (const PieceInfo& p : t.pieces) {
        if (p.box == c.box && (p.checksum != c.checksum || p.length != c.length)) {
          out.push_back({&t, &c, &p});
        }
      }
    }
  }
  return out;
}

// Manifests parsed (by bytes) and serialized (by pieces) on a pool from
// this size: a 4,096-rank manifest (14 MiB, half a million pieces) takes
// most of a second on one thread.
constexpr size_t kParallelManifestBytes = size_t{4} << 20;
constexpr size_t kParallelManifestPieces = size_t{64} << 10;

int ManifestThreads() {
  return static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
}

Status ForEachRange(size_t n, bool parallel, const std::function<Status(size_t, size_t)>& fn) {
  if (!parallel) return fn(0, n);
  ThreadPool pool(ManifestThreads());
  const size_t ranges = static_cast<size_t>(pool.size()) * 4;
  return pool.ParallelFor(static_cast<int64_t>(ranges),
                          [&](int64_t r) { return fn(n * r / ranges, n * (r + 1) / ranges); });
}

std::string SerializeManifest(const Manifest& m) {
  // A protobuf message is its fields in field order, so the manifest is
  // written as three parts: the fields before `tensors` (5), each tensor as
  // one field 5, then the fields after it. Deterministic serialization of
  // the whole message gives the same bytes; this way only one tensor's
  // protobuf exists at a time (a 4,096-rank manifest holds half a million
  // pieces).
  native::Manifest head, tail;
  head.set_format_version(m.format_version);
  head.set_step(m.step);
  ToProto(m.mesh, head.mutable_mesh());
  for (const FileInfo& f : m.files) {
    auto* fp = head.add_files();
    fp->set_name(f.name);
    fp->set_size(f.size);
    fp->set_checksum(f.checksum);
    fp->set_host(f.host);
  }
  for (const auto& [k, v] : m.metadata) (*tail.mutable_metadata())[k] = v;
  tail.set_created_by(m.created_by);
  for (const ParityGroup& g : m.parity_groups) {
    auto* gp = tail.add_parity_groups();
    for (uint32_t f : g.members) gp->add_members(f);
    gp->set_parity(g.parity);
  }
  for (const ErasureGroup& g : m.erasure_groups) {
    auto* gp = tail.add_erasure_groups();
    gp->set_code(g.code);
    for (uint32_t f : g.members) gp->add_members(f);
    for (uint32_t f : g.parity) gp->add_parity(f);
  }
  // Format 2 and later: the frame's header first, filled in below.
  const size_t header = m.format_version < 2 ? 0 : kManifestHeader;
  auto fill = [](const TensorEntry& t, native::TensorProto* tp) {
    tp->Clear();
    tp->set_name(t.name);
    ToProto(t.layout, tp->mutable_layout());
    if (t.mesh) ToProto(*t.mesh, tp->mutable_mesh());
    for (const PieceInfo& pc : t.pieces) PieceToProto(pc, tp->add_pieces());
    for (const PieceInfo& pc : t.copies) PieceToProto(pc, tp->add_copies());
  };
  const uint32_t tensor_tag = google::protobuf::internal::WireFormatLite::MakeTag(
      native::Manifest::kTensorsFieldNumber,
      google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  // Tensors in contiguous ranges, each reusing one TensorProto (its
  // pieces' storage too); on a pool when there are many pieces (a
  // 16,384-rank manifest holds 1.6 million: half a second on one thread).
  size_t pieces = 0;
  for (const TensorEntry& t : m.tensors) pieces += t.pieces.size() + t.copies.size();
  const size_t n_tensors = m.tensors.size();
  const bool parallel = pieces >= kParallelManifestPieces;
  // The exact size first, so that the bytes are one allocation written in
  // place: grown by doubling, a 16,384-rank manifest (52 MiB) held its
  // last two buffers at once, 100 MiB at the reshard's peak. The tensors'
  // messages are built twice for it.
  std::vector<size_t> at(n_tensors + 1);  // where each tensor's field starts, then the end
  (void)ForEachRange(n_tensors, parallel, [&](size_t lo, size_t hi) {
    native::TensorProto tp;
    for (size_t i = lo; i < hi; ++i) {
      fill(m.tensors[i], &tp);
      const size_t n = tp.ByteSizeLong();
      at[i + 1] = google::protobuf::io::CodedOutputStream::VarintSize32(tensor_tag) +
                  google::protobuf::io::CodedOutputStream::VarintSize64(n) + n;
    }
    return Status::Ok();
  });
  const size_t head_size = head.ByteSizeLong();
  at[0] = header + head_size;
  for (size_t i = 0; i < n_tensors; ++i) at[i + 1] += at[i];
  const size_t tail_size = tail.ByteSizeLong();
  std::string out(at[n_tensors] + tail_size, '\0');
  // Deterministic: the same manifest always frames to the same bytes.
  auto put = [&](size_t offset, size_t size, auto&& write) {
    google::protobuf::io::ArrayOutputStream stream(out.data() + offset, static_cast<int>(size));
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    write(coded);
  };
  put(header, head_size, [&](auto& coded) { head.SerializeWithCachedSizes(&coded); });
  (void)ForEachRange(n_tensors, parallel, [&](size_t lo, size_t hi) {
    native::TensorProto tp;
    for (size_t i = lo; i < hi; ++i) {
      fill(m.tensors[i], &tp);
      const size_t n = tp.ByteSizeLong();
      put(at[i], at[i + 1] - at[i], [&](auto& coded) {
        coded.WriteTag(tensor_tag);
        coded.WriteVarint32(static_cast<uint32_t>(n));
        tp.SerializeWithCachedSizes(&coded);
      });
    }
    return Status::Ok();
  });
  put(at[n_tensors], tail_size, [&](auto& coded) { tail.SerializeWithCachedSizes(&coded); });
  if (header == 0) return out;  // format 1: the bare protobuf
  const std::string_view payload = std::string_view(out).substr(header);
  std::memcpy(out.data(), kManifestMagic, sizeof(kManifestMagic));
  PutLittleEndian<uint32_t>(out.data() + 8, m.format_version);
  PutLittleEndian<uint32_t>(out.data() + 12, kManifestHeader);
  PutLittleEndian<uint64_t>(out.data() + 16, payload.size());
  PutLittleEndian<uint64_t>(out.data() + 24, FrameChecksum(out, payload));
  return out;
}

namespace {

// The manifest protobuf `payload` with its tensors (field 5) apart: `rest`
// holds every other field's bytes, `tensors` each tensor's message, so
// that tensors are parsed one at a time. False when it is not a valid
// protobuf.
bool SplitTensors(std::string_view payload, std::string* rest,
                  std::vector<std::string_view>* tensors) {
  using google::protobuf::internal::WireFormatLite;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(payload.data()),
                                            static_cast<int>(payload.size()));
  while (true) {
    const int start = in.CurrentPosition();
    const uint32_t tag = in.ReadTag();
    if (tag == 0) break;
    if (WireFormatLite::GetTagFieldNumber(tag) == native::Manifest::kTensorsFieldNumber &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t length = 0;
      if (!in.ReadVarint32(&length)) return false;
      const int at = in.CurrentPosition();
      if (length > payload.size() - static_cast<size_t>(at) || !in.Skip(static_cast<int>(length))) {
        return false;
      }
      tensors->push_back(payload.substr(at, length));
    } else {
      if (!WireFormatLite::SkipField(&in, tag)) return false;
      rest->append(payload.substr(start, in.CurrentPosition() - start));
    }
  }
  return static_cast<size_t>(in.CurrentPosition()) == payload.size();
}

// Manifests at least this long have their tensors parsed on a pool.

// Tensor #index of manifest `m` (its mesh and files parsed), from its
// protobuf bytes, parsed into `tp`.
Result<TensorEntry> TensorFromProto(std::string_view bytes, size_t index, native::TensorProto* tp,
                                    const Manifest& m, const std::string& where) {
  if (!tp->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return DataLossError(where + ": not a valid manifest (tensor #" + std::to_string(index) +
                         " is a corrupt protobuf)");
  }
  const std::string tctx = where + ": tensor '" + tp->name() + "'";
  TensorEntry t;
  t.name = tp->name();
  auto layout = FromProto(tp->layout());
  if (!layout.ok()) return layout.status().Annotate(tctx);
  t.layout = *layout;
  if (tp->has_mesh()) {
    auto tm = FromProto(tp->mesh());
    if (!tm.ok()) return tm.status().Annotate(tctx);
    t.mesh = *tm;
  }
  RETURN_IF_ERROR(ValidateLayout(t.layout, t.mesh ? *t.mesh : m.mesh).Annotate(tctx));
  const Box whole = Box::FromShape(t.layout.split_shape());  // piece boxes are over the view
  t.pieces.reserve(tp->pieces_size());
  t.copies.reserve(tp->copies_size());
  for (const auto& pp : tp->pieces()) {
    ASSIGN_OR_RETURN(PieceInfo pc, PieceFromProto(pp, t, whole, m.files, tctx));
    t.pieces.push_back(std::move(pc));
  }
  for (const auto& pp : tp->copies()) {
    ASSIGN_OR_RETURN(PieceInfo pc, PieceFromProto(pp, t, whole, m.files, tctx + ": copy"));
    RETURN_IF_ERROR(CheckCopy(t, pc, m.files[pc.file].name, tctx));
    t.copies.push_back(std::move(pc));
  }
  return t;
}

}  // namespace

Result<Manifest> ParseManifest(std::string_view bytes, const std::string& path, bool bare_ok) {
  const std::string where = "manifest '" + path + "'";
  std::string_view payload = bytes;
  uint32_t framed = 0;  // the frame's version; 0 for a bare protobuf
  if (bytes.size() >= sizeof(kManifestMagic) &&
      std::memcmp(bytes.data(), kManifestMagic, sizeof(kManifestMagic)) == 0) {
    if (bytes.size() < kManifestHeader)
      return DataLossError(where + " is corrupt: truncated header");
    framed = GetLittleEndian<uint32_t>(bytes.data() + 8);
    const uint32_t header = GetLittleEndian<uint32_t>(bytes.data() + 12);
    const uint64_t length = GetLittleEndian<uint64_t>(bytes.data() + 16);
    if (header != kManifestHeader || length != bytes.size() - kManifestHeader) {
      return DataLossError(where + " is corrupt: its header records " + std::to_string(length) +
                           " bytes after a " + std::to_string(header) +
                           "-byte header, the file has " + std::to_string(bytes.size()));
    }
    payload = bytes.substr(kManifestHeader);
    if (FrameChecksum(bytes, payload) != GetLittleEndian<uint64_t>(bytes.data() + 24)) {
      return DataLossError(where + " is corrupt: checksum mismatch");
    }
  } else if (!bare_ok) {
    return DataLossError(where +
                         " is corrupt: its header is damaged (the checkpoint is format 2 "
                         "or later, whose manifests start with TSRMNFST)");
  }
  // Tensors are parsed one at a time (SplitTensors): the manifest of a
  // 4,096-rank checkpoint would otherwise exist twice, as protobuf and as
  // Manifest.
  native::Manifest p;
  std::string rest;
  std::vector<std::string_view> tensor_bytes;
  if (payload.size() > static_cast<size_t>(INT32_MAX) ||
      !SplitTensors(payload, &rest, &tensor_bytes) ||
      !p.ParseFromArray(rest.data(), static_cast<int>(rest.size()))) {
    return DataLossError(where + ": not a valid manifest (truncated or corrupt protobuf)");
  }
  if (p.format_version() == 0 || p.format_version() > kNativeFormatVersion ||
      framed > kNativeFormatVersion) {
    return FailedPreconditionError(where + ": format version " +
                                   std::to_string(std::max(framed, p.format_version())) +
                                   " is not readable by this Tessera (reads 1 to " +
                                   std::to_string(kNativeFormatVersion) + ")");
  }
  // Format 1 is the bare protobuf, every later one framed with its version.
  if ((framed == 0) != (p.format_version() == 1) || (framed != 0 && framed != p.format_version())) {
    return DataLossError(where + " is corrupt: format version " +
                         std::to_string(p.format_version()) +
                         (framed ? " in a frame of version " + std::to_string(framed)
                                 : " without the frame it is written with"));
  }
  Manifest m;
  m.format_version = p.format_version();
  m.step = p.step();
  m.created_by = p.created_by();
  auto mesh = FromProto(p.mesh());
  if (!mesh.ok()) return mesh.status().Annotate(where);
  m.mesh = *mesh;
  for (const auto& f : p.files()) m.files.push_back({f.name(), f.size(), f.checksum(), f.host()});
  // Tensors parsed on a pool when there are many (a 4,096-rank manifest
  // holds half a million pieces), in contiguous ranges, each reusing one
  // TensorProto; the first error by tensor order is the one reported.
  std::vector<TensorEntry> tensors(tensor_bytes.size());
  auto parse_range = [&](size_t lo, size_t hi) -> Status {
    native::TensorProto tp;  // reused: its pieces' storage too
    for (size_t i = lo; i < hi; ++i) {
      ASSIGN_OR_RETURN(tensors[i], TensorFromProto(tensor_bytes[i], i, &tp, m, where));
    }
    return Status::Ok();
  };
  RETURN_IF_ERROR(
      ForEachRange(tensors.size(), payload.size() >= kParallelManifestBytes, parse_range));
  std::set<std::string_view> names;
  for (const TensorEntry& t : tensors) {
    if (!names.insert(t.name).second) {
      return DataLossError(where + ": tensor '" + t.name + "' appears twice");
    }
  }
  m.tensors = std::move(tensors);
  std::set<uint32_t> grouped;
  for (const auto& gp : p.parity_groups()) {
    ParityGroup g;
    g.members.assign(gp.members().begin(), gp.members().end());
    g.parity = gp.parity();
    std::vector<uint32_t> all = g.members;
    all.push_back(g.parity);
    for (uint32_t f : all) {
      RETURN_IF_ERROR(GroupFile(f, m.files, &grouped, where));
      if (f != g.parity && m.files[f].size > m.files[g.parity].size) {
        return DataLossError(where + ": parity file '" + m.files[g.parity].name +
                             "' is shorter than its member '" + m.files[f].name + "'");
      }
    }
    if (g.members.size() < 2) {
      return DataLossError(where + ": parity file '" + m.files[g.parity].name +
                           "' protects fewer than 2 files");
    }
    m.parity_groups.push_back(std::move(g));
  }
  for (const auto& gp : p.erasure_groups()) {
    ErasureGroup g{gp.code(),
                   {gp.members().begin(), gp.members().end()},
                   {gp.parity().begin(), gp.parity().end()}};
    if (g.code.empty() || g.members.empty() || g.parity.empty()) {
      return DataLossError(where + ": an erasure-code group lacks its code, members or parity");
    }
    for (const auto* list : {&g.members, &g.parity}) {
      for (uint32_t f : *list) RETURN_IF_ERROR(GroupFile(f, m.files, &grouped, where));
    }
    m.erasure_groups.push_back(std::move(g));
  }
  for (const auto& [k, v] : p.metadata()) m.metadata[k] = v;
  return m;
}

}  // namespace tessera
