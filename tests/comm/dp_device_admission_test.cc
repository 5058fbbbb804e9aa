// The daemon's admission of data-parallel jobs by device (worker::CheckDistributedDevice): cpu
// always (Gloo); cuda:N when this build has NCCL, else refused naming NCCL; simt refused with its
// own message; a plain run on any device is not its business.
#include <gtest/gtest.h>

#include <string>

#include "traind/comm/distributed.h"
#include "traind/worker/admission.h"

namespace traind::worker {
namespace {

engine::JobSpec Ranks(int64_t world) {
  engine::JobSpec spec;
  engine::DistributedSpec d;
  d.world_size = world;
  d.rank = 0;
  spec.distributed = d;
  return spec;
}

TEST(DistributedAdmission, CpuAlwaysCudaWithNcclSimtNever) {
  EXPECT_TRUE(CheckDistributedDevice(engine::JobSpec{}, "cuda:0").ok());
  EXPECT_TRUE(CheckDistributedDevice(Ranks(1), "simt").ok());  // world 1 is a plain run
  EXPECT_TRUE(CheckDistributedDevice(Ranks(2), "cpu").ok());

  const Status simt = CheckDistributedDevice(Ranks(2), "simt");
  EXPECT_EQ(simt.code(), Status::Code::kUnimplemented);
  EXPECT_NE(simt.message().find("data parallel on simt is not supported: no communicator reduces its memory"),
            std::string::npos)
      << simt.message();

  const Status cuda = CheckDistributedDevice(Ranks(2), "cuda:1");
  if (comm::NcclBuilt()) {  // this build has the CUDA backend, and NCCL with it
    EXPECT_TRUE(cuda.ok()) << cuda.ToString();
  } else {
    EXPECT_EQ(cuda.code(), Status::Code::kUnimplemented);
    EXPECT_NE(cuda.message().find("data parallel on cuda:1 is not supported by this build (NCCL "
                                  "is not built"),
              std::string::npos)
        << cuda.message();
  }
}

}  // namespace
}  // namespace traind::worker
