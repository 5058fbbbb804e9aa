// OverlappedAllReduce: the data-parallel gradient all-reduce in buckets, started while backward
// still runs (what PyTorch DDP's gradient buckets do). The trainable buffer is cut at transformer
// block boundaries into buckets of at least `bucket_bytes`, in backward order (the last block's
// first). When Backward() reports a block's gradients final (Model::SetOnBlockGradients) and that
// completes a bucket, the bucket goes to a communication thread that all-reduces it while the
// trainer's thread computes the blocks below. Finish() adds what is left (the embeddings and the
// final norm, final only at the end of backward, and any parameter outside a block) and waits.
//
// ZeRO-1 (`shards` given: every rank's range of the buffer, ZeroOneShards): each bucket is
// reduce-scattered instead (Communicator::ReduceScatterSumInPlace, the counts each bucket's
// intersection with each rank's range, zero allowed), so a rank receives only its own range's
// sums; the rest of the buffer then holds partial sums, which nothing may read.
//
// Every rank cuts the same buckets and reduces them in the same order, so the collectives match.
// Device-neutral through the backend's markers (Backend::RecordMarker / WaitMarker, after
// UseMarkers): when a block's backward has been issued, BlockDone records a marker after it on the
// trainer's thread, and the communication thread waits for that marker before it hands the bucket
// to the communicator, so on an asynchronous backend (cuda: a CUDA event on the compute stream)
// the collective reads finished gradients; on cpu the ops have finished when the hook runs and the
// markers cost nothing. The sums differ from one whole-buffer all-reduce only in rounding (the ring
// adds each element in an order that depends on its position in the buffer it is reduced with).
// The communicator is used from the communication thread between Arm() and Finish() and from no
// other thread then (the Communicator contract: one caller at a time; so a communicator with
// per-thread state, NCCL's current device, sets it in every call).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/param_info.h"
#include "traind/engine/communicator.h"
#include "traind/engine/mutex.h"
#include "traind/engine/status.h"

namespace traind::engine {

// The transformer block a parameter belongs to, from its HF name (".h.3.", ".layers.3.",
// ".layer.3."), or -1 (embeddings, final norm, heads).
int64_t BlockOfParam(const std::string& hf_name);

class OverlappedAllReduce {
 public:
  using Range = std::pair<int64_t, int64_t>;  // [begin, end) elements of the gradient buffer

  // The bucket plan of `params` (views into a buffer of `num` floats): buckets of whole blocks,
  // each a contiguous range, of at least `bucket_bytes` (the last one may be smaller).
  // Blocks whose parameters do not form one contiguous range are left to Finish().
  // `shards` (ZeRO-1): every rank's range [begin_r, end_r), contiguous, in rank order, covering
  // [0, num); empty: all-reduce.
  OverlappedAllReduce(Communicator* comm, const std::vector<ParamInfo>& params, int64_t num,
                      int64_t bucket_bytes, std::vector<Range> shards = {});
  ~OverlappedAllReduce();  // joins the thread
  OverlappedAllReduce(const OverlappedAllReduce&) = delete;
  OverlappedAllReduce& operator=(const OverlappedAllReduce&) = delete;

  // One marker per bucket from `backend` (which must outlive this): BlockDone records it, the
  // communication thread waits for it before the bucket's collective. Without this call buckets
  // go straight to the communicator (the gradients must then be final when BlockDone runs).
  // The backend's NewMarker error.
  Status UseMarkers(Backend* backend);

  const std::vector<Range>& buckets() const { return buckets_; }  // in reduction order
  const std::vector<Range>& rest() const { return rest_; }        // reduced by Finish()

  // The reduce-scatter counts of `piece` over `shards`: per rank, the size of its range's
  // intersection with the piece (they add up to the piece's size when the shards cover it).
  static std::vector<int64_t> ShardCounts(const Range& piece, const std::vector<Range>& shards);
  // Reduces one piece of `grads` now, on the calling thread: all-reduce, or (shards given) the
  // reduce-scatter of ShardCounts. What Finish() does per piece, for a step without buckets.
  static Status ReducePiece(Communicator* comm, float* grads, const Range& piece,
                            const std::vector<Range>& shards);

  // Before the last micro-batch's backward: the gradients live at `grads`.
  void Arm(float* grads);
  // From Backward(), on the thread that issues the backend's ops: block `layer`'s gradients have
  // been issued; records the bucket's marker and queues the bucket it completes. A failed record
  // is Finish()'s error (the bucket is not reduced).
  void BlockDone(int64_t layer);
  // After Backward() and a Backend::Synchronize (the rest carries no marker): queues the rest,
  // waits until everything is reduced. The first error of any marker or collective (the later
  // ones are not issued). *comm_seconds: time inside the all-reduces;
  // *waited_seconds: of it, the time this call waited (not hidden behind backward).
  Status Finish(double* comm_seconds, double* waited_seconds);

 private:
  void Loop();

  // A queued piece of the buffer and the marker its collective waits for (-1: none).
  struct Piece {
    Range range;
    int marker = -1;
  };

  Communicator* comm_;
  // Set by UseMarkers (under mu_, for Loop) before the first BlockDone, which reads them unlocked
  // on the same thread.
  Backend* backend_ = nullptr;
  std::vector<int> marker_of_bucket_;  // per bucket
  std::vector<Range> shards_;  // ZeRO-1: every rank's range; empty: all-reduce
  std::vector<Range> buckets_;
  std::vector<int64_t> bucket_of_last_block_;  // per block: the bucket its backward completes, or -1
  std::vector<Range> rest_;

  Mutex mu_;
  CondVar cv_;
  float* grads_ TRAIND_GUARDED_BY(mu_) = nullptr;
  std::deque<Piece> queue_ TRAIND_GUARDED_BY(mu_);
  int64_t in_flight_ TRAIND_GUARDED_BY(mu_) = 0;  // queued or being reduced
  double comm_seconds_ TRAIND_GUARDED_BY(mu_) = 0;
  Status error_ TRAIND_GUARDED_BY(mu_);
  bool stop_ TRAIND_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace traind::engine
