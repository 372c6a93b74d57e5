// Each rank draws its own rows of one logical random matrix (Philox keyed by
// the logical element index), the ranks all-gather the rows, and every rank
// checks the result equals the matrix drawn whole on one process: random
// values do not depend on how a tensor is split. Then a sum all-reduce.
//
//   tessel-launch --nproc_per_node 4 -- global_random_demo --rows 7 --cols 5
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <tessel/tessel.h>

#include <numeric>

DEFINE_int64(rows, 7, "Rows of the logical matrix (any size; split unevenly if needed)");
DEFINE_int64(cols, 5, "Columns of the logical matrix");
DEFINE_uint64(seed, 2024, "Random seed");

using namespace tessel;

int main(int argc, char** argv) {
  Init(&argc, &argv);
  auto& world = comm::World();
  const int p = world.size(), me = world.rank();
  TESSEL_CHECK(FLAGS_rows >= 0 && FLAGS_cols >= 0) << "--rows and --cols must be >= 0";

  // Balanced split: the first rows % p ranks get one extra row.
  std::vector<int64_t> rows(p, FLAGS_rows / p), counts(p);
  for (int r = 0; r < FLAGS_rows % p; ++r) ++rows[r];
  for (int r = 0; r < p; ++r) counts[r] = rows[r] * FLAGS_cols;
  int64_t first_row = std::accumulate(rows.begin(), rows.begin() + me, int64_t{0});

  Tensor mine = rand({rows[me], FLAGS_cols}, FLAGS_seed, /*offset=*/first_row * FLAGS_cols);
  Tensor gathered = Tensor::Empty({FLAGS_rows, FLAGS_cols}, DType::kFloat32);
  world.AllGatherV(mine.raw_data(), gathered.raw_data(), counts, DType::kFloat32);
  Tensor whole = rand({FLAGS_rows, FLAGS_cols}, FLAGS_seed);
  bool same = gathered.ToVector<float>() == whole.ToVector<float>();
  LOG(INFO) << "rank " << me << " of " << p << " holds rows [" << first_row << ", " << first_row + rows[me]
            << ") local shape " << mine.shape() << "; gathered == drawn whole: " << (same ? "yes" : "NO");

  Tensor ones_t = ones({3}, DType::kInt64);
  world.AllReduce(ones_t);
  LOG(INFO) << "rank " << me << " all_reduce(ones) = " << ones_t.ToVector<int64_t>()[0] << " (expected " << p
            << ")";
  return same && ones_t.ToVector<int64_t>()[0] == p ? 0 : 1;
}
