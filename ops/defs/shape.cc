// reshape and transpose.
#include "ops/cpu/transpose.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"

namespace tessel {

void RegisterShapeOps() {
  OpDef reshape;
  reshape.name = "reshape";
  reshape.inputs = {"x"};
  reshape.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    Shape shape(a.Get<std::vector<int64_t>>("shape"));
    TESSEL_CHECK(shape.numel() == in[0].shape.numel())
        << "reshape of " << in[0].shape << " (" << in[0].shape.numel() << " elements) to " << shape << " ("
        << shape.numel() << " elements)";
    return std::vector<TensorSpec>{{shape, in[0].dtype}};
  };
  // A split of dimension 0 survives when dimension 0 is unchanged.
  reshape.sbp = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    const auto& shape = a.Get<std::vector<int64_t>>("shape");
    std::vector<SbpSignature> out = {{{P()}, {P()}}};
    if (!shape.empty() && in[0].shape.ndim() > 0 && shape[0] == in[0].shape[0])
      out.push_back({{S(0)}, {S(0)}});
    return out;
  };
  reshape.local_attrs = [](const Attrs& a, const std::vector<TensorSpec>& logical,
                           const std::vector<TensorSpec>& local) {
    std::vector<int64_t> shape = a.Get<std::vector<int64_t>>("shape");
    if (!shape.empty() && local[0].shape.ndim() > 0 && local[0].shape.numel() != logical[0].shape.numel()) {
      shape[0] = local[0].shape[0];  // split on dimension 0
    }
    Attrs out = a;
    return out.Set("shape", shape);
  };
  reshape.kernels[DeviceType::kCPU] = [](const std::vector<Tensor>& in, const Attrs& a) {
    return std::vector<Tensor>{in[0].Clone().Reshape(Shape(a.Get<std::vector<int64_t>>("shape")))};
  };
  reshape.grad = [](const GradContext& c) {
    return std::vector<Tensor>{fn::reshape(c.grad_outputs[0], c.inputs[0].shape())};
  };
  RegisterOp(std::move(reshape));

  OpDef transpose;
  transpose.name = "transpose";
  transpose.inputs = {"x"};
  transpose.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    std::vector<int64_t> dims = in[0].shape.dims();
    std::swap(dims[in[0].shape.NormalizeAxis(a.Get<int64_t>("dim0"))],
              dims[in[0].shape.NormalizeAxis(a.Get<int64_t>("dim1"))]);
    return std::vector<TensorSpec>{{Shape(dims), in[0].dtype}};
  };
  transpose.sbp = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    int64_t d0 = in[0].shape.NormalizeAxis(a.Get<int64_t>("dim0"));
    int64_t d1 = in[0].shape.NormalizeAxis(a.Get<int64_t>("dim1"));
    std::vector<SbpSignature> out = {{{P()}, {P()}}};
    for (int64_t d = 0; d < in[0].shape.ndim(); ++d) {
      int64_t to = d == d0 ? d1 : d == d1 ? d0 : d;
      out.push_back({{S(static_cast<int>(d))}, {S(static_cast<int>(to))}});
    }
    return out;
  };
  transpose.kernels[DeviceType::kCPU] = [](const std::vector<Tensor>& in, const Attrs& a) {
    return std::vector<Tensor>{cpu::Transpose(in[0], a.Get<int64_t>("dim0"), a.Get<int64_t>("dim1"))};
  };
  transpose.grad = [](const GradContext& c) {
    return std::vector<Tensor>{
        fn::transpose(c.grad_outputs[0], c.attrs.Get<int64_t>("dim0"), c.attrs.Get<int64_t>("dim1"))};
  };
  RegisterOp(std::move(transpose));
}

}  // namespace tessel
