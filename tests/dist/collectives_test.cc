// Every collective of the Gloo communicator on the world and on subgroups,
// with odd and uneven sizes, in f32 and i64 (plus the other dtypes for
// all-reduce), checking each received value. Run through tessel-launch:
//   tessel-launch --nproc_per_node 4 -- collectives_test
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

#include "core/comm/process_group.h"

namespace tessel::comm {
namespace {

int Me() { return World().rank(); }
int P() { return World().size(); }

// Exactly representable in every tested dtype, distinct per (rank, index).
template <typename T>
T Value(int rank, int64_t i) {
  return static_cast<T>((rank + 1) * 100000 + i);
}
template <>
float Value<float>(int rank, int64_t i) {
  return static_cast<float>(rank + 1) * 0.5f + static_cast<float>(i % 4096) * 0.25f;
}

template <typename T>
class TypedCollectives : public ::testing::Test {};
using Types = ::testing::Types<float, int64_t>;
TYPED_TEST_SUITE(TypedCollectives, Types);

TYPED_TEST(TypedCollectives, AllReduceSumAndMaxOddSizes) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  for (int64_t n : {1, 7, 1001, 300007}) {  // 300007 f32/i64 > Gloo's 1 MiB segment
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<T> buf(n);
      for (int64_t i = 0; i < n; ++i) buf[i] = Value<T>(Me(), i);
      World().AllReduce(buf.data(), n, dtype, op);
      for (int64_t i = 0; i < n; ++i) {
        T want = op == ReduceOp::kMax ? Value<T>(P() - 1, i) : T(0);
        if (op == ReduceOp::kSum) {
          for (int r = 0; r < P(); ++r) want += Value<T>(r, i);
        }
        ASSERT_EQ(buf[i], want) << "n=" << n << " op=" << ReduceOpName(op) << " i=" << i;
      }
    }
  }
}

TYPED_TEST(TypedCollectives, AllGatherAndAllGatherV) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  const int64_t n = 13;
  std::vector<T> in(n), out(n * P());
  for (int64_t i = 0; i < n; ++i) in[i] = Value<T>(Me(), i);
  World().AllGather(in.data(), n, out.data(), dtype);
  for (int r = 0; r < P(); ++r)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[r * n + i], Value<T>(r, i));

  // Uneven, with an empty contribution from rank 1.
  std::vector<int64_t> counts(P());
  for (int r = 0; r < P(); ++r) counts[r] = r == 1 ? 0 : 2 * r + 3;
  std::vector<T> mine(counts[Me()]);
  for (int64_t i = 0; i < counts[Me()]; ++i) mine[i] = Value<T>(Me(), i);
  std::vector<T> all(std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  World().AllGatherV(mine.data(), all.data(), counts, dtype);
  int64_t pos = 0;
  for (int r = 0; r < P(); ++r)
    for (int64_t i = 0; i < counts[r]; ++i) ASSERT_EQ(all[pos++], Value<T>(r, i)) << "from rank " << r;
}

TYPED_TEST(TypedCollectives, ReduceScatterAndReduceScatterV) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  std::vector<int64_t> uneven(P());
  for (int r = 0; r < P(); ++r) uneven[r] = r == 2 ? 0 : 2 * r + 1;
  for (const auto& counts : {std::vector<int64_t>(P(), 11), uneven}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      std::vector<T> in(total), out(counts[Me()]);
      for (int64_t i = 0; i < total; ++i) in[i] = Value<T>(Me(), i);
      World().ReduceScatterV(in.data(), out.data(), counts, dtype, op);
      int64_t start = std::accumulate(counts.begin(), counts.begin() + Me(), int64_t{0});
      for (int64_t i = 0; i < counts[Me()]; ++i) {
        T want = op == ReduceOp::kMax ? Value<T>(P() - 1, start + i) : T(0);
        if (op == ReduceOp::kSum)
          for (int r = 0; r < P(); ++r) want += Value<T>(r, start + i);
        ASSERT_EQ(out[i], want) << "op=" << ReduceOpName(op) << " i=" << i;
      }
    }
  }
}

