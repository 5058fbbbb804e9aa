// ResolveDistributed and the job runner's choice of communicator: see traind/comm/distributed.h.
#include "traind/comm/distributed.h"

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "rendezvous.h"
#include "spec_agreement.h"
#include "traind/comm/gloo_communicator.h"
#include "traind/engine/devices.h"
#if TRAIND_HAVE_NCCL
#include "traind/comm/nccl_communicator.h"
#endif

namespace traind::comm {

Result<DistributedOptions> ResolveDistributed(const engine::JobSpec& spec, const GetEnv& getenv) {
  DistributedOptions o;
  const engine::DistributedSpec d = spec.distributed.value_or(engine::DistributedSpec{});
  auto env_int = [&](const std::optional<int64_t>& field, const char* name, const char* var,
                     int64_t min, int64_t max, bool required, int64_t fallback,
                     int64_t* out) -> Status {
    if (field) {
      *out = *field;
      return Status::Ok();
    }
    const char* v = getenv(var);
    if (v == nullptr || *v == '\0') {
      if (required) {
        return Status::InvalidArgument(std::string("distributed.") + name + ": not set, and " + var +
                                       " is not in the environment");
      }
      *out = fallback;
      return Status::Ok();
    }
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < min || x > max) {
      return Status::InvalidArgument(std::string("distributed.") + name + ": " + var + "='" + v +
                                     "' is not an integer in [" + std::to_string(min) + ", " +
                                     std::to_string(max) + "]");
    }
    *out = x;
    return Status::Ok();
  };
  int64_t world = 1, rank = 0, port = 29400;
  TRAIND_RETURN_IF_ERROR(env_int(d.world_size, "world_size", "WORLD_SIZE", 1, 1 << 20, false, 1, &world));
  // RANK, else JOB_COMPLETION_INDEX (what a Kubernetes Indexed Job sets in pod i: deploy/k8s/).
  const char* rank_env = getenv("RANK");
  const char* index_env = getenv("JOB_COMPLETION_INDEX");
  const bool use_index = (rank_env == nullptr || *rank_env == '\0') && index_env != nullptr &&
                         *index_env != '\0';
  if (Status st = env_int(d.rank, "rank", use_index ? "JOB_COMPLETION_INDEX" : "RANK", 0, 1 << 20,
                          world > 1, 0, &rank);
      !st.ok()) {
    if (!d.rank && !use_index && (rank_env == nullptr || *rank_env == '\0')) {  // neither is set
      return Status::InvalidArgument(st.message() + " (nor JOB_COMPLETION_INDEX)");
    }
    return st;
  }
  TRAIND_RETURN_IF_ERROR(env_int(d.master_port, "master_port", "MASTER_PORT", 1, 65535, false, 29400, &port));
  if (rank >= world) {
    return Status::InvalidArgument("distributed.rank: " + std::to_string(rank) +
                                   " must be < world_size " + std::to_string(world));
  }
  o.world_size = static_cast<int>(world);
  o.rank = static_cast<int>(rank);
  o.master_port = static_cast<int>(port);
  if (d.master_addr) {
    o.master_addr = *d.master_addr;
  } else if (const char* v = getenv("MASTER_ADDR"); v != nullptr && *v != '\0') {
    o.master_addr = v;
  } else {
    o.master_addr = "127.0.0.1";
  }
  auto env_seconds = [&](const char* var, std::chrono::milliseconds* out) -> Status {
    const char* v = getenv(var);
    if (v == nullptr || *v == '\0') return Status::Ok();
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(s > 0)) {
      return Status::InvalidArgument(std::string(var) + "='" + v + "': expected seconds > 0");
    }
    *out = std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
    return Status::Ok();
  };
  TRAIND_RETURN_IF_ERROR(env_seconds("TRAIND_DIST_TIMEOUT_S", &o.rendezvous_timeout));
  TRAIND_RETURN_IF_ERROR(env_seconds("TRAIND_DIST_COLLECTIVE_TIMEOUT_S", &o.collective_timeout));
  if (const char* v = getenv("GLOO_SOCKET_IFNAME"); v != nullptr) o.iface = v;
  // The attempt alone: neither the job's name nor its output_dir keys the rendezvous.
  const char* attempt = getenv("TRAIND_DIST_ATTEMPT");
  o.prefix = std::string("traind/") + (attempt != nullptr && *attempt ? attempt : "0") + "/";
  return o;
}

