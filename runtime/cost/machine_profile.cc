#include "runtime/cost/machine_profile.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/env.h"

namespace tessera {
namespace {

using Json = nlohmann::ordered_json;

Status Positive(const std::string& source, const char* key, double v) {
  if (v > 0 && std::isfinite(v)) return Status::Ok();
  return InvalidArgumentError(source + ": \"" + key + "\" must be a positive number");
}

// A kernel's roofline: bytes and flops per unit.
struct Roofline {
  double bytes, flops;
};
constexpr Roofline kRoofline[] = {
    {8, 0},  {12, 0},  // layer norm: read x, write y; backward reads x, dy, writes dx
    {8, 0},  {12, 0},  // GELU
    {12, 0},           // residual add: two reads, a write
    {12, 0}, {12, 0},  // embedding: wte and wpe rows into the output; back
    {12, 0}, {12, 0},  // cross-entropy: logits, probabilities; back
    {12, 0}, {0, 1},   // attention forward: scores written, read, the softmax; products
    {24, 0}, {0, 1},   // attention backward
    {28, 0},           // AdamW: parameter, gradient, two moments read, three written
    {4, 0},            // squared norm: one read
};

constexpr std::string_view kKernelNames[] = {"layer_norm_forward",
                                             "layer_norm_backward",
                                             "gelu_forward",
                                             "gelu_backward",
                                             "residual_add",
                                             "embedding_forward",
                                             "embedding_backward",
                                             "cross_entropy_forward",
                                             "cross_entropy_backward",
                                             "attention_forward_scores",
                                             "attention_forward_products",
                                             "attention_backward_scores",
                                             "attention_backward_products",
                                             "adamw",
                                             "squared_norm"};
static_assert(std::size(kRoofline) == kKernelCount && std::size(kKernelNames) == kKernelCount,
              "a roofline and a name for every Kernel");

// A measured table's time for `bytes`: log-log between its sizes; below
// the smallest, the smallest's time; above the largest, its time and the
// rest at the link's `bandwidth` (each rank moving `moved` of the bytes).
double TableSeconds(const CollectiveTable& t, double bytes, double moved, double bandwidth) {
  if (bytes <= t.bytes.front()) return t.seconds.front();
  if (bytes >= t.bytes.back()) {
    return t.seconds.back() + moved * (bytes - t.bytes.back()) / bandwidth;
  }
  const size_t i = static_cast<size_t>(std::upper_bound(t.bytes.begin(), t.bytes.end(), bytes) -
                                       t.bytes.begin());
  const double f = std::log(bytes / t.bytes[i - 1]) / std::log(t.bytes[i] / t.bytes[i - 1]);
  return std::exp(std::log(t.seconds[i - 1]) + f * std::log(t.seconds[i] / t.seconds[i - 1]));
}

// The parts of a profile's JSON, each checked (errors name `source` and
// the key).
Status ParseDevice(const Json& j, const std::string& source, MachineProfile* p) {
  if (!j.contains("device") || !j["device"].is_object()) {
    return InvalidArgumentError(source + ": no \"device\" object");
  }
  const Json& d = j["device"];
  p->matmul_flops = d.value("matmul_flops", 0.0);
  p->memory_bandwidth = d.value("memory_bandwidth", 0.0);
  p->memory_bytes = static_cast<int64_t>(d.value("memory_bytes", 0.0));
  RETURN_IF_ERROR(Positive(source, "device.matmul_flops", p->matmul_flops));
  if (d.contains("matmul_library")) {
    const Json& name = d["matmul_library"];
    Result<MatmulLibrary> library =
        ParseMatmulLibrary(name.is_string() ? name.get<std::string>() : name.dump());
    if (!library.ok()) {
      return InvalidArgumentError(source +
                                  ": device.matmul_library: " + library.status().message());
    }
    p->matmul_library = *library;
  }
  if (d.contains("matmul_libraries")) {
    if (!d["matmul_libraries"].is_object()) {
      return InvalidArgumentError(source + ": device.matmul_libraries is not an object");
    }
    for (const auto& [name, flops] : d["matmul_libraries"].items()) {
      Result<MatmulLibrary> library = ParseMatmulLibrary(name);
      if (!library.ok() || !flops.is_number() || !(flops.get<double>() > 0)) {
        return InvalidArgumentError(
            source + ": device.matmul_libraries." + name +
            (library.ok() ? " must be a positive number" : ": " + library.status().message()));
      }
      p->matmul_libraries.emplace_back(*library, flops.get<double>());
    }
  }
  return Positive(source, "device.memory_bandwidth", p->memory_bandwidth);
}

Status ParseLinks(const Json& j, const std::string& source, MachineProfile* p) {
  for (auto [key, link] :
       {std::pair{"intra_host", &p->intra_host}, {"inter_host", &p->inter_host}}) {
    if (!j.contains(key)) {
      if (std::string(key) == "inter_host") {  // one host: never used
        p->inter_host = p->intra_host;
        continue;
      }
      return InvalidArgumentError(source + ": no \"" + key + "\" link");
    }
    const Json& l = j[key];
    link->latency_s = l.value("latency_s", 0.0);
    link->bandwidth = l.value("bandwidth", 0.0);
    RETURN_IF_ERROR(Positive(source, (std::string(key) + ".bandwidth").c_str(), link->bandwidth));
    if (link->latency_s < 0) {
      return InvalidArgumentError(source + ": \"" + key + ".latency_s\" must be >= 0");
    }
  }
  return Status::Ok();
}

Result<CollectiveTable> ParseTable(const Json& c, const std::string& where) {
  CollectiveTable t;
  const std::string kind = c.value("kind", "");
  bool known = false;
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                           CollectiveKind::kReduceScatter, CollectiveKind::kSendRecv}) {
    if (kind == CollectiveName(k)) {
      t.kind = k;
      known = true;
    }
  }
  if (!known) {
    return InvalidArgumentError(where + ": kind \"" + kind +
                                "\" (measured tables are of AllReduce, AllGather, "
                                "ReduceScatter or SendRecv)");
  }
  t.group = c.value("group", 0);
  t.bytes = c.value("bytes", std::vector<double>{});
  t.seconds = c.value("seconds", std::vector<double>{});
  if (t.group < 2 || t.bytes.empty() || t.bytes.size() != t.seconds.size()) {
    return InvalidArgumentError(where +
                                ": needs a group of at least 2 and as many "
                                "\"seconds\" as \"bytes\" (at least one)");
  }
  for (size_t i = 0; i < t.bytes.size(); ++i) {
    if (!(t.bytes[i] > 0 && t.seconds[i] > 0 && std::isfinite(t.seconds[i])) ||
        (i > 0 && t.bytes[i] <= t.bytes[i - 1])) {
      return InvalidArgumentError(where + ": sizes must ascend and every figure be positive");
    }
  }
  return t;
}

