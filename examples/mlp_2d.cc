// Seed example: a 2-D parallel MLP on 4 ranks, data parallel 2 x tensor
// parallel 2: a column-parallel 1024 -> 16384 Linear, GELU, a row-parallel
// 16384 -> 1024 Linear. The batch of 32 is split over dp and the output
// reduced over tp: each rank's local output is [16, 1024].
//
//   tessel-launch --nproc_per_node 4 -- mlp_2d
#include <tessel/tessel.h>

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

using namespace tessel;

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  dist::Setup({.data_parallel_size = 2, .tensor_parallel_size = 2});
  layers::Linear fc1(1024, 16384, {.parallel = layers::Parallel::kCol});
  layers::Linear fc2(16384, 1024, {.parallel = layers::Parallel::kRow, .seed = 99});
  Tensor x = rand({32, 1024}, dist::GetLayerPlacement(0), dist::GetNdSbp({S(0), B()}));
  Tensor y = fc2(fn::gelu(fc1(x)));
  LOG(INFO) << "rank " << dist::Rank() << " local shape " << y.to_local().shape() << " (" << y.nd_sbp()
            << " on " << y.placement() << ")";
  return y.to_local().shape() == Shape{16, 1024} ? 0 : 1;
}