bool NcclBuilt() { return TRAIND_HAVE_NCCL != 0; }

namespace {

// OpenCommunicatorForJob, in a restartable world's rounds when `rounds` is not null.
Result<std::unique_ptr<engine::Communicator>> OpenForJob(const engine::JobSpec& spec,
                                                         const std::string& device,
                                                         RestartRounds* rounds) {
  TRAIND_ASSIGN_OR_RETURN(DistributedOptions o,
                          ResolveDistributed(spec, [](const char* v) { return std::getenv(v); }));
  o.rounds = rounds;
  if (o.world_size == 1) return std::unique_ptr<engine::Communicator>();
  o.agreement = EncodeAgreement(spec.name, FieldsRanksMustAgree(spec));
  std::string resolved = device.empty() ? "cpu" : device;
  // The registry's capabilities of the device ("auto" resolved as RunJob will).
  TRAIND_ASSIGN_OR_RETURN(engine::DeviceCapabilities caps, engine::DeviceCapabilitiesOf(resolved));
  if (!caps.data_parallel()) {
    return Status::Unimplemented(
        "distributed: data parallel on " + resolved +
        " is not supported: no communicator reduces its memory (NCCL needs a CUDA device, Gloo "
        "host memory); use --device cpu (Gloo) or cuda:N (NCCL)");
  }
  if (caps.has_own_memory) {
    // The device first, with the engine's own error (no GPU, no such device), before any rank
    // waits in the rendezvous.
    TRAIND_ASSIGN_OR_RETURN(engine::DeviceInfo info, engine::QueryDevice(resolved));
    resolved = info.device;
  }
  if (caps.device_collective == "nccl") {
#if TRAIND_HAVE_NCCL
    return OpenNcclCommunicator(o, std::atoi(resolved.c_str() + 5));  // "cuda:N"
#else
    return Status::Unimplemented("distributed: data parallel on " + resolved +
                                 " needs NCCL, which this build does not have (built without the "
                                 "CUDA backend); use --device cpu (Gloo)");
#endif
  }
  return OpenGlooCommunicator(o);
}

}  // namespace

Result<std::unique_ptr<engine::Communicator>> OpenCommunicatorForJob(const engine::JobSpec& spec,
                                                                     const std::string& device) {
  return OpenForJob(spec, device, nullptr);
}

RestartableWorld::RestartableWorld(int max_restarts) : rounds_(std::make_unique<RestartRounds>()) {
  rounds_->max_restarts = max_restarts;
}

RestartableWorld::~RestartableWorld() = default;

Result<std::unique_ptr<engine::Communicator>> RestartableWorld::Open(const engine::JobSpec& spec,
                                                                     const std::string& device) {
  rounds_->assembled = false;
  return OpenForJob(spec, device, rounds_.get());
}

Status RestartableWorld::AfterFailure(const Status& failure) const {
  // Collectives report a peer that went away or timed out as UNAVAILABLE (Gloo and NCCL alike);
  // before the world assembled, the rendezvous's own error (a rank that never came) is final.
  if (failure.code() != Status::Code::kUnavailable || !rounds_->assembled) return failure;
  const int64_t failed = rounds_->round + 1;  // rounds 0..round each ended in a failure
  if (failed <= rounds_->max_restarts) return Status::Ok();
  return Status::Unavailable(std::to_string(failed) + " attempts of the world failed (rounds 0 to " +
                             std::to_string(rounds_->round) + "; --max-restarts " +
                             std::to_string(rounds_->max_restarts) +
                             " used up); the last, in round " + std::to_string(rounds_->round) +
                             ": " + failure.message());
}

int64_t RestartableWorld::round() const { return rounds_->round; }

int RestartableWorld::max_restarts() const { return rounds_->max_restarts; }

}  // namespace traind::comm
