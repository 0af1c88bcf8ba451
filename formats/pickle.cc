#include "formats/pickle.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "core/utf8.h"

namespace tessera {

std::string_view Pickle::RecordName(int32_t index) const {
  const PickleValue& v = values_[index];
  if (v.kind != PickleKind::kRecord || v.items.empty()) return {};
  const PickleValue& callable = values_[v.items[0]];
  return callable.kind == PickleKind::kGlobal ? std::string_view(callable.text)
                                              : std::string_view();
}

namespace {

std::string Quoted(std::string_view s, char quote) {
  std::string out(1, quote);
  size_t n = std::min<size_t>(s.size(), 200);
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = s[i];
    if (c == '\\' || c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (n < s.size()) out += "...";
  out += quote;
  return out;
}

}  // namespace

std::string Pickle::Repr(int32_t index, int max_items) const {
  struct Printer {
    const Pickle& p;
    int max_items;
    mutable int budget = 256;  // values shown in all
    std::string Seq(const std::vector<int32_t>& items, int depth, const char* open,
                    const char* close, int stride) const {
      std::string out = open;
      int shown = 0;
      for (size_t i = 0; i < items.size(); i += stride) {
        if (shown++ == max_items) {
          out += ", ...";
          break;
        }
        if (i) out += ", ";
        out += Of(items[i], depth + 1);
        if (stride == 2) out += ": " + Of(items[i + 1], depth + 1);
      }
      return out + close;
    }
    std::string Record(const PickleValue& v, int depth) const {
      std::string out = Of(v.items[0], depth + 1) + Of(v.items[1], depth + 1);
      if (!v.appended.empty()) out += " + " + Seq(v.appended, depth, "[", "]", 1);
      if (!v.set_items.empty()) out += " + " + Seq(v.set_items, depth, "{", "}", 2);
      if (v.state >= 0) out += " state " + Of(v.state, depth + 1);
      return out;
    }
    std::string Of(int32_t i, int depth) const {
      const PickleValue& v = p.values_[i];
      if (depth > 6 || --budget < 0) return "...";
      switch (v.kind) {
        case PickleKind::kNone:
          return "None";
        case PickleKind::kBool:
          return v.boolean ? "True" : "False";
        case PickleKind::kInt:
          return std::to_string(v.integer);
        case PickleKind::kBigInt:
          return "<int of " + std::to_string(v.text.size()) + " bytes>";
        case PickleKind::kFloat: {
          // The shortest text that reads back as the same double, as Python's repr.
          char buf[32];
          auto end = std::to_chars(buf, buf + sizeof(buf), v.number).ptr;
          std::string out(buf, end);
          if (out.find_first_of(".eEn") == std::string::npos) out += ".0";
          return out;
        }
        case PickleKind::kStr:
          return Quoted(v.text, '\'');
        case PickleKind::kBytes:
          return "b" + Quoted(v.text, '\'');
        case PickleKind::kTuple:
          return Seq(v.items, depth, "(", v.items.size() == 1 ? ",)" : ")", 1);
        case PickleKind::kList:
          return Seq(v.items, depth, "[", "]", 1);
        case PickleKind::kDict:
          return Seq(v.items, depth, "{", "}", 2);
        case PickleKind::kSet:
          return Seq(v.items, depth, "set(", ")", 1);
        case PickleKind::kGlobal:
          return PrintableText(v.text);
        case PickleKind::kRecord:
          return Record(v, depth);
        case PickleKind::kPersistentId:
          return "persistent_id" + Of(v.items[0], depth + 1);
      }
      return "?";
    }
  };
  return Printer{*this, max_items}.Of(index, 0);
}

std::optional<std::vector<int64_t>> Pickle::AsInts(int32_t index) const {
  const PickleValue* v = &values_[index];
  if (v->kind == PickleKind::kRecord) {
    const PickleValue& args = values_[v->items[1]];
    if (args.items.size() != 1) return std::nullopt;
    v = &values_[args.items[0]];
  }
  if (v->kind != PickleKind::kTuple && v->kind != PickleKind::kList) return std::nullopt;
  std::vector<int64_t> out;
  for (int32_t e : v->items) {
    if (values_[e].kind != PickleKind::kInt) return std::nullopt;
    out.push_back(values_[e].integer);
  }
  return out;
}

std::optional<int64_t> Pickle::AsInt(int32_t index) const {
  const PickleValue* v = &values_[index];
  if (v->kind == PickleKind::kRecord) {
    const PickleValue& args = values_[v->items[1]];
    if (args.kind != PickleKind::kTuple || args.items.size() != 1) return std::nullopt;
    v = &values_[args.items[0]];
  }
  if (v->kind != PickleKind::kInt) return std::nullopt;
  return v->integer;
}

const std::vector<int32_t>* Pickle::Pairs(int32_t index) const {
  const PickleValue& v = values_[index];
  if (v.kind == PickleKind::kDict) return &v.items;
  if (RecordName(index) == "collections.OrderedDict") return &v.set_items;
  return nullptr;
}

int32_t Pickle::Get(int32_t index, std::string_view key) const {
  const std::vector<int32_t>* pairs = Pairs(index);
  for (size_t k = 0; pairs && k + 1 < pairs->size(); k += 2) {
    const PickleValue& name = values_[(*pairs)[k]];
    if (name.kind == PickleKind::kStr && name.text == key) return (*pairs)[k + 1];
  }
  return -1;
}

Status PickleWalkBudget::Visit(int depth, const std::string& where) {
  if (depth > max_depth_) {
    return DataLossError(where + ": values nest deeper than " + std::to_string(max_depth_) +
                         " levels (a cycle, or hostile nesting)");
  }
  if (--remaining_ < 0) {
    return DataLossError(where + ": shared references expand to too many values to walk");
  }
  return Status::Ok();
}

// The parser: one pass over the opcodes with a stack of value indices and
// a stack of marks.
class PickleParser {
 public:
  PickleParser(std::string_view data, const std::string& where, const PickleLimits& limits)
      : data_(data), where_(where), limits_(limits) {}

