// Every CPU kernel, forward and backward, against PyTorch computed when the
// test runs: cases are written to a scratch directory, torch_reference.py
// (run once, with Debian's python3-torch) computes outputs and input
// gradients for the same upstream gradients, and each is compared within
// 1e-5 relative (see RelError).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "core/tensor.h"
#include "ops/cpu/cross_entropy.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/layer_norm.h"
#include "ops/cpu/reduce.h"
#include "ops/cpu/softmax.h"

#ifndef TESSEL_TORCH_PYTHON
#define TESSEL_TORCH_PYTHON "/usr/bin/python3"
#endif

namespace tessel::cpu {
namespace {

namespace fs = std::filesystem;

struct Input {
  Tensor value;
  bool grad = false;  // compare this input's gradient
};

// One op application: inputs, attributes for the torch side, and the tessel
// forward and backward (dy -> gradients of the inputs marked grad).
struct Case {
  std::string name, op, attrs_json;
  std::vector<Input> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> forward;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&, const Tensor& y, const Tensor& dy)> backward;
};

std::string ListJson(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str() + "]";
}

void WriteRaw(const fs::path& path, const Tensor& t) {
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(t.raw_data()), t.nbytes());
}

Tensor ReadRaw(const fs::path& path, const Shape& shape) {
  Tensor t = Tensor::Empty(shape, DType::kFloat32);
  std::ifstream in(path, std::ios::binary);
  in.read(static_cast<char*>(t.raw_data()), t.nbytes());
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(t.nbytes())) << "short reference file " << path;
  return t;
}

// Worst |a - b| / (|b| + mean |b|): relative to each element where it is
// large, relative to the tensor's typical size where it is tiny. 1e-5 passes.
double RelError(const Tensor& got, const Tensor& want) {
  const float* a = got.data<float>();
  const float* b = want.data<float>();
  double mean = 0, worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) mean += std::abs(b[i]);
  mean = std::max(mean / static_cast<double>(std::max<int64_t>(want.numel(), 1)), 1e-12);
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    double diff = std::abs(static_cast<double>(a[i]) - b[i]);
    worst = std::max(worst, diff / (std::abs(static_cast<double>(b[i])) + mean));
  }
  return worst;
}

uint64_t g_seed = 1;
Tensor Randn(const Shape& s) { return randn(s, g_seed++); }
Tensor Rand(const Shape& s, float lo, float hi) {
  Tensor t = rand(s, g_seed++);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  return t;
}

Tensor Ones(const Shape& s) { return ones(s); }
Tensor Scale(const Tensor& t, double s) { return BinaryScalar(BinaryOp::kMul, t, s); }

