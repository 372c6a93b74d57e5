// Uses the installed headers and libraries: start-up, a collective, a global
// tensor re-laid out by boxing, and a functional op with autograd.
#include <tessel/tessel.h>

#include <iostream>

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

using namespace tessel;

int main(int argc, char** argv) {
  Init(&argc, &argv);
  auto& world = comm::World();
  Tensor t = arange({2, 3}, DType::kInt64);
  world.AllReduce(t);
  int64_t sum = 0;
  for (int64_t v : t.ToVector<int64_t>()) sum += v;

  std::vector<int> ranks(world.size());
  for (int r = 0; r < world.size(); ++r) ranks[r] = r;
  Placement all("cpu", ranks);
  Tensor g = rand({5, 3}, all, {S(0)}, 7).to_global(all, {B()});
  bool same = g.to_local().ToVector<float>() == rand({5, 3}, 7).ToVector<float>();

  Tensor w = randn({4, 3}, 1).set_requires_grad(true);
  fn::sum(fn::matmul(ones({2, 4}), w), {}).backward();  // d/dw = 2 everywhere
  bool grad_ok = w.grad().ToVector<float>() == std::vector<float>(12, 2.0f);

  std::cout << "consumer: world " << world.size() << ", all_reduce sum " << sum << ", boxing "
            << (same ? "ok" : "WRONG") << ", autograd " << (grad_ok ? "ok" : "WRONG") << std::endl;
  return sum == 15 * world.size() && same && grad_ok ? 0 : 1;
}
