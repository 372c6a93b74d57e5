#include "ops/cpu/nn_kernels.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/philox.h"

namespace tessel::cpu {

Tensor Dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset,
               const std::vector<int64_t>& box_begin, const std::vector<int64_t>& logical_shape) {
  TESSEL_CHECK(x.dtype() == DType::kFloat32) << "dropout supports f32, got " << x.dtype();
  TESSEL_CHECK(p >= 0 && p < 1) << "dropout probability " << p << " must be in [0, 1)";
  const Shape& shape = x.shape();
  const int64_t nd = shape.ndim();
  std::vector<int64_t> strides = Shape(logical_shape).ContiguousStrides(), idx(nd, 0);
  const Philox gen(seed);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const float* in = x.data<float>();
  Tensor out = Tensor::Empty(shape, DType::kFloat32);
  float* y = out.data<float>();
  for (int64_t i = 0; i < shape.numel(); ++i) {
    int64_t flat = 0;
    for (int64_t d = 0; d < nd; ++d) flat += (box_begin[d] + idx[d]) * strides[d];
    y[i] = gen.Uniform(offset + static_cast<uint64_t>(flat)) >= p ? in[i] * scale : 0.0f;
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape.dims()[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

Tensor Embedding(const Tensor& table, const Tensor& ids, int64_t vocab_begin) {
  TESSEL_CHECK(table.dtype() == DType::kFloat32 && table.ndim() == 2 && ids.dtype() == DType::kInt64)
      << "embedding needs an f32 table [V, H] and i64 ids; got " << table.ToString() << " and "
      << ids.ToString();
  const int64_t rows = table.shape()[0], h = table.shape()[1];
  std::vector<int64_t> dims = ids.shape().dims();
  dims.push_back(h);
  Tensor out = Tensor::Empty(Shape(dims), DType::kFloat32);
  const float* t = table.data<float>();
  const int64_t* id = ids.data<int64_t>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    int64_t r = id[i] - vocab_begin;
    if (r >= 0 && r < rows) {
      std::memcpy(o + i * h, t + r * h, h * sizeof(float));
    } else {
      std::memset(o + i * h, 0, h * sizeof(float));
    }
  }
  return out;
}

Tensor EmbeddingGrad(const Tensor& ids, const Tensor& dy, int64_t vocab_begin, int64_t rows,
                     int64_t padding_idx) {
  const int64_t h = dy.shape()[-1];
  Tensor out = Tensor::Empty({rows, h}, DType::kFloat32);
  std::memset(out.raw_data(), 0, out.nbytes());
  const int64_t* id = ids.data<int64_t>();
  const float* g = dy.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    int64_t r = id[i] - vocab_begin;
    if (r < 0 || r >= rows || id[i] == padding_idx) continue;
    for (int64_t c = 0; c < h; ++c) o[r * h + c] += g[i * h + c];
  }
  return out;
}

Tensor Pick(const Tensor& x, const Tensor& labels, int64_t class_begin, int64_t ignore_index) {
  const int64_t n = x.shape()[0], c = x.shape()[1];
  Tensor out = Tensor::Empty({n}, DType::kFloat32);
  const float* in = x.data<float>();
  const int64_t* y = labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t j = y[i] - class_begin;
    out.data<float>()[i] = y[i] != ignore_index && j >= 0 && j < c ? in[i * c + j] : 0.0f;
  }
  return out;
}

Tensor PickGrad(const Tensor& labels, const Tensor& dy, int64_t class_begin, int64_t columns,
                int64_t ignore_index) {
  const int64_t n = labels.numel();
  Tensor out = Tensor::Empty({n, columns}, DType::kFloat32);
  std::memset(out.raw_data(), 0, out.nbytes());
  const int64_t* y = labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t j = y[i] - class_begin;
    if (y[i] != ignore_index && j >= 0 && j < columns)
      out.data<float>()[i * columns + j] = dy.data<float>()[i];
  }
  return out;
}

namespace {
// Calls fn(patch_element_index, image_element_index) for every element.
template <typename Fn>
void ForEachPatchElement(const Shape& image, int64_t p, Fn fn) {
  const int64_t b = image[0], c = image[1], h = image[2], w = image[3];
  const int64_t ph = h / p, pw = w / p, n = ph * pw, k = c * p * p;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t py = 0; py < ph; ++py)
      for (int64_t px = 0; px < pw; ++px)
        for (int64_t ci = 0; ci < c; ++ci)
          for (int64_t ky = 0; ky < p; ++ky)
            for (int64_t kx = 0; kx < p; ++kx) {
              int64_t patch = (bi * n + py * pw + px) * k + (ci * p + ky) * p + kx;
              int64_t pixel = ((bi * c + ci) * h + py * p + ky) * w + px * p + kx;
              fn(patch, pixel);
            }
}
}  // namespace

Tensor Patchify(const Tensor& x, int64_t patch) {
  const Shape& s = x.shape();
  TESSEL_CHECK(x.dtype() == DType::kFloat32 && s.ndim() == 4 && patch > 0 && s[2] % patch == 0 &&
               s[3] % patch == 0)
      << "patchify needs f32 images [B, C, H, W] with H and W divisible by the patch size " << patch
      << "; got " << x.ToString();
  Tensor out = Tensor::Empty({s[0], (s[2] / patch) * (s[3] / patch), s[1] * patch * patch}, DType::kFloat32);
  const float* in = x.data<float>();
  float* o = out.data<float>();
  ForEachPatchElement(s, patch, [&](int64_t pe, int64_t px) { o[pe] = in[px]; });
  return out;
}

Tensor Unpatchify(const Tensor& patches, const Shape& image_shape, int64_t patch) {
  Tensor out = Tensor::Empty(image_shape, DType::kFloat32);
  const float* in = patches.data<float>();
  float* o = out.data<float>();
  ForEachPatchElement(image_shape, patch, [&](int64_t pe, int64_t px) { o[px] = in[pe]; });
  return out;
}

void AdamWUpdate(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamWConfig& c) {
  const Tensor& p = param;
  float* pp = param.data<float>();
  float* pm = exp_avg.data<float>();
  float* pv = exp_avg_sq.data<float>();
  const float* g = grad.data<float>();
  const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(c.step));
  const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(c.step));
  for (int64_t i = 0; i < p.numel(); ++i) {
    pp[i] = static_cast<float>(pp[i] * (1 - c.lr * c.weight_decay));
    pm[i] = static_cast<float>(c.beta1 * pm[i] + (1 - c.beta1) * g[i]);
    pv[i] = static_cast<float>(c.beta2 * pv[i] + (1 - c.beta2) * g[i] * g[i]);
    const double denom = std::sqrt(pv[i]) / std::sqrt(bc2) + c.eps;
    pp[i] = static_cast<float>(pp[i] - c.lr / bc1 * pm[i] / denom);
  }
}

void SgdUpdate(const Tensor& param, const Tensor& grad, const Tensor& buffer, double lr, double momentum,
               double weight_decay, bool first) {
  const Tensor& p = param;
  float* pp = param.data<float>();
  float* pb = buffer.data<float>();
  const float* g = grad.data<float>();
  for (int64_t i = 0; i < p.numel(); ++i) {
    const double d = g[i] + weight_decay * pp[i];
    pb[i] = static_cast<float>(first || momentum == 0 ? d : momentum * pb[i] + d);
    pp[i] = static_cast<float>(pp[i] - lr * (momentum == 0 ? d : pb[i]));
  }
}

}  // namespace tessel::cpu
