#include "runtime/cost/pipeline_cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/byte_size.h"
#include "runtime/parallel/pipeline.h"

namespace tessera {
namespace {

// The pipeline's schedule (runtime/parallel/pipeline.h: 1F1B, or
// interleaved over chunks), simulated: each stage's `group` ranks run its
// tasks in the runtime's order, the forwards a third of a micro-batch's
// work through the chunk and the backwards the rest, a forward after the
// previous virtual stage's, a backward after the next one's. Where ranks
// share devices (more ranks than cores) the ranks that have work share the
// `devices` (processor sharing) and those waiting for a neighbour take
// none: the runtime's point-to-point waits sleep (the process's CPU time
// drops: 3.7 s against 4.3 s for dp4 over the same steps on 4 in-process
// ranks on 2 cores; Open MPI's receives poll instead, so mpirun jobs with
// more ranks than cores are priced optimistically). Compute runs at the
// share, collectives and transfers take their own time. Returns the
// pipeline's seconds.
// (A waiting rank takes no share rather than a fraction of a working
// one's: with each kernel measured, a fraction fitted to measured rankings
// ranks no better than this physical 0; BENCHMARKS.md, "Automatic
// parallelism".)
double SimulatePipeline(const std::vector<StageCost>& stages, int m, int rpd, int group,
                        double devices) {
  const int pp = static_cast<int>(stages.size());
  // (A stage priced without chunks, as one.)
  const int v = std::max<int>(1, static_cast<int>(stages[0].chunk_compute.size()));
  constexpr double kForward = 1.0 / 3;
  // Per stage: its next task, which phase of it runs (compute, then
  // collectives and transfers) and what is left of it.
  struct Stage {
    int k = 0;
    bool comm = false, ready = false;
    double left = 0;
  };
  thread_local std::vector<Stage> st;
  const std::vector<PipelineSchedule>& schedules = PipelineSchedules(pp, m, v);
  // Forwards and backwards done per virtual stage (each in micro-batch order).
  thread_local std::vector<int> forwards, backwards;
  st.assign(pp, Stage{});
  forwards.assign(pp * v, 0);
  backwards.assign(pp * v, 0);
  auto task = [&](int s) -> const PipeTask& { return schedules[s].tasks()[st[s].k]; };
  auto part = [&](int s, const PipeTask& t, bool comm) {
    const double frac = t.backward ? 1 - kForward : kForward;
    const StageCost& c = stages[s];
    if (c.chunk_compute.empty()) return frac * (comm ? c.tp_comm + c.pp_comm : c.compute / rpd);
    return frac * (comm ? c.chunk_comm[t.chunk] : c.chunk_compute[t.chunk] / rpd);
  };
  const int tasks = 2 * m * v;
  for (int s = 0; s < pp; ++s) st[s].left = part(s, task(s), false);
  double t = 0;
  int finished = 0;
  while (finished < pp) {
    int active = 0;
    for (int s = 0; s < pp; ++s) {
      Stage& x = st[s];
      if (x.k >= tasks) {
        x.ready = false;
        continue;
      }
      const PipeTask& y = task(s);
      const int vs = y.chunk * pp + s;
      x.ready = y.backward ? (vs == pp * v - 1 || backwards[vs + 1] > y.micro_batch)
                           : (vs == 0 || forwards[vs - 1] > y.micro_batch);
      if (x.ready) active += group;
    }
    if (active == 0) return std::numeric_limits<double>::infinity();  // cannot happen: it ends
    const double rate = std::min(1.0, devices / active);
    double dt = std::numeric_limits<double>::infinity();
    for (const Stage& x : st) {
      if (x.ready) dt = std::min(dt, x.comm ? x.left : x.left / rate);
    }
    t += dt;
    for (int s = 0; s < pp; ++s) {
      Stage& x = st[s];
      if (!x.ready) continue;
      x.left -= x.comm ? dt : dt * rate;
      if (x.left > 1e-15) continue;
      const PipeTask& y = task(s);
      if (!x.comm) {
        x.comm = true;
        x.left = part(s, y, true);
        if (x.left > 0) continue;
      }
      ++(y.backward ? backwards : forwards)[y.chunk * pp + s];
      x.comm = false;
      if (++x.k < tasks) {
        x.left = part(s, task(s), false);
      } else {
        ++finished;
      }
    }
  }
  return t;
}

// Interleaved schedules up to this many stages x micro-batches x chunks
// are simulated, longer ones priced by formula.
constexpr double kSimulatedTasks = 64;

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 1 ? "%.2f ms" : "%.3f s", s < 1 ? s * 1e3 : s);
  return buf;
}

}  // namespace

