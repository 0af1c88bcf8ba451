// A Python pickle reader that never calls anything: protocols 0-5 parsed
// into an inert graph of values. A global (GLOBAL, STACK_GLOBAL) is only a
// name; a call (REDUCE, NEWOBJ, NEWOBJ_EX) becomes a record of the callable's
// name and its arguments; BUILD stores the state in that record; APPEND and
// SETITEM on a record keep the items. What the records mean (a PyTorch
// tensor, an OrderedDict) is for the layer above to interpret from the
// names it allows; every other record stays a named record whose arguments
// and state can be shown.
//
// Refused by name, since they have no inert reading: INST and OBJ (protocol
// 0/1 calls of a class named in the stream), text PERSID (persistent ids are
// read only as BINPERSID of an object), EXT1/EXT2/EXT4 (the copyreg
// extension registry), NEXT_BUFFER / READONLY_BUFFER (out-of-band buffers).
//
// Hostile input cannot exhaust memory: values are capped (PickleLimits),
// every length is checked against the input before anything is allocated,
// the memo is a map (an index of 2^32 costs one entry), and shared or
// cyclic references are references, never copies. Walks of the graph are
// bounded in depth and in the number of values they visit
// (PickleWalkBudget).
#ifndef TESSERA_FORMATS_PICKLE_H_
#define TESSERA_FORMATS_PICKLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tessera {

// The defaults bound a hostile stream to about 1 GiB of values and memo
// (a value is ~140 bytes); a DeepSpeed optimizer file's pickle, the largest
// a checkpoint holds, has a few values per parameter.
struct PickleLimits {
  int64_t max_values = int64_t{1} << 22;  // values the stream may create
  int64_t max_memo = int64_t{1} << 22;    // memo entries
  int max_depth = 256;                    // nesting a walk follows
};

enum class PickleKind : uint8_t {
  kNone,
  kBool,
  kInt,     // fits int64
  kBigInt,  // `text`: little-endian two's complement bytes (LONG1/LONG4/LONG)
  kFloat,
  kStr,    // `text`: UTF-8 as stored
  kBytes,  // `text`: the bytes (BINBYTES, SHORT_BINSTRING, BYTEARRAY8, ...)
  kTuple,
  kList,
  kDict,    // `items`: key, value, key, value, ...
  kSet,     // set and frozenset
  kGlobal,  // `text`: "module.name" (a name only; nothing is imported)
  // A call that was not made: `items[0]` the callable (usually a kGlobal),
  // `items[1]` its arguments (a kTuple; NEWOBJ: the class's arguments,
  // NEWOBJ_EX: a tuple (args, kwargs)), then what APPEND/APPENDS and
  // SETITEM/SETITEMS added to it (`appended`, `set_items`) and the BUILD
  // state (`state`, or -1).
  kRecord,
  kPersistentId,  // `items[0]`: the id object (BINPERSID)
};

struct PickleValue {
  PickleKind kind = PickleKind::kNone;
  bool new_object = false;  // kRecord made by NEWOBJ / NEWOBJ_EX (cls.__new__)
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  int32_t state = -1;  // kRecord's BUILD state
  std::string text;
  std::vector<int32_t> items;
  std::vector<int32_t> appended;   // kRecord: APPEND / APPENDS
  std::vector<int32_t> set_items;  // kRecord: SETITEM / SETITEMS, key, value, ...
};

// A parsed pickle: values indexed by int32, the top of the stream at `root`.
class Pickle {
 public:
  const PickleValue& at(int32_t index) const { return values_[index]; }
  int32_t root() const { return root_; }
  size_t size() const { return values_.size(); }
  // Bytes of the input the stream took, STOP included (a file of several
  // pickles continues there).
  size_t consumed() const { return consumed_; }

  // The callable's name of a record ("collections.OrderedDict"); "" for
  // other values or a record whose callable is not a global.
  std::string_view RecordName(int32_t index) const;
  // A short Python-like rendering for people (inspect), printable: containers
  // cut after `max_items`, strings after 200 bytes, nesting after 6 levels,
  // and at most 256 values shown in all (shared references are shown again
  // each time, so a budget, not the depth, bounds the text).
  std::string Repr(int32_t index, int max_items = 8) const;
  // The integers of a tuple or list of integers, or of a record that
  // rebuilds a tuple subclass from one (torch.Size((2, 3))); nullopt for
  // anything else.
  std::optional<std::vector<int64_t>> AsInts(int32_t index) const;
  // The integer of an int, or of a record made from one (an IntEnum member
  // pickled as its class called with its value); nullopt for anything else.
  std::optional<int64_t> AsInt(int32_t index) const;
  // The keys and values (key, value, key, value, ...) of a dict or of a
  // collections.OrderedDict record; nullptr for anything else.
  const std::vector<int32_t>* Pairs(int32_t index) const;
  // The value under the str key `key` of Pairs(index); -1 where there is none.
  int32_t Get(int32_t index, std::string_view key) const;

 private:
  friend class PickleParser;
  std::vector<PickleValue> values_;
  int32_t root_ = -1;
  size_t consumed_ = 0;
};

// Parses one pickle from the start of `data`. `where` names the input in
// errors ("'model.pt' record 'archive/data.pkl'"); an error also gives the
// byte offset and the opcode.
Result<Pickle> ParsePickle(std::string_view data, const std::string& where,
                           const PickleLimits& limits = {});

// What a walk of the graph may visit: a walk deeper than limits.max_depth
// (a cycle, or hostile nesting) or visiting more than 4 x the pickle's
// values + 1024 (shared references fanned out) fails, naming `where`.
class PickleWalkBudget {
 public:
  explicit PickleWalkBudget(const Pickle& pickle, const PickleLimits& limits = {})
      : remaining_(4 * static_cast<int64_t>(pickle.size()) + 1024), max_depth_(limits.max_depth) {}
  // Counts one visit at `depth`; an error once over budget.
  Status Visit(int depth, const std::string& where);

 private:
  int64_t remaining_;
  int max_depth_;
};

// Writing pickles (protocol 2), opcode by opcode, for the files Tessera
// writes in PyTorch's formats: only names and plain values, no memo.
class PickleWriter {
 public:
  PickleWriter() : out_("\x80\x02") {}
  // GLOBAL module.name.
  void Global(std::string_view module, std::string_view name);
  void Str(std::string_view s);  // BINUNICODE
  void Int(int64_t v);           // BININT or LONG1
  void None() { out_ += 'N'; }
  void Bool(bool v) { out_ += v ? '\x88' : '\x89'; }
  // Raw opcodes: "(" MARK, "t" TUPLE, ")" EMPTY_TUPLE, "R" REDUCE,
  // "}" EMPTY_DICT, "u" SETITEMS, "]" EMPTY_LIST, "e" APPENDS, "b" BUILD,
  // "\x81" NEWOBJ, "Q" BINPERSID, ...
  void Op(std::string_view ops) { out_.append(ops); }
  // The stream, STOP appended.
  std::string Take();

 private:
  void Le32(uint32_t v);
  std::string out_;
};

}  // namespace tessera

#endif  // TESSERA_FORMATS_PICKLE_H_
