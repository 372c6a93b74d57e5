// Seed example: a column-parallel Linear 2048 -> 32768 on 2 ranks (tp = 2).
// Each rank holds half of the output features: local output [32, 16384].
//
//   tessel-launch --nproc_per_node 2 -- linear_col_parallel
#include <tessel/tessel.h>

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

using namespace tessel;

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  dist::Setup({.tensor_parallel_size = 2});
  layers::Linear fc(2048, 32768, {.parallel = layers::Parallel::kCol});
  Tensor x = rand({32, 2048}, dist::GetLayerPlacement(0), dist::GetNdSbp({S(0), B()}));
  Tensor y = fc(x);
  LOG(INFO) << "rank " << dist::Rank() << " local shape " << y.to_local().shape();
  return y.to_local().shape() == Shape{32, 16384} ? 0 : 1;
}
