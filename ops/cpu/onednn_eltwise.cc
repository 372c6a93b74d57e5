#include "ops/cpu/onednn_eltwise.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>

#include "core/bounded_cache.h"

namespace tessel::cpu {
namespace {

dnnl::algorithm Algorithm(Eltwise f) {
  switch (f) {
    case Eltwise::kGeluErf:
      return dnnl::algorithm::eltwise_gelu_erf;
    case Eltwise::kGeluTanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
    case Eltwise::kExp:
      break;
  }
  return dnnl::algorithm::eltwise_exp;
}

const dnnl::engine& CpuEngine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // lives for the process
  return *engine;
}

dnnl::memory::desc Flat(int64_t n) {
  return dnnl::memory::desc({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
}

// Per thread: oneDNN runs a primitive on the thread that made it (and ops
// run on the actor runtime's threads as well as the caller's).
dnnl::primitive Primitive(Eltwise f, bool backward, int64_t n) {
  thread_local BoundedCache<std::string, dnnl::primitive> cache(256);
  const std::string key = std::to_string(static_cast<int>(f)) + (backward ? "b" : "f") + std::to_string(n);
  if (std::optional<dnnl::primitive> p = cache.Get(key)) return *p;
  const dnnl::algorithm alg = Algorithm(f);
  const dnnl::memory::desc md = Flat(n);
  const dnnl::eltwise_forward::primitive_desc forward(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, md, 0.0f, 0.0f), CpuEngine());
  dnnl::primitive p = backward
                          ? dnnl::primitive(dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(
                                dnnl::eltwise_backward::desc(alg, md, md, 0.0f, 0.0f), CpuEngine(), forward)))
                          : dnnl::primitive(dnnl::eltwise_forward(forward));
  cache.Put(key, p);
  return p;
}

dnnl::memory Memory(int64_t n, const float* p) {
  return dnnl::memory(Flat(n), CpuEngine(), const_cast<float*>(p));  // oneDNN's handles are not const
}

}  // namespace

void EltwiseForward(Eltwise f, const float* x, float* y, int64_t n) {
  if (n == 0) return;
  dnnl::stream stream(CpuEngine());
  Primitive(f, false, n).execute(stream, {{DNNL_ARG_SRC, Memory(n, x)}, {DNNL_ARG_DST, Memory(n, y)}});
  stream.wait();
}

void EltwiseBackward(Eltwise f, const float* x, const float* dy, float* dx, int64_t n) {
  if (n == 0) return;
  dnnl::stream stream(CpuEngine());
  Primitive(f, true, n)
      .execute(stream, {{DNNL_ARG_SRC, Memory(n, x)},
                        {DNNL_ARG_DIFF_DST, Memory(n, dy)},
                        {DNNL_ARG_DIFF_SRC, Memory(n, dx)}});
  stream.wait();
}

}  // namespace tessel::cpu