Status ParseCollectives(const Json& j, const std::string& source, MachineProfile* p) {
  if (!j.contains("collectives")) return Status::Ok();
  const Json& list = j["collectives"];
  if (!list.is_array()) return InvalidArgumentError(source + ": \"collectives\" must be a list");
  for (const Json& c : list) {
    const std::string where =
        source + ": collectives[" + std::to_string(p->collectives.size()) + "]";
    ASSIGN_OR_RETURN(CollectiveTable t, ParseTable(c, where));
    p->collectives.push_back(std::move(t));
  }
  return Status::Ok();
}

Status ParseKernels(const Json& j, const std::string& source, MachineProfile* p) {
  if (!j.contains("kernels")) return Status::Ok();
  const Json& kernels = j["kernels"];
  if (!kernels.is_object()) return InvalidArgumentError(source + ": \"kernels\" must be an object");
  for (const auto& [name, value] : kernels.items()) {
    int k = 0;
    while (k < kKernelCount && kKernelNames[k] != name) ++k;
    if (k == kKernelCount) {
      std::string known;
      for (std::string_view n : kKernelNames) known += (known.empty() ? "" : ", ") + std::string(n);
      return InvalidArgumentError(source + ": kernels: unknown kernel \"" + name +
                                  "\" (known: " + known + ")");
    }
    const double v = value.is_number() ? value.get<double>() : -1;
    if (!(v > 0 && std::isfinite(v))) {
      return InvalidArgumentError(source + ": kernels: \"" + name +
                                  "\" must be a positive number (seconds per unit)");
    }
    p->kernel_seconds[k] = v;
  }
  return Status::Ok();
}

