// Operator strategy files: the shard strategy of every operator of a model
// (MindSpore's semi-automatic parallel, `ops.MatMul().shard(((dp, 1), (1,
// tp)))`), plus the parts of a parallel configuration that are not an
// operator's (the mesh, optimizer sharding, the pipeline's stages and
// micro-batches), in one JSON file:
//
//   {
//     "format": "tessera.op_strategy", "version": 1,
//     "mesh": {"pp": 1, "dp": 2, "tp": 2},          // optional: checked
//                                                   // ("cp": context parallel)
//     "cp_algo": "ring",                            // optional: or "ulysses" (cp > 1)
//     "zero": 1,                                    // optional: ZeRO-1
//     "micro_batches": 4,                           // optional (pp > 1)
//     "virtual_stages": 2,                          // optional: chunks per stage
//     "micro_batch_interleave": 2,                  // optional: multi-copy (tp > 1)
//     "stage_layers": [3, 1],                       // optional: layers per stage
//                                                   // (per chunk with virtual_stages)
//     "recompute": {"h.*": "selective"},            // optional, per block
//     "offload": "optimizer",                       // optional: Adam's moments on disk
//     "offload_dir": "/scratch/offload",            // where (with offload)
//     "ps_servers": 2,                              // optional: parameter servers
//     "ps_params": "wte,h.*.mlp.c_fc.*",            // what they hold (default all)
//     "ps_staleness": 2,                            // optional: asynchronous, a
//                                                   // worker up to 2 steps ahead
//     "dataset_strategy": "data_parallel",          // optional, or "full_batch",
//                                                   // "sequence" (rows over dp,
//                                                   // positions over cp)
//     "operators": {
//       "h.*.attn.c_attn": [["dp", null], [null, "tp"]],
//       "h.*.mlp.c_fc":    [[2, 1], [1, 4]],
//       "lm_head":         [["dp", "tp"], [null, "tp"]]
//     }
//   }
//
// An operator's strategy lists, for each of its inputs, for each dimension,
// the mesh axes cutting it: null, "-" or 1 (not cut), "tp", or ["dp", "tp"]
// (cut over dp, each piece again over tp). A MindSpore split count (2, 4)
// is accepted where exactly one set of mesh axes has that product; else the
// error names the candidates. Names may use `*` for one dot-free part of a
// name ("h.*.mlp.c_fc"); an exact name wins over a pattern, and two
// patterns giving one operator different strategies are an error.
// Operators the file does not name run data parallel: the rows of their
// activations cut over every axis but the pipeline's (MindSpore's default),
// parameters whole.
//
// The "format" key keeps this file and transform/'s layout strategy files
// ("tessera.strategy") apart: each parser refuses the other kind by name.
#ifndef TESSERA_RUNTIME_PARALLEL_OP_STRATEGY_H_
#define TESSERA_RUNTIME_PARALLEL_OP_STRATEGY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "runtime/parallel/context_parallel.h"
#include "transform/mesh.h"

