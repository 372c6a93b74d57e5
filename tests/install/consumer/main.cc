// Uses the installed headers and library: start-up, a tensor, a collective.
#include <tessel/tessel.h>

#include <iostream>

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  tessel::Tensor t = tessel::arange({2, 3}, tessel::DType::kInt64);
  tessel::comm::World().AllReduce(t);
  int64_t sum = 0;
  for (int64_t v : t.ToVector<int64_t>()) sum += v;
  std::cout << "consumer: world " << tessel::comm::World().size() << ", " << t.ToString() << ", sum " << sum
            << std::endl;
  return sum == 15 * tessel::comm::World().size() ? 0 : 1;
}
