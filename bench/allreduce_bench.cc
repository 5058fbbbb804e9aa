// allreduce_bench: the fp32 all-reduce of traind's Gloo communicator (comm/, what a data-parallel
// run's gradients go through) over loopback, size by size, against the memcpy rate of the same size
// measured in the same processes at the same time (issue 15: Gloo's own benchmark tools are not
// packaged in Debian, so the bound is memory's).
//
// One process per rank, the rank, world and master from the environment as `traind run` reads
// them (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT; comm::ResolveDistributed), or --spawn W:
// this process forks W ranks on 127.0.0.1 and a port the kernel hands out, and waits for them.
// Per size (fp32, 4 KiB .. 64 MiB in x4 steps; --quick: 4 .. 256 KiB): a barrier, a checked
// all-reduce (every element must equal 1 + 2 + ... + W), warm-up, then N timed all-reduces of a
// zeroed buffer; the time of one is the mean over the N, taken on the slowest rank (all-gathered).
//   algbw = bytes / time;  busbw = algbw x 2(W-1)/W  (nccl-tests' convention: what each rank sends
//   and receives in a ring all-reduce, so busbw compares across world sizes; 0 at W = 1)
// Then, after a barrier, every rank times N memcpys of the same size at once (each rank's own
// buffers, so the ranks share the memory system as they do during the all-reduce):
//   memcpy_gbs = bytes / time of one memcpy, the slowest rank's.
// A ring all-reduce over loopback moves at least 2(W-1)/W x S through memory per rank (into the
// sender's socket, out of the receiver's: each a copy, plus reading the operands of the sums), so
// busbw / memcpy is at most about 1 and well below it in practice; at small sizes memcpy runs from
// cache and the all-reduce is latency-bound, so the ratio only means something from ~1 MiB up.
// Usage: allreduce_bench [--quick] [--spawn W] [--iters N] [--warmup N]
//                        [--min-bytes B] [--max-bytes B]
// Prints a table on rank 0 and, per size,
//   RESULT allreduce world=W bytes=S iters=N time_us=... algbw_gbs=... busbw_gbs=...
//          memcpy_gbs=... ratio=...
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "traind/comm/gloo_communicator.h"
#include "traind/engine/communicator.h"
#include "traind/engine/job_spec.h"

namespace traind::bench {
namespace {

using engine::CommDType;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

const char* FlagValue(int argc, char** argv, int* i) {
  if (*i + 1 >= argc) {
    std::fprintf(stderr, "allreduce_bench: %s needs a value\n", argv[*i]);
    std::exit(2);
  }
  return argv[++*i];
}

struct Options {
  bool quick = false;
  int spawn = 0;         // > 0: fork this many ranks on loopback
  int iters = 0;         // 0: by size (about 1 GiB of all-reduce per size, 5 .. 1000)
  int warmup = -1;       // -1: max(2, iters / 10)
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = int64_t{64} << 20;
};

int ItersFor(const Options& o, int64_t bytes) {
  if (o.iters > 0) return o.iters;
  const int64_t budget = o.quick ? (int64_t{4} << 20) : (int64_t{1} << 30);
  return static_cast<int>(std::clamp<int64_t>(budget / bytes, 5, o.quick ? 20 : 1000));
}

// A port on 127.0.0.1 that the kernel just handed out (closed again: rank 0's store binds it).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("allreduce_bench: no free port");
    std::exit(1);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// The slowest rank's value of `x` (an fp32 all-gather of one value per rank).
Result<double> SlowestRank(engine::Communicator* comm, double x) {
  const float mine = static_cast<float>(x);
  std::vector<float> all(static_cast<size_t>(comm->world_size()));
  TRAIND_RETURN_IF_ERROR(comm->AllGather(&mine, all.data(), 1, CommDType::kF32));
  return static_cast<double>(*std::max_element(all.begin(), all.end()));
}

Status RunRank(const Options& o) {
  // The communicator exactly as `traind run` opens it: a spec with `distributed: {}` completed
  // from the environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT, TRAIND_DIST_*).
  engine::JobSpec spec;
  spec.name = "allreduce_bench";
  spec.distributed = engine::DistributedSpec{};
  TRAIND_ASSIGN_OR_RETURN(auto dist,
                          comm::ResolveDistributed(spec, [](const char* v) { return std::getenv(v); }));
  // A world of one run by hand: its store on a free port rather than 29400 (a real run's default).
  if (dist.world_size == 1 && std::getenv("MASTER_PORT") == nullptr) dist.master_port = FreePort();
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<engine::Communicator> comm,
                          comm::OpenGlooCommunicator(dist));
  const int W = comm->world_size(), rank = comm->rank();
  const bool print = rank == 0;
  if (print) {
    std::printf("== fp32 all-reduce (%s ring, %d rank%s over %s:%d) vs memcpy of the same size\n",
                comm->name().c_str(), W, W == 1 ? "" : "s", dist.master_addr.c_str(),
                dist.master_port);
    std::printf("   busbw = bytes/time x 2(W-1)/W (nccl-tests); memcpy = bytes/time of one copy, "
                "all ranks copying at once; times: the slowest rank's mean\n");
    std::printf("%12s %6s %12s %11s %11s %12s %8s\n", "bytes", "iters", "time_us", "algbw_GB/s",
                "busbw_GB/s", "memcpy_GB/s", "ratio");
    std::fflush(stdout);
  }
  const double bus_factor = 2.0 * (W - 1) / W;
  const float expect = static_cast<float>(W * (W + 1) / 2);
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    const int64_t n = bytes / 4;
    const int iters = ItersFor(o, bytes);
    const int warmup = o.warmup >= 0 ? o.warmup : std::max(2, iters / 10);
    std::vector<float> buf(static_cast<size_t>(n), static_cast<float>(rank + 1));
    TRAIND_RETURN_IF_ERROR(comm->Barrier());
    TRAIND_RETURN_IF_ERROR(comm->AllReduceSum(buf.data(), n, CommDType::kF32));
    for (int64_t i = 0; i < n; ++i) {
      if (buf[static_cast<size_t>(i)] != expect) {
        return Status::Internal("all-reduce of " + std::to_string(bytes) + " bytes: element " +
                                std::to_string(i) + " is " +
                                std::to_string(buf[static_cast<size_t>(i)]) + ", expected " +
                                std::to_string(expect));
      }
    }
    // Zeros from here: repeated in-place sums stay finite (the cost of an add does not depend on
    // its operands' values in fp32, denormals aside).
    std::fill(buf.begin(), buf.end(), 0.0f);
    for (int i = 0; i < warmup; ++i) {
      TRAIND_RETURN_IF_ERROR(comm->AllReduceSum(buf.data(), n, CommDType::kF32));
    }
    TRAIND_RETURN_IF_ERROR(comm->Barrier());
    Clock::time_point t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      TRAIND_RETURN_IF_ERROR(comm->AllReduceSum(buf.data(), n, CommDType::kF32));
    }
    const double mine = Seconds(t0, Clock::now()) / iters;
    TRAIND_ASSIGN_OR_RETURN(const double t_allreduce, SlowestRank(comm.get(), mine));

