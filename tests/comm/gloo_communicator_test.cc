// The Gloo communicator's contract (traind/engine/communicator.h) with every rank a thread of this
// process, over loopback: sums, 16-bit sums with fp32 accumulation, reduce-scatter (equal counts,
// and in place with a count per rank), all-gather,
// broadcast, barrier; the rendezvous's errors (a rank that never joins, no rank 0, a rank taken
// twice, disagreeing world sizes); ResolveDistributed's environment defaults; a restartable
// world's rounds (RestartableWorld: a new process of a rank joins the survivors' next round).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tcp_store.h"
#include "traind/comm/distributed.h"
#include "traind/comm/gloo_communicator.h"
#include "free_port.h"

namespace traind::comm {
namespace {

using engine::CommDType;
using engine::Communicator;

using comm_test::FreePort;

int NextPort() { return FreePort(); }

GlooOptions Opts(int world, int rank, int port, int timeout_ms = 10000) {
  GlooOptions o;
  o.world_size = world;
  o.rank = rank;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.prefix = "test/" + std::to_string(port) + "/0/";
  o.rendezvous_timeout = std::chrono::milliseconds(timeout_ms);
  o.collective_timeout = std::chrono::milliseconds(20000);
  return o;
}

// Runs body(rank, comm) on `world` threads, each with its own communicator.
void RunWorld(int world, const std::function<void(int, Communicator*)>& body) {
  const int port = NextPort();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = OpenGlooCommunicator(Opts(world, r, port));
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      ASSERT_EQ((*comm)->rank(), r);
      ASSERT_EQ((*comm)->world_size(), world);
      body(r, comm->get());
    });
  }
  for (auto& t : threads) t.join();
}

uint16_t Bf16(float f) {  // exact for the values used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(GlooCommunicator, AllReduceSumF32EveryRankSameBits) {
  for (int world : {2, 4}) {
    std::vector<std::vector<float>> results(world);
    const int64_t n = 300001;  // several ring segments, not a multiple of the world
    RunWorld(world, [&](int r, Communicator* c) {
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = std::sin(0.001f * static_cast<float>(i) * (r + 1)) / 3.0f;
      ASSERT_TRUE(c->AllReduceSum(x.data(), n, CommDType::kF32).ok());
      results[r] = x;
    });
    for (int64_t i = 0; i < n; i += 997) {
      double want = 0;
      for (int r = 0; r < world; ++r) want += std::sin(0.001f * static_cast<float>(i) * (r + 1)) / 3.0f;
      EXPECT_NEAR(results[0][i], want, 1e-6) << i;
    }
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(0, std::memcmp(results[0].data(), results[r].data(), n * 4)) << "rank " << r;
    }
  }
}

TEST(GlooCommunicator, SixteenBitSumsAccumulateInF32) {
  // 4 ranks add 1 + 2^-8 each: in bf16 arithmetic the partial sums would round (bf16 has 8
  // mantissa bits); accumulated in fp32 the total 4 + 2^-6 is exact in bf16.
  std::vector<uint16_t> out_bf(4), out_f16(4);
  RunWorld(4, [&](int r, Communicator* c) {
    uint16_t b = Bf16(1.0f + 1.0f / 128.0f);  // 1 + 2^-7: exactly representable in bf16
    ASSERT_TRUE(c->AllReduceSum(&b, 1, CommDType::kBF16).ok());
    if (r == 0) out_bf[0] = b;
    uint16_t h = 0x3c00 + 1;  // f16 1 + 2^-10
    ASSERT_TRUE(c->AllReduceSum(&h, 1, CommDType::kF16).ok());
    if (r == 0) out_f16[0] = h;
  });
  EXPECT_EQ(FromBf16(out_bf[0]), 4.0f + 4.0f / 128.0f);
  // 4 * (1 + 2^-10) = 4 + 2^-8 is exactly representable in f16 (exponent 2, 10 mantissa bits).
  EXPECT_EQ(out_f16[0], 0x4400 + 1);  // 4 + 1 ulp(4) = 4 + 2^-8
}