  Result<Pickle> Run() {
    // Most opcodes make a value (a few bytes of input each); reserved up
    // to a bound, so that growth does not copy a large graph many times.
    out_.values_.reserve(std::min<size_t>(
        {data_.size() / 4, size_t{1} << 20, static_cast<size_t>(limits_.max_values)}));
    while (true) {
      if (pos_ >= data_.size()) return Fail("the stream ends before STOP");
      op_at_ = pos_;
      op_ = static_cast<unsigned char>(data_[pos_++]);
      if (op_ == '.') break;
      RETURN_IF_ERROR(Step());
    }
    if (stack_.size() != 1 || !marks_.empty()) {
      return Fail("STOP with " + std::to_string(stack_.size()) + " values and " +
                  std::to_string(marks_.size()) + " marks on the stack (one value expected)");
    }
    out_.root_ = stack_.back();
    out_.consumed_ = pos_;
    return std::move(out_);
  }

 private:
  Status Fail(const std::string& what) const {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " (opcode 0x%02x at byte %zu)", op_, op_at_);
    return DataLossError("pickle " + where_ + ": " + what + buf);
  }
  Status Refuse(const char* name, const char* why) const {
    return Fail(std::string("opcode ") + name + " is refused: " + why);
  }

  // --- input ---
  Result<std::string_view> Take(uint64_t n) {
    if (n > data_.size() - pos_) {
      return Fail("a length of " + std::to_string(n) + " bytes runs past the end of the stream");
    }
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  Result<uint64_t> Unsigned(int bytes) {
    ASSIGN_OR_RETURN(std::string_view s, Take(bytes));
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[i]);
    return v;
  }
  Result<std::string_view> Line() {
    size_t end = data_.find('\n', pos_);
    if (end == std::string_view::npos) return Fail("a text argument without its newline");
    std::string_view s = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  // --- values ---
  Result<int32_t> New(PickleValue v) {
    if (static_cast<int64_t>(out_.values_.size()) >= limits_.max_values) {
      return Fail("more than " + std::to_string(limits_.max_values) + " values");
    }
    out_.values_.push_back(std::move(v));
    return static_cast<int32_t>(out_.values_.size() - 1);
  }
  Status Push(PickleValue v) {
    ASSIGN_OR_RETURN(int32_t i, New(std::move(v)));
    stack_.push_back(i);
    return Status::Ok();
  }
  Status PushInt(int64_t i) {
    PickleValue v;
    v.kind = PickleKind::kInt;
    v.integer = i;
    return Push(std::move(v));
  }
  Status PushText(PickleKind kind, std::string_view s) {
    PickleValue v;
    v.kind = kind;
    v.text = std::string(s);
    return Push(std::move(v));
  }
  Result<int32_t> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) {
      return Fail("the stack is empty");
    }
    int32_t i = stack_.back();
    stack_.pop_back();
    return i;
  }
  Result<int32_t> Top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) {
      return Fail("the stack is empty");
    }
    return stack_.back();
  }
  // The values above the last mark, which is removed.
  Result<std::vector<int32_t>> PopMark() {
    if (marks_.empty()) return Fail("no MARK to pop to");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<int32_t> items(stack_.begin() + m, stack_.end());
    stack_.resize(m);
    return items;
  }
  Status PushSeq(PickleKind kind, std::vector<int32_t> items) {
    PickleValue v;
    v.kind = kind;
    v.items = std::move(items);
    return Push(std::move(v));
  }

  // --- memo ---
  Status Put(uint64_t key) {
    ASSIGN_OR_RETURN(int32_t top, Top());
    if (!memo_.count(key) && static_cast<int64_t>(memo_.size()) >= limits_.max_memo) {
      return Fail("more than " + std::to_string(limits_.max_memo) + " memo entries");
    }
    memo_[key] = top;
    return Status::Ok();
  }
  Status Get(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) return Fail("memo key " + std::to_string(key) + " was never stored");
    stack_.push_back(it->second);
    return Status::Ok();
  }
  Result<uint64_t> TextKey() {
    ASSIGN_OR_RETURN(std::string_view line, Line());
    ASSIGN_OR_RETURN(int64_t k, ParseTextInt(line));
    if (k < 0) return Fail("a negative memo key");
    return static_cast<uint64_t>(k);
  }

  // --- containers ---
  Status AppendTo(int32_t target, const std::vector<int32_t>& items) {
    PickleValue& t = out_.values_[target];
    if (t.kind == PickleKind::kList) {
      t.items.insert(t.items.end(), items.begin(), items.end());
    } else if (t.kind == PickleKind::kRecord) {
      t.appended.insert(t.appended.end(), items.begin(), items.end());
    } else {
      return Fail("APPEND to a value that is not a list or an object");
    }
    return Status::Ok();
  }
  Status SetItemsOf(int32_t target, const std::vector<int32_t>& items) {
    if (items.size() % 2) return Fail("SETITEMS with a key and no value");
    PickleValue& t = out_.values_[target];
    if (t.kind == PickleKind::kDict) {
      t.items.insert(t.items.end(), items.begin(), items.end());
    } else if (t.kind == PickleKind::kRecord) {
      t.set_items.insert(t.set_items.end(), items.begin(), items.end());
    } else {
      return Fail("SETITEM on a value that is not a dict or an object");
    }
    return Status::Ok();
  }
  Status AddItems(int32_t target, const std::vector<int32_t>& items) {
    PickleValue& t = out_.values_[target];
    if (t.kind != PickleKind::kSet) return Fail("ADDITEMS to a value that is not a set");
    t.items.insert(t.items.end(), items.begin(), items.end());
    return Status::Ok();
  }
  Status Call(int32_t callable, int32_t args, bool new_object) {
    if (out_.values_[args].kind != PickleKind::kTuple) {
      return Fail("a call's arguments are not a tuple");
    }
    PickleValue v;
    v.kind = PickleKind::kRecord;
    v.new_object = new_object;
    v.items = {callable, args};
    return Push(std::move(v));
  }
  Status Build() {
    ASSIGN_OR_RETURN(int32_t state, Pop());
    ASSIGN_OR_RETURN(int32_t target, Top());
    PickleValue& t = out_.values_[target];
    if (t.kind != PickleKind::kRecord) return Fail("BUILD on a value that is not an object");
    t.state = state;
    return Status::Ok();
  }
  Status Global(std::string_view module, std::string_view name) {
    std::string text(module);
    text += '.';
    text += name;
    return PushText(PickleKind::kGlobal, text);
  }

  // --- text arguments (protocol 0) ---
  Result<int64_t> ParseTextInt(std::string_view s) {
    if (!s.empty() && s.back() == 'L') s.remove_suffix(1);
    if (s.empty() || s.size() > 19)
      return Fail("integer '" + PrintableText(s) + "' not understood");
    size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (i == s.size()) return Fail("integer '" + PrintableText(s) + "' not understood");
    int64_t v = 0;
    for (; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9')
        return Fail("integer '" + PrintableText(s) + "' not understood");
      if (v > (INT64_MAX - (s[i] - '0')) / 10)
        return Fail("integer '" + PrintableText(s) + "' out of range");
      v = v * 10 + (s[i] - '0');
    }
    return s[0] == '-' ? -v : v;
  }
  Status TextInt() {
    ASSIGN_OR_RETURN(std::string_view line, Line());
    if (line == "00" || line == "01") {
      PickleValue v;
      v.kind = PickleKind::kBool;
      v.boolean = line == "01";
      return Push(std::move(v));
    }
    ASSIGN_OR_RETURN(int64_t i, ParseTextInt(line));
    return PushInt(i);
  }
  Status TextFloat() {
    ASSIGN_OR_RETURN(std::string_view line, Line());
    std::string s(line);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size())
      return Fail("float '" + PrintableText(s) + "' not understood");
    PickleValue v;
    v.kind = PickleKind::kFloat;
    v.number = d;
    return Push(std::move(v));
  }
  // STRING: a quoted repr with backslash escapes (\\, \', \", \n, \r, \t, \xNN).
  Status TextString() {
    ASSIGN_OR_RETURN(std::string_view line, Line());
    if (line.size() < 2 || line.front() != line.back() ||
        (line.front() != '\'' && line.front() != '"')) {
      return Fail("STRING argument is not quoted");
    }
    std::string_view body = line.substr(1, line.size() - 2);
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] != '\\') {
        out += body[i];
        continue;
      }
      if (++i == body.size()) return Fail("STRING ends in a backslash");
      static const std::string_view kFrom = "\\'\"nrt", kTo = "\\'\"\n\r\t";
      size_t f = kFrom.find(body[i]);
      if (f != std::string_view::npos) {
        out += kTo[f];
      } else if (body[i] == 'x' && i + 2 < body.size() &&
                 std::isxdigit(static_cast<unsigned char>(body[i + 1])) &&
                 std::isxdigit(static_cast<unsigned char>(body[i + 2]))) {
        out += static_cast<char>(std::stoi(std::string(body.substr(i + 1, 2)), nullptr, 16));
        i += 2;
      } else {
        return Fail("STRING escape '\\" + PrintableText(body.substr(i, 1)) + "' not understood");
      }
    }
    return PushText(PickleKind::kBytes, out);
  }
  // UNICODE: raw-unicode-escape (\uXXXX and \UXXXXXXXX; other bytes are
  // Latin-1 code points), stored as UTF-8.
  Status TextUnicode() {
    ASSIGN_OR_RETURN(std::string_view line, Line());
    std::string out;
    for (size_t i = 0; i < line.size(); ++i) {
      uint32_t cp = static_cast<unsigned char>(line[i]);
      if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == 'u' || line[i + 1] == 'U')) {
        size_t n = line[i + 1] == 'u' ? 4 : 8;
        if (i + 2 + n > line.size()) return Fail("UNICODE escape cut short");
        std::string hex(line.substr(i + 2, n));
        if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
          return Fail("UNICODE escape '" + PrintableText(hex) + "' is not hexadecimal");
        }
        cp = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
        if (cp > 0x10FFFF) return Fail("UNICODE escape beyond U+10FFFF");
        i += 1 + n;
      }
      AppendUtf8(cp, &out);
    }
    return PushText(PickleKind::kStr, out);
  }
  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  Status TextGlobal() {
    ASSIGN_OR_RETURN(std::string_view module, Line());
    ASSIGN_OR_RETURN(std::string_view name, Line());
    return Global(module, name);
  }

  // --- binary arguments ---
  Status Long(uint64_t n) {
    ASSIGN_OR_RETURN(std::string_view s, Take(n));
    if (n > 8) return PushText(PickleKind::kBigInt, s);
    uint64_t u = 0;
    for (int i = static_cast<int>(n) - 1; i >= 0; --i)
      u = (u << 8) | static_cast<unsigned char>(s[i]);
    if (n > 0 && n < 8 && (static_cast<unsigned char>(s[n - 1]) & 0x80))
      u |= ~uint64_t{0} << (8 * n);
    return PushInt(static_cast<int64_t>(u));
  }
  Status BinFloat() {
    ASSIGN_OR_RETURN(std::string_view s, Take(8));
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<unsigned char>(s[i]);  // big-endian
    PickleValue v;
    v.kind = PickleKind::kFloat;
    std::memcpy(&v.number, &u, 8);
    return Push(std::move(v));
  }
  Status Bool(bool b) {
    PickleValue v;
    v.kind = PickleKind::kBool;
    v.boolean = b;
    return Push(std::move(v));
  }
  Status Sized(PickleKind kind, int length_bytes) {
    ASSIGN_OR_RETURN(uint64_t n, Unsigned(length_bytes));
    ASSIGN_OR_RETURN(std::string_view s, Take(n));
    return PushText(kind, s);
  }
  Status StackGlobal() {
    ASSIGN_OR_RETURN(int32_t name, Pop());
    ASSIGN_OR_RETURN(int32_t module, Pop());
    const PickleValue& m = out_.values_[module];
    const PickleValue& n = out_.values_[name];
    if (m.kind != PickleKind::kStr || n.kind != PickleKind::kStr) {
      return Fail("STACK_GLOBAL of values that are not strings");
    }
    // Memoized strings would otherwise be copied into every global.
    copied_ += m.text.size() + n.text.size();
    if (m.text.size() + n.text.size() > 4096 || copied_ > data_.size() + (size_t{64} << 20)) {
      return Fail("global names longer than the stream could hold");
    }
    return Global(m.text, n.text);
  }
  Status TupleOf(int n) {
    if (stack_.size() < static_cast<size_t>(n) ||
        (!marks_.empty() && stack_.size() - marks_.back() < static_cast<size_t>(n))) {
      return Fail("the stack holds fewer than " + std::to_string(n) + " values");
    }
    std::vector<int32_t> items(stack_.end() - n, stack_.end());
    stack_.resize(stack_.size() - n);
    return PushSeq(PickleKind::kTuple, std::move(items));
  }
  Status Frame() {
    ASSIGN_OR_RETURN(uint64_t n, Unsigned(8));
    if (n > data_.size() - pos_) return Fail("a FRAME runs past the end of the stream");
    return Status::Ok();  // frames only group opcodes
  }

  std::optional<Status> StepStack();
  std::optional<Status> StepData();
  std::optional<Status> StepContainers();
  Status Step();

  std::string_view data_;
  const std::string& where_;
  const PickleLimits& limits_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  unsigned char op_ = 0;
  std::vector<int32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, int32_t> memo_;
  size_t copied_ = 0;  // bytes of memoized strings copied into globals
  Pickle out_;
};