TYPED_TEST(TypedCollectives, AllToAllAndAllToAllV) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  // Element k of the block src -> dst.
  auto value = [](int src, int dst, int64_t k) { return Value<T>(src, dst * 1000 + k); };
  const int64_t n = 3;
  std::vector<T> in(n * P()), out(n * P());
  for (int d = 0; d < P(); ++d)
    for (int64_t k = 0; k < n; ++k) in[d * n + k] = value(Me(), d, k);
  World().AllToAll(in.data(), out.data(), n, dtype);
  for (int s = 0; s < P(); ++s)
    for (int64_t k = 0; k < n; ++k) ASSERT_EQ(out[s * n + k], value(s, Me(), k));

  // Block sizes depend on (src, dst), several are zero.
  auto count = [](int src, int dst) -> int64_t { return (src + 2 * dst) % 4; };
  std::vector<int64_t> send(P()), recv(P());
  for (int r = 0; r < P(); ++r) {
    send[r] = count(Me(), r);
    recv[r] = count(r, Me());
  }
  std::vector<T> vin, vout(std::accumulate(recv.begin(), recv.end(), int64_t{0}));
  for (int d = 0; d < P(); ++d)
    for (int64_t k = 0; k < send[d]; ++k) vin.push_back(value(Me(), d, k));
  World().AllToAllV(vin.data(), send, vout.data(), recv, dtype);
  int64_t pos = 0;
  for (int s = 0; s < P(); ++s)
    for (int64_t k = 0; k < recv[s]; ++k) ASSERT_EQ(vout[pos++], value(s, Me(), k)) << "from " << s;
}

TYPED_TEST(TypedCollectives, BroadcastFromEveryRoot) {
  using T = TypeParam;
  for (int root = 0; root < P(); ++root) {
    std::vector<T> buf(1001);
    for (int64_t i = 0; i < 1001; ++i) buf[i] = Value<T>(Me(), i);
    World().Broadcast(buf.data(), 1001, DTypeOf<T>::value, root);
    for (int64_t i = 0; i < 1001; ++i) ASSERT_EQ(buf[i], Value<T>(root, i)) << "root " << root;
  }
}

TYPED_TEST(TypedCollectives, SendRecvRingWithTags) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  int next = (Me() + 1) % P(), prev = (Me() + P() - 1) % P();
  std::vector<T> a(777), b(5);
  for (int64_t i = 0; i < 777; ++i) a[i] = Value<T>(Me(), i);
  for (int64_t i = 0; i < 5; ++i) b[i] = Value<T>(Me(), 9000 + i);
  // Two streams to the same peer, received in the opposite order by tag.
  auto sa = World().ISend(a.data(), 777, dtype, next, /*tag=*/1);
  auto sb = World().ISend(b.data(), 5, dtype, next, /*tag=*/2);
  std::vector<T> ra(777), rb(5);
  World().Recv(rb.data(), 5, dtype, prev, /*tag=*/2);
  World().Recv(ra.data(), 777, dtype, prev, /*tag=*/1);
  sa->Wait();
  sb->Wait();
  for (int64_t i = 0; i < 777; ++i) ASSERT_EQ(ra[i], Value<T>(prev, i));
  for (int64_t i = 0; i < 5; ++i) ASSERT_EQ(rb[i], Value<T>(prev, 9000 + i));
}

TEST(Collectives, BlockingSendRecvInRankOrder) {
  // Even ranks send first, odd ranks receive first: no cycle of waits.
  int64_t out = Me() * 10, in = -1;
  int next = (Me() + 1) % P(), prev = (Me() + P() - 1) % P();
  if (Me() % 2 == 0) {
    World().Send(&out, 1, DType::kInt64, next);
    World().Recv(&in, 1, DType::kInt64, prev);
  } else {
    World().Recv(&in, 1, DType::kInt64, prev);
    World().Send(&out, 1, DType::kInt64, next);
  }
  EXPECT_EQ(in, prev * 10);
}

