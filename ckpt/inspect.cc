#include "ckpt/inspect.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/byte_size.h"
#include "core/utf8.h"

namespace tessera {

std::string PlacementString(const Layout& layout) {
  std::string out = layout.view.empty() ? "" : "view " + ShapeToString(layout.view);
  bool split = false;
  for (const auto& axes : layout.dim_axes) split = split || !axes.empty();
  if (split) {
    out += out.empty() ? "split [" : " split [";
    for (size_t d = 0; d < layout.dim_axes.size(); ++d) {
      if (d > 0) out += ", ";
      const auto& axes = layout.dim_axes[d];
      if (axes.empty()) out += "-";
      for (size_t i = 0; i < axes.size(); ++i) out += (i ? "*" : "") + axes[i];
    }
    out += "]";
  }
  if (!layout.opt_axes.empty()) {
    out += out.empty() ? "opt [" : " opt [";
    for (size_t i = 0; i < layout.opt_axes.size(); ++i) out += (i ? ", " : "") + layout.opt_axes[i];
    out += "]";
  }
  if (!layout.stage_axis.empty()) {
    out += (out.empty() ? "stage " : " stage ") + layout.stage_axis + "=" +
           std::to_string(layout.stage);
    for (int64_t c : layout.copy_stages) out += "," + std::to_string(c);
  }
  return out.empty() ? "replicated" : out;
}

namespace {

// Whether a metadata value is text to show: UTF-8 without control
// characters other than tab.
bool IsText(const std::string& v) {
  if (!IsUtf8(v)) return false;
  for (unsigned char c : v) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  return true;
}

constexpr size_t kShownValueBytes = 60;

// Rows as aligned columns; columns from `first_number` on align right.
void PrintTable(const std::vector<std::vector<std::string>>& rows, size_t first_number,
                std::ostringstream& out) {
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const bool right = c >= first_number;
      const std::string pad(width[c] - row[c].size(), ' ');
      line += right ? pad + row[c] : row[c] + (c + 1 < row.size() ? pad : "");
      if (c + 1 < row.size()) line += "  ";
    }
    out << line << "\n";
  }
}

}  // namespace

std::string InspectText(const CheckpointReader& r, bool files) {
  const auto& tensors = r.strategy().tensors();
  int64_t bytes = 0, stored = 0, pieces = 0;
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"tensor", "dtype", "shape", "layout", "bytes", "pieces", "stored"});
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Layout& l = tensors[i].layout;
    const TensorStorage s = r.Storage(i);
    bytes += ByteSize(l);
    stored += s.stored_bytes;
    pieces += s.pieces;
    rows.push_back({PrintableText(tensors[i].name), std::string(DTypeName(l.dtype)),
                    ShapeToString(l.shape), PrintableText(PlacementString(l)),
                    HumanBytes(ByteSize(l)), std::to_string(s.pieces), HumanBytes(s.stored_bytes)});
  }
  std::ostringstream out;
  // Everything taken from the file is shown as PrintableText.
  out << "checkpoint  " << PrintableText(r.path()) << "\n"
      << "format      " << r.format() << "\n"
      << "step        " << r.meta().step << "\n"
      << "mesh        " << PrintableText(r.strategy().mesh().ToString()) << " ("
      << r.strategy().world_size() << " ranks)\n";
  if (!r.meta().created_by.empty()) {
    out << "created by  " << PrintableText(r.meta().created_by) << "\n";
  }
  out << "tensors     " << tensors.size() << ", " << HumanBytes(bytes) << " in " << pieces
      << " pieces, " << HumanBytes(stored) << " stored\n";
  if (!r.meta().metadata.empty()) {
    out << "metadata   ";
    for (const auto& [k, v] : r.meta().metadata) {
      if (IsText(v) && v.size() <= kShownValueBytes) {
        out << " " << PrintableText(k) << "=\"" << PrintableText(v) << "\"";
      } else {
        out << " " << PrintableText(k) << " (" << v.size() << " B)";
      }
    }
    out << "\n";
  }
  const std::vector<StoredFile> file_list = r.Files();
  if (!file_list.empty()) {
    std::set<std::string> hosts, groups;
    int64_t parity = 0;
    uint64_t parity_bytes = 0;
    for (const StoredFile& f : file_list) {
      if (!f.host.empty()) hosts.insert(f.host);
      if (!f.group.empty()) groups.insert(f.group);
      parity += f.parity ? 1 : 0;
      parity_bytes += f.parity ? f.bytes : 0;
    }
    out << "files       " << file_list.size();
    if (!hosts.empty()) out << " on " << hosts.size() << (hosts.size() == 1 ? " host" : " hosts");
    if (parity > 0) {
      out << ", " << parity << " of them parity (" << HumanBytes(static_cast<int64_t>(parity_bytes))
          << ") in " << groups.size() << (groups.size() == 1 ? " group" : " groups");
    }
    out << "\n";
  }
  out << "\n";
  PrintTable(rows, 4, out);
  if (files && !file_list.empty()) {
    std::vector<std::vector<std::string>> table = {{"file", "bytes", "host", "group", "role"}};
    for (const StoredFile& f : file_list) {
      table.push_back({PrintableText(f.name), HumanBytes(static_cast<int64_t>(f.bytes)),
                       f.host.empty() ? "-" : PrintableText(f.host),
                       f.group.empty() ? "-" : f.group, f.parity ? "parity" : "data"});
    }
    out << "\n";
    PrintTable(table, 99, out);
  }
  return out.str();
}

