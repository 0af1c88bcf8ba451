#include "ckpt/meta_attributes.h"

namespace tessera {
namespace {

constexpr char kCreatedByKey[] = "tessera.created_by";
constexpr char kMetaKey[] = "tessera.meta.";
constexpr char kMetaHexKey[] = "tessera.meta_hex.";

bool Printable(const std::string& s) {
  for (unsigned char c : s) {
    if ((c < 0x20 || c > 0x7e) && c != '\n' && c != '\t') return false;
  }
  return true;
}

std::string ToHex(const std::string& s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Result<std::string> FromHex(const std::string& s) {
  if (s.size() % 2 != 0) return InvalidArgumentError("odd number of hex digits");
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); i += 2) {
    const int hi = digit(s[i]), lo = digit(s[i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgumentError("not lowercase hex");
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

}  // namespace

std::pair<std::string, std::string> MetaAttribute(const std::string& key, const std::string& value,
                                                  bool hex) {
  if (hex) return {kMetaHexKey + key, ToHex(value)};
  return {kMetaKey + key, value};
}

std::map<std::string, std::string> EncodeMetaAttributes(const Strategy& strategy,
                                                        const CheckpointMeta& meta,
                                                        bool text_only) {
  std::map<std::string, std::string> m;
  m[kStrategyAttribute] = StrategyToJson(strategy);
  m[kStepAttribute] = std::to_string(meta.step);
  if (!meta.created_by.empty() && (!text_only || Printable(meta.created_by))) {
    m[kCreatedByKey] = meta.created_by;
  }
  for (const auto& [key, value] : meta.metadata) {
    m.insert(MetaAttribute(key, value, /*hex=*/text_only && !Printable(value)));
  }
  return m;
}

Status DecodeMetaAttributes(const std::string& where,
                            const std::map<std::string, std::string>& attributes,
                            CheckpointMeta* meta) {
  for (const auto& [key, value] : attributes) {
    if (key == kStepAttribute) {
      try {
        meta->step = std::stoll(value);
      } catch (...) {
        return DataLossError(where + ": " + key + " '" + value + "' is not a number");
      }
    } else if (key == kCreatedByKey) {
      meta->created_by = value;
    } else if (key.rfind(kMetaHexKey, 0) == 0) {
      auto bytes = FromHex(value);
      if (!bytes.ok()) return DataLossError(where + ": " + key + ": " + bytes.status().message());
      meta->metadata[key.substr(sizeof(kMetaHexKey) - 1)] = *bytes;
    } else if (key.rfind(kMetaKey, 0) == 0) {
      meta->metadata[key.substr(sizeof(kMetaKey) - 1)] = value;
    }
  }
  return Status::Ok();
}

}  // namespace tessera