TEST(GlooCommunicator, ReduceScatterAllGatherBroadcastBarrier) {
  const int world = 3;
  const int64_t count = 5;
  std::vector<std::vector<float>> scattered(world), gathered(world);
  std::vector<std::string> broadcast(world);
  RunWorld(world, [&](int r, Communicator* c) {
    std::vector<float> in(count * world);
    for (int64_t i = 0; i < count * world; ++i) in[i] = static_cast<float>(i * 10 + r);
    std::vector<float> out(count);
    ASSERT_TRUE(c->ReduceScatterSum(in.data(), out.data(), count, CommDType::kF32).ok());
    scattered[r] = out;
    std::vector<float> mine(count, static_cast<float>(r + 1)), all(count * world);
    ASSERT_TRUE(c->AllGather(mine.data(), all.data(), count, CommDType::kF32).ok());
    gathered[r] = all;
    char text[16] = {0};
    if (r == 2) std::strcpy(text, "from rank 2");
    ASSERT_TRUE(c->Broadcast(text, sizeof(text), 2).ok());
    broadcast[r] = text;
    ASSERT_TRUE(c->Barrier().ok());
    EXPECT_EQ(c->Broadcast(text, sizeof(text), 7).code(), Status::Code::kInvalidArgument);
  });
  for (int r = 0; r < world; ++r) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t g = r * count + i;
      EXPECT_EQ(scattered[r][i], static_cast<float>(g * 10 * world + 0 + 1 + 2));
    }
    for (int q = 0; q < world; ++q) {
      for (int64_t i = 0; i < count; ++i) EXPECT_EQ(gathered[r][q * count + i], q + 1.0f);
    }
    EXPECT_EQ(broadcast[r], "from rank 2");
  }
}