TEST(Collectives, AllReduceOtherDTypes) {
  const int64_t n = 5;
  std::vector<int32_t> i32(n, Me() + 1);
  World().AllReduce(i32.data(), n, DType::kInt32, ReduceOp::kSum);
  for (int32_t v : i32) EXPECT_EQ(v, P() * (P() + 1) / 2);
  std::vector<Float16> f16(n, Float16(static_cast<float>(Me()) + 0.5f));
  World().AllReduce(f16.data(), n, DType::kFloat16, ReduceOp::kMax);
  for (Float16 v : f16) EXPECT_EQ(static_cast<float>(v), P() - 0.5f);
  std::vector<BFloat16> bf16(n, BFloat16(1.0f));
  World().AllReduce(bf16.data(), n, DType::kBFloat16, ReduceOp::kSum);
  for (BFloat16 v : bf16) EXPECT_EQ(static_cast<float>(v), static_cast<float>(P()));
  bool flag[2] = {Me() == 2, false};
  World().AllReduce(flag, 2, DType::kBool, ReduceOp::kMax);
  EXPECT_TRUE(flag[0]);
  EXPECT_FALSE(flag[1]);
  Tensor t = full({3, 3}, Me(), DType::kInt64);
  World().AllReduce(t);
  for (int64_t v : t.ToVector<int64_t>()) EXPECT_EQ(v, P() * (P() - 1) / 2);
}

