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
#include "sbp/global_tensor.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

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
  EXPECT_TRUE(m.defined());
  EXPECT_TRUE(m.is_lazy());
  EXPECT_EQ(m.shape(), (Shape{3, 5}));
  EXPECT_EQ(m.dtype(), DType::kFloat32);
  EXPECT_EQ(m.nbytes(), 0u);
  EXPECT_EQ(m.raw_data(), nullptr);
  EXPECT_NE(ErrorOf([&] { m.data<float>(); }).find("lazy"), std::string::npos);
  // The original keeps its data.
  EXPECT_FALSE(t.is_lazy());
  EXPECT_EQ(t.ToVector<float>().size(), 15u);
}

// The eager interpreter refuses a lazy input before any work, naming the op
// and the input.
TEST(LazyTensor, EagerOpsRefuseLazyInputsNamingThem) {
  Tensor lazy = Tensor::Lazy({2, 3}, DType::kFloat32);
  Tensor x = randn({2, 3}, 1);
  std::string msg = ErrorOf([&] { fn::add(x, lazy); });
  EXPECT_NE(msg.find("op 'add'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("input b is lazy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
}

// Lazy tensors flow through an interpreter that only computes metadata: the
// same op definitions give shapes and dtypes without any data, which is
// what a graph builder needs from the handle.
TEST(LazyTensor, AnInterpreterCanPropagateLazyValues) {
  class ShapeOnly final : public Interpreter {
   public:
    std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs,
                              const Attrs& attrs) override {
      std::vector<TensorSpec> specs;
      for (const Tensor& t : inputs) specs.push_back({t.shape(), t.dtype()});
      std::vector<Tensor> outs;
      for (const TensorSpec& s : op.infer(specs, attrs)) outs.push_back(Tensor::Lazy(s.shape, s.dtype));
      return outs;
    }
  } shape_only;
  InterpreterScope scope(shape_only);
  Tensor a = Tensor::Lazy({4, 8}, DType::kFloat32);
  Tensor b = Tensor::Lazy({8, 16}, DType::kFloat32);
  Tensor y = fn::relu(fn::matmul(a, b));
  EXPECT_TRUE(y.is_lazy());
  EXPECT_EQ(y.shape(), (Shape{4, 16}));
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  EXPECT_EQ(y.ToString(), "Tensor(f32, [4, 16], cpu, lazy)");
}

// Autograd state lives in the tensor's implementation: handle copies share
// it, and a same-layout to_global with another gradient layout records a
// node without touching the leaf's state.
TEST(Autograd, StateIsSharedByHandles) {
  Tensor w = randn({4}, 3);
  Tensor alias = w;
  alias.set_requires_grad(true);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(w.impl_ptr(), alias.impl_ptr());
  Tensor d = w.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.raw_data(), w.raw_data());

  const Placement one("cpu", std::vector<int>{0});
  Tensor g = w.detach().to_global(one, {B()});
  g.set_requires_grad(true);
  Tensor same = g.to_global(one, {B()}, {B()});
  fn::sum(fn::mul(same, same), {0}).backward();
  ASSERT_TRUE(g.grad().defined());
  std::vector<float> wv = w.ToVector<float>(), gv = g.grad().to_local().ToVector<float>();
  for (size_t i = 0; i < wv.size(); ++i) EXPECT_NEAR(gv[i], 2 * wv[i], 1e-6);
}

// An inner interpreter may hand back an input as a result (a pass-through);
// the autograd layer gives that result a handle of its own, so recording
// the op does not turn the input leaf into a computed tensor.
TEST(Autograd, ResultsAliasingInputsGetTheirOwnHandles) {
  class PassThrough final : public Interpreter {
   public:
    std::vector<Tensor> Apply(const OpDef&, const std::vector<Tensor>& inputs, const Attrs&) override {
      return {inputs[0]};
    }
  } pass_through;
  AutogradInterpreter autograd(pass_through);
  Tensor x = randn({3}, 4).set_requires_grad(true);
  Tensor y;
  {
    InterpreterScope scope(autograd);
    y = fn::relu(x);
  }
  EXPECT_NE(y.impl_ptr(), x.impl_ptr());
  EXPECT_EQ(y.raw_data(), x.raw_data());
  // x is still a leaf: turning requires_grad off is refused only for
  // computed tensors.
  EXPECT_EQ(ErrorOf([&] { x.set_requires_grad(false); }), "");
  EXPECT_NE(ErrorOf([&] { y.set_requires_grad(false); }).find("computed by an op"), std::string::npos);
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
