// The interpreter stack: scopes nest per thread, threads without a scope use
// the process default, a missing interpreter is a clear error, autograd is
// a layer over any interpreter, and recorded ops keep only the values their
// gradients read.
#include "ops/interpreter.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "graph/autograd.h"
#include "graph/eager_interpreter.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"

namespace tessel {
namespace {

using testing::ErrorOf;

// Runs ops eagerly and records their names (a stand-in for a tracer that
// must see every op applied on its thread).
class Recorder final : public Interpreter {
 public:
  std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) override {
    names.push_back(op.name);
    return EagerInterpreter().Apply(op, inputs, attrs);
  }
  std::vector<std::string> names;
};

TEST(InterpreterStack, ScopesNestAndRestore) {
  Recorder outer, inner;
  Tensor x = Tensor::FromVector<float>({1, 2}, {2});
  {
    InterpreterScope o(outer);
    fn::add(x, x);
    {
      InterpreterScope i(inner);
      fn::mul(x, x);
      EXPECT_EQ(&CurrentInterpreter(), &inner);
    }
    fn::neg(x);
    EXPECT_EQ(&CurrentInterpreter(), &outer);
  }
  EXPECT_EQ(outer.names, (std::vector<std::string>{"add", "neg"}));
  EXPECT_EQ(inner.names, (std::vector<std::string>{"mul"}));
  EXPECT_EQ(&CurrentInterpreter(), DefaultInterpreter());
  EXPECT_EQ(DefaultInterpreter(), &EagerAutogradInterpreter());
}

TEST(InterpreterStack, ScopesAreThreadLocal) {
  Recorder tracer;
  InterpreterScope scope(tracer);
  Interpreter* seen_by_other = nullptr;
  std::thread other([&] {
    seen_by_other = &CurrentInterpreter();
    fn::add(Tensor::FromVector<float>({1}, {1}), Tensor::FromVector<float>({2}, {1}));
  });
  other.join();
  EXPECT_EQ(seen_by_other, &EagerAutogradInterpreter());
  EXPECT_TRUE(tracer.names.empty()) << "an op on another thread reached this thread's interpreter";
}

TEST(InterpreterStack, NoInterpreterSaysHowToInstallOne) {
  Interpreter* previous = SetDefaultInterpreter(nullptr);
  std::string error = ErrorOf([] { fn::neg(Tensor::FromVector<float>({1}, {1})); });
  SetDefaultInterpreter(previous);
  EXPECT_NE(error.find("no interpreter"), std::string::npos) << error;
  EXPECT_NE(error.find("tessel::Init"), std::string::npos) << error;
}

TEST(InterpreterStack, AutogradIsALayerOverAnyInterpreter) {
  Recorder below;
  AutogradInterpreter autograd(below);
  InterpreterScope scope(autograd);
  Tensor x = Tensor::FromVector<float>({1, -2, 3}, {3}).set_requires_grad(true);
  Tensor loss = fn::sum(fn::mul(x, x), {});
  EXPECT_TRUE(loss.requires_grad());
  const size_t forward_ops = below.names.size();
  loss.backward();  // the gradient ops go through the same stack
  EXPECT_EQ(x.grad().ToVector<float>(), (std::vector<float>{2, -4, 6}));
  EXPECT_GT(below.names.size(), forward_ops) << "backward ops bypassed the current interpreter";
}

TEST(InterpreterStack, EagerWithoutAutogradRecordsNothing) {
  InterpreterScope scope(EagerInterpreter());
  Tensor x = Tensor::FromVector<float>({1, 2}, {2}).set_requires_grad(true);
  EXPECT_FALSE(fn::mul(x, x).requires_grad());
}

// A recorded op keeps only what its gradient reads: mul_scalar nothing,
// softmax its output, not its input. So after the forward pass, the
// intermediate `a` is freed once the caller drops it, and backward is right.
TEST(SavedForGrad, ActivationsTheGradientDoesNotReadAreFreed) {
  Allocator* cpu = GetAllocator(Device::CPU());
  const int64_t rows = 256, cols = 1024, bytes = rows * cols * 4;  // 1 MiB per activation
  Tensor x = randn({rows, cols}, 3).set_requires_grad(true);
  const int64_t before = cpu->stats().allocated_bytes;
  Tensor y;
  {
    Tensor a = fn::mul_scalar(x, 2.0);
    y = fn::softmax(a);
  }
  const int64_t kept = cpu->stats().allocated_bytes - before;
  EXPECT_GE(kept, bytes);      // y
  EXPECT_LT(kept, 2 * bytes);  // not a: neither mul_scalar nor softmax saved it
  // d/dx sum(softmax(2x) * w) against the closed form 2 * y * (w - sum(y * w)).
  Tensor w = randn({rows, cols}, 4);
  fn::sum(fn::mul(y, w), {}).backward();
  std::vector<float> yv = y.detach().ToVector<float>(), wv = w.ToVector<float>(),
                     g = x.grad().ToVector<float>();
  for (int64_t r = 0; r < rows; r += 37) {
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) dot += yv[r * cols + c] * wv[r * cols + c];
    for (int64_t c = 0; c < cols; c += 101) {
      const int64_t i = r * cols + c;
      EXPECT_NEAR(g[i], 2 * yv[i] * (wv[i] - dot), 1e-6) << "row " << r << " col " << c;
    }
  }
}

TEST(SavedForGrad, MetadataOnlyKeepsShapeAndDtypeButNoData) {
  Tensor t = randn({3, 5}, 1);
  Tensor m = t.metadata_only();
  EXPECT_FALSE(m.defined());
  EXPECT_EQ(m.shape(), (Shape{3, 5}));
  EXPECT_EQ(m.dtype(), DType::kFloat32);
  EXPECT_NE(ErrorOf([&] { m.data<float>(); }).find("undefined"), std::string::npos);
}

// A kernel sees typed context, not rewritten attributes: on local tensors
// the logical specs are the local ones and every box is whole.
TEST(KernelContext, LocalRunsSeeWholeBoxesAndLogicalAttributes) {
  static std::vector<std::string> seen;
  static bool registered = [] {
    OpDef def;
    def.name = "test_kernel_context_probe";
    def.inputs = {"x"};
    def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
      return std::vector<TensorSpec>{{Shape{in[0].shape[0]}, in[0].dtype}};
    };
    def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
      seen = {ctx.input_box(0).ToString(),
              ctx.output_box(0).ToString(),
              ctx.logical_inputs[0].shape.ToString(),
              ctx.logical_outputs[0].shape.ToString(),
              ctx.output_shape(0).ToString(),
              ctx.device.ToString(),
              ctx.stream == nullptr ? "host" : "stream",
              std::to_string(ctx.attrs.Get<int64_t>("k"))};
      return std::vector<Tensor>{zeros(ctx.output_shape(0))};
    };
    RegisterOp(std::move(def));
    return true;
  }();
  ASSERT_TRUE(registered);
  Tensor y = ApplyOp("test_kernel_context_probe", {ones({3, 5})}, {{"k", int64_t{7}}}).at(0);
  EXPECT_EQ(y.shape(), (Shape{3}));
  EXPECT_EQ(seen,
            (std::vector<std::string>{"[0:3, 0:5]", "[0:3]", "[3, 5]", "[3]", "[3]", "cpu", "host", "7"}));
}

}  // namespace
}  // namespace tessel