// Stack, memo and refused opcodes; nullopt when `op_` is none of them.
std::optional<Status> PickleParser::StepStack() {
  switch (op_) {
    case 0x80: {  // PROTO
      ASSIGN_OR_RETURN(uint64_t proto, Unsigned(1));
      if (proto > 5) return Fail("protocol " + std::to_string(proto) + " (this reader knows 0-5)");
      return Status::Ok();
    }
    case 0x95:  // FRAME
      return Frame();
    case '(':  // MARK
      marks_.push_back(stack_.size());
      return Status::Ok();
    case '0':  // POP; at a mark, CPython pops the mark
      if (!marks_.empty() && stack_.size() == marks_.back()) return PopMark().status();
      return Pop().status();
    case '1':  // POP_MARK
      return PopMark().status();
    case '2': {  // DUP
      ASSIGN_OR_RETURN(int32_t top, Top());
      stack_.push_back(top);
      return Status::Ok();
    }
    case 'p': {  // PUT
      ASSIGN_OR_RETURN(uint64_t k, TextKey());
      return Put(k);
    }
    case 'q':    // BINPUT
    case 'r': {  // LONG_BINPUT
      ASSIGN_OR_RETURN(uint64_t k, Unsigned(op_ == 'q' ? 1 : 4));
      return Put(k);
    }
    case 0x94:  // MEMOIZE
      return Put(memo_.size());
    case 'g': {  // GET
      ASSIGN_OR_RETURN(uint64_t k, TextKey());
      return Get(k);
    }
    case 'h':    // BINGET
    case 'j': {  // LONG_BINGET
      ASSIGN_OR_RETURN(uint64_t k, Unsigned(op_ == 'h' ? 1 : 4));
      return Get(k);
    }
    case 'i':
      return Refuse("INST", "it calls a class named in the stream");
    case 'o':
      return Refuse("OBJ", "it calls a class from the stack");
    case 'P':
      return Refuse("PERSID", "text persistent ids are not how PyTorch refers to storages");
    case 0x82:
    case 0x83:
    case 0x84:
      return Refuse("EXT1/EXT2/EXT4", "they name objects through the copyreg extension registry");
    case 0x97:
    case 0x98:
      return Refuse("NEXT_BUFFER/READONLY_BUFFER", "out-of-band buffers are not part of a file");
  }
  return std::nullopt;
}

