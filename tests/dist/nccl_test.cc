// The NCCL communicator on GPU buffers: every collective against values
// worked out here, on the world's ranks. With fewer GPUs than ranks (ranks
// sharing a device) NCCL cannot form the group: that must be a clear error,
// not a hang. Without a GPU: "skipped: no CUDA device" (TESSEL_REQUIRE_GPU=1
// fails instead).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>

#include "core/comm/nccl_communicator.h"
#include "core/comm/process_group.h"
#include "core/cuda/cuda_runtime.h"
#include "core/tensor.h"
#include "tests/testing/test_util.h"

namespace tessel::comm {
namespace {

bool SkipWithoutGpu() {
  if (cuda::DeviceCount() > 0) return false;
  const char* required = std::getenv("TESSEL_REQUIRE_GPU");
  if (required != nullptr && std::string(required) == "1") {
    ADD_FAILURE() << "TESSEL_REQUIRE_GPU=1 but no CUDA device is visible";
    return true;
  }
  return true;
}

#define SKIP_WITHOUT_GPU() \
  if (SkipWithoutGpu()) GTEST_SKIP() << "skipped: no CUDA device"

std::vector<int> AllRanks() {
  std::vector<int> all(World().size());
  std::iota(all.begin(), all.end(), 0);
  return all;
}

Device MyGpu() { return RankDevice(DeviceType::kCUDA); }

std::unique_ptr<NcclCommunicator> MakeNccl(const std::string& name, int timeout_s = 60) {
  return std::make_unique<NcclCommunicator>(GetStore(), "test/" + name, AllRanks(), World().rank(),
                                            MyGpu().index(), std::chrono::seconds(timeout_s));
}

Tensor OnGpu(const std::vector<float>& v) {
  return Tensor::FromVector<float>(v, {static_cast<int64_t>(v.size())}).To(MyGpu());
}
std::vector<float> Host(const Tensor& t) { return t.To(Device::CPU()).ToVector<float>(); }

bool SharedGpu() { return cuda::DeviceCount() < World().size(); }

TEST(Nccl, CollectivesGiveTheExpectedValues) {
  SKIP_WITHOUT_GPU();
  if (SharedGpu()) GTEST_SKIP() << "ranks share a GPU: see RanksSharingAGpuAreAClearError";
  auto nccl = MakeNccl("collectives");
  const int n = nccl->size(), me = nccl->rank();
  EXPECT_EQ(nccl->backend(), "nccl");

  Tensor x = OnGpu({1.0f * (me + 1), -2.0f * me, 0.5f});
  nccl->AllReduce(x.raw_data(), 3, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(Host(x), (std::vector<float>{n * (n + 1) / 2.0f, -1.0f * n * (n - 1), 0.5f * n}));
  Tensor m = OnGpu({1.0f * me, -1.0f * me});
  nccl->AllReduce(m.raw_data(), 2, DType::kFloat32, ReduceOp::kMax);
  EXPECT_EQ(Host(m), (std::vector<float>{n - 1.0f, 0.0f}));

  // Uneven blocks: member r holds r + 1 values, all equal to r.
  std::vector<int64_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r + 1;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  Tensor mine = OnGpu(std::vector<float>(me + 1, static_cast<float>(me)));
  Tensor gathered = Tensor::Empty({total}, DType::kFloat32, MyGpu());
  nccl->AllGatherV(mine.raw_data(), gathered.raw_data(), counts, DType::kFloat32);
  std::vector<float> want;
  for (int r = 0; r < n; ++r) want.insert(want.end(), counts[r], static_cast<float>(r));
  EXPECT_EQ(Host(gathered), want);
  // Even blocks take NCCL's all-gather.
  Tensor even = Tensor::Empty({2 * n}, DType::kFloat32, MyGpu());
  Tensor two = OnGpu({1.0f * me, 10.0f * me});
  nccl->AllGather(two.raw_data(), 2, even.raw_data(), DType::kFloat32);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(Host(even)[2 * r], 1.0f * r);
    EXPECT_EQ(Host(even)[2 * r + 1], 10.0f * r);
  }

  // Reduce-scatter: every member sends 1..total; member r gets its block summed n times.
  std::vector<float> ramp(total);
  std::iota(ramp.begin(), ramp.end(), 1.0f);
  Tensor send = OnGpu(ramp);
  Tensor block = Tensor::Empty({counts[me]}, DType::kFloat32, MyGpu());
  nccl->ReduceScatterV(send.raw_data(), block.raw_data(), counts, DType::kFloat32, ReduceOp::kSum);
  const int64_t begin = me * (me + 1) / 2;
  std::vector<float> want_block;
  for (int64_t i = 0; i < counts[me]; ++i) want_block.push_back(static_cast<float>(n) * ramp[begin + i]);
  EXPECT_EQ(Host(block), want_block);

  // All-to-all: member s sends value 100 s + r to member r.
  std::vector<float> out_values(n);
  for (int r = 0; r < n; ++r) out_values[r] = 100.0f * me + r;
  Tensor a2a_in = OnGpu(out_values), a2a_out = Tensor::Empty({n}, DType::kFloat32, MyGpu());
  nccl->AllToAll(a2a_in.raw_data(), a2a_out.raw_data(), 1, DType::kFloat32);
  for (int s = 0; s < n; ++s) EXPECT_EQ(Host(a2a_out)[s], 100.0f * s + me);

  Tensor b = OnGpu({me == n - 1 ? 7.0f : 0.0f, me == n - 1 ? 8.0f : 0.0f});
  nccl->Broadcast(b.raw_data(), 2, DType::kFloat32, n - 1);
  EXPECT_EQ(Host(b), (std::vector<float>{7.0f, 8.0f}));
  nccl->Barrier();

  if (n > 1) {  // a ring of sends and receives
    Tensor ring_out = OnGpu({static_cast<float>(me)}), ring_in = OnGpu({-1.0f});
    auto recv = nccl->IRecv(ring_in.raw_data(), 1, DType::kFloat32, (me + n - 1) % n);
    auto send = nccl->ISend(ring_out.raw_data(), 1, DType::kFloat32, (me + 1) % n);
    send->Wait();
    recv->Wait();
    EXPECT_EQ(Host(ring_in)[0], static_cast<float>((me + n - 1) % n));
  }
}

TEST(Nccl, RanksSharingAGpuAreAClearError) {
  SKIP_WITHOUT_GPU();
  if (!SharedGpu()) GTEST_SKIP() << "every rank has its own GPU";
  std::string error = testing::ErrorOf([&] { MakeNccl("shared", 20); });
  EXPECT_NE(error.find("NCCL"), std::string::npos) << error;
}

}  // namespace
}  // namespace tessel::comm
