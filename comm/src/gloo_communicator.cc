// GlooCommunicator and the rendezvous: see traind/comm/gloo_communicator.h.
#include "traind/comm/gloo_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "tcp_store.h"

namespace traind::comm {
namespace {

using engine::CommDType;
using Clock = std::chrono::steady_clock;

// ---- 16-bit <-> fp32 (round to nearest even; NaN stays NaN) ----
float Bf16ToF32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else {
    u = sign | (exp + 112u) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    float a;
    std::memcpy(&a, &abs, 4);
    // a * 2^24 rounded to nearest even is the subnormal's mantissa.
    const float scaled = a * 16777216.0f;
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // round mantissa to 10 bits, nearest even
  return static_cast<uint16_t>(sign | (((r >> 23) - 112u) << 10 | ((r >> 13) & 0x3ffu)));
}

size_t ElementSize(CommDType t) { return t == CommDType::kF32 ? 4 : 2; }

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

class GlooCommunicator : public engine::Communicator {
 public:
  GlooCommunicator(std::unique_ptr<TcpStoreServer> server, std::unique_ptr<TcpStoreClient> store,
                   std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout)
      : server_(std::move(server)), store_(std::move(store)), context_(std::move(context)),
        timeout_(timeout) {}
  ~GlooCommunicator() override {
    context_.reset();  // closes the pairs before rank 0's store goes away
    store_.reset();
    server_.reset();
  }

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }
  std::string name() const override { return "gloo"; }

  Status AllReduceSum(void* data, int64_t count, CommDType type) override {
    if (count <= 0) return Status::Ok();
    if (type == CommDType::kF32) return SumF32(static_cast<float*>(data), count, "all-reduce");
    auto* h = static_cast<uint16_t*>(data);
    scratch_.resize(static_cast<size_t>(count));
    Widen(h, count, type, scratch_.data());
    TRAIND_RETURN_IF_ERROR(SumF32(scratch_.data(), count, "all-reduce"));
    Narrow(scratch_.data(), count, type, h);
    return Status::Ok();
  }

  Status ReduceScatterSum(const void* in, void* out, int64_t count, CommDType type) override {
    if (count <= 0) return Status::Ok();
    const int64_t total = count * world_size();
    scratch_.resize(static_cast<size_t>(total));
    if (type == CommDType::kF32) {
      std::memcpy(scratch_.data(), in, static_cast<size_t>(total) * 4);
    } else {
      Widen(static_cast<const uint16_t*>(in), total, type, scratch_.data());
    }
    TRAIND_RETURN_IF_ERROR(SumF32(scratch_.data(), total, "reduce-scatter"));
    const float* mine = scratch_.data() + count * rank();
    if (type == CommDType::kF32) {
      std::memcpy(out, mine, static_cast<size_t>(count) * 4);
    } else {
      Narrow(mine, count, type, static_cast<uint16_t*>(out));
    }
    return Status::Ok();
  }

