#include "train/overlapped_allreduce.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>

namespace traind::engine {

using Clock = std::chrono::steady_clock;

int64_t BlockOfParam(const std::string& hf_name) {
  for (const char* marker : {".h.", ".layers.", ".layer."}) {
    const size_t at = hf_name.find(marker);
    if (at == std::string::npos) continue;
    const size_t start = at + std::char_traits<char>::length(marker);
    size_t end = start;
    while (end < hf_name.size() && hf_name[end] >= '0' && hf_name[end] <= '9') ++end;
    if (end > start && end < hf_name.size() && hf_name[end] == '.') {
      return std::strtoll(hf_name.substr(start, end - start).c_str(), nullptr, 10);
    }
  }
  return -1;
}

std::vector<int64_t> OverlappedAllReduce::ShardCounts(const Range& piece,
                                                      const std::vector<Range>& shards) {
  std::vector<int64_t> counts;
  counts.reserve(shards.size());
  for (const Range& s : shards) {
    counts.push_back(std::max<int64_t>(0, std::min(piece.second, s.second) -
                                              std::max(piece.first, s.first)));
  }
  return counts;
}

Status OverlappedAllReduce::ReducePiece(Communicator* comm, float* grads, const Range& piece,
                                        const std::vector<Range>& shards) {
  if (shards.empty()) {
    return comm->AllReduceSum(grads + piece.first, piece.second - piece.first, CommDType::kF32);
  }
  return comm->ReduceScatterSumInPlace(grads + piece.first, ShardCounts(piece, shards),
                                       CommDType::kF32);
}

OverlappedAllReduce::OverlappedAllReduce(Communicator* comm, const std::vector<ParamInfo>& params,
                                         int64_t num, int64_t bucket_bytes,
                                         std::vector<Range> shards)
    : comm_(comm), shards_(std::move(shards)) {
  // Each block's range and element count.
  int64_t blocks = 0;
  for (const ParamInfo& p : params) blocks = std::max(blocks, BlockOfParam(p.hf_name) + 1);
  std::vector<int64_t> lo(static_cast<size_t>(blocks), std::numeric_limits<int64_t>::max());
  std::vector<int64_t> hi(static_cast<size_t>(blocks), 0), count(static_cast<size_t>(blocks), 0);
  for (const ParamInfo& p : params) {
    const int64_t b = BlockOfParam(p.hf_name);
    if (b < 0) continue;
    lo[b] = std::min(lo[b], p.offset);
    hi[b] = std::max(hi[b], p.offset + p.numel);
    count[b] += p.numel;
  }
  bucket_of_last_block_.assign(static_cast<size_t>(blocks), -1);
  // Backward order: block blocks-1 first. A bucket grows downwards while the next block's range
  // ends where the bucket begins.
  Range open{0, 0};
  int64_t open_low_block = -1;
  auto close = [&] {
    if (open.second > open.first) {
      bucket_of_last_block_[static_cast<size_t>(open_low_block)] = static_cast<int64_t>(buckets_.size());
      buckets_.push_back(open);
    }
    open = {0, 0};
    open_low_block = -1;
  };
  for (int64_t b = blocks - 1; b >= 0; --b) {
    const bool contiguous = count[b] > 0 && hi[b] - lo[b] == count[b];
    if (!contiguous) {
      close();
      continue;
    }
    if (open.second > open.first && hi[b] != open.first) close();
    open = open.second > open.first ? Range{lo[b], open.second} : Range{lo[b], hi[b]};
    open_low_block = b;
    if ((open.second - open.first) * static_cast<int64_t>(sizeof(float)) >= bucket_bytes) close();
  }
  close();
  // The rest: [0, num) minus the buckets, in ascending pieces.
  std::vector<Range> covered = buckets_;
  std::sort(covered.begin(), covered.end());
  int64_t at = 0;
  for (const Range& r : covered) {
    if (r.first > at) rest_.push_back({at, r.first});
    at = std::max(at, r.second);
  }
  if (at < num) rest_.push_back({at, num});
  thread_ = std::thread([this] { Loop(); });
}

OverlappedAllReduce::~OverlappedAllReduce() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

Status OverlappedAllReduce::UseMarkers(Backend* backend) {
  std::vector<int> markers;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    TRAIND_ASSIGN_OR_RETURN(int m, backend->NewMarker());
    markers.push_back(m);
  }
  MutexLock lock(&mu_);
  backend_ = backend;
  marker_of_bucket_ = std::move(markers);
  return Status::Ok();
}

void OverlappedAllReduce::Arm(float* grads) {
  MutexLock lock(&mu_);
  grads_ = grads;
  comm_seconds_ = 0;
  error_ = Status::Ok();
}

void OverlappedAllReduce::BlockDone(int64_t layer) {
  if (layer < 0 || layer >= static_cast<int64_t>(bucket_of_last_block_.size())) return;
  const int64_t bucket = bucket_of_last_block_[static_cast<size_t>(layer)];
  if (bucket < 0) return;
  Piece piece{buckets_[static_cast<size_t>(bucket)], -1};
  Status recorded;
  if (backend_ != nullptr) {
    piece.marker = marker_of_bucket_[static_cast<size_t>(bucket)];
    recorded = backend_->RecordMarker(piece.marker);
  }
  {
    MutexLock lock(&mu_);
    if (!recorded.ok()) {
      if (error_.ok()) error_ = recorded;
      return;
    }
    queue_.push_back(piece);
    ++in_flight_;
  }
  cv_.NotifyAll();
}

Status OverlappedAllReduce::Finish(double* comm_seconds, double* waited_seconds) {
  const Clock::time_point start = Clock::now();
  MutexLock lock(&mu_);
  for (const Range& r : rest_) {
    queue_.push_back(Piece{r, -1});
    ++in_flight_;
  }
  cv_.NotifyAll();
  while (in_flight_ != 0) cv_.Wait(&mu_);
  *comm_seconds = comm_seconds_;
  *waited_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return error_;
}

void OverlappedAllReduce::Loop() {
  mu_.Lock();
  for (;;) {
    while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
    if (queue_.empty()) {  // stop_
      mu_.Unlock();
      return;
    }
    const Piece piece = queue_.front();
    queue_.pop_front();
    const bool failed = !error_.ok();
    float* grads = grads_;
    Backend* backend = backend_;
    mu_.Unlock();
    Status s;
    double seconds = 0;
    // The bucket's gradients are final once the work issued before its marker has finished.
    if (!failed && piece.marker >= 0) s = backend->WaitMarker(piece.marker);
    if (!failed && s.ok()) {
      const Clock::time_point t0 = Clock::now();
      s = ReducePiece(comm_, grads, piece.range, shards_);
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    mu_.Lock();
    comm_seconds_ += seconds;
    if (error_.ok() && !s.ok()) error_ = s;
    if (--in_flight_ == 0) cv_.NotifyAll();
  }
}

}  // namespace traind::engine