// bf16 from fp32, rounded to nearest even (the communicator's rounding; finite values only).
uint16_t Bf16Rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The variable-count reduce-scatter in place (ZeRO-1's): odd counts, empty ranges (a rank that
// receives nothing, a world where one rank holds everything), fp32 and bf16, several calls in a
// row and an all-reduce between them, against a host reference. The ring adds range q's
// elements from rank q+1 round to q, in fp32; the reference adds them in that order, so the
// rank's range must match it bit for bit (and the exact sum to rounding). Then the in-place
// all-gather with the same counts (ZeRO-1's weight gather): every rank ends with every owner's
// range, byte for byte (reduce-scatter + all-gather = all-reduce).
TEST(GlooCommunicator, ReduceScatterInPlaceWithACountPerRank) {
  auto value = [](int r, int64_t i) {
    return std::sin(0.37f * static_cast<float>(i) + static_cast<float>(r)) * (r + 1) / 7.0f;
  };
  const std::vector<std::vector<int64_t>> cases[] = {
      {{7, 13}, {0, 9}, {250001, 3}},                       // world 2
      {{7, 0, 13}, {0, 0, 5}, {1001, 2003, 999}},           // world 3
      {{0, 5, 0, 100003}, {3, 1, 4, 1}, {0, 0, 0, 0}},      // world 4 (the last: nothing at all)
  };
  for (const auto& calls : cases) {
    const int world = static_cast<int>(calls[0].size());
    // Per call, per rank: its range after the call, fp32 and bf16.
    std::vector<std::vector<std::vector<float>>> got(calls.size(),
                                                     std::vector<std::vector<float>>(world));
    std::vector<std::vector<std::vector<uint16_t>>> got16(
        calls.size(), std::vector<std::vector<uint16_t>>(world));
    // After the all-gather: every rank's whole buffer.
    std::vector<std::vector<std::vector<float>>> whole(calls.size(),
                                                       std::vector<std::vector<float>>(world));
    std::vector<std::vector<std::vector<uint16_t>>> whole16(
        calls.size(), std::vector<std::vector<uint16_t>>(world));
    RunWorld(world, [&](int r, Communicator* c) {
      for (size_t k = 0; k < calls.size(); ++k) {
        const std::vector<int64_t>& counts = calls[k];
        int64_t total = 0, before = 0;
        for (int q = 0; q < world; ++q) {
          if (q < r) before += counts[q];
          total += counts[q];
        }
        std::vector<float> x(static_cast<size_t>(total) + 1);
        std::vector<uint16_t> h(static_cast<size_t>(total) + 1);
        for (int64_t i = 0; i < total; ++i) {
          x[i] = value(r, i);
          h[i] = Bf16(value(r, i));
        }
        ASSERT_TRUE(c->ReduceScatterSumInPlace(x.data(), counts, CommDType::kF32).ok());
        float one = 1.0f;  // another collective between the calls
        ASSERT_TRUE(c->AllReduceSum(&one, 1, CommDType::kF32).ok());
        EXPECT_EQ(one, static_cast<float>(world));
        ASSERT_TRUE(c->ReduceScatterSumInPlace(h.data(), counts, CommDType::kBF16).ok());
        got[k][r].assign(x.begin() + before, x.begin() + before + counts[r]);
        got16[k][r].assign(h.begin() + before, h.begin() + before + counts[r]);
        ASSERT_TRUE(c->AllGatherInPlace(x.data(), counts, CommDType::kF32).ok());
        ASSERT_TRUE(c->AllGatherInPlace(h.data(), counts, CommDType::kBF16).ok());
        whole[k][r].assign(x.begin(), x.begin() + total);
        whole16[k][r].assign(h.begin(), h.begin() + total);
      }
      // Wrong counts: refused on every rank before anything is sent.
      std::vector<float> y(4);
      EXPECT_EQ(c->ReduceScatterSumInPlace(y.data(), {1, 1}, CommDType::kF32).code(),
                world == 2 ? Status::Code::kOk : Status::Code::kInvalidArgument);
      std::vector<int64_t> negative(world, 1);
      negative[0] = -1;
      EXPECT_EQ(c->ReduceScatterSumInPlace(y.data(), negative, CommDType::kF32).code(),
                Status::Code::kInvalidArgument);
      EXPECT_EQ(c->AllGatherInPlace(y.data(), negative, CommDType::kF32).code(),
                Status::Code::kInvalidArgument);
    });
    for (size_t k = 0; k < calls.size(); ++k) {
      int64_t offset = 0;
      for (int q = 0; q < world; ++q) {
        const int64_t n = calls[k][q];
        ASSERT_EQ(static_cast<int64_t>(got[k][q].size()), n);
        int64_t mismatches = 0, mismatches16 = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t g = offset + i;
          float acc = value((q + 1) % world, g), acc16 = FromBf16(Bf16(value((q + 1) % world, g)));
          double exact = 0;
          for (int j = 2; j <= world; ++j) {
            acc += value((q + j) % world, g);
            acc16 += FromBf16(Bf16(value((q + j) % world, g)));
          }
          for (int j = 0; j < world; ++j) exact += value(j, g);
          mismatches += got[k][q][i] != acc ? 1 : 0;
          mismatches16 += got16[k][q][i] != Bf16Rne(acc16) ? 1 : 0;
          EXPECT_NEAR(got[k][q][i], exact, 1e-5) << "case world " << world << " call " << k;
        }
        EXPECT_EQ(mismatches, 0) << "world " << world << " call " << k << " rank " << q;
        EXPECT_EQ(mismatches16, 0) << "world " << world << " call " << k << " rank " << q;
        // Every rank holds range q as its owner reduced it.
        for (int r = 0; r < world; ++r) {
          ASSERT_GE(whole[k][r].size(), static_cast<size_t>(offset + n));
          EXPECT_TRUE(std::equal(got[k][q].begin(), got[k][q].end(), whole[k][r].begin() + offset))
              << "world " << world << " call " << k << ": rank " << r << "'s copy of range " << q;
          EXPECT_TRUE(
              std::equal(got16[k][q].begin(), got16[k][q].end(), whole16[k][r].begin() + offset))
              << "world " << world << " call " << k << ": rank " << r << "'s bf16 range " << q;
        }
        offset += n;
      }
    }
  }
}

