// Uses only tessel::core from the install: start-up and a collective.
#include <tessel/core/comm/process_group.h>
#include <tessel/core/init.h>
#include <tessel/core/tensor.h>

#include <iostream>

int main(int argc, char** argv) {
  tessel::InitProcess(&argc, &argv);
  auto& world = tessel::comm::World();
  tessel::Tensor t = tessel::Tensor::FromVector<float>({1, 2, 3}, {3});
  world.AllReduce(t);
  const bool ok = t.ToVector<float>() ==
                  std::vector<float>{1.0f * world.size(), 2.0f * world.size(), 3.0f * world.size()};
  std::cout << "core consumer: world " << world.size() << ", all_reduce " << (ok ? "ok" : "WRONG")
            << std::endl;
  return ok ? 0 : 1;
}