  Status AllGather(const void* in, void* out, int64_t count, CommDType type) override {
    if (count <= 0) return Status::Ok();
    const size_t bytes = static_cast<size_t>(count) * ElementSize(type);
    return Guard("all-gather", bytes, [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes);
      opts.setOutput(static_cast<uint8_t*>(out), bytes * static_cast<size_t>(world_size()));
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= world_size()) {
      return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " outside world " +
                                     std::to_string(world_size()));
    }
    if (bytes == 0) return Status::Ok();
    return Guard("broadcast", bytes, [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  Status Barrier() override {
    return Guard("barrier", 0, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  Status SumF32(float* data, int64_t count, const char* what) {
    return Guard(what, static_cast<size_t>(count) * 4, [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, static_cast<size_t>(count));
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  static void Widen(const uint16_t* h, int64_t n, CommDType t, float* f) {
    for (int64_t i = 0; i < n; ++i) f[i] = t == CommDType::kBF16 ? Bf16ToF32(h[i]) : F16ToF32(h[i]);
  }
  static void Narrow(const float* f, int64_t n, CommDType t, uint16_t* h) {
    for (int64_t i = 0; i < n; ++i) h[i] = t == CommDType::kBF16 ? F32ToBf16(f[i]) : F32ToF16(f[i]);
  }

  // Runs a Gloo call, turning its exceptions into statuses that name this rank.
  template <typename F>
  Status Guard(const char* what, size_t bytes, F&& f) {
    if (broken_) {
      return Status::Unavailable("gloo " + std::string(what) + " on rank " + std::to_string(rank()) +
                                 ": the communicator failed earlier (" + broken_message_ + ")");
    }
    try {
      f();
      return Status::Ok();
    } catch (const std::exception& e) {
      broken_ = true;
      broken_message_ = e.what();
      const bool timeout = broken_message_.find("imed out") != std::string::npos ||
                           broken_message_.find("imeout") != std::string::npos;
      return Status::Unavailable("gloo " + std::string(what) + " of " + std::to_string(bytes) +
                                 " bytes on rank " + std::to_string(rank()) + " of " +
                                 std::to_string(world_size()) + " failed" +
                                 (timeout ? " (timed out after " +
                                                std::to_string(timeout_.count() / 1000) +
                                                " s: a peer died or hangs)"
                                          : std::string(" (a peer went away)")) +
                                 ": " + broken_message_);
    }
  }

  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
  std::unique_ptr<TcpStoreClient> store_;
  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
  std::vector<float> scratch_;
  bool broken_ = false;
  std::string broken_message_;
};

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

Result<std::unique_ptr<engine::Communicator>> OpenGlooCommunicator(const GlooOptions& o) {
  if (o.world_size < 1) {
    return Status::InvalidArgument("distributed.world_size: must be >= 1, got " +
                                   std::to_string(o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return Status::InvalidArgument("distributed.rank: must be in [0, " +
                                   std::to_string(o.world_size) + "), got " + std::to_string(o.rank));
  }
  const std::string where = o.master_addr + ":" + std::to_string(o.master_port);
  const std::string me = "rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size);
  std::unique_ptr<TcpStoreServer> server;
  if (o.rank == 0) {
    TRAIND_ASSIGN_OR_RETURN(server, TcpStoreServer::Start(o.master_addr, o.master_port));
  }
  const Clock::time_point deadline = Clock::now() + o.rendezvous_timeout;
  TRAIND_ASSIGN_OR_RETURN(
      std::unique_ptr<TcpStoreClient> store,
      TcpStoreClient::Connect(o.master_addr, o.master_port, o.prefix, o.rendezvous_timeout,
                              me + " waited for rank 0, which hosts the rendezvous store; rank 0 "
                                   "never came (is it running, with this master_addr/master_port?)"));
  // Claim this rank, then wait for everyone.
  bool taken = false;
  TRAIND_RETURN_IF_ERROR(store->SetIfAbsent("join/" + std::to_string(o.rank),
                                            std::to_string(o.world_size), &taken));
  if (taken) {
    return Status::InvalidArgument("distributed.rank: rank " + std::to_string(o.rank) +
                                   " has already joined this run (" + o.prefix + ") at " + where +
                                   ": two processes were given the same RANK");
  }
  std::vector<int> missing;
  auto missing_names = [&]() {
    std::string names;
    for (size_t i = 0; i < missing.size(); ++i) {
      names += (i ? (i + 1 == missing.size() ? " and " : ", ") : "") + std::to_string(missing[i]);
    }
    return (missing.size() == 1 ? "rank " : "ranks ") + names + " never joined";
  };
  for (;;) {
    std::vector<int> now;
    for (int r = 0; r < o.world_size; ++r) {
      std::string v;
      bool found = false;
      const Status got = store->TryGet("join/" + std::to_string(r), &v, &found);
      if (!got.ok()) {  // rank 0 gave up (its own timeout) and closed the store
        return Status::Unavailable(
            "rendezvous at " + where + " (" + o.prefix + "): " +
            (missing.empty() ? std::string("the store closed") : missing_names()) +
            "; rank 0 stopped waiting and closed the store (this is " + me + "): " + got.message());
      }
      if (!found) {
        now.push_back(r);
      } else if (v != std::to_string(o.world_size)) {
        return Status::InvalidArgument("distributed.world_size: rank " + std::to_string(r) +
                                       " joined with world_size " + v + ", this " + me + " has " +
                                       std::to_string(o.world_size));
      }
    }
    missing = std::move(now);
    if (missing.empty()) break;
    if (Clock::now() >= deadline) {
      return Status::Unavailable(
          "rendezvous at " + where + " (" + o.prefix + "): " + missing_names() + " within " +
          Seconds(o.rendezvous_timeout) + " s (" +
          std::to_string(o.world_size - static_cast<int>(missing.size())) + " of " +
          std::to_string(o.world_size) + " ranks came; this is " + me + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Gloo's full mesh through the same store (keys under <prefix>gloo/), then a barrier.
  try {
    gloo::transport::tcp::attr attr;
    if (!o.iface.empty()) {
      attr.iface = o.iface;
    } else if (!o.hostname.empty()) {
      attr.hostname = o.hostname;
    } else if (IsLoopback(o.master_addr)) {
      attr.hostname = "127.0.0.1";
    } else {
      char host[256] = {0};
      ::gethostname(host, sizeof(host) - 1);
      attr.hostname = host;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world_size);
    context->setTimeout(o.rendezvous_timeout);
    gloo::rendezvous::PrefixStore gloo_keys("gloo", *store);
    context->connectFullMesh(gloo_keys, device);
    context->setTimeout(o.collective_timeout);
    auto comm = std::make_unique<GlooCommunicator>(std::move(server), std::move(store), context,
                                                   o.collective_timeout);
    TRAIND_RETURN_IF_ERROR(comm->Barrier());
    return std::unique_ptr<engine::Communicator>(std::move(comm));
  } catch (const std::exception& e) {
    return Status::Unavailable("rendezvous at " + where + ": " + me +
                               " could not connect Gloo's mesh: " + e.what());
  }
}

Result<GlooOptions> ResolveDistributed(const engine::JobSpec& spec, const GetEnv& getenv) {
  GlooOptions o;
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
  const char* attempt = getenv("TRAIND_DIST_ATTEMPT");
  const std::string job = !spec.name.empty() ? spec.name : spec.output_dir;
  o.prefix = "traind/" + job + "/" + (attempt != nullptr && *attempt ? attempt : "0") + "/";
  return o;
}

Result<std::unique_ptr<engine::Communicator>> OpenCommunicatorForJob(const engine::JobSpec& spec) {
  TRAIND_ASSIGN_OR_RETURN(GlooOptions o,
                          ResolveDistributed(spec, [](const char* v) { return std::getenv(v); }));
  if (o.world_size == 1) return std::unique_ptr<engine::Communicator>();
  return OpenGlooCommunicator(o);
}

}  // namespace traind::comm