// Sums rank+1 over the world: every rank must see W(W+1)/2.
void ExpectWorldSums(Communicator* comm, int world) {
  float x = static_cast<float>(comm->rank() + 1);
  ASSERT_TRUE(comm->AllReduceSum(&x, 1, CommDType::kF32).ok());
  EXPECT_EQ(x, static_cast<float>(world * (world + 1) / 2));
}

TEST(GlooRendezvous, ARankThatNeverJoinsIsNamed) {
  const int port = NextPort();
  const auto t0 = std::chrono::steady_clock::now();
  auto comm = OpenGlooCommunicator(Opts(3, 0, port, 1500));  // ranks 1 and 2 never come
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), Status::Code::kUnavailable);
  EXPECT_NE(comm.status().message().find("ranks 1 and 2 never joined within 1.5 s"),
            std::string::npos)
      << comm.status().message();
  EXPECT_LT(s, 5.0);

  // World 2 with rank 1 present but rank 0's peer... rank 1 alone: the store's host never comes.
  auto lonely = OpenGlooCommunicator(Opts(2, 1, NextPort(), 800));
  ASSERT_FALSE(lonely.ok());
  EXPECT_NE(lonely.status().message().find("rank 0 never came"), std::string::npos)
      << lonely.status().message();
}

TEST(GlooRendezvous, OneRankMissingOfTwo) {
  const int port = NextPort();
  auto comm = OpenGlooCommunicator(Opts(2, 0, port, 1000));
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("rank 1 never joined within 1 s"), std::string::npos)
      << comm.status().message();
}

