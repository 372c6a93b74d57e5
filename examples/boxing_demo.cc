// Global tensors on a 2x2 mesh: draw a random matrix split both ways,
// re-lay it out with to_global (the planner picks the collectives), print
// the plan, and check the gathered value against the matrix drawn whole.
//
//   tessel-launch --nproc_per_node 4 -- boxing_demo
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <tessel/tessel.h>

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

DEFINE_int64(rows, 7, "Rows of the logical matrix");
DEFINE_int64(cols, 5, "Columns of the logical matrix");

using namespace tessel;

int main(int argc, char** argv) {
  Init(&argc, &argv);
  TESSEL_CHECK(comm::World().size() == 4)
      << "boxing_demo runs on 4 ranks (a 2x2 mesh), got " << comm::World().size();
  Placement mesh("cpu", {{0, 1}, {2, 3}});
  Tensor x = rand({FLAGS_rows, FLAGS_cols}, mesh, {S(0), S(1)}, /*seed=*/1);  // each rank draws its block
  Tensor y = x.to_global(mesh, {S(1), S(0)});
  if (comm::World().rank() == 0) {
    LOG(INFO) << PlanBoxing(mesh, {S(0), S(1)}, mesh, {S(1), S(0)}, x.shape(), x.dtype()).Explain();
  }
  Tensor all = GatherLogical(y);
  bool same = all.ToVector<float>() == rand({FLAGS_rows, FLAGS_cols}, /*seed=*/1).ToVector<float>();
  LOG(INFO) << "rank " << comm::World().rank() << ": x local " << x.to_local().shape() << " -> y local "
            << y.to_local().shape()
            << "; gathered value equals the matrix drawn whole: " << (same ? "yes" : "NO");
  return same ? 0 : 1;
}