TEST(Collectives, SubgroupsAreCachedAndIndependent) {
  ASSERT_EQ(P(), 4) << "this test is written for 4 ranks";
  auto odd = GetGroup({1, 3});
  auto reversed = GetGroup({3, 2, 0});  // group order differs from world order
  EXPECT_EQ(odd == nullptr, Me() % 2 == 0);
  EXPECT_EQ(reversed == nullptr, Me() == 1);
  EXPECT_EQ(GetGroup({1, 3}), odd);  // cached
  if (odd) {
    EXPECT_EQ(odd->rank(), Me() / 2);
    int64_t v = Me();
    odd->AllReduce(&v, 1, DType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(v, 4);
  }
  if (reversed) {
    std::vector<int> expect_rank = {2, -1, 1, 0};
    EXPECT_EQ(reversed->rank(), expect_rank[Me()]);
    EXPECT_EQ(reversed->world_ranks(), (std::vector<int>{3, 2, 0}));
    int64_t v = Me() == 3 ? 77 : -1;
    reversed->Broadcast(&v, 1, DType::kInt64, /*root=*/0);  // group rank 0 is world rank 3
    EXPECT_EQ(v, 77);
    std::vector<int64_t> all(3);
    int64_t mine = Me();
    reversed->AllGather(&mine, 1, all.data(), DType::kInt64);
    EXPECT_EQ(all, (std::vector<int64_t>{3, 2, 0}));
  }
  World().Barrier();
}

// Asynchronous collectives return at once and run on the group's thread in
// the order issued; a blocking call waits for them first.
TEST(Collectives, AsyncCollectivesReturnAtOnceAndKeepOrder) {
  const int64_t n = 1000;
  std::vector<float> a(n, 1.0f + Me()), b(n, 10.0f * (Me() + 1));
  std::vector<int64_t> gathered(P()), mine = {Me() * 7};
  int64_t root_value = Me() == 1 ? 42 : -1;
  // Rank 0 arrives late: everyone else's calls must return before it does.
  if (Me() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  auto wa = World().IAllReduce(a.data(), n, DType::kFloat32, ReduceOp::kSum);
  auto wb = World().IAllReduce(b.data(), n, DType::kFloat32, ReduceOp::kMax);
  auto wg = World().IAllGatherV(mine.data(), gathered.data(), std::vector<int64_t>(P(), 1), DType::kInt64);
  auto wr = World().IBroadcast(&root_value, 1, DType::kInt64, /*root=*/1);
  const double issue_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (Me() != 0) {
    EXPECT_LT(issue_s, 0.1) << "issuing asynchronous collectives blocked";
    EXPECT_GT(World().QueuedCollectives(), 0u);  // rank 0 has not arrived yet
  }
  int64_t after = 1;  // a blocking collective after the queued ones
  World().AllReduce(&after, 1, DType::kInt64, ReduceOp::kSum);
  EXPECT_EQ(World().QueuedCollectives(), 0u);
  wa->Wait();
  wb->Wait();
  wg->Wait();
  wr->Wait();
  const float sum = static_cast<float>(P() * (P() + 1)) / 2;
  for (int64_t i = 0; i < n; i += 99) {
    ASSERT_EQ(a[i], sum);
    ASSERT_EQ(b[i], 10.0f * P());
  }
  for (int r = 0; r < P(); ++r) EXPECT_EQ(gathered[r], r * 7);
  EXPECT_EQ(root_value, 42);
  EXPECT_EQ(after, P());
}

TEST(Collectives, AsyncErrorsSurfaceInWait) {
  std::vector<float> buf(4);
  // Bad arguments fail where the call is made.
  EXPECT_THROW(World().IAllGatherV(buf.data(), buf.data(), {1, 1}, DType::kFloat32), Error);
  EXPECT_THROW(World().IBroadcast(buf.data(), 4, DType::kFloat32, 9), Error);
  // A collective that fails on the group's thread fails its Wait, named.
  auto pair = GetGroup({0, 2});
  if (pair) {
    pair->Close();
    auto work = pair->IAllReduce(buf.data(), 4, DType::kFloat32, ReduceOp::kSum);
    try {
      work->Wait();
      ADD_FAILURE() << "an all-reduce on a closed group succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("closed"), std::string::npos) << e.what();
    }
  }
  World().Barrier();
}

// A group is complete on every member when GetGroup returns anywhere, so a
// member may close it (or leave) at once: before, a peer that had not yet
// seen its connection complete failed with "Connection closed by peer".
// Every ordered list of two or more ranks is its own group.
TEST(Collectives, GroupsMayBeClosedAsSoonAsMade) {
  int made = 0;
  for (int mask = 0; mask < (1 << P()); ++mask) {
    std::vector<int> ranks;
    for (int r = 0; r < P(); ++r)
      if (mask & (1 << r)) ranks.push_back(r);
    if (ranks.size() < 2 || ranks.size() == static_cast<size_t>(P())) continue;
    do {
      auto group = GetGroup(ranks);
      if (group) {
        group->Close();
        ++made;
      }
    } while (std::next_permutation(ranks.begin(), ranks.end()));
  }
  EXPECT_GT(made, 0);
  World().Barrier();
}

// Tags by channel: transfers of two channels posted in opposite orders on
// the two sides still meet their own peers.
TEST(Collectives, TagChannelsKeepConcurrentTransfersApart) {
  EXPECT_EQ(Communicator::MakeTag(1, 5), (1u << 24) | 5u);
  EXPECT_EQ(Communicator::MakeTag(2, (1u << 24) + 3), (2u << 24) | 3u);  // the sequence wraps in its bits
  const int next = (Me() + 1) % P(), prev = (Me() + P() - 1) % P();
  const uint8_t pipe_a = Communicator::kFirstFreeChannel, pipe_b = Communicator::kFirstFreeChannel + 1;
  using D = Communicator::Direction;
  std::vector<int64_t> send_a(3, Me() * 100 + 1), send_b(5, Me() * 100 + 2), recv_a(3, -1), recv_b(5, -1);
  std::vector<std::unique_ptr<Work>> pending;
  pending.push_back(
      World().ISend(send_a.data(), 3, DType::kInt64, next, World().NextTag(pipe_a, next, D::kSend)));
  pending.push_back(
      World().ISend(send_b.data(), 5, DType::kInt64, next, World().NextTag(pipe_b, next, D::kSend)));
  pending.push_back(
      World().IRecv(recv_b.data(), 5, DType::kInt64, prev, World().NextTag(pipe_b, prev, D::kRecv)));
  pending.push_back(
      World().IRecv(recv_a.data(), 3, DType::kInt64, prev, World().NextTag(pipe_a, prev, D::kRecv)));
  for (auto& w : pending) w->Wait();
  EXPECT_EQ(recv_a, std::vector<int64_t>(3, prev * 100 + 1));
  EXPECT_EQ(recv_b, std::vector<int64_t>(5, prev * 100 + 2));
  // The next message on a channel gets the next sequence number.
  EXPECT_EQ(World().NextTag(pipe_a, next, D::kSend), Communicator::MakeTag(pipe_a, 1));
  EXPECT_EQ(World().NextTag(pipe_a, prev, D::kRecv), Communicator::MakeTag(pipe_a, 1));
}

TEST(Collectives, BadArgumentsAreNamed) {
  std::vector<float> buf(4);
  try {
    World().AllGatherV(buf.data(), buf.data(), {1, 1}, DType::kFloat32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "all_gather on gloo group [0, 1, 2, 3] got 2 counts; expected one per member (4)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(World().Broadcast(buf.data(), 4, DType::kFloat32, 9), Error);
  EXPECT_THROW(GetGroup({0, 0}), Error);
  EXPECT_THROW(GetGroup({0, 17}), Error);
}

}  // namespace
}  // namespace tessel::comm
