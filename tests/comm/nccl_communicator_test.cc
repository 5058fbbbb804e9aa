// The NCCL communicator where there may be no GPU (built whenever comm/ has NCCL; label dist):
// it is compiled and linked; without a CUDA device it fails at once with one error naming NCCL and
// the device, before any rank waits in the rendezvous (with one, a world of one opens); NCCL's
// unique id travels from rank 0 to the others through the shared rendezvous store (threads as
// ranks; ncclGetUniqueId needs no GPU); the job runner's choice refuses simt and reports a missing
// GPU with the engine's own device error.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "nccl_unique_id.h"
#include "rendezvous.h"
#include "traind/comm/distributed.h"
#include "traind/comm/nccl_communicator.h"
#include "traind/engine/devices.h"
#include "free_port.h"

namespace traind::comm {
namespace {

using Clock = std::chrono::steady_clock;

using comm_test::FreePort;

DistributedOptions Opts(int world, int rank, int port, int timeout_ms = 10000) {
  DistributedOptions o;
  o.world_size = world;
  o.rank = rank;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.prefix = "nccl-test/" + std::to_string(port) + "/0/";
  o.rendezvous_timeout = std::chrono::milliseconds(timeout_ms);
  o.collective_timeout = std::chrono::milliseconds(20000);
  return o;
}

// What this machine has: the test checks the branch it is on (it never skips).
int CudaDevices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

TEST(NcclCommunicator, IsBuilt) { EXPECT_TRUE(NcclBuilt()); }

TEST(NcclCommunicator, WithoutAGpuFailsAtOnceNamingNcclAndTheDevice) {
  if (CudaDevices() > 0) {  // a GPU machine: a world of one opens, sums and closes
    auto comm = OpenNcclCommunicator(Opts(1, 0, FreePort()), 0);
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    EXPECT_EQ((*comm)->name(), "nccl");
    EXPECT_TRUE((*comm)->Barrier().ok());
    return;
  }
  // Rank 1 of 2 with no rank 0 anywhere: the device error comes first, not a rendezvous wait.
  const Clock::time_point start = Clock::now();
  auto comm = OpenNcclCommunicator(Opts(2, 1, FreePort(), 5000), 0);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(comm.ok());
  const Status& s = comm.status();
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("nccl: rank 1 of 2: cuda:0 is not usable, no CUDA device"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("cuda"), std::string::npos) << s.message();
  EXPECT_LT(seconds, 2.0) << "waited in the rendezvous before checking the device";
  std::printf("without a GPU (%.3f s): %s\n", seconds, s.ToString().c_str());
  // A device index past the end is named too (0 devices here).
  auto none = OpenNcclCommunicator(Opts(1, 0, FreePort()), 3);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("cuda:3"), std::string::npos)
      << none.status().message();
}

TEST(NcclUniqueId, TravelsFromRankZeroThroughTheRendezvousStore) {
  for (const int world : {2, 3}) {
    const int port = FreePort();
    std::vector<Result<std::string>> ids(static_cast<size_t>(world),
                                         Status::Internal("not run"));
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        auto rv = JoinRendezvous(Opts(world, r, port));
        if (!rv.ok()) {
          ids[static_cast<size_t>(r)] = rv.status();
          return;
        }
        ids[static_cast<size_t>(r)] = ShareNcclUniqueId(*rv, r);
        // Rank 0's store stays up until every other rank has read the id (each says so: one key
        // for all would let rank 0 close the store while a slower rank still leaves the
        // rendezvous).
        if (r == 0) {
          for (int other = 1; other < world; ++other) {
            (void)WaitForKey(*rv, "test/done/" + std::to_string(other), "rank " + std::to_string(other));
          }
        } else {
          (void)rv->store->Set("test/done/" + std::to_string(r), "1");
        }
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(ids[static_cast<size_t>(r)].ok())
          << "rank " << r << ": " << ids[static_cast<size_t>(r)].status().ToString();
    }
    const std::string& id = *ids[0];
    EXPECT_EQ(id.size(), 128u);  // NCCL_UNIQUE_ID_BYTES
    EXPECT_NE(id, std::string(id.size(), '\0')) << "ncclGetUniqueId gave an empty id";
    for (int r = 1; r < world; ++r) EXPECT_EQ(*ids[static_cast<size_t>(r)], id) << "rank " << r;
  }
}

TEST(NcclUniqueId, ARankWaitingForItNamesRankZero) {
  // Rank 0 joins but never publishes (it died between the rendezvous and ncclGetUniqueId).
  const int port = FreePort();
  Status waited;
  std::thread zero([&] {
    auto rv = JoinRendezvous(Opts(2, 0, port, 4000));
    ASSERT_TRUE(rv.ok()) << rv.status().ToString();
    (void)WaitForKey(*rv, "test/done", "rank 1");  // keeps the store up until rank 1 gave up
  });
  std::thread one([&] {
    auto rv = JoinRendezvous(Opts(2, 1, port, 1500));
    ASSERT_TRUE(rv.ok()) << rv.status().ToString();
    waited = ShareNcclUniqueId(*rv, 1).status();
    (void)rv->store->Set("test/done", "1");
  });
  zero.join();
  one.join();
  EXPECT_EQ(waited.code(), Status::Code::kUnavailable) << waited.ToString();
  EXPECT_NE(waited.message().find("rank 0 (NCCL's unique id) did not publish 'nccl/unique_id'"),
            std::string::npos)
      << waited.message();
  EXPECT_NE(waited.message().find("this is rank 1 of 2"), std::string::npos) << waited.message();
}

engine::JobSpec TwoRanks() {
  engine::JobSpec spec;
  spec.name = "nccl-choice";
  engine::DistributedSpec d;
  d.world_size = 2;
  d.rank = 1;
  d.master_addr = "127.0.0.1";
  d.master_port = FreePort();
  spec.distributed = d;
  return spec;
}

TEST(OpenCommunicatorForJob, SimtIsRefusedAndCudaWithoutAGpuIsTheDeviceError) {
  engine::RegisterGpuBackends();
  auto simt = OpenCommunicatorForJob(TwoRanks(), "simt");
  ASSERT_FALSE(simt.ok());
  EXPECT_EQ(simt.status().code(), Status::Code::kUnimplemented);
  EXPECT_NE(simt.status().message().find("data parallel on simt"), std::string::npos)
      << simt.status().message();
  if (CudaDevices() > 0) return;  // the cuda branch below is the no-GPU one
  const Clock::time_point start = Clock::now();
  auto cuda = OpenCommunicatorForJob(TwoRanks(), "cuda:0");
  ASSERT_FALSE(cuda.ok());
  // The engine's device error (as at device open), not a rendezvous wait.
  EXPECT_EQ(cuda.status().code(), Status::Code::kFailedPrecondition) << cuda.status().ToString();
  EXPECT_EQ(cuda.status().message().rfind("device cuda:0: ", 0), 0u) << cuda.status().message();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 2.0);
  std::printf("traind run's choice on cuda:0 without a GPU: %s\n", cuda.status().ToString().c_str());
}

}  // namespace
}  // namespace traind::comm