StepPrediction PriceStep(const std::vector<StageCost>& stages, int m, const MachineProfile& prof,
                         int group, double cutoff) {
  StepPrediction p;
  double sum = 0, slowest = 0, after = 0;
  int slow = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    sum += stages[s].micro;
    if (stages[s].micro > slowest) slowest = stages[s].micro, slow = static_cast<int>(s);
    if (stages[s].after > after) {
      after = stages[s].after;
      p.dp_comm = stages[s].dp_comm;
      p.optimizer = stages[s].optimizer;
    }
    p.stage_seconds.push_back(stages[s].micro);
    p.stage_memory.push_back(stages[s].memory);
    if (stages[s].memory.total() > p.memory.total()) {
      p.memory = stages[s].memory;
      p.memory_stage = static_cast<int>(s);
    }
  }
  p.pipeline = sum + (m - 1) * slowest;
  const int pp = static_cast<int>(stages.size());
  const bool interleaved = stages[0].chunk_compute.size() > 1;
  if (interleaved && prof.ranks_per_device <= 1) {
    // Every rank on its own device: the schedule's critical path,
    // simulated; for long schedules (what the search meets on thousands of
    // devices), Megatron's bubble: each micro-batch through the slowest
    // stage plus one pass of the others' chunks, (pp - 1) / v of a step's.
    const double v = static_cast<double>(stages[0].chunk_compute.size());
    p.pipeline =
        static_cast<double>(pp) * m * v <= kSimulatedTasks
            ? SimulatePipeline(stages, m, 1, group, std::numeric_limits<double>::infinity())
            : m * slowest + (sum - slowest) / v;
  } else if (pp > 1 && prof.ranks_per_device > 1) {
    const int ranks = pp * group;
    const double devices =
        prof.hosts > 0
            ? std::min<double>(ranks, static_cast<double>(prof.hosts) * prof.devices_per_host)
            : ranks;
    // What any schedule takes at least: one stage's own tasks at a whole
    // device, and all stages' compute spread over every device.
    double chain = 0, work = 0;
    for (const StageCost& c : stages) {
      chain = std::max(chain, m * (c.compute / prof.ranks_per_device + c.tp_comm + c.pp_comm));
      work += static_cast<double>(group) * m * c.compute / prof.ranks_per_device;
    }
    const double lower = std::max(chain, work / devices);
    if (lower + after >= cutoff) {
      p.pipeline = lower;
    } else {
      // (1F1B's formula also bounds the shared run; not an interleaved one's.)
      const double simulated = SimulatePipeline(stages, m, prof.ranks_per_device, group, devices);
      p.pipeline = interleaved ? simulated : std::min(p.pipeline, simulated);
    }
  }
  p.compute = m * stages[slow].compute;
  p.tp_comm = m * stages[slow].tp_comm;
  p.pp_comm = m * stages[slow].pp_comm;
  p.bubble = std::max(0.0, p.pipeline - m * slowest);
  p.seconds = p.pipeline + after;
  return p;
}

std::string StepPrediction::ToString() const {
  std::string out =
      "step " + Seconds(seconds) + " (compute " + Seconds(compute) + ", tp collectives " +
      Seconds(tp_comm) + ", pipeline transfers " + Seconds(pp_comm) + ", bubble " +
      Seconds(bubble) + ", gradient sums " + Seconds(dp_comm) + ", update " + Seconds(optimizer) +
      "); largest rank (stage " + std::to_string(memory_stage) + "): " + memory.ToString();
  if (server_memory.total() > 0) out += "; largest parameter server: " + server_memory.ToString();
  return out;
}

std::vector<int> BalanceStages(int layers, int pp, double block, double first, double last) {
  std::vector<double> extra(pp, 0.0);
  extra[0] += first;
  extra[pp - 1] += last;
  if (block <= 0) block = 1e-30;
  // The least X such that stages of at most X seconds hold every layer
  // (each stage at least one): bisection, then the caps it gives.
  auto caps = [&](double x, std::vector<int>* n) {
    int64_t total = 0;
    for (int s = 0; s < pp; ++s) {
      const double c = std::floor((x - extra[s]) / block + 1e-9);
      (*n)[s] = static_cast<int>(std::clamp(c, 0.0, static_cast<double>(layers)));
      total += (*n)[s];
    }
    return total;
  };
  std::vector<int> n(pp);
  double lo = 0, hi = (layers + 1) * block;
  for (double e : extra) hi = std::max(hi, layers * block + e + block);
  for (int i = 0; i < 100 && hi - lo > 1e-6 * block; ++i) {
    const double mid = (lo + hi) / 2;
    bool ok = caps(mid, &n) >= layers;
    for (int v : n) ok = ok && v >= 1;
    (ok ? hi : lo) = mid;
  }
  int64_t total = caps(hi, &n);
  for (int& v : n) v = std::max(v, 1);
  total = 0;
  for (int v : n) total += v;
  // Too many: take layers from the slowest stages (the later one on a tie).
  while (total > layers) {
    int worst = -1;
    for (int s = 0; s < pp; ++s) {
      if (n[s] > 1 && (worst < 0 || n[s] * block + extra[s] >= n[worst] * block + extra[worst]))
        worst = s;
    }
    --n[worst];
    --total;
  }
  return n;
}

}  // namespace tessera
