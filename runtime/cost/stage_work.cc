#include "runtime/cost/stage_work.h"

#include <algorithm>

namespace tessera {

int64_t StageWork::shared_bytes() const {
  int64_t n = 0;
  for (int64_t b : shared) n += b;
  return n;
}

void StageWork::AddCollective(CollectiveKind kind, double b) {
  const int k = static_cast<int>(kind);
  ++comm_count[k];
  comm_bytes[k] += b;
}

void StageWork::Add(const StageWork& o) { AddTimes(o, 1); }

void StageWork::AddTimes(const StageWork& o, int64_t n) {
  if (n <= 0) return;
  flops += o.flops * n;
  bytes += o.bytes * n;
  for (int k = 0; k < kKernelCount; ++k) kernel[k] += o.kernel[k] * n;
  for (int k = 0; k < kCollectiveKinds; ++k) {
    comm_count[k] += o.comm_count[k] * static_cast<int>(n);
    comm_bytes[k] += o.comm_bytes[k] * n;
  }
  slot_bytes += o.slot_bytes * n;
  for (int i = 0; i < kSharedBuffers; ++i) shared[i] = std::max(shared[i], o.shared[i]);
  tp_sum_floats += o.tp_sum_floats * n;
  for (int k = 0; k < kCollectiveKinds; ++k) {
    cp_count[k] += o.cp_count[k] * static_cast<int>(n);
    cp_bytes[k] += o.cp_bytes[k] * n;
  }
  for (int k = 0; k < kKernelCount; ++k) cp_hiding[k] += o.cp_hiding[k] * n;
  cp_buffer_bytes = std::max(cp_buffer_bytes, o.cp_buffer_bytes);
}

void Grow(StageWork* w, int id, int64_t bytes) { w->shared[id] = std::max(w->shared[id], bytes); }

StageWork Since(const StageWork& now, const StageWork& before) {
  StageWork d;
  d.flops = now.flops - before.flops;
  d.bytes = now.bytes - before.bytes;
  for (int k = 0; k < kKernelCount; ++k) d.kernel[k] = now.kernel[k] - before.kernel[k];
  for (int k = 0; k < kCollectiveKinds; ++k) {
    d.comm_count[k] = now.comm_count[k] - before.comm_count[k];
    d.comm_bytes[k] = now.comm_bytes[k] - before.comm_bytes[k];
    d.cp_count[k] = now.cp_count[k] - before.cp_count[k];
    d.cp_bytes[k] = now.cp_bytes[k] - before.cp_bytes[k];
  }
  for (int k = 0; k < kKernelCount; ++k) d.cp_hiding[k] = now.cp_hiding[k] - before.cp_hiding[k];
  return d;
}

double ComputeSeconds(const StageWork& w, const MachineProfile& p) {
  double t = p.ComputeSeconds(w.flops, w.bytes);
  for (int k = 0; k < kKernelCount; ++k) {
    if (w.kernel[k] > 0) t += p.KernelSeconds(static_cast<Kernel>(k), w.kernel[k]);
  }
  return t;
}

double GroupCommSeconds(const StageWork& w, const MachineProfile& p, int group) {
  const bool inter = p.CrossesHosts(1, group);
  double t = 0;
  for (int k = 0; k < kCollectiveKinds; ++k) {
    const int n = w.comm_count[k];
    if (n > 0) {
      t += n *
           p.CollectiveSeconds(static_cast<CollectiveKind>(k), w.comm_bytes[k] / n, group, inter);
    }
  }
  return t;
}

double CpCommSeconds(const StageWork& w, const MachineProfile& p, int cp, int stride) {
  if (cp <= 1) return 0;
  const bool inter = p.CrossesHosts(stride, cp);
  double blocking = 0, ring = 0;
  for (int k = 0; k < kCollectiveKinds; ++k) {
    const int n = w.cp_count[k];
    if (n == 0) continue;
    const double t =
        n * p.CollectiveSeconds(static_cast<CollectiveKind>(k), w.cp_bytes[k] / n, cp, inter);
    (static_cast<CollectiveKind>(k) == CollectiveKind::kSendRecv ? ring : blocking) += t;
  }
  double hiding = 0;
  for (int k = 0; k < kKernelCount; ++k) {
    if (w.cp_hiding[k] > 0) hiding += p.KernelSeconds(static_cast<Kernel>(k), w.cp_hiding[k]);
  }
  return blocking + std::max(0.0, ring - hiding);
}

}  // namespace tessera