// Scalars, strings and globals; nullopt when `op_` is none of them.
std::optional<Status> PickleParser::StepData() {
  switch (op_) {
    case 'N':
      return Push(PickleValue{});
    case 0x88:
    case 0x89:
      return Bool(op_ == 0x88);
    case 'I':
      return TextInt();
    case 'L': {
      ASSIGN_OR_RETURN(std::string_view line, Line());
      ASSIGN_OR_RETURN(int64_t i, ParseTextInt(line));
      return PushInt(i);
    }
    case 'J': {
      ASSIGN_OR_RETURN(uint64_t u, Unsigned(4));
      return PushInt(static_cast<int32_t>(static_cast<uint32_t>(u)));
    }
    case 'K':
    case 'M': {
      ASSIGN_OR_RETURN(uint64_t u, Unsigned(op_ == 'K' ? 1 : 2));
      return PushInt(static_cast<int64_t>(u));
    }
    case 0x8a:
    case 0x8b: {
      ASSIGN_OR_RETURN(uint64_t n, Unsigned(op_ == 0x8a ? 1 : 4));
      return Long(n);
    }
    case 'F':
      return TextFloat();
    case 'G':
      return BinFloat();
    case 'S':
      return TextString();
    case 'V':
      return TextUnicode();
    case 'T':  // BINSTRING (Python 2 str: bytes)
      return Sized(PickleKind::kBytes, 4);
    case 'U':  // SHORT_BINSTRING
      return Sized(PickleKind::kBytes, 1);
    case 'B':
      return Sized(PickleKind::kBytes, 4);
    case 'C':
      return Sized(PickleKind::kBytes, 1);
    case 0x8e:  // BINBYTES8
    case 0x96:  // BYTEARRAY8
      return Sized(PickleKind::kBytes, 8);
    case 'X':
      return Sized(PickleKind::kStr, 4);
    case 0x8c:
      return Sized(PickleKind::kStr, 1);
    case 0x8d:
      return Sized(PickleKind::kStr, 8);
    case 'c':
      return TextGlobal();
    case 0x93:
      return StackGlobal();
  }
  return std::nullopt;
}