TEST(GlooRendezvous, SameRankTwiceAndWorldSizeMismatch) {
  {
    const int port = NextPort();
    Status second;
    std::thread a([&] { (void)OpenGlooCommunicator(Opts(2, 0, port, 1500)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::thread b([&] { second = OpenGlooCommunicator(Opts(2, 0, port, 1500)).status(); });
    a.join();
    b.join();
    // The second "rank 0" cannot host the store (the port is taken) or finds rank 0 claimed.
    EXPECT_FALSE(second.ok());
  }
  {
    // A second process claiming rank 1 while the world gathers: refused, naming the rank; the
    // world (3 ranks, one never comes) then times out as before.
    const int port = NextPort();
    Status r0, r1, again;
    std::thread a([&] { r0 = OpenGlooCommunicator(Opts(3, 0, port, 1500)).status(); });
    std::thread b([&] { r1 = OpenGlooCommunicator(Opts(3, 1, port, 1500)).status(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    again = OpenGlooCommunicator(Opts(3, 1, port, 1500)).status();
    a.join();
    b.join();
    EXPECT_EQ(again.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(again.message().find("distributed.rank: rank 1 is already taken at 127.0.0.1:" +
                                   std::to_string(port)),
              std::string::npos)
        << again.ToString();
    EXPECT_NE(r0.message().find("rank 2 never joined"), std::string::npos) << r0.ToString();
  }
  {
    // A process claiming rank 1 once the world is up (the store lives with rank 0's
    // communicator): refused before it claims anything, saying a world is running there.
    const int port = NextPort();
    std::unique_ptr<Communicator> c0, c1;
    std::thread a([&] {
      auto c = OpenGlooCommunicator(Opts(2, 0, port, 1500));
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      c0 = std::move(*c);
    });
    std::thread b([&] {
      auto c = OpenGlooCommunicator(Opts(2, 1, port, 1500));
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      c1 = std::move(*c);
    });
    a.join();
    b.join();
    for (int rank : {1, 2}) {
      const int world = rank + 1;  // rank 1 of this world's 2, or rank 2 of a world of 3
      const Status again = OpenGlooCommunicator(Opts(world, rank, port, 1500)).status();
      EXPECT_EQ(again.code(), Status::Code::kFailedPrecondition);
      EXPECT_NE(again.message().find("rendezvous at 127.0.0.1:" + std::to_string(port) +
                                     ": a world of 2 ranks has already assembled there and is "
                                     "running; this process (rank " + std::to_string(rank) +
                                     " of " + std::to_string(world) +
                                     ") does not join a running world"),
                std::string::npos)
          << again.ToString();
    }
    // The world itself is untouched.
    std::thread other([&] { ExpectWorldSums(c1.get(), 2); });
    ExpectWorldSums(c0.get(), 2);
    other.join();
  }
  {
    const int port = NextPort();
    Status r0, r1;
    std::thread a([&] { r0 = OpenGlooCommunicator(Opts(2, 0, port, 1500)).status(); });
    std::thread b([&] { r1 = OpenGlooCommunicator(Opts(3, 1, port, 1500)).status(); });
    a.join();
    b.join();
    EXPECT_FALSE(r0.ok());
    EXPECT_FALSE(r1.ok());
    const std::string both = r0.message() + " | " + r1.message();
    EXPECT_NE(both.find("joined with world_size"), std::string::npos) << both;
  }
}

TEST(GlooRendezvous, StaleAttemptKeysAreNotSeen) {
  // A store holding attempt 0's join keys: attempt 1's ranks do not count them.
  const int port = NextPort();
  auto server = TcpStoreServer::Start("127.0.0.1", port);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto old = TcpStoreClient::Connect("127.0.0.1", port, "job/0/", std::chrono::seconds(2), "");
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE((*old)->Set("join/1", "2").ok());
  auto fresh = TcpStoreClient::Connect("127.0.0.1", port, "job/1/", std::chrono::seconds(2), "");
  ASSERT_TRUE(fresh.ok());
  std::string v;
  bool found = true;
  ASSERT_TRUE((*fresh)->TryGet("join/1", &v, &found).ok());
  EXPECT_FALSE(found);
  ASSERT_TRUE((*old)->TryGet("join/1", &v, &found).ok());
  EXPECT_TRUE(found);
  EXPECT_EQ(v, "2");
}

TEST(RestartRounds, TheStoreRaisesACounterToTheMax) {
  const int port = NextPort();
  auto server = TcpStoreServer::Start("127.0.0.1", port);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto c = TcpStoreClient::Connect("127.0.0.1", port, "job/0/", std::chrono::seconds(2), "");
  ASSERT_TRUE(c.ok());
  int64_t now = -7;
  ASSERT_TRUE((*c)->RaiseTo("round", 0, &now).ok());  // absent: set
  EXPECT_EQ(now, 0);
  ASSERT_TRUE((*c)->RaiseTo("round", 3, &now).ok());
  EXPECT_EQ(now, 3);
  ASSERT_TRUE((*c)->RaiseTo("round", 1, &now).ok());  // never lowered
  EXPECT_EQ(now, 3);
  std::string v;
  bool found = false;
  ASSERT_TRUE((*c)->TryGet("round", &v, &found).ok());
  EXPECT_TRUE(found);
  EXPECT_EQ(v, "3");
}

// A job spec whose distributed block names everything (no environment needed).
engine::JobSpec RoundsSpec(int world, int rank, int port) {
  engine::JobSpec spec;
  spec.name = "rounds-" + std::to_string(port);
  engine::DistributedSpec d;
  d.world_size = world;
  d.rank = rank;
  d.master_addr = "127.0.0.1";
  d.master_port = port;
  spec.distributed = d;
  return spec;
}

// Threads as ranks of a restartable world (the process tests are dp_restart_test): round 0, then
// `victim`'s process "dies" (its communicator and RestartableWorld destroyed; rank 0's store goes
// with it when the victim is 0) and a new process of it joins at once, before the survivor has
// noticed (its claim in round 0 is taken, or it finds a new store's counter at 0); the survivor
// then fails its attempt (AfterFailure: restart) and opens again. Both end in round 1 and sum.
void RestartOneRank(int victim) {
  const int port = NextPort();
  const int W = 2;
  const int survivor = 1 - victim;
  std::vector<std::unique_ptr<RestartableWorld>> worlds;
  std::vector<std::unique_ptr<Communicator>> comms(W);
  for (int r = 0; r < W; ++r) worlds.push_back(std::make_unique<RestartableWorld>(2));
  {
    std::vector<std::thread> t;
    for (int r = 0; r < W; ++r) {
      t.emplace_back([&, r] {
        auto c = worlds[r]->Open(RoundsSpec(W, r, port), "cpu");
        ASSERT_TRUE(c.ok()) << c.status().ToString();
        comms[r] = std::move(*c);
      });
    }
    for (auto& th : t) th.join();
  }
  ASSERT_TRUE(comms[0] && comms[1]);
  EXPECT_EQ(worlds[0]->round(), 0);
  EXPECT_EQ(worlds[1]->round(), 0);
  // Not a distributed failure: never restarted.
  EXPECT_EQ(worlds[survivor]->AfterFailure(Status::InvalidArgument("bad spec")).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(worlds[survivor]->AfterFailure(Status::ResourceExhausted("disk full")).code(),
            Status::Code::kResourceExhausted);
  // The victim dies; its new process joins while the survivor still holds round 0.
  comms[victim].reset();
  worlds[victim] = std::make_unique<RestartableWorld>(2);
  std::unique_ptr<Communicator> fresh;
  std::thread newcomer([&] {
    auto c = worlds[victim]->Open(RoundsSpec(W, victim, port), "cpu");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    fresh = std::move(*c);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  comms[survivor].reset();  // the survivor's attempt failed
  ASSERT_TRUE(worlds[survivor]->AfterFailure(Status::Unavailable("gloo all-reduce failed")).ok());
  auto again = worlds[survivor]->Open(RoundsSpec(W, survivor, port), "cpu");
  newcomer.join();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(fresh);
  EXPECT_EQ(worlds[0]->round(), 1);
  EXPECT_EQ(worlds[1]->round(), 1);
  std::thread other([&] { ExpectWorldSums(fresh.get(), W); });
  ExpectWorldSums(again->get(), W);
  other.join();
  // Round 1 failing too, with --max-restarts 2: one more restart (round 2). The bound itself is
  // dp_restart_test's TheRestartsAreBounded.
  EXPECT_TRUE(worlds[survivor]->AfterFailure(Status::Unavailable("x")).ok());
}

TEST(RestartRounds, ANewProcessOfRankOneJoinsTheSurvivorsNextRound) { RestartOneRank(1); }

TEST(RestartRounds, ANewRankZeroIsRaisedToTheSurvivorsRound) { RestartOneRank(0); }

// Rank 0 dies during the rendezvous (its store closes while rank 1 waits in it): rank 1
// reconnects to the restarted rank 0's new store within its timeout, carries its round there,
// and the two assemble.
TEST(RestartRounds, ARankZeroThatDiesDuringTheRendezvousIsWaitedFor) {
  const int port = NextPort();
  auto started = TcpStoreServer::Start("127.0.0.1", port);  // the first rank 0's store
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  std::unique_ptr<TcpStoreServer> first = std::move(*started);
  RestartableWorld w1(2);
  std::unique_ptr<Communicator> c1;
  std::thread rank1([&] {
    auto c = w1.Open(RoundsSpec(2, 1, port), "cpu");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    c1 = std::move(*c);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  first.reset();  // rank 0 dies
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  RestartableWorld w0(2);
  auto c0 = w0.Open(RoundsSpec(2, 0, port), "cpu");
  rank1.join();
  ASSERT_TRUE(c0.ok()) << c0.status().ToString();
  ASSERT_TRUE(c1);
  EXPECT_EQ(w0.round(), 0);
  EXPECT_EQ(w1.round(), 0);
  std::thread other([&] { ExpectWorldSums(c1.get(), 2); });
  ExpectWorldSums(c0->get(), 2);
  other.join();
}

TEST(ResolveDistributed, FieldsWinOverEnvironmentAndErrorsNameTheField) {
  std::map<std::string, std::string> env = {
      {"WORLD_SIZE", "4"}, {"RANK", "3"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}};
  auto getenv = [&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  engine::JobSpec spec;
  spec.name = "j";
  spec.distributed.emplace();
  auto o = ResolveDistributed(spec, getenv);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->rank, 3);
  EXPECT_EQ(o->master_addr, "10.0.0.1");
  EXPECT_EQ(o->master_port, 1234);
  // Ranks meet at master_addr:master_port: the prefix holds the attempt, never the job.
  EXPECT_EQ(o->prefix, "traind/0/");
  spec.name = "another";
  spec.output_dir = "/elsewhere";
  ASSERT_TRUE(ResolveDistributed(spec, getenv).ok());
  EXPECT_EQ(ResolveDistributed(spec, getenv)->prefix, "traind/0/");
  spec.distributed->rank = 1;
  spec.distributed->master_port = 29500;
  o = ResolveDistributed(spec, getenv);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->master_port, 29500);
  env["WORLD_SIZE"] = "two";
  o = ResolveDistributed(spec, getenv);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("distributed.world_size: WORLD_SIZE='two'"), std::string::npos)
      << o.status().message();
  env.erase("RANK");
  env["WORLD_SIZE"] = "2";
  spec.distributed->rank.reset();
  o = ResolveDistributed(spec, getenv);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("distributed.rank: not set, and RANK is not in the environment"),
            std::string::npos);
  env["RANK"] = "2";
  o = ResolveDistributed(spec, getenv);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("distributed.rank: 2 must be < world_size 2"), std::string::npos);
}

// A Kubernetes Indexed Job (deploy/k8s/) sets JOB_COMPLETION_INDEX, not RANK: the rank comes from
// it when RANK is unset or empty; RANK and the spec's field win over it; its errors name it.
TEST(ResolveDistributed, RankFallsBackToJobCompletionIndex) {
  std::map<std::string, std::string> env = {{"WORLD_SIZE", "2"},
                                            {"JOB_COMPLETION_INDEX", "1"},
                                            {"MASTER_ADDR", "traind-dp-0.traind-dp"}};
  auto getenv = [&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  engine::JobSpec spec;
  spec.name = "dp";
  spec.distributed.emplace();
  auto o = ResolveDistributed(spec, getenv);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->world_size, 2);
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->master_addr, "traind-dp-0.traind-dp");
  env["RANK"] = "";  // empty counts as unset
  o = ResolveDistributed(spec, getenv);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 1);
  env["RANK"] = "0";  // RANK wins
  o = ResolveDistributed(spec, getenv);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 0);
  env.erase("RANK");
  spec.distributed->rank = 0;  // the spec's field wins
  o = ResolveDistributed(spec, getenv);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 0);
  spec.distributed->rank.reset();
  env["JOB_COMPLETION_INDEX"] = "x";
  o = ResolveDistributed(spec, getenv);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("distributed.rank: JOB_COMPLETION_INDEX='x' is not an integer"),
            std::string::npos)
      << o.status().message();
  env["JOB_COMPLETION_INDEX"] = "2";
  o = ResolveDistributed(spec, getenv);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("distributed.rank: 2 must be < world_size 2"), std::string::npos)
      << o.status().message();
  env["RANK"] = "x";  // a bad RANK is named as RANK, with JOB_COMPLETION_INDEX present
  o = ResolveDistributed(spec, getenv);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("distributed.rank: RANK='x' is not an integer"), std::string::npos)
      << o.status().message();
  EXPECT_EQ(o.status().message().find("nor JOB_COMPLETION_INDEX"), std::string::npos);
  env.erase("RANK");
  env.erase("JOB_COMPLETION_INDEX");
  o = ResolveDistributed(spec, getenv);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("distributed.rank: not set, and RANK is not in the environment "
                                      "(nor JOB_COMPLETION_INDEX)"),
            std::string::npos)
      << o.status().message();
}

}  // namespace
}  // namespace traind::comm
