// Where a parameter-server job keeps its parameters (MindSpore's
// set_ps_context mode): ranks [0, S) of the world are servers, the rest
// workers. A parameter placed on the servers is held, with its Adam
// moments, by one server (or, when large, cut by rows of dimension 0 over
// all of them: the embedding by vocabulary rows); the workers push its
// gradient there each step and pull its new value. The others stay on
// the workers, averaged among them as in data parallelism.
//
// The placement is a pure function of the model's parameter list, S and
// the patterns, so every rank computes the same one without talking:
//  1. the parameters the patterns name ("all": every one; else a list of
//     names where '*' is one dot-free part, as for operators);
//  2. with S > 1, each 2-D-or-more parameter bigger than the servers' fair
//     share (its bytes > the named parameters' bytes / S) with at least S
//     rows is cut into S contiguous row ranges as torch.chunk cuts them,
//     range k on server k;
//  3. the rest whole, largest first (ties: first in the model's order), each
//     onto the server holding the fewest bytes so far (ties: the lowest):
//     the LPT rule, within 4/3 of the best balance, where MindSpore's
//     `index % S` can put every matrix on one server.
// Every server must hold something: more servers than there are pieces to
// place is an error naming --ps-servers.
#ifndef TESSERA_RUNTIME_MODEL_PS_PLACEMENT_H_
#define TESSERA_RUNTIME_MODEL_PS_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/model/gpt.h"
#include "transform/strategy.h"

namespace tessera {

// One server's share of one parameter: rows [row_begin, row_end) of
// dimension 0 (all of them when the parameter is whole).
struct PsPiece {
  size_t param = 0;  // index in the model's parameter list
  std::string name;
  int64_t row_begin = 0, row_end = 0;
  int64_t offset = 0, count = 0;  // elements, in the flat parameter vector
  bool decay = false;
  int server = 0;
  bool whole = true;  // the piece is the whole parameter
};

class PsPlacement {
 public:
  // `params`: the whole model's (one stage, no tp). `patterns`: "all" or
  // comma-separated names/patterns (errors name the pattern matching
  // nothing). `servers` >= 1.
  static Result<PsPlacement> Create(const std::vector<ParamInfo>& params, int servers,
                                    const std::string& patterns);
  int servers() const { return servers_; }
  // Every piece, in the model's parameter order (then by rows).
  const std::vector<PsPiece>& pieces() const { return pieces_; }
  // The parameters left on the workers (indices, in order).
  const std::vector<size_t>& local() const { return local_; }
  bool OnServers(size_t param) const { return on_servers_[param]; }
  // The pieces server `s` holds (indices into pieces()).
  std::vector<size_t> PiecesOf(int s) const;
  int64_t ServerFloats(int s) const;
  int64_t LocalFloats() const;
  // "server 0: wte[0:25129), h.0.attn.c_attn.weight, ... (12.3 MiB); ...".
  std::string Describe() const;

 private:
  int servers_ = 1;
  std::vector<PsPiece> pieces_;
  std::vector<size_t> local_;
  std::vector<bool> on_servers_;
  std::vector<int64_t> param_floats_;
};

// The largest message of a step's push or pull, in floats: 4 MiB, or more
// when the pieces would need more than 16,000 messages (MPI's tags). A
// server folds through W - 1 buffers of it.
int64_t PsMessageFloats(const PsPlacement& placement);

// The layouts of a parameter-server job's checkpoint (a sliced save by
// every rank of the world, servers first): the strategy's mesh is the
// world, {"rank": world}; a parameter on the servers lives on a mesh of
// its own, {"server": S}, cut by rows over it (dim 0 split over "server")
// or whole on its server (stage_axis "server", stage k); one the workers
// keep is on ranks S .. world - 1 (stage_axis "rank", stage S, the other
// workers as copy stages, so one of them writes it). The moments
// ("optimizer.<name>.exp_avg", "...exp_avg_sq") have their parameter's
// layout. Any reader loads it into any other configuration (regions).
// With every parameter on the servers, `world` may be S: the servers' own
// save (asynchronous servers with replaceable workers).
Result<Strategy> PsStrategy(const std::vector<ParamInfo>& params, const PsPlacement& placement,
                            int world);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_PS_PLACEMENT_H_