Status ParseFields(const Json& j, const std::string& source, MachineProfile* p) {
  if (j.value("version", 0) != 1) {
    return InvalidArgumentError(source + ": machine profile version " +
                                j.value("version", Json(0)).dump() + " (this build reads 1)");
  }
  p->name = j.value("name", "");
  p->source = j.value("source", "");
  p->backend = j.value("backend", "");
  p->devices_per_host = j.value("devices_per_host", 1);
  p->hosts = j.value("hosts", 0);
  p->copy_turn_s = j.value("copy_turn_s", 0.0);
  if (!(p->copy_turn_s >= 0)) return InvalidArgumentError(source + ": copy_turn_s must be >= 0");
  if (j.contains("disk")) {
    const Json& d = j["disk"];
    p->disk_read = d.value("read", 0.0);
    p->disk_write = d.value("write", 0.0);
    if (!(p->disk_read >= 0) || !(p->disk_write >= 0)) {
      return InvalidArgumentError(source + ": disk bandwidths must be >= 0");
    }
  }
  RETURN_IF_ERROR(ParseDevice(j, source, p));
  RETURN_IF_ERROR(ParseLinks(j, source, p));
  RETURN_IF_ERROR(ParseCollectives(j, source, p));
  return ParseKernels(j, source, p);
}

}  // namespace

RingShape RingOf(CollectiveKind kind, double n) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return {2 * (n - 1), 2 * (n - 1) / n};
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
      return {n - 1, (n - 1) / n};
    case CollectiveKind::kSendRecv:
      return {1, 1};
  }
  return {0, 0};
}

std::string_view KernelName(Kernel kernel) { return kKernelNames[static_cast<int>(kernel)]; }

std::string_view CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "AllReduce";
    case CollectiveKind::kReduceScatter:
      return "ReduceScatter";
    case CollectiveKind::kAllGather:
      return "AllGather";
    case CollectiveKind::kAllToAll:
      return "AllToAll";
    case CollectiveKind::kSendRecv:
      return "SendRecv";
  }
  return "?";
}

Result<MachineProfile> MachineProfile::Parse(std::string_view text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgumentError(source + ": not JSON: " + e.what());
  }
  if (!j.is_object() || j.value("format", "") != kMachineProfileFormat) {
    return InvalidArgumentError(source + ": not a machine profile (\"format\" must be \"" +
                                std::string(kMachineProfileFormat) + "\")");
  }
  MachineProfile p;
  try {
    RETURN_IF_ERROR(ParseFields(j, source, &p));
  } catch (const std::exception& e) {
    return InvalidArgumentError(source + ": " + e.what());
  }
  if (p.devices_per_host < 1 || p.hosts < 0) {
    return InvalidArgumentError(source + ": devices_per_host must be >= 1 and hosts >= 0");
  }
  return p;
}

Result<MachineProfile> MachineProfile::Load(const std::string& path) {
  auto text = ReadFileToString(Env::Default(), path);
  if (!text.ok()) {
    return Status(text.status().code(), "machine profile " + path + ": " + text.status().message());
  }
  return Parse(*text, path);
}

