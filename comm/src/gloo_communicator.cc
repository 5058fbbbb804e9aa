// GlooCommunicator: see traind/comm/gloo_communicator.h. The rendezvous before Gloo's mesh is
// comm's shared one (rendezvous.h); only Gloo's calls live here.
#include "traind/comm/gloo_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "rank_ranges.h"
#include "rendezvous.h"

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

// The ring reduce-scatter's slot tag (under Gloo's reduce prefix, which nothing else here uses).
constexpr uint32_t kRingReduceScatterTag = 0x7273;
// The ring all-gather's (under Gloo's all-gather prefix, with a tag gloo::allgather never uses).
constexpr uint32_t kRingAllGatherTag = 0x6167;

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// The rendezvous store as Gloo's rendezvous::Store (what connectFullMesh exchanges addresses
// through); Gloo wants exceptions on I/O errors and timeouts.
class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(TcpStoreClient* client) : client_(client) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const Status s = client_->Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error(s.message());
  }

  std::vector<char> get(const std::string& key) override {
    wait({key}, client_->timeout());
    std::string v;
    bool found = false;
    const Status s = client_->TryGet(key, &v, &found);
    if (!s.ok()) throw std::runtime_error(s.message());
    if (!found) {
      throw std::runtime_error("rendezvous store: key " + client_->prefix() + key + " vanished");
    }
    return std::vector<char>(v.begin(), v.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, client_->timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    for (const std::string& key : keys) {
      for (;;) {
        std::string v;
        bool found = false;
        const Status s = client_->TryGet(key, &v, &found);
        if (!s.ok()) throw std::runtime_error(s.message());
        if (found) break;
        if (Clock::now() >= deadline) {
          throw std::runtime_error("rendezvous store at " + client_->where() + ": key " +
                                   client_->prefix() + key + " not set within " +
                                   std::to_string(timeout.count()) + " ms");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

 private:
  TcpStoreClient* client_;
};

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

  // Equal counts: `in` copied (widened) into the scratch buffer, the ring reduce-scatter there,
  // this rank's range out.
  Status ReduceScatterSum(const void* in, void* out, int64_t count, CommDType type) override {
    if (count <= 0) return Status::Ok();
    const int64_t total = count * world_size();
    scratch_.resize(static_cast<size_t>(total));
    if (type == CommDType::kF32) {
      std::memcpy(scratch_.data(), in, static_cast<size_t>(total) * 4);
    } else {
      Widen(static_cast<const uint16_t*>(in), total, type, scratch_.data());
    }
    const std::vector<int64_t> counts(static_cast<size_t>(world_size()), count);
    TRAIND_RETURN_IF_ERROR(RingReduceScatterF32(scratch_.data(), counts, "reduce-scatter"));
    const float* mine = scratch_.data() + count * rank();
    if (type == CommDType::kF32) {
      std::memcpy(out, mine, static_cast<size_t>(count) * 4);
    } else {
      Narrow(mine, count, type, static_cast<uint16_t*>(out));
    }
    return Status::Ok();
  }

  Status ReduceScatterSumInPlace(void* data, const std::vector<int64_t>& counts,
                                 CommDType type) override {
    TRAIND_ASSIGN_OR_RETURN(const RankRanges ranges,
                            CheckedRankRanges("reduce-scatter", counts, world_size()));
    const int64_t total = ranges.total, before = ranges.offset[static_cast<size_t>(rank())];
    if (total == 0) return Status::Ok();
    if (type == CommDType::kF32) {
      return RingReduceScatterF32(static_cast<float*>(data), counts, "reduce-scatter");
    }
    // 16-bit: widened whole, reduced in fp32, this rank's range rounded back.
    auto* h = static_cast<uint16_t*>(data);
    scratch_.resize(static_cast<size_t>(total));
    Widen(h, total, type, scratch_.data());
    TRAIND_RETURN_IF_ERROR(RingReduceScatterF32(scratch_.data(), counts, "reduce-scatter"));
    Narrow(scratch_.data() + before, counts[static_cast<size_t>(rank())], type, h + before);
    return Status::Ok();
  }

  // The ring all-gather on Gloo's transport, in place (bytes: 16-bit values travel as they are).
  // Step s of W-1: rank r sends range (r-s) mod W to rank r+1 and receives range (r-s-1) mod W
  // from rank r-1 straight into its place; what it sends at step s+1 is what it received at step
  // s. Each rank sends every range but the next rank's once; empty ranges are skipped.
  Status AllGatherInPlace(void* data, const std::vector<int64_t>& counts, CommDType type) override {
    TRAIND_ASSIGN_OR_RETURN(const RankRanges ranges,
                            CheckedRankRanges("all-gather", counts, world_size()));
    const int W = world_size(), r = rank();
    const size_t unit = ElementSize(type);
    const int64_t total = ranges.total;
    const std::vector<int64_t>& offset = ranges.offset;
    if (W == 1 || total == 0) return Status::Ok();
    const size_t bytes = static_cast<size_t>(total) * unit;
    return Guard("all-gather", bytes, [&] {
      auto buf = context_->createUnboundBuffer(data, bytes);
      const int right = (r + 1) % W, left = (r + W - 1) % W;
      const uint64_t slot = gloo::Slot::build(gloo::kAllgatherSlotPrefix, kRingAllGatherTag);
      for (int s = 0; s < W - 1; ++s) {
        const auto send_q = static_cast<size_t>((r - s + 2 * W) % W);
        const auto recv_q = static_cast<size_t>((r - s - 1 + 2 * W) % W);
        const size_t send_bytes = static_cast<size_t>(counts[send_q]) * unit;
        const size_t recv_bytes = static_cast<size_t>(counts[recv_q]) * unit;
        if (recv_bytes > 0) {
          buf->recv(left, slot, static_cast<size_t>(offset[recv_q]) * unit, recv_bytes);
        }
        if (send_bytes > 0) {
          buf->send(right, slot, static_cast<size_t>(offset[send_q]) * unit, send_bytes);
        }
        if (recv_bytes > 0 && !buf->waitRecv(timeout_)) throw std::runtime_error("receive aborted");
        if (send_bytes > 0 && !buf->waitSend(timeout_)) throw std::runtime_error("send aborted");
      }
    });
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
  // The ring reduce-scatter on Gloo's transport, in place on fp32 `data` (counts as
  // ReduceScatterSumInPlace's). Step s of W-1: rank r sends range (r-s-1) mod W to rank r+1 and
  // receives range (r-s-2) mod W from rank r-1, adding it into its own copy; what it sends at
  // step s+1 is what it summed at step s, so after W-1 steps range r holds every rank's sum. Each
  // rank sends every range but its own once (C - counts[r] elements); empty ranges are skipped on
  // both sides of a pair. The sums of one element are added in ring order, from rank
  // (owner+1) mod W round to the owner.
  Status RingReduceScatterF32(float* data, const std::vector<int64_t>& counts, const char* what) {
    const int W = world_size(), r = rank();
    int64_t total = 0, largest = 0;
    std::vector<int64_t> offset(counts.size());
    for (size_t q = 0; q < counts.size(); ++q) {
      offset[q] = total;
      total += counts[q];
      largest = std::max(largest, counts[q]);
    }
    if (W == 1 || total == 0) return Status::Ok();
    return Guard(what, static_cast<size_t>(total) * 4, [&] {
      recv_.resize(static_cast<size_t>(std::max<int64_t>(largest, 1)));
      auto send_buf = context_->createUnboundBuffer(data, static_cast<size_t>(total) * 4);
      auto recv_buf = context_->createUnboundBuffer(recv_.data(), recv_.size() * 4);
      const int right = (r + 1) % W, left = (r + W - 1) % W;
      const uint64_t slot = gloo::Slot::build(gloo::kReduceSlotPrefix, kRingReduceScatterTag);
      for (int s = 0; s < W - 1; ++s) {
        const auto send_q = static_cast<size_t>((r - s - 1 + 2 * W) % W);
        const auto recv_q = static_cast<size_t>((r - s - 2 + 2 * W) % W);
        const size_t send_bytes = static_cast<size_t>(counts[send_q]) * 4;
        const size_t recv_n = static_cast<size_t>(counts[recv_q]);
        if (recv_n > 0) recv_buf->recv(left, slot, 0, recv_n * 4);
        if (send_bytes > 0) {
          send_buf->send(right, slot, static_cast<size_t>(offset[send_q]) * 4, send_bytes);
        }
        if (recv_n > 0) {
          if (!recv_buf->waitRecv(timeout_)) throw std::runtime_error("receive aborted");
          float* dst = data + offset[recv_q];
          const float* src = recv_.data();
          for (size_t i = 0; i < recv_n; ++i) dst[i] += src[i];
        }
        if (send_bytes > 0 && !send_buf->waitSend(timeout_)) {
          throw std::runtime_error("send aborted");
        }
      }
    });
  }

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
  std::vector<float> recv_;  // the ring reduce-scatter's receive buffer (the largest range)
  bool broken_ = false;
  std::string broken_message_;
};

}  // namespace

Result<std::unique_ptr<engine::Communicator>> OpenGlooCommunicator(const GlooOptions& o) {
  TRAIND_ASSIGN_OR_RETURN(Rendezvous rv, JoinRendezvous(o));
  const std::string& where = rv.where;
  const std::string& me = rv.me;
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
    GlooStore store(rv.store.get());
    gloo::rendezvous::PrefixStore gloo_keys("gloo", store);
    context->connectFullMesh(gloo_keys, device);
    context->setTimeout(o.collective_timeout);
    auto comm = std::make_unique<GlooCommunicator>(std::move(rv.server), std::move(rv.store),
                                                   context, o.collective_timeout);
    TRAIND_RETURN_IF_ERROR(comm->Barrier());
    return std::unique_ptr<engine::Communicator>(std::move(comm));
  } catch (const std::exception& e) {
    return Status::Unavailable("rendezvous at " + where + ": " + me +
                               " could not connect Gloo's mesh: " + e.what());
  }
}

}  // namespace traind::comm