// Containers, calls and persistent ids; nullopt when `op_` is none of them.
std::optional<Status> PickleParser::StepContainers() {
  switch (op_) {
    case ')':
      return PushSeq(PickleKind::kTuple, {});
    case 't': {
      ASSIGN_OR_RETURN(auto items, PopMark());
      return PushSeq(PickleKind::kTuple, std::move(items));
    }
    case 0x85:
    case 0x86:
    case 0x87:
      return TupleOf(op_ - 0x84);
    case ']':
      return PushSeq(PickleKind::kList, {});
    case 'l': {
      ASSIGN_OR_RETURN(auto items, PopMark());
      return PushSeq(PickleKind::kList, std::move(items));
    }
    case '}':
      return PushSeq(PickleKind::kDict, {});
    case 'd': {
      ASSIGN_OR_RETURN(auto items, PopMark());
      if (items.size() % 2) return Fail("DICT with a key and no value");
      return PushSeq(PickleKind::kDict, std::move(items));
    }
    case 0x8f:
      return PushSeq(PickleKind::kSet, {});
    case 0x91: {
      ASSIGN_OR_RETURN(auto items, PopMark());
      return PushSeq(PickleKind::kSet, std::move(items));
    }
    case 'a': {
      ASSIGN_OR_RETURN(int32_t v, Pop());
      ASSIGN_OR_RETURN(int32_t target, Top());
      return AppendTo(target, {v});
    }
    case 'e':
    case 'u':
    case 0x90: {
      ASSIGN_OR_RETURN(auto items, PopMark());
      ASSIGN_OR_RETURN(int32_t target, Top());
      if (op_ == 'e') return AppendTo(target, items);
      return op_ == 'u' ? SetItemsOf(target, items) : AddItems(target, items);
    }
    case 's': {
      ASSIGN_OR_RETURN(int32_t value, Pop());
      ASSIGN_OR_RETURN(int32_t key, Pop());
      ASSIGN_OR_RETURN(int32_t target, Top());
      return SetItemsOf(target, {key, value});
    }
    case 'R':
    case 0x81: {  // REDUCE, NEWOBJ
      ASSIGN_OR_RETURN(int32_t args, Pop());
      ASSIGN_OR_RETURN(int32_t callable, Pop());
      return Call(callable, args, op_ == 0x81);
    }
    case 0x92: {  // NEWOBJ_EX: cls, args, kwargs
      ASSIGN_OR_RETURN(int32_t kwargs, Pop());
      ASSIGN_OR_RETURN(int32_t args, Pop());
      ASSIGN_OR_RETURN(int32_t cls, Pop());
      PickleValue both;
      both.kind = PickleKind::kTuple;
      both.items = {args, kwargs};
      ASSIGN_OR_RETURN(int32_t packed, New(std::move(both)));
      return Call(cls, packed, true);
    }
    case 'b':
      return Build();
    case 'Q': {  // BINPERSID
      ASSIGN_OR_RETURN(int32_t id, Pop());
      return PushSeq(PickleKind::kPersistentId, {id});
    }
  }
  return std::nullopt;
}

Status PickleParser::Step() {
  for (auto step :
       {&PickleParser::StepStack, &PickleParser::StepData, &PickleParser::StepContainers}) {
    if (std::optional<Status> s = (this->*step)()) return *s;
  }
  return Fail("unknown opcode");
}

Result<Pickle> ParsePickle(std::string_view data, const std::string& where,
                           const PickleLimits& limits) {
  return PickleParser(data, where, limits).Run();
}

void PickleWriter::Global(std::string_view module, std::string_view name) {
  out_ += 'c';
  out_.append(module);
  out_ += '\n';
  out_.append(name);
  out_ += '\n';
}

void PickleWriter::Str(std::string_view s) {
  out_ += 'X';
  Le32(static_cast<uint32_t>(s.size()));
  out_.append(s);
}

void PickleWriter::Int(int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    out_ += 'J';
    Le32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    return;
  }
  out_ += "\x8a\x08";  // LONG1 of 8 bytes
  for (int i = 0; i < 8; ++i)
    out_ += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
}

std::string PickleWriter::Take() {
  out_ += '.';
  return std::move(out_);
}

void PickleWriter::Le32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace tessera