std::vector<Case> MakeCases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.name = c.op + "_" + std::to_string(cases.size());
    cases.push_back(std::move(c));
  };

  // matmul with transposes, batches and a shared 2-D operand.
  struct MM {
    Shape a, b;
    bool ta, tb;
  };
  for (const MM& m : {MM{{7, 5}, {5, 3}, false, false}, MM{{5, 7}, {5, 3}, true, false},
                      MM{{7, 5}, {3, 5}, false, true}, MM{{5, 7}, {3, 5}, true, true},
                      MM{{2, 7, 5}, {2, 5, 3}, false, false}, MM{{3, 7, 5}, {5, 4}, false, false},
                      MM{{2, 5, 7}, {2, 3, 5}, true, true}, MM{{33, 65}, {65, 17}, false, false}}) {
    std::ostringstream attrs;
    attrs << "{\"ta\": " << (m.ta ? "true" : "false") << ", \"tb\": " << (m.tb ? "true" : "false") << "}";
    add({"",
         "matmul",
         attrs.str(),
         {{Randn(m.a), true}, {Randn(m.b), true}},
         [m](const std::vector<Tensor>& in) { return Matmul(in[0], in[1], m.ta, m.tb); },
         [m](const std::vector<Tensor>& in, const Tensor&, const Tensor& dy) {
           const Tensor &a = in[0], &b = in[1];
           Tensor da = m.ta ? Matmul(b, dy, m.tb, true) : Matmul(dy, b, false, !m.tb);
           Tensor db = m.tb ? Matmul(dy, a, true, m.ta) : Matmul(a, dy, !m.ta, false);
           return std::vector<Tensor>{SumToShape(da, a.shape()), SumToShape(db, b.shape())};
         }});
  }

  // Broadcasting binary ops.
  struct BinCase {
    Shape a, b;
  };
  for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
    for (const BinCase& s : {BinCase{{7, 5, 3}, {7, 5, 3}}, BinCase{{7, 5, 3}, {3}},
                             BinCase{{7, 1, 3}, {5, 1}}, BinCase{{1}, {4, 3}}, BinCase{{6, 1}, {6, 9}}}) {
      Tensor b = op == BinaryOp::kDiv ? Rand(s.b, 0.5f, 2.0f) : Randn(s.b);
      add({"",
           BinaryOpName(op),
           "{}",
           {{Randn(s.a), true}, {b, true}},
           [op](const std::vector<Tensor>& in) { return Binary(op, in[0], in[1]); },
           [op](const std::vector<Tensor>& in, const Tensor&, const Tensor& dy) {
             const Tensor &a = in[0], &b = in[1];
             Tensor da, db;
             switch (op) {
               case BinaryOp::kAdd:
                 da = dy, db = dy;
                 break;
               case BinaryOp::kSub:
                 da = dy, db = Unary(UnaryOp::kNeg, dy);
                 break;
               case BinaryOp::kMul:
                 da = Binary(BinaryOp::kMul, dy, b), db = Binary(BinaryOp::kMul, dy, a);
                 break;
               case BinaryOp::kDiv:
                 da = Binary(BinaryOp::kDiv, dy, b);
                 db = Unary(UnaryOp::kNeg, Binary(BinaryOp::kDiv, Binary(BinaryOp::kMul, dy, a),
                                                  Binary(BinaryOp::kMul, b, b)));
                 break;
             }
             return std::vector<Tensor>{SumToShape(da, a.shape()), SumToShape(db, b.shape())};
           }});
    }
    add({"",
         std::string(BinaryOpName(op)) + "_scalar",
         "{\"scalar\": 1.75}",
         {{Randn({5, 7}), true}},
         [op](const std::vector<Tensor>& in) { return BinaryScalar(op, in[0], 1.75); },
         [op](const std::vector<Tensor>&, const Tensor&, const Tensor& dy) {
           double s = op == BinaryOp::kMul ? 1.75 : op == BinaryOp::kDiv ? 1 / 1.75 : 1.0;
           return std::vector<Tensor>{Scale(dy, s)};
         }});
  }

  // Activations.
  for (UnaryOp op : {UnaryOp::kRelu, UnaryOp::kGeluErf, UnaryOp::kGeluTanh, UnaryOp::kTanh, UnaryOp::kExp,
                     UnaryOp::kNeg}) {
    for (const Shape& s : {Shape{7, 5, 3}, Shape{1001}}) {
      add({"",
           UnaryOpName(op),
           "{}",
           {{Scale(Randn(s), 2.0), true}},
           [op](const std::vector<Tensor>& in) { return Unary(op, in[0]); },
           [op](const std::vector<Tensor>& in, const Tensor&, const Tensor& dy) {
             return std::vector<Tensor>{UnaryGrad(op, in[0], dy)};
           }});
    }
  }

  // Reductions.
  struct Red {
    std::vector<int64_t> axes;
    bool keepdim;
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
    for (const Red& r : {Red{{0}, false}, Red{{-1}, true}, Red{{0, 2}, false}, Red{{1}, true}}) {
      std::ostringstream attrs;
      attrs << "{\"axes\": " << ListJson(r.axes) << ", \"keepdim\": " << (r.keepdim ? "true" : "false")
            << "}";
      add({"",
           ReduceOpName(op),
           attrs.str(),
           {{Randn({7, 5, 3}), true}},
           [op, r](const std::vector<Tensor>& in) { return Reduce(op, in[0], r.axes, r.keepdim); },
           [op, r](const std::vector<Tensor>& in, const Tensor&, const Tensor& dy) {
             const Tensor& x = in[0];
             Tensor keep_dy = dy.Reshape(Reduce(ReduceOp::kSum, x, r.axes, true).shape());
             if (op == ReduceOp::kMax) return std::vector<Tensor>{ReduceMaxGrad(x, r.axes, keep_dy)};
             Tensor g = Binary(BinaryOp::kMul, Ones(x.shape()), keep_dy);
             double count = static_cast<double>(x.numel()) / static_cast<double>(keep_dy.numel());
             return std::vector<Tensor>{op == ReduceOp::kMean ? Scale(g, 1.0 / count) : g};
           }});
    }
  }

  // Softmax: plain, scaled, padding mask, causal (square and rectangular).
  struct Soft {
    Shape shape;
    float scale;
    bool mask, causal;
  };
  for (const Soft& s : {Soft{{7, 5}, 1.0f, false, false}, Soft{{2, 3, 5, 5}, 0.125f, false, true},
                        Soft{{2, 3, 4, 6}, 0.5f, false, true}, Soft{{2, 3, 5, 7}, 0.25f, true, false}}) {
    std::ostringstream attrs;
    attrs << "{\"scale\": " << s.scale << ", \"causal\": " << (s.causal ? "true" : "false") << "}";
    std::vector<Input> inputs = {{Scale(Randn(s.shape), 3.0), true}};
    if (s.mask) {  // [batch, 1, 1, k] padding mask, the last two keys padded
      Tensor mask = Tensor::Empty({s.shape[0], 1, 1, s.shape[-1]}, DType::kBool);
      for (int64_t i = 0; i < mask.numel(); ++i) mask.data<bool>()[i] = i % s.shape[-1] < s.shape[-1] - 2;
      inputs.push_back({mask, false});
    }
    add({"", "softmax", attrs.str(), inputs,
         [s](const std::vector<Tensor>& in) {
           return Softmax(in[0], {s.scale, in.size() > 1 ? in[1] : Tensor(), s.causal});
         },
         [s](const std::vector<Tensor>&, const Tensor& y, const Tensor& dy) {
           return std::vector<Tensor>{SoftmaxGrad(y, dy, s.scale)};
         }});
  }

  // Layer norm with weight and bias.
  for (const Shape& s : {Shape{7, 5}, Shape{2, 3, 33}}) {
    int64_t d = s[-1];
    add({"",
         "layer_norm",
         "{\"eps\": 1e-05}",
         {{Scale(Randn(s), 3.0), true}, {Rand({d}, 0.5f, 1.5f), true}, {Randn({d}), true}},
         [](const std::vector<Tensor>& in) { return LayerNorm(in[0], in[1], in[2], 1e-5f).y; },
         [](const std::vector<Tensor>& in, const Tensor&, const Tensor& dy) {
           LayerNormResult r = LayerNorm(in[0], in[1], in[2], 1e-5f);
           LayerNormGrads g = LayerNormGrad(dy, in[0], r.mean, r.rstd, in[1]);
           return std::vector<Tensor>{g.dx, g.dgamma, g.dbeta};
         }});
  }

  // Sparse cross-entropy with an ignored row.
  for (int64_t classes : {5, 1000}) {
    const int64_t n = 7;
    Tensor labels = Tensor::Empty({n}, DType::kInt64);
    for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = i == 3 ? -100 : (i * 7919) % classes;
    add({"",
         "cross_entropy",
         "{\"ignore_index\": -100}",
         {{Scale(Randn({n, classes}), 2.0), true}, {labels, false}},
         [](const std::vector<Tensor>& in) { return SparseCrossEntropy(in[0], in[1]); },
         [](const std::vector<Tensor>& in, const Tensor&, const Tensor& dy) {
           return std::vector<Tensor>{SparseCrossEntropyGrad(in[0], in[1], dy)};
         }});
  }
  return cases;
}