std::string MachineProfile::ToJson() const {
  Json j;
  j["format"] = kMachineProfileFormat;
  j["version"] = 1;
  j["name"] = name;
  j["source"] = source;
  if (!backend.empty()) j["backend"] = backend;
  j["devices_per_host"] = devices_per_host;
  j["hosts"] = hosts;
  if (copy_turn_s > 0) j["copy_turn_s"] = copy_turn_s;
  if (disk_read > 0 || disk_write > 0) j["disk"] = {{"read", disk_read}, {"write", disk_write}};
  j["device"] = {{"matmul_flops", matmul_flops},
                 {"memory_bandwidth", memory_bandwidth},
                 {"memory_bytes", static_cast<double>(memory_bytes)}};
  if (matmul_library) j["device"]["matmul_library"] = MatmulLibraryName(*matmul_library);
  for (const auto& [library, flops] : matmul_libraries) {
    j["device"]["matmul_libraries"][std::string(MatmulLibraryName(library))] = flops;
  }
  j["intra_host"] = {{"latency_s", intra_host.latency_s}, {"bandwidth", intra_host.bandwidth}};
  j["inter_host"] = {{"latency_s", inter_host.latency_s}, {"bandwidth", inter_host.bandwidth}};
  if (!collectives.empty()) {
    Json list = Json::array();
    for (const CollectiveTable& t : collectives) {
      list.push_back({{"kind", CollectiveName(t.kind)},
                      {"group", t.group},
                      {"bytes", t.bytes},
                      {"seconds", t.seconds}});
    }
    j["collectives"] = list;
  }
  Json kernels = Json::object();
  for (int k = 0; k < kKernelCount; ++k) {
    if (kernel_seconds[k] > 0) kernels[std::string(kKernelNames[k])] = kernel_seconds[k];
  }
  if (!kernels.empty()) j["kernels"] = kernels;
  return j.dump(2) + "\n";
}

MachineProfile MachineProfile::ForRanks(int ranks) const {
  MachineProfile p = *this;
  const int64_t devices = static_cast<int64_t>(hosts) * devices_per_host;
  p.ranks_per_device =
      hosts > 0 && ranks > devices ? static_cast<int>((ranks + devices - 1) / devices) : 1;
  p.ranks_per_host = hosts > 0 ? (ranks + hosts - 1) / hosts : 1;
  return p;
}

double MachineProfile::ComputeSeconds(double flops, double bytes) const {
  return (flops / matmul_flops + bytes / memory_bandwidth) * ranks_per_device;
}

double MachineProfile::DiskSeconds(double read_bytes, double write_bytes) const {
  const double r = disk_read > 0 ? disk_read : kDefaultDiskBandwidth;
  const double w = disk_write > 0 ? disk_write : kDefaultDiskBandwidth;
  return (read_bytes / r + write_bytes / w) * ranks_per_host;
}

double MachineProfile::KernelSeconds(Kernel kernel, double units) const {
  const int k = static_cast<int>(kernel);
  if (kernel_seconds[k] > 0) return units * kernel_seconds[k] * ranks_per_device;
  return ComputeSeconds(units * kRoofline[k].flops, units * kRoofline[k].bytes);
}

double MachineProfile::CollectiveSeconds(CollectiveKind kind, double bytes, int group,
                                         bool inter_host) const {
  if (group <= 1 || bytes <= 0) return 0;
  const LinkProfile& l = inter_host ? this->inter_host : intra_host;
  const RingShape ring = RingOf(kind, group);
  const double line = ring.steps * l.latency_s + ring.moved * bytes / l.bandwidth;
  if (!inter_host) {
    for (const CollectiveTable& t : collectives) {
      if (t.kind != kind || t.group != group) continue;
      // Timed cold (the table) and back to back (the line), a collective
      // costs at least the larger: on this VM either can be the slow one
      // from one calibration to the next under Gloo.
      return std::max(TableSeconds(t, bytes, ring.moved, l.bandwidth), line);
    }
  }
  return line;
}

bool MachineProfile::CrossesHosts(int64_t stride, int64_t size) const {
  // The ranks are row-major over the mesh, so such a group lies in an
  // aligned block of stride x size ranks: inside one host when the block
  // divides a host, else some group straddles two.
  const int64_t block = stride * size;
  return size > 1 && (block > devices_per_host || devices_per_host % block != 0);
}

}  // namespace tessera