namespace tessera {

inline constexpr std::string_view kOpStrategyFormat = "tessera.op_strategy";

// The axes cutting one dimension, outermost first.
using DimAxes = std::vector<std::string>;
// One input: a DimAxes per dimension.
using InputStrategy = std::vector<DimAxes>;

struct OpStrategy {
  std::vector<InputStrategy> inputs;
  // MindSpore's notation with axis names: "((dp, -), (-, tp))", "dp*tp" for
  // a dimension cut by two axes.
  std::string ToString() const;
  bool operator==(const OpStrategy& o) const { return inputs == o.inputs; }
};

// What a model says about one of its operators, for checking strategies.
struct OpSignature {
  std::string name;  // "h.0.mlp.c_fc"
  std::string kind;  // "linear", "embedding", ... (for messages)
  struct Input {
    std::string name;            // "x", "weight"
    std::vector<int64_t> shape;  // -1 for the rows (batch x sequence)
    std::string param;           // the parameter it is, if any ("wte")
    // Dimensions that may be cut unevenly (torch.chunk: the vocabulary).
    std::vector<int> uneven;
  };
  std::vector<Input> inputs;
};

// A parsed file, not yet checked against a model.
// Activation checkpointing of a block (MindSpore's `recompute` on a Cell):
// kFull keeps only the block's input and output and runs the block again
// in backward; kSelective (Korthikanti et al.) runs only the attention core
// again (scores, softmax, weighted sum: the activations that grow with the
// sequence squared). The numbers do not change: the kernels are
// deterministic.
enum class Recompute { kNone, kFull, kSelective };

Result<Recompute> ParseRecompute(std::string_view text);  // none, full, selective
std::string_view RecomputeName(Recompute r);

// What offload keeps on disk (train_gpt --offload, the file's "offload"):
// "none", "optimizer" (Adam's moments), "optimizer,params" (the weights
// too; the kinds in any order).
struct OffloadKinds {
  bool optimizer = false, params = false;
  std::string Name() const;
  bool operator==(const OffloadKinds&) const = default;
};
Result<OffloadKinds> ParseOffload(const std::string& text);

struct OpStrategyFile {
  std::string source;  // the path (or "<text>"), for messages
  std::optional<int> pp, dp, cp, tp, zero, micro_batches, virtual_stages, micro_batch_interleave;
  // Parameter servers (runtime/model/ps_placement.h): how many, and the
  // parameters they hold ("all", or names and patterns; empty: unset).
  std::optional<int> ps_servers;
  std::string ps_params;
  // Asynchronous servers: how many steps a worker may run ahead of the
  // slowest (unset: synchronous).
  std::optional<int> ps_staleness;
  std::optional<CpAlgo> cp_algo;
  // "offload": "optimizer", "optimizer,params" (or "none"); "offload_dir":
  // where its files go.
  std::optional<OffloadKinds> offload;
  std::string offload_dir;
  std::vector<int> stage_layers;
  // "recompute": {"h.*": "selective", "h.0": "full"}: blocks (patterns as
  // for operators; an exact name wins) and none, full or selective.
  std::vector<std::pair<std::string, Recompute>> recompute;
  // MindSpore's dataset_strategy: "data_parallel" (each replica reads its
  // rows of the batch), "full_batch" (every rank reads the whole batch, the
  // strategy cuts it), or the layout of the inputs, [[dp, 1], [dp, 1]] (=
  // data_parallel: the batch cut over dp, the sequence whole), "sequence"
  // (each rank reads its rows and its positions: the batch over dp, the
  // sequence over cp; MindSpore's [[dp, cp], [dp, cp]]). Empty: unset.
  std::string dataset_strategy;
  int dataset_count = 0;      // a split count given for the batch (checked against dp)
  int dataset_seq_count = 0;  // one given for the sequence (checked against cp)
  struct Entry {
    std::string pattern;
    // Per input, per dimension: axis names, or a split count to map.
    std::vector<std::vector<DimAxes>> axes;
    std::vector<std::vector<int64_t>> counts;  // > 1 where a count was given
  };
  std::vector<Entry> operators;

  static Result<OpStrategyFile> Parse(std::string_view json, const std::string& source);
  // The file's text (Parse reads it back to an equal file; split counts
  // are written as counts, axes as names).
  std::string ToJson() const;
  static Result<OpStrategyFile> Load(const std::string& path);
};

// Whether `name` matches `pattern` ('*': one or more characters other than
// '.').
bool MatchesOpPattern(std::string_view pattern, std::string_view name);

// Whether strategy `s` fits operator `op` on `mesh`: as many inputs and
// dimensions as the operator's, axes the mesh has (not "pp"), each at
// most once per input, cutting their dimensions evenly. The error starts
// with `where` and names the operator, the input and the dimension.
Status CheckOpStrategy(const OpSignature& op, const OpStrategy& s, const Mesh& mesh,
                       const std::string& where);

// The strategy of every operator of `ops` on `mesh` (axes "pp", "dp", "tp"
// as ParallelConfig makes them): the file's where it names the operator,
// else data parallel. Errors name the file, the operator, the input and
// the dimension: an unknown operator (a pattern matching none), a wrong
// number of inputs or dimensions, an axis the mesh lacks or that is used
// twice in one input, a cut that does not divide its dimension, an
// ambiguous split count, a parameter given different layouts by two
// operators (both named).
// With `named_only`, only the operators the file names (what a search
// completes).
Result<std::map<std::string, OpStrategy>> ResolveOpStrategies(const OpStrategyFile& file,
                                                              const std::vector<OpSignature>& ops,
                                                              const Mesh& mesh,
                                                              bool named_only = false);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_PARALLEL_OP_STRATEGY_H_