TEST(KernelParity, ForwardAndBackwardMatchPyTorch) {
  fs::path dir = fs::temp_directory_path() / ("tessel_parity_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<Case> cases = MakeCases();
  std::vector<Tensor> outputs, dys;
  std::ostringstream manifest;
  manifest << "[";
  for (size_t c = 0; c < cases.size(); ++c) {
    Case& k = cases[c];
    std::vector<Tensor> in;
    manifest << (c ? "," : "") << "{\"name\": \"" << k.name << "\", \"op\": \"" << k.op
             << "\", \"attrs\": " << k.attrs_json << ", \"inputs\": [";
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      const Tensor& t = k.inputs[i].value;
      std::string file = k.name + ".in" + std::to_string(i);
      WriteRaw(dir / file, t);
      manifest << (i ? "," : "") << "{\"file\": \"" << file << "\", \"shape\": " << ListJson(t.shape().dims())
               << ", \"dtype\": \"" << DTypeName(t.dtype())
               << "\", \"grad\": " << (k.inputs[i].grad ? "true" : "false") << "}";
      in.push_back(t);
    }
    manifest << "]}";
    outputs.push_back(k.forward(in));
    dys.push_back(Randn(outputs.back().shape()));
    WriteRaw(dir / (k.name + ".dy"), dys.back());
  }
  manifest << "]";
  std::ofstream(dir / "cases.json") << manifest.str();

  std::string cmd = std::string(TESSEL_TORCH_PYTHON) + " " +
                    TESSEL_SOURCE_DIR "/tests/ops/torch_reference.py " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the PyTorch reference failed: " << cmd;

  std::map<std::string, int> checked;
  int total = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    Case& k = cases[c];
    SCOPED_TRACE(k.name + " " + k.attrs_json);
    std::vector<Tensor> in;
    for (const Input& i : k.inputs) in.push_back(i.value);
    Tensor want = ReadRaw(dir / (k.name + ".out"), outputs[c].shape());
    EXPECT_LE(RelError(outputs[c], want), 1e-5) << "forward";
    std::vector<Tensor> grads = k.backward(in, outputs[c], dys[c]);
    size_t g = 0;
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      if (!k.inputs[i].grad) continue;
      Tensor ref = ReadRaw(dir / (k.name + ".grad" + std::to_string(g)), k.inputs[i].value.shape());
      ASSERT_EQ(grads.at(g).shape(), ref.shape()) << "gradient " << i;
      EXPECT_LE(RelError(grads[g], ref), 1e-5) << "gradient of input " << i;
      ++g;
    }
    ++checked[k.op];
    ++total;
  }
  std::ostringstream summary;
  for (const auto& [op, n] : checked) summary << " " << op << ":" << n;
  std::printf("kernel parity vs PyTorch: %d op/case pairs, forward and backward (%zu ops):%s\n", total,
              checked.size(), summary.str().c_str());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel::cpu
