// A checkpoint's strategy, step, creator and metadata as string keys and
// values, for the formats that store whole tensors beside string
// attributes: safetensors' `__metadata__` and HDF5's root attributes. The
// keys are "tessera.strategy" (the strategy JSON), "tessera.step",
// "tessera.created_by" and "tessera.meta.<key>" (or, where only printable
// text is allowed, "tessera.meta_hex.<key>" in lowercase hex).
#ifndef TESSERA_CKPT_META_ATTRIBUTES_H_
#define TESSERA_CKPT_META_ATTRIBUTES_H_

#include <map>
#include <string>
#include <utility>

#include "ckpt/checkpoint.h"
#include "transform/strategy.h"

namespace tessera {

inline constexpr char kStrategyAttribute[] = "tessera.strategy";
inline constexpr char kStepAttribute[] = "tessera.step";

// One metadata entry as an attribute: ("tessera.meta.<key>", value), or
// with `hex` ("tessera.meta_hex.<key>", lowercase hex of value).
std::pair<std::string, std::string> MetaAttribute(const std::string& key, const std::string& value,
                                                  bool hex);

// `text_only`: values that are not printable text are hex-encoded, and a
// creator that is not is left out (safetensors' header holds JSON strings).
std::map<std::string, std::string> EncodeMetaAttributes(const Strategy& strategy,
                                                        const CheckpointMeta& meta, bool text_only);

// Fills `meta` from the keys above (others are ignored); errors start with
// `where` and name the key.
Status DecodeMetaAttributes(const std::string& where,
                            const std::map<std::string, std::string>& attributes,
                            CheckpointMeta* meta);

}  // namespace tessera

#endif  // TESSERA_CKPT_META_ATTRIBUTES_H_