    // memcpy of the same size, every rank at once, source and destination touched first.
    std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 2);
    for (int i = 0; i < warmup; ++i) std::memcpy(dst.data(), src.data(), dst.size());
    TRAIND_RETURN_IF_ERROR(comm->Barrier());
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      src[static_cast<size_t>(i) % src.size()] = static_cast<char>(i);  // not a repeated no-op
      std::memcpy(dst.data(), src.data(), dst.size());
    }
    const double mine_copy = Seconds(t0, Clock::now()) / iters;
    if (dst[0] != src[0]) return Status::Internal("memcpy mismatch");
    TRAIND_ASSIGN_OR_RETURN(const double t_copy, SlowestRank(comm.get(), mine_copy));

    const double algbw = static_cast<double>(bytes) / t_allreduce / 1e9;
    const double busbw = algbw * bus_factor;
    const double copybw = static_cast<double>(bytes) / t_copy / 1e9;
    if (print) {
      std::printf("%12lld %6d %12.1f %11.3f %11.3f %12.3f %8.3f\n", static_cast<long long>(bytes),
                  iters, t_allreduce * 1e6, algbw, busbw, copybw, busbw / copybw);
      std::printf("RESULT allreduce world=%d bytes=%lld iters=%d time_us=%.2f algbw_gbs=%.4f "
                  "busbw_gbs=%.4f memcpy_gbs=%.4f ratio=%.4f\n",
                  W, static_cast<long long>(bytes), iters, t_allreduce * 1e6, algbw, busbw, copybw,
                  busbw / copybw);
      std::fflush(stdout);
    }
  }
  return comm->Barrier();
}

// --spawn W: W ranks of this program on loopback (fork before any thread exists), each with the
// environment `traind run` would get; the exit status is the first failing rank's.
int Spawn(const Options& o) {
  const std::string port = std::to_string(FreePort());
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.spawn; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("allreduce_bench: fork");
      return 1;
    }
    if (pid == 0) {
      ::setenv("WORLD_SIZE", std::to_string(o.spawn).c_str(), 1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      const Status st = RunRank(o);
      if (!st.ok()) std::fprintf(stderr, "allreduce_bench rank %d: %s\n", r, st.ToString().c_str());
      std::fflush(stdout);
      ::_exit(st.ok() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc == 0) rc = code;
  }
  return rc;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      o.quick = true;
      o.max_bytes = 256 << 10;
    } else if (a == "--spawn") {
      o.spawn = std::atoi(FlagValue(argc, argv, &i));
    } else if (a == "--iters") {
      o.iters = std::atoi(FlagValue(argc, argv, &i));
    } else if (a == "--warmup") {
      o.warmup = std::atoi(FlagValue(argc, argv, &i));
    } else if (a == "--min-bytes") {
      o.min_bytes = std::atoll(FlagValue(argc, argv, &i));
    } else if (a == "--max-bytes") {
      o.max_bytes = std::atoll(FlagValue(argc, argv, &i));
    } else {
      std::fprintf(stderr,
                   "usage: allreduce_bench [--quick] [--spawn W] [--iters N] [--warmup N] "
                   "[--min-bytes B] [--max-bytes B]\n");
      return 2;
    }
  }
  if (o.min_bytes < 4 || o.min_bytes % 4 != 0 || o.max_bytes < o.min_bytes) {
    std::fprintf(stderr, "allreduce_bench: sizes must be multiples of 4 bytes, min <= max\n");
    return 2;
  }
  if (o.spawn < 0 || o.spawn > 64) {
    std::fprintf(stderr, "allreduce_bench: --spawn takes 1 .. 64 ranks\n");
    return 2;
  }
  if (o.spawn > 0) return Spawn(o);
  const Status st = RunRank(o);
  if (!st.ok()) {
    std::fprintf(stderr, "allreduce_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) { return traind::bench::Main(argc, argv); }