std::string InspectJson(const CheckpointReader& r) {
  using nlohmann::json;
  json j;
  j["path"] = r.path();
  j["format"] = std::string(r.format());
  j["step"] = r.meta().step;
  j["created_by"] = r.meta().created_by;
  json mesh = json::object();
  const Mesh& m = r.strategy().mesh();
  for (int a = 0; a < m.ndim(); ++a) mesh[m.axis_name(a)] = m.axis_size(a);
  j["mesh"] = mesh;
  json keys = json::array();
  for (const auto& [k, v] : r.meta().metadata) {
    json entry = {{"key", IsUtf8(k) ? k : PrintableText(k)}, {"bytes", v.size()}};
    if (IsUtf8(v)) entry["text"] = v;
    keys.push_back(std::move(entry));
  }
  j["metadata"] = keys;
  json tensors = json::array();
  const auto& ts = r.strategy().tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    const Layout& l = ts[i].layout;
    const TensorStorage s = r.Storage(i);
    json t;
    t["name"] = IsUtf8(ts[i].name) ? ts[i].name : PrintableText(ts[i].name);
    t["dtype"] = std::string(DTypeName(l.dtype));
    t["shape"] = l.shape;
    if (!l.view.empty()) t["view"] = l.view;
    t["dim_axes"] = l.dim_axes;
    t["opt_axes"] = l.opt_axes;
    if (!l.stage_axis.empty()) {
      t["stage"] = {{"axis", l.stage_axis}, {"index", l.stage}};
      if (!l.copy_stages.empty()) t["stage"]["copy_stages"] = l.copy_stages;
    }
    t["layout"] = PlacementString(l);
    t["bytes"] = ByteSize(l);
    t["pieces"] = s.pieces;
    t["stored_bytes"] = s.stored_bytes;
    tensors.push_back(std::move(t));
  }
  j["tensors"] = tensors;
  json files = json::array();
  for (const StoredFile& f : r.Files()) {
    json entry = {{"name", IsUtf8(f.name) ? f.name : PrintableText(f.name)},
                  {"bytes", f.bytes},
                  {"host", IsUtf8(f.host) ? f.host : PrintableText(f.host)},
                  {"group", f.group},
                  {"role", f.parity ? "parity" : "data"}};
    files.push_back(std::move(entry));
  }
  if (!files.empty()) j["files"] = files;
  // Printable ASCII whatever the file held: every non-ASCII character as a
  // \u escape, and any byte that is not UTF-8 (an axis name from a damaged
  // file) replaced.
  return j.dump(2, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace) + "\n";
}

}  // namespace tessera
