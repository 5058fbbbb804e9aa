// OffloadedOptimizer: see offloaded_optimizer.h.
#include "optim/offloaded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "core/half.h"
#include "optim/adamw.h"
#include "optim/state_io.h"

namespace traind::engine {
namespace {

constexpr char kMagic[4] = {'T', 'O', 'S', '1'};
constexpr const char* kKind = "state";
constexpr const char* kAdamWFormat = AdamWOptimizer::kStateFormat;  // the same checkpoints

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutStr(std::string* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

// A bounds-checked reader over a payload; the first failure sticks.
class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  bool ok() const { return ok_; }
  bool done() const { return pos_ == s_.size(); }
  uint64_t U(int bytes) {
    if (!Need(static_cast<size_t>(bytes))) return 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s_[pos_ + i])) << (8 * i);
    pos_ += static_cast<size_t>(bytes);
    return v;
  }
  std::string Bytes(uint64_t n) {
    if (!Need(n)) return {};
    std::string out = s_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }
  std::string Str() { return Bytes(U(4)); }

 private:
  bool Need(uint64_t n) {
    if (!ok_ || n > s_.size() - pos_) ok_ = false;
    return ok_;
  }
  const std::string& s_;
  size_t pos_ = 0;
  bool ok_ = true;
};

struct Group {
  std::string name;                // the store's group key: "<index> <first tensor's name>"
  int64_t begin = 0;               // element range of the flat buffers
  int64_t end = 0;
  std::vector<ParamInfo> params;   // offsets relative to begin
  std::vector<bool> quantized;     // adamw_8bit: params[i]'s 8-bit choice (empty: the size rule)
};

// `quantized` (empty, or one per parameter of `params`): each parameter's 8-bit choice, which
// its group's instance is given (a ZeRO-1 slice keeps its whole tensor's).
std::vector<Group> MakeGroups(const TrainingSpec& t, const std::vector<ParamInfo>& unsorted,
                              const std::vector<bool>& quantized, const OffloadOptions& o) {
  std::vector<size_t> order(unsorted.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return unsorted[a].offset < unsorted[b].offset;
  });
  std::vector<ParamInfo> params;
  std::vector<bool> choice;  // per sorted parameter (empty without `quantized`)
  for (size_t i : order) {
    params.push_back(unsorted[i]);
    if (!quantized.empty()) choice.push_back(quantized[i]);
  }
  std::vector<int64_t> param_bytes;
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    ParamInfo alone = params[i];
    alone.offset = 0;
    const std::vector<bool> one =
        choice.empty() ? std::vector<bool>{} : std::vector<bool>{static_cast<bool>(choice[i])};
    param_bytes.push_back(OptimizerPlanBytes(t, {alone}, alone.numel, one));
    total += param_bytes.back();
  }
  // About 16 groups (so reads, updates and writes overlap), none over the configured size, none
  // under 16 KiB (per-group overhead).
  const int64_t target = std::min(o.group_state_bytes, std::max<int64_t>(total / 16, 16 << 10));
  std::vector<Group> groups;
  Group cur;
  int64_t cur_bytes = 0;
  auto flush = [&] {
    if (cur.params.empty()) return;
    cur.begin = cur.params.front().offset;
    cur.end = cur.begin;
    for (ParamInfo& p : cur.params) {
      cur.end = std::max(cur.end, p.offset + p.numel);
      p.offset -= cur.begin;
    }
    std::string first = cur.params.front().hf_name.substr(0, 200);
    cur.name = std::to_string(groups.size()) + " " + first;
    groups.push_back(std::move(cur));
    cur = Group();
    cur_bytes = 0;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (!cur.params.empty() && cur_bytes + param_bytes[i] > target) flush();
    cur.params.push_back(params[i]);
    if (!choice.empty()) cur.quantized.push_back(choice[i]);
    cur_bytes += param_bytes[i];
  }
  flush();
  return groups;
}

// What both offloaded optimizers share: steps are driven from the host (the state is not in
// device memory, so nothing is captured in the optimizer's CUDA graph); a step's commit runs
// behind the next step's forward and backward (the store's flush and fsync, then the read-ahead
// of the next step's first chunks), awaited before the store is used again; and the first store
// error sticks: later steps do nothing and the job ends with it.
// The fp32 master weights in the store (OffloadOptions::master_weights), cut into segments of the
// flat buffer (AdamW: its chunks; the other optimizers: their groups), each stored as raw fp32 in
// pieces of at most `piece_elems`: StateKey{segment name, first piece + i, "master"}. The
// segments cover [0, num_params) in order.
class MasterSegments {
 public:
  struct Segment {
    std::string name;
    int64_t begin = 0, end = 0;   // flat range
    int64_t first_piece = 0;      // the key index of its first piece
  };
  MasterSegments(OptimizerStateStore* store, std::vector<Segment> segments, int64_t piece_elems)
      : store_(store), segments_(std::move(segments)), piece_elems_(piece_elems) {
    for (const Segment& s : segments_) largest_ = std::max(largest_, s.end - s.begin);
    put_buf_.resize(static_cast<size_t>(largest_));
  }
  int64_t largest() const { return largest_; }
  size_t size() const { return segments_.size(); }
  const Segment& operator[](size_t s) const { return segments_[s]; }

  std::vector<StateKey> Keys(size_t s) const {
    std::vector<StateKey> keys;
    const Segment& seg = segments_[s];
    for (int64_t at = seg.begin, i = 0; at < seg.end; at += piece_elems_, ++i) {
      keys.push_back(StateKey{seg.name, seg.first_piece + i, "master"});
    }
    return keys;
  }
  void Prefetch(size_t s) const {
    if (s >= segments_.size()) return;
    for (const StateKey& k : Keys(s)) store_->Prefetch(k);
  }
  // The committed segment s into host (its length), and host written as segment s.
  Status Read(size_t s, float* host) const {
    return EachPiece(s, [&](const StateKey& k, int64_t at, int64_t n) {
      return store_->Read(k, host + at, static_cast<size_t>(n) * 4);
    });
  }
  Status Write(size_t s, const float* host) {
    return EachPiece(s, [&](const StateKey& k, int64_t at, int64_t n) {
      return store_->Write(k, host + at, static_cast<size_t>(n) * 4);
    });
  }

  // MasterWeightsStore::PutMaster's assembly: pieces in order, each segment written as it
  // completes. INTERNAL for a piece out of order.
  Status Put(int64_t offset, const float* host, int64_t n) {
    const int64_t total = segments_.empty() ? 0 : segments_.back().end;
    if (offset != put_next_ || n < 0 || offset + n > total) {
      return Status::Internal("master weights: a piece [" + std::to_string(offset) + ", " +
                              std::to_string(offset + n) + ") where [" + std::to_string(put_next_) +
                              ", ...) of " + std::to_string(total) + " was expected");
    }
    Invalidate();
    while (n > 0) {
      const size_t s = SegmentOf(put_next_);
      const Segment& seg = segments_[s];
      const int64_t take = std::min(n, seg.end - put_next_);
      std::memcpy(put_buf_.data() + (put_next_ - seg.begin), host, static_cast<size_t>(take) * 4);
      put_next_ += take;
      host += take;
      n -= take;
      if (put_next_ == seg.end) TRAIND_RETURN_IF_ERROR(Write(s, put_buf_.data()));
    }
    if (put_next_ == total) {
      put_next_ = 0;
      complete_ = true;
    }
    return Status::Ok();
  }
  // OK once a whole set was put (and none is half-way).
  Status CheckComplete() const {
    if (put_next_ == 0 && complete_) return Status::Ok();
    return Status::Internal("master weights: " + std::to_string(put_next_) + " of " +
                            std::to_string(segments_.empty() ? 0 : segments_.back().end) +
                            " elements were given");
  }
  // The committed master weights [offset, offset + n) through two cached segments (the least
  // recently used one is replaced): an export asks in tensor-name order, which goes back and
  // forth between the two segments a block straddles.
  Status Get(int64_t offset, float* host, int64_t n) const {
    const int64_t total = segments_.empty() ? 0 : segments_.back().end;
    if (offset < 0 || n < 0 || offset + n > total) {
      return Status::Internal("master weights: [" + std::to_string(offset) + ", " +
                              std::to_string(offset + n) + ") outside the " + std::to_string(total));
    }
    while (n > 0) {
      const size_t s = SegmentOf(offset);
      int slot = get_segment_[0] == s ? 0 : get_segment_[1] == s ? 1 : -1;
      if (slot < 0) {
        slot = get_older_;
        get_buf_[slot].resize(static_cast<size_t>(largest_));
        Prefetch(s + 1);
        get_segment_[slot] = segments_.size();
        TRAIND_RETURN_IF_ERROR(Read(s, get_buf_[slot].data()));
        get_segment_[slot] = s;
      }
      get_older_ = 1 - slot;
      const Segment& seg = segments_[s];
      const int64_t take = std::min(n, seg.end - offset);
      std::memcpy(host, get_buf_[slot].data() + (offset - seg.begin), static_cast<size_t>(take) * 4);
      offset += take;
      host += take;
      n -= take;
    }
    return Status::Ok();
  }
  // The stored segments changed (a step): Get's cached segments are stale.
  void Invalidate() { get_segment_[0] = get_segment_[1] = segments_.size(); }

 private:
  // f(key, offset in the segment, elements) for each piece of segment s, in order.
  template <typename F>
  Status EachPiece(size_t s, F&& f) const {
    const Segment& seg = segments_[s];
    int64_t at = seg.begin;
    for (const StateKey& k : Keys(s)) {
      const int64_t n = std::min(piece_elems_, seg.end - at);
      TRAIND_RETURN_IF_ERROR(f(k, at - seg.begin, n));
      at += n;
    }
    return Status::Ok();
  }
  size_t SegmentOf(int64_t offset) const {
    auto it = std::upper_bound(segments_.begin(), segments_.end(), offset,
                               [](int64_t at, const Segment& s) { return at < s.end; });
    return static_cast<size_t>(it - segments_.begin());
  }

  OptimizerStateStore* store_;
  std::vector<Segment> segments_;
  int64_t piece_elems_;
  int64_t largest_ = 0;
  std::vector<float> put_buf_;
  int64_t put_next_ = 0;
  bool complete_ = false;
  mutable std::vector<float> get_buf_[2];
  mutable size_t get_segment_[2] = {static_cast<size_t>(-1), static_cast<size_t>(-1)};
  mutable int get_older_ = 0;  // the slot Get replaces next
};

class HostDrivenOffload : public Optimizer, public MasterWeightsStore {
 public:
  HostDrivenOffload(std::string name, OptimizerStateStore* store)
      : store_(store), name_(std::move(name)) {}
  ~HostDrivenOffload() override {
    if (commit_in_flight_) (void)store_->AwaitCommit();  // the store outlives the optimizer
  }
  std::string name() const override { return name_; }
  int64_t step() const override { return step_; }
  bool issues_from_device_scalars() const override { return false; }
  void FillNextStep(StepScalars*) const override {}
  void IssueStep(float*, const float*, const StepScalars*) override {}
  void CountStep() override {}
  Status status() const override { return status_; }
  void Step(float* params, const float* grads, double lr, float grad_scale) override {
    if (!status_.ok()) return;
    status_ = AwaitCommit();
    if (!status_.ok()) return;
    status_ = RunStep(params, grads, lr, grad_scale);
  }
  // Ranks that write no checkpoint still see the last commit's result at the end.
  Status ContributeState() const override { return AwaitCommit(); }
  // StateStream (the subclass's: out of the store a chunk or a group at a time) into `path`.
  Status WriteState(const std::string& path) const override {
    TRAIND_ASSIGN_OR_RETURN(const SafetensorsStream stream, StateStream());
    return WriteSafetensorsStream(path, stream);
  }

  // The master weights in the store (master_, set by the subclass): the model's weights in and out.
  MasterWeightsStore* master_weights_store() override { return master_ != nullptr ? this : nullptr; }
  Status PutMaster(int64_t offset, const float* host, int64_t n) override {
    if (!status_.ok()) return status_;
    if (offset == 0) TRAIND_RETURN_IF_ERROR(AwaitCommit());
    if (Status s = master_->Put(offset, host, n); !s.ok()) status_ = s;
    return status_;
  }
  Status CommitMaster() override {
    if (!status_.ok()) return status_;
    TRAIND_RETURN_IF_ERROR(master_->CheckComplete());
    return CommitNow();
  }
  Status GetMaster(int64_t offset, float* host, int64_t n) const override {
    TRAIND_RETURN_IF_ERROR(AwaitCommit());
    return master_->Get(offset, host, n);
  }

 protected:
  // One step, its commit started (CommitBehind); advances step_ only when its writes succeeded.
  virtual Status RunStep(float* params, const float* grads, double lr, float grad_scale) = 0;
  // After the commit of a step succeeded.
  virtual void Committed() const {}
  // A commit of the store at the current step now (CommitMaster: the weights just put).
  virtual Status CommitNow() {
    TRAIND_RETURN_IF_ERROR(AwaitCommit());
    if (Status s = store_->Commit(step_); !s.ok() && status_.ok()) status_ = s;
    return status_;
  }

  // With OffloadOptions::master_weights: the master weights in the store (segments of the
  // subclass: AdamW's chunks, the groups), the model's sink, a device window of the largest
  // segment and its host buffer.
  // `windows`: the device window and its host buffer (host_p_) of ReadMasterWindow /
  // RefreshFromWindow; an update on the host needs neither (the master weights are read and
  // written in its staging slots, and the compute copy goes up from there: UploadRange).
  Status EnableMaster(std::vector<MasterSegments::Segment> segments, int64_t piece_elems,
                      MasterWeightsSink* sink, DeviceArena* arena, bool windows = true) {
    master_ = std::make_unique<MasterSegments>(store_, std::move(segments), piece_elems);
    sink_ = sink;
    if (master_->largest() == 0 || !windows) return Status::Ok();
    TRAIND_ASSIGN_OR_RETURN(void* p, arena->Allocate(MemoryCategory::kOptimizer,
                                                     static_cast<size_t>(master_->largest()) * 4,
                                                     "offload window master weights"));
    win_p_ = static_cast<float*>(p);
    window_arena_ = arena;
    host_p_.resize(static_cast<size_t>(master_->largest()));
    return Status::Ok();
  }
  // Segment s's master weights into the device window (the parameters its update runs on).
  Status ReadMasterWindow(size_t s, Backend* backend) {
    TRAIND_RETURN_IF_ERROR(master_->Read(s, host_p_.data()));
    backend->CopyHostToDevice(win_p_, host_p_.data(), static_cast<size_t>(SegmentElems(s)) * 4);
    return Status::Ok();
  }
  // After its update: the window to the host and the model's weights refreshed from it (before
  // the backend's next synchronisation; the caller synchronises, then WriteMasterWindow).
  void RefreshFromWindow(size_t s, Backend* backend) {
    backend->CopyDeviceToHost(host_p_.data(), win_p_, static_cast<size_t>(SegmentElems(s)) * 4);
    sink_->MasterUpdated((*master_)[s].begin, win_p_, SegmentElems(s));  // before the next segment reuses it
  }
  Status WriteMasterWindow(size_t s) { return master_->Write(s, host_p_.data()); }
  // OffloadOptions::update_on_host: the CPU backend the update runs on, and two staging slots of
  // `elems` elements each of [gradients | weights] (with `master`, the master weights in the store,
  // their 16-bit rounding behind): pinned on CUDA, the next range's copies in flight while this
  // one updates. Call before EnableMaster.
  Status EnableHostUpdate(Backend* device, int threads, int64_t elems, bool master) {
    host_ = MakeCpuBackend(threads);
    staging_elems_ = elems;
    if (elems == 0) return Status::Ok();
    TRAIND_ASSIGN_OR_RETURN(staging_, device->MakeHostStaging(2, static_cast<size_t>(elems) * (master ? 10 : 8)));
    return Status::Ok();
  }
  // The flat range [lo, lo + n)'s gradients (and without the master weights in the store its fp32
  // weights from `params`) into staging slot `slot`, behind the compute work issued so far.
  Status DownloadRange(int slot, int64_t lo, int64_t n, const float* grads, const float* params) {
    const size_t bytes = static_cast<size_t>(n) * 4;
    TRAIND_RETURN_IF_ERROR(staging_->Download(slot, 0, grads + lo, bytes));
    if (master_ == nullptr) TRAIND_RETURN_IF_ERROR(staging_->Download(slot, WeightsAt(), params + lo, bytes));
    return Status::Ok();
  }
  // The slot's gradients and weights once they came down (master weights: read from the store
  // into the weights' place).
  Status HostRange(int slot, size_t segment, float** g, float** w) {
    TRAIND_ASSIGN_OR_RETURN(void* host, staging_->Host(slot));
    *g = static_cast<float*>(host);
    *w = *g + staging_elems_;
    if (master_ != nullptr) TRAIND_RETURN_IF_ERROR(master_->Read(segment, *w));
    return Status::Ok();
  }
  // After the host update of [lo, lo + n) in slot `slot`: the weights go up. With the master
  // weights in the store, the model's compute copy: the 16-bit weights rounded on the host (the
  // device cast's bits) behind the weights in the slot (2 bytes a parameter instead of 4, and no
  // fp32 window on the device) and the fp32 resident pieces as they are; else the fp32 weights
  // into `params` in place.
  Status UploadRange(int slot, int64_t lo, int64_t n, float* params) {
    TRAIND_ASSIGN_OR_RETURN(void* host, staging_->Host(slot));  // no copy of this slot pending
    const size_t w_at = WeightsAt();
    if (master_ == nullptr) return staging_->Upload(slot, w_at, params + lo, static_cast<size_t>(n) * 4);
    const MasterWeightsSink::ComputeCopy copy = sink_->ComputeCopyOf(lo, n);
    const size_t w16_at = 2 * w_at;
    const float* w = reinterpret_cast<const float*>(static_cast<char*>(host) + w_at);
    uint16_t* w16 = reinterpret_cast<uint16_t*>(static_cast<char*>(host) + w16_at);
    F32To16Span(copy.type == DType::kBF16, w, n, w16);
    TRAIND_RETURN_IF_ERROR(staging_->Upload(slot, w16_at, copy.weights16, static_cast<size_t>(n) * 2));
    for (const MasterWeightsSink::Fp32Piece& piece : copy.fp32) {
      TRAIND_RETURN_IF_ERROR(staging_->Upload(slot, w_at + static_cast<size_t>(piece.offset - lo) * 4,
                                              piece.device, static_cast<size_t>(piece.n) * 4));
    }
    return Status::Ok();
  }
  size_t WeightsAt() const { return static_cast<size_t>(staging_elems_) * 4; }
  int64_t SegmentElems(size_t s) const { return (*master_)[s].end - (*master_)[s].begin; }
  void ReleaseMasterWindow() {
    if (win_p_ != nullptr) window_arena_->Release(win_p_);
    win_p_ = nullptr;
  }

  std::unique_ptr<MasterSegments> master_;
  MasterWeightsSink* sink_ = nullptr;
  float* win_p_ = nullptr;
  DeviceArena* window_arena_ = nullptr;
  std::vector<float> host_p_;
  // OffloadOptions::update_on_host (EnableHostUpdate): null without it.
  std::unique_ptr<Backend> host_;
  std::unique_ptr<HostStaging> staging_;
  int64_t staging_elems_ = 0;  // elements of a slot's gradients (and of its weights)

  // Commits `step` behind the caller (the next step's forward and backward), then reads ahead
  // `prefetch` (the next step's first chunks).
  void CommitBehind(int64_t step, std::vector<StateKey> prefetch) {
    store_->CommitInBackground(step, std::move(prefetch));
    commit_in_flight_ = true;
  }
  // The pending commit's result (OK when none); every use of the store other than a step's
  // writes starts here. A failure sticks in status_.
  Status AwaitCommit() const {
    if (!commit_in_flight_) return status_;
    commit_in_flight_ = false;
    Status s = store_->AwaitCommit();
    if (s.ok()) Committed();
    else if (status_.ok()) status_ = s;
    return status_;
  }

  OptimizerStateStore* store_;
  int64_t step_ = 0;         // steps applied (their commits started)
  mutable Status status_;    // the first store error (SaveState is const and may hit one)
  mutable bool commit_in_flight_ = false;

 private:
  std::string name_;
};

class OffloadedOptimizer final : public HostDrivenOffload {
 public:
  OffloadedOptimizer(const TrainingSpec& t, std::vector<Group> groups, DeviceArena* arena,
                     OptimizerStateStore* store, const OffloadOptions& o)
      : HostDrivenOffload(t.optim, store), t_(t), groups_(std::move(groups)), arena_(arena),
        options_(o), committed_(groups_.size()), pending_(groups_.size()) {
    for (const Group& g : groups_) largest_ = std::max(largest_, g.end - g.begin);
  }
  ~OffloadedOptimizer() override { ReleaseMasterWindow(); }

  // OffloadOptions::update_on_host: the groups' transient instances live in a host arena of the
  // CPU backend (never the device's), and the staging slots hold the largest group
  // (RunStepOnHost).
  Status EnableGroupsOnHost() {
    TRAIND_RETURN_IF_ERROR(EnableHostUpdate(arena_->backend(), options_.host_threads, largest_,
                                            options_.master_weights));
    host_arena_ = std::make_unique<DeviceArena>(host_.get(), 0);
    return Status::Ok();
  }
  // Where the groups' transient instances live.
  DeviceArena* WindowArena() const { return host_arena_ != nullptr ? host_arena_.get() : arena_; }
  // The first group's instance: what the real optimizer rejects (its options), before a step.
  Result<std::unique_ptr<Optimizer>> ProbeWindow() const { return Window(0); }

  // OffloadOptions::master_weights: each group's master weights in the store beside its state
  // (StateKey{group name, piece, "master"}, raw fp32 in pieces of piece_bytes), updated in a
  // device window of the largest group.
  Status EnableGroupMaster(MasterWeightsSink* sink) {
    std::vector<MasterSegments::Segment> segments;
    for (const Group& g : groups_) segments.push_back({g.name, g.begin, g.end, 0});
    return EnableMaster(std::move(segments),
                        std::max<int64_t>(1, static_cast<int64_t>(options_.piece_bytes / 4)), sink, arena_,
                        /*windows=*/host_ == nullptr);
  }

  SafetensorsFile SaveState() const override {
    SafetensorsFile out;
    if (!AwaitCommit().ok()) return out;
    for (size_t g = 0; g < groups_.size() && status_.ok(); ++g) {
      Result<SafetensorsFile> f = GroupState(g);
      if (!f.ok()) {
        status_ = f.status();
        return {};
      }
      if (out.metadata.empty()) out.metadata = f->metadata;
      for (auto& [name, tensor] : f->tensors) out.tensors[name] = std::move(tensor);
    }
    out.metadata["step"] = std::to_string(step_);
    return out;
  }

  // Streamed: the header from each group's state read one at a time (names, dtypes, shapes),
  // then the tensors in name order from one group's state at a time (a group is read again when
  // name order comes back to it); never the whole state in RAM, at the cost of reading the state
  // at least twice.
  Result<SafetensorsStream> StateStream() const override {
    TRAIND_RETURN_IF_ERROR(AwaitCommit());
    SafetensorsStream out;
    auto group_of = std::make_shared<std::vector<size_t>>();  // per tensor
    for (size_t g = 0; g < groups_.size(); ++g) {
      // The group's committed state, not a fresh instance's: which tensors exist can depend on
      // the step (SGD's momentum buffers appear with the first step).
      TRAIND_ASSIGN_OR_RETURN(const SafetensorsFile state, GroupState(g));
      if (out.metadata.empty()) out.metadata = state.metadata;
      for (const auto& [name, t] : state.tensors) {
        out.tensors.push_back({name, t.dtype, t.shape});
        group_of->push_back(g);
      }
    }
    out.metadata["step"] = std::to_string(step_);
    struct Cache {
      size_t group;
      SafetensorsFile state;
    };
    auto cache = std::make_shared<Cache>(Cache{groups_.size(), {}});
    auto names = std::make_shared<std::vector<StreamedTensor>>(out.tensors);
    out.data = [this, group_of, cache, names](size_t i, const SafetensorsSink& sink) -> Status {
      const size_t g = (*group_of)[i];
      if (cache->group != g) {
        TRAIND_ASSIGN_OR_RETURN(cache->state, GroupState(g));
        cache->group = g;
      }
      auto it = cache->state.tensors.find((*names)[i].name);
      if (it == cache->state.tensors.end()) {
        return Status::DataLoss(store_->Describe() + " group '" + groups_[g].name + "' holds no tensor " +
                                (*names)[i].name);
      }
      sink(it->second.data.data(), it->second.data.size());
      return Status::Ok();
    };
    return out;
  }

  Status LoadState(const SafetensorsFile& file) override {
    TRAIND_RETURN_IF_ERROR(AwaitCommit());
    TRAIND_ASSIGN_OR_RETURN(const int64_t step, StepOf(file.metadata));
    for (size_t g = 0; g < groups_.size(); ++g) {
      TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> inner, Window(g));
      TRAIND_RETURN_IF_ERROR(inner->LoadState(file));  // checks format, names, shapes
      TRAIND_RETURN_IF_ERROR(WriteGroup(g, inner->SaveState()));
    }
    TRAIND_RETURN_IF_ERROR(CommitAs(step));
    step_ = step;
    return Status::Ok();
  }

  // Streamed: one group's tensors ("<hf_name>.<state>" of its parameters) read from the file at
  // a time, loaded into its window and written to the store; never the whole state in RAM.
  Status ReadState(const std::string& path) override {
    TRAIND_RETURN_IF_ERROR(AwaitCommit());
    TRAIND_ASSIGN_OR_RETURN(SafetensorsReader file, SafetensorsReader::Open(path));
    TRAIND_ASSIGN_OR_RETURN(const int64_t step, StepOf(file.metadata()));
    const std::map<std::string, SafetensorsReader::Entry>& all = file.tensors();
    for (size_t g = 0; g < groups_.size(); ++g) {
      SafetensorsFile part;
      part.metadata = file.metadata();
      for (const ParamInfo& p : groups_[g].params) {
        const std::string prefix = p.hf_name + ".";
        for (auto it = all.lower_bound(prefix);
             it != all.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
          TRAIND_ASSIGN_OR_RETURN(HostTensor t, file.ReadTensor(it->first));
          part.tensors[it->first] = std::move(t);
        }
      }
      TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> inner, Window(g));
      TRAIND_RETURN_IF_ERROR(inner->LoadState(part));  // checks format, names, shapes
      TRAIND_RETURN_IF_ERROR(WriteGroup(g, inner->SaveState()));
    }
    TRAIND_RETURN_IF_ERROR(CommitAs(step));
    step_ = step;
    return Status::Ok();
  }

 private:
  static Result<int64_t> StepOf(const std::map<std::string, std::string>& metadata) {
    auto it = metadata.find("step");
    int64_t step = -1;
    if (it != metadata.end()) {
      try {
        step = std::stoll(it->second);
      } catch (...) {
      }
    }
    if (step < 0) return Status::DataLoss("optimizer state: metadata lacks a valid step");
    return step;
  }

  // A transient instance of the real optimizer over group g (its state in the window arena).
  Result<std::unique_ptr<Optimizer>> Window(size_t g) const {
    const Group& gr = groups_[g];
    return MakeOptimizer(t_, gr.params, gr.end - gr.begin, WindowArena(), gr.quantized);
  }

  StateKey Key(size_t g, size_t piece) const {
    return StateKey{groups_[g].name, static_cast<int64_t>(piece), kKind};
  }

  void Prefetch(size_t g) const {
    if (g >= groups_.size()) return;
    if (master_ != nullptr) master_->Prefetch(g);
    for (size_t i = 0; i < committed_[g].size(); ++i) store_->Prefetch(Key(g, i));
  }

  // Group g's committed state (a fresh instance's at step 0: zeros, nothing stored yet).
  Result<SafetensorsFile> GroupState(size_t g) const {
    if (step_ == 0) {
      TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> inner, Window(g));
      return inner->SaveState();
    }
    std::string payload;
    for (size_t i = 0; i < committed_[g].size(); ++i) {
      const size_t at = payload.size();
      payload.resize(at + committed_[g][i]);
      TRAIND_RETURN_IF_ERROR(store_->Read(Key(g, i), payload.data() + at, committed_[g][i]));
    }
    return ParseOptimizerState(payload, store_->Describe() + " group '" + groups_[g].name + "'");
  }

  Status WriteGroup(size_t g, const SafetensorsFile& state) {
    const std::string payload = SerializeOptimizerState(state);
    std::vector<size_t>& sizes = pending_[g];
    sizes.clear();
    for (size_t at = 0; at < payload.size(); at += options_.piece_bytes) {
      const size_t n = std::min(options_.piece_bytes, payload.size() - at);
      TRAIND_RETURN_IF_ERROR(store_->Write(Key(g, sizes.size()), payload.data() + at, n));
      sizes.push_back(n);
    }
    return Status::Ok();
  }

  Status CommitAs(int64_t step) {
    TRAIND_RETURN_IF_ERROR(store_->Commit(step));
    committed_ = pending_;
    return Status::Ok();
  }
  Status CommitNow() override {
    TRAIND_RETURN_IF_ERROR(AwaitCommit());
    if (Status s = CommitAs(step_); !s.ok() && status_.ok()) status_ = s;
    return status_;
  }

  Status RunStep(float* params, const float* grads, double lr, float grad_scale) override {
    Backend* backend = arena_->backend();
    if (master_ != nullptr) master_->Invalidate();
    Prefetch(0);
    Prefetch(1);
    if (host_ != nullptr) {
      TRAIND_RETURN_IF_ERROR(RunStepOnHost(params, grads, lr, grad_scale));
      CommitStep();
      return Status::Ok();
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      Prefetch(g + 2);  // read-ahead two groups in front; writes go behind in the store
      const Group& gr = groups_[g];
      TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> inner, Window(g));
      if (step_ > 0) {
        TRAIND_ASSIGN_OR_RETURN(SafetensorsFile state, GroupState(g));
        TRAIND_RETURN_IF_ERROR(inner->LoadState(state));
      }
      float* p = params + gr.begin;  // the group's parameters, or its master weights' window
      if (master_ != nullptr) {
        TRAIND_RETURN_IF_ERROR(ReadMasterWindow(g, backend));
        p = win_p_;
      }
      inner->Step(p, grads + gr.begin, lr, grad_scale);
      TRAIND_RETURN_IF_ERROR(inner->status());
      if (master_ != nullptr) {
        RefreshFromWindow(g, backend);
        backend->Synchronize();
        TRAIND_RETURN_IF_ERROR(WriteMasterWindow(g));
      }
      TRAIND_RETURN_IF_ERROR(WriteGroup(g, inner->SaveState()));
    }
    CommitStep();
    return Status::Ok();
  }

  // OffloadOptions::update_on_host: group g's gradients (and without the master weights in the
  // store its weights) come down through staging slot g % 2 while group g - 1 updates; its
  // instance (in the host arena) updates the parameters in the slot with the CPU backend's
  // kernels, and they go up (the model's compute copy: UploadRange, or the fp32 weights in
  // place) while group g + 1 updates.
  Status RunStepOnHost(float* params, const float* grads, double lr, float grad_scale) {
    Backend* backend = arena_->backend();
    auto download = [&](size_t g) {
      return DownloadRange(static_cast<int>(g % 2), groups_[g].begin, groups_[g].end - groups_[g].begin, grads,
                           params);
    };
    if (!groups_.empty()) TRAIND_RETURN_IF_ERROR(download(0));
    for (size_t g = 0; g < groups_.size(); ++g) {
      Prefetch(g + 2);
      if (g + 1 < groups_.size()) TRAIND_RETURN_IF_ERROR(download(g + 1));
      const Group& gr = groups_[g];
      const int slot = static_cast<int>(g % 2);
      TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> inner, Window(g));
      if (step_ > 0) {
        TRAIND_ASSIGN_OR_RETURN(SafetensorsFile state, GroupState(g));
        TRAIND_RETURN_IF_ERROR(inner->LoadState(state));
      }
      float *gh = nullptr, *wh = nullptr;
      TRAIND_RETURN_IF_ERROR(HostRange(slot, g, &gh, &wh));
      TRAIND_RETURN_IF_ERROR(backend->status());
      inner->Step(wh, gh, lr, grad_scale);
      host_->Synchronize();
      TRAIND_RETURN_IF_ERROR(inner->status());
      TRAIND_RETURN_IF_ERROR(host_->status());
      TRAIND_RETURN_IF_ERROR(UploadRange(slot, gr.begin, gr.end - gr.begin, params));
      if (master_ != nullptr) TRAIND_RETURN_IF_ERROR(master_->Write(g, wh));
      TRAIND_RETURN_IF_ERROR(WriteGroup(g, inner->SaveState()));
    }
    return Status::Ok();
  }

  // The step's commit behind the caller, the next step's first groups read ahead.
  void CommitStep() {
    std::vector<StateKey> next;  // the next step reads groups 0 and 1 first
    for (size_t g = 0; g < std::min<size_t>(2, groups_.size()); ++g) {
      if (master_ != nullptr) {
        for (const StateKey& k : master_->Keys(g)) next.push_back(k);
      }
      for (size_t i = 0; i < pending_[g].size(); ++i) next.push_back(Key(g, i));
    }
    CommitBehind(step_ + 1, std::move(next));
    ++step_;
  }

  void Committed() const override { committed_ = pending_; }

  TrainingSpec t_;
  std::vector<Group> groups_;
  DeviceArena* arena_;
  OffloadOptions options_;
  mutable std::vector<std::vector<size_t>> committed_;  // per group: sizes of its committed pieces
  std::vector<std::vector<size_t>> pending_;    // per group: sizes written since the commit
  int64_t largest_ = 0;                          // elements of the largest group
  std::unique_ptr<DeviceArena> host_arena_;      // update_on_host: the instances' (EnableGroupsOnHost)
};

// AdamW, the common case, without a transient instance or a payload format: the flat state
// arrays m and v are cut into fixed chunks (StateKey{"adamw", chunk, "exp_avg" | "exp_avg_sq"},
// raw fp32), and a step streams them through one persistent device window (m and v of one chunk)
// with the in-memory AdamW's kernel. Large tensors (a 50K-token embedding) span several chunks,
// so the window stays one chunk whatever the model.
class OffloadedAdamW final : public HostDrivenOffload {
 public:
  static int64_t ChunkElems(int64_t num_params, const OffloadOptions& o) {
    const int64_t most = std::max<int64_t>(4096, o.group_state_bytes / 8);
    return std::min(most, std::max<int64_t>(4096, (num_params + 15) / 16));
  }
  static int64_t PlanBytes(int64_t num_params, const OffloadOptions& o) {
    // m, v (and the master weights); updated on the host, none (the staging slots are host memory).
    const int64_t windows = o.update_on_host ? 0 : 2 + (o.master_weights ? 1 : 0);
    return num_params > 0 ? windows * 4 * std::min(num_params, ChunkElems(num_params, o)) : 0;
  }

  static Result<std::unique_ptr<Optimizer>> Create(const TrainingSpec& t,
                                                   const std::vector<ParamInfo>& params,
                                                   int64_t num_params, DeviceArena* arena,
                                                   OptimizerStateStore* store,
                                                   const OffloadOptions& o) {
    std::unique_ptr<OffloadedAdamW> opt(new OffloadedAdamW(t, params, num_params, arena, store));
    opt->chunk_ = std::min(num_params, ChunkElems(num_params, o));
    if (opt->chunk_ > 0) {
      const int64_t bytes = opt->chunk_ * 4;
      if (!o.update_on_host) {  // the device windows of m and v (on the host: host_m_, host_v_)
        TRAIND_ASSIGN_OR_RETURN(void* m, arena->Allocate(MemoryCategory::kOptimizer, bytes,
                                                         "offload window exp_avg"));
        opt->win_m_ = static_cast<float*>(m);
        TRAIND_ASSIGN_OR_RETURN(void* v, arena->Allocate(MemoryCategory::kOptimizer, bytes,
                                                         "offload window exp_avg_sq"));
        opt->win_v_ = static_cast<float*>(v);
      }
      opt->host_m_.resize(static_cast<size_t>(opt->chunk_));
      opt->host_v_.resize(static_cast<size_t>(opt->chunk_));
      if (o.update_on_host) {  // the staging slots hold a chunk
        TRAIND_RETURN_IF_ERROR(
            opt->EnableHostUpdate(arena->backend(), o.host_threads, opt->chunk_, o.master_weights));
      }
      if (o.master_weights) {
        std::vector<MasterSegments::Segment> chunks;  // one piece per chunk: {"adamw", c, "master"}
        for (int64_t c = 0; c < opt->NumChunks(); ++c) {
          chunks.push_back({"adamw", c * opt->chunk_, std::min(num_params, (c + 1) * opt->chunk_), c});
        }
        TRAIND_RETURN_IF_ERROR(opt->EnableMaster(std::move(chunks), opt->chunk_, o.master_sink, arena,
                                                 /*windows=*/!o.update_on_host));
      }
    }
    return std::unique_ptr<Optimizer>(std::move(opt));
  }

  ~OffloadedAdamW() override {
    if (win_m_ != nullptr) arena_->Release(win_m_);
    if (win_v_ != nullptr) arena_->Release(win_v_);
    ReleaseMasterWindow();
  }

  SafetensorsFile SaveState() const override {
    std::vector<float> m, v;
    SafetensorsFile file;
    if (!AwaitCommit().ok()) return file;
    if (Status s = ReadAll(&m, &v); !s.ok()) {
      status_ = s;
      return file;
    }
    for (const ParamInfo& p : params_) {
      file.tensors[p.hf_name + ".exp_avg"] = HostTensor::FromF32(m.data() + p.offset, p.shape);
      file.tensors[p.hf_name + ".exp_avg_sq"] = HostTensor::FromF32(v.data() + p.offset, p.shape);
    }
    state_io::SetHeader(&file, kAdamWFormat, step_);
    return file;
  }

  // Streamed: one chunk of each kind in memory at a time, never the whole state.
  Result<SafetensorsStream> StateStream() const override {
    TRAIND_RETURN_IF_ERROR(AwaitCommit());
    SafetensorsStream out;
    for (const ParamInfo& p : params_) {
      out.tensors.push_back({p.hf_name + ".exp_avg", "F32", p.shape});
      out.tensors.push_back({p.hf_name + ".exp_avg_sq", "F32", p.shape});
    }
    SafetensorsFile header;  // the metadata only
    state_io::SetHeader(&header, kAdamWFormat, step_);
    out.metadata = header.metadata;
    struct Chunks {  // the chunk of each kind last read
      std::vector<float> buf[2];
      int64_t cached[2] = {-1, -1};
    };
    auto chunks = std::make_shared<Chunks>();
    for (auto& b : chunks->buf) b.resize(static_cast<size_t>(chunk_));
    out.data = [this, chunks](size_t i, const SafetensorsSink& sink) -> Status {
      const ParamInfo& p = params_[i / 2];
      const int which = static_cast<int>(i % 2);
      std::vector<float>& buf = chunks->buf[which];
      for (int64_t at = p.offset; at < p.offset + p.numel;) {
        const int64_t c = at / chunk_, lo = c * chunk_, n = std::min(chunk_, num_params_ - lo);
        if (chunks->cached[which] != c) {
          if (step_ == 0) {
            std::fill(buf.begin(), buf.end(), 0.0f);
          } else {
            Prefetch(c + 1, false);
            TRAIND_RETURN_IF_ERROR(store_->Read(Key(c, which), buf.data(), static_cast<size_t>(n) * 4));
          }
          chunks->cached[which] = c;
        }
        const int64_t end = std::min(p.offset + p.numel, lo + n);
        if (!sink(buf.data() + (at - lo), static_cast<size_t>(end - at) * 4)) return Status::Ok();
        at = end;
      }
      return Status::Ok();
    };
    return out;
  }

  Status LoadState(const SafetensorsFile& file) override {
    TRAIND_RETURN_IF_ERROR(AwaitCommit());
    TRAIND_ASSIGN_OR_RETURN(const int64_t step, state_io::ReadStep(file, kAdamWFormat));
    std::vector<float> all[2] = {std::vector<float>(static_cast<size_t>(num_params_)),
                                 std::vector<float>(static_cast<size_t>(num_params_))};
    for (const ParamInfo& p : params_) {
      for (int which = 0; which < 2; ++which) {
        TRAIND_ASSIGN_OR_RETURN(
            const HostTensor* t,
            state_io::Find(file, p.hf_name + (which == 0 ? ".exp_avg" : ".exp_avg_sq"), "F32", p.shape));
        std::memcpy(all[which].data() + p.offset, t->data.data(), t->data.size());
      }
    }
    for (int64_t c = 0; c * chunk_ < num_params_; ++c) {
      const int64_t lo = c * chunk_, n = std::min(chunk_, num_params_ - lo);
      for (int which = 0; which < 2; ++which) {
        TRAIND_RETURN_IF_ERROR(store_->Write(Key(c, which), all[which].data() + lo, static_cast<size_t>(n) * 4));
      }
    }
    TRAIND_RETURN_IF_ERROR(store_->Commit(step));
    step_ = step;
    return Status::Ok();
  }

  // Streamed (resume): every tensor checked against the header first, then chunk by chunk m and
  // v assembled from byte ranges of the tensors that overlap the chunk (pread) in the two
  // chunk-sized host buffers and written to the store: host memory stays at the window, never
  // the whole state (transformers #17258: a resume that read it whole was OOM-killed).
  Status ReadState(const std::string& path) override {
    TRAIND_RETURN_IF_ERROR(AwaitCommit());
    TRAIND_ASSIGN_OR_RETURN(SafetensorsReader file, SafetensorsReader::Open(path));
    TRAIND_ASSIGN_OR_RETURN(const int64_t step, state_io::ReadStep(file.metadata(), kAdamWFormat));
    struct Piece {
      int64_t offset, numel;
      std::string name[2];
    };
    std::vector<Piece> pieces;
    for (const ParamInfo& p : params_) {
      Piece piece{p.offset, p.numel, {p.hf_name + ".exp_avg", p.hf_name + ".exp_avg_sq"}};
      for (int which = 0; which < 2; ++which) {
        TRAIND_ASSIGN_OR_RETURN(const SafetensorsReader::Entry* e,
                                state_io::Find(file, piece.name[which], "F32", p.shape));
        (void)e;
      }
      pieces.push_back(std::move(piece));
    }
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    std::vector<float>* buf[2] = {&host_m_, &host_v_};
    size_t first = 0;  // the first piece that may overlap the chunk
    for (int64_t c = 0; c < NumChunks(); ++c) {
      const int64_t lo = c * chunk_, n = std::min(chunk_, num_params_ - lo), hi = lo + n;
      while (first < pieces.size() && pieces[first].offset + pieces[first].numel <= lo) ++first;
      for (int which = 0; which < 2; ++which) {
        float* dst = buf[which]->data();
        std::fill(dst, dst + n, 0.0f);  // as LoadState: elements no tensor covers are zero
        for (size_t i = first; i < pieces.size() && pieces[i].offset < hi; ++i) {
          const Piece& p = pieces[i];
          const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
          if (a >= b) continue;
          TRAIND_RETURN_IF_ERROR(file.ReadRange(p.name[which], static_cast<uint64_t>(a - p.offset) * 4,
                                                dst + (a - lo), static_cast<size_t>(b - a) * 4));
        }
        TRAIND_RETURN_IF_ERROR(store_->Write(Key(c, which), dst, static_cast<size_t>(n) * 4));
      }
    }
    TRAIND_RETURN_IF_ERROR(store_->Commit(step));
    step_ = step;
    return Status::Ok();
  }

 private:
  struct Run {
    int64_t offset, numel;
    bool decay;
  };
  OffloadedAdamW(const TrainingSpec& t, const std::vector<ParamInfo>& params, int64_t num_params,
                 DeviceArena* arena, OptimizerStateStore* store)
      : HostDrivenOffload("adamw", store), t_(t), params_(params), num_params_(num_params), arena_(arena) {
    std::vector<ParamInfo> sorted = params;
    std::sort(sorted.begin(), sorted.end(),
              [](const ParamInfo& a, const ParamInfo& b) { return a.offset < b.offset; });
    for (const ParamInfo& p : sorted) {  // as AdamWOptimizer: decay runs over contiguous tensors
      const bool decay = p.weight_decay && t.weight_decay != 0.0;
      if (!runs_.empty() && runs_.back().decay == decay && runs_.back().offset + runs_.back().numel == p.offset) {
        runs_.back().numel += p.numel;
      } else {
        runs_.push_back({p.offset, p.numel, decay});
      }
    }
  }

  // which: 0 exp_avg, 1 exp_avg_sq (the master weights: master_).
  StateKey Key(int64_t chunk, int which) const {
    return StateKey{"adamw", chunk, which == 0 ? "exp_avg" : "exp_avg_sq"};
  }
  int64_t NumChunks() const { return chunk_ > 0 ? (num_params_ + chunk_ - 1) / chunk_ : 0; }
  // The chunk's m and v (not before the first step: there are none) and, with `master`, its
  // master weights.
  void Prefetch(int64_t c, bool master = true) const {
    if (c < 0 || c >= NumChunks()) return;
    if (step_ > 0) {
      store_->Prefetch(Key(c, 0));
      store_->Prefetch(Key(c, 1));
    }
    if (master && master_ != nullptr) master_->Prefetch(static_cast<size_t>(c));
  }

  // The whole committed state as flat arrays (zeros before the first step).
  Status ReadAll(std::vector<float>* m, std::vector<float>* v) const {
    m->assign(static_cast<size_t>(num_params_), 0.0f);
    v->assign(static_cast<size_t>(num_params_), 0.0f);
    if (step_ == 0) return Status::Ok();
    for (int64_t c = 0; c < NumChunks(); ++c) {
      Prefetch(c + 1, false);
      const int64_t lo = c * chunk_, n = std::min(chunk_, num_params_ - lo);
      TRAIND_RETURN_IF_ERROR(store_->Read(Key(c, 0), m->data() + lo, static_cast<size_t>(n) * 4));
      TRAIND_RETURN_IF_ERROR(store_->Read(Key(c, 1), v->data() + lo, static_cast<size_t>(n) * 4));
    }
    return Status::Ok();
  }

  // A step runs the chunks from the last to the first: backward finishes the last layers'
  // gradients first, so with BeginStep / GradientsFinalFrom the chunks of layers whose gradients
  // are final update while backward goes on below them; the order does not change a bit of the
  // update (each element's AdamW is independent of the others).
  void StartStep(float* params, const float* grads, double lr, float grad_scale) {
    const int64_t step = step_ + 1;
    // As AdamWOptimizer::Step: 1 - beta ** step in double, handed to the kernel in fp32.
    cur_ = Current{params, grads, lr, grad_scale, 1.0 - std::pow(t_.adam_beta1, static_cast<double>(step)),
                   1.0 - std::pow(t_.adam_beta2, static_cast<double>(step)), step_ == 0};
    if (master_ != nullptr) master_->Invalidate();
    next_ = NumChunks() - 1;
    final_from_ = num_params_;
    downloaded_ = -1;
    Prefetch(next_);
    Prefetch(next_ - 1);
    active_ = true;
  }

  // Chunk c of the current step: read (its read-ahead started two chunks before), updated in the
  // window (or on the host: UpdateChunkOnHost), written back behind.
  Status UpdateChunk(int64_t c) {
    if (host_ != nullptr) return UpdateChunkOnHost(c);
    Backend* backend = arena_->backend();
    const int64_t lo = c * chunk_, n = std::min(chunk_, num_params_ - lo), hi = lo + n;
    const size_t bytes = static_cast<size_t>(n) * 4;
    Prefetch(c - 2);
    // The chunk's parameters: in the model's buffer (flat offsets), or read into the master
    // window (offsets from lo).
    float* p = cur_.params;
    int64_t p_base = 0;
    if (master_ != nullptr) {
      TRAIND_RETURN_IF_ERROR(ReadMasterWindow(static_cast<size_t>(c), backend));
      p = win_p_;
      p_base = lo;
    }
    if (cur_.fresh) {
      backend->Memset0(win_m_, bytes);
      backend->Memset0(win_v_, bytes);
    } else {
      TRAIND_RETURN_IF_ERROR(store_->Read(Key(c, 0), host_m_.data(), bytes));
      TRAIND_RETURN_IF_ERROR(store_->Read(Key(c, 1), host_v_.data(), bytes));
      backend->CopyHostToDevice(win_m_, host_m_.data(), bytes);
      backend->CopyHostToDevice(win_v_, host_v_.data(), bytes);
    }
    ApplyAdamW(backend, lo, hi, p, p_base, cur_.grads, 0, win_m_, win_v_);
    backend->CopyDeviceToHost(host_m_.data(), win_m_, bytes);
    backend->CopyDeviceToHost(host_v_.data(), win_v_, bytes);
    if (master_ != nullptr) RefreshFromWindow(static_cast<size_t>(c), backend);
    backend->Synchronize();
    return WriteChunk(c, bytes, host_p_.data());
  }

  // The current step's AdamW over the flat elements [lo, hi) on `be`, run by run (decay or not):
  // element e is p[e - p_base], g[e - g_base], m[e - lo] and v[e - lo].
  void ApplyAdamW(Backend* be, int64_t lo, int64_t hi, float* p, int64_t p_base, const float* g,
                  int64_t g_base, float* m, float* v) const {
    for (const Run& r : runs_) {
      const int64_t a = std::max(lo, r.offset), b = std::min(hi, r.offset + r.numel);
      if (a >= b) continue;
      be->AdamW(p + (a - p_base), g + (a - g_base), m + (a - lo), v + (a - lo), b - a, static_cast<float>(cur_.lr),
                static_cast<float>(t_.adam_beta1), static_cast<float>(t_.adam_beta2),
                static_cast<float>(t_.adam_epsilon), r.decay ? static_cast<float>(t_.weight_decay) : 0.0f,
                static_cast<float>(cur_.bc1), static_cast<float>(cur_.bc2), cur_.grad_scale);
    }
  }

  // Chunk c's updated m and v (host_m_, host_v_) and master weights (`master`, on the host)
  // written behind.
  Status WriteChunk(int64_t c, size_t bytes, const float* master) {
    TRAIND_RETURN_IF_ERROR(store_->Write(Key(c, 0), host_m_.data(), bytes));
    TRAIND_RETURN_IF_ERROR(store_->Write(Key(c, 1), host_v_.data(), bytes));
    if (master_ != nullptr) TRAIND_RETURN_IF_ERROR(master_->Write(static_cast<size_t>(c), master));
    return Status::Ok();
  }

  // OffloadOptions::update_on_host: the chunk's gradients come down, its parameters (the master
  // weights from the store, or the device's fp32 weights) and m, v are updated by the CPU
  // backend's AdamW in host memory (the same per-element math as every backend's kernel), and the
  // weights go back up: with the master weights the model's compute copy (UploadRange: 16-bit
  // rounded on the host, the fp32 resident pieces), else the device's fp32 weights in place. The
  // copies go through the backend's HostStaging (pinned slots and a copy stream on CUDA), two
  // slots of [gradients | weights]: chunk c - 1's download is issued before chunk c updates (when its
  // gradients are final) and chunk c's upload runs while chunk c - 1 updates; the host waits only
  // for the slot it is about to use.
  Status UpdateChunkOnHost(int64_t c) {
    Backend* backend = arena_->backend();
    const int64_t lo = c * chunk_, n = std::min(chunk_, num_params_ - lo), hi = lo + n;
    const size_t bytes = static_cast<size_t>(n) * 4;
    const int slot = static_cast<int>(c % 2);
    Prefetch(c - 2);
    if (downloaded_ != c) TRAIND_RETURN_IF_ERROR(DownloadChunk(c));
    if (c > 0 && (c - 1) * chunk_ >= final_from_) TRAIND_RETURN_IF_ERROR(DownloadChunk(c - 1));
    if (cur_.fresh) {
      std::fill(host_m_.begin(), host_m_.begin() + n, 0.0f);
      std::fill(host_v_.begin(), host_v_.begin() + n, 0.0f);
    } else {
      TRAIND_RETURN_IF_ERROR(store_->Read(Key(c, 0), host_m_.data(), bytes));
      TRAIND_RETURN_IF_ERROR(store_->Read(Key(c, 1), host_v_.data(), bytes));
    }
    float *g = nullptr, *w = nullptr;  // the gradients (and weights) came down
    TRAIND_RETURN_IF_ERROR(HostRange(slot, static_cast<size_t>(c), &g, &w));
    TRAIND_RETURN_IF_ERROR(backend->status());
    ApplyAdamW(host_.get(), lo, hi, w, lo, g, lo, host_m_.data(), host_v_.data());
    host_->Synchronize();
    TRAIND_RETURN_IF_ERROR(UploadRange(slot, lo, n, cur_.params));
    return WriteChunk(c, bytes, w);
  }
  // Chunk c's staging download, behind the compute work issued so far.
  Status DownloadChunk(int64_t c) {
    const int64_t lo = c * chunk_;
    TRAIND_RETURN_IF_ERROR(
        DownloadRange(static_cast<int>(c % 2), lo, std::min(chunk_, num_params_ - lo), cur_.grads, cur_.params));
    downloaded_ = c;
    return Status::Ok();
  }

 public:
  bool updates_during_backward() const override { return NumChunks() > 0; }
  // The values only: the store is not touched before the first chunk is final (the previous
  // step's commit keeps running behind the forward and the first blocks' backward).
  void BeginStep(float* params, const float* grads, double lr, float grad_scale) override {
    begun_ = Current{params, grads, lr, grad_scale};
    has_begun_ = true;
    early_ = 0;
  }
  void GradientsFinalFrom(int64_t offset) override {
    if (!has_begun_ || !status_.ok()) return;
    if (!active_) {
      if (NumChunks() == 0 || (NumChunks() - 1) * chunk_ < offset) return;  // nothing final yet
      if (!AwaitCommit().ok()) return;  // AwaitCommit keeps its error in status_
      StartStep(begun_.params, begun_.grads, begun_.lr, begun_.grad_scale);
    }
    final_from_ = offset;
    for (; active_ && status_.ok() && next_ >= 0 && next_ * chunk_ >= offset; --next_) {
      if (Status s = UpdateChunk(next_); !s.ok()) {
        status_ = s;
        return;
      }
      early_ += std::min(chunk_, num_params_ - next_ * chunk_);
    }
  }
  int64_t updated_during_backward() const override { return early_; }

 private:
  Status RunStep(float* params, const float* grads, double lr, float grad_scale) override {
    if (has_begun_ && (params != begun_.params || grads != begun_.grads || lr != begun_.lr ||
                       grad_scale != begun_.grad_scale)) {
      return Status::Internal("offloaded adamw: Step's values differ from its BeginStep's");
    }
    has_begun_ = false;
    if (!active_) StartStep(params, grads, lr, grad_scale);
    final_from_ = 0;  // backward has finished: every gradient is final
    for (; next_ >= 0; --next_) TRAIND_RETURN_IF_ERROR(UpdateChunk(next_));
    active_ = false;
    // The next step's reads in its order, as far as the store's read-ahead budget goes (it drops
    // the rest): they come in while the next forward and backward run.
    std::vector<StateKey> next;
    for (int64_t c = NumChunks() - 1; c >= 0; --c) {
      if (master_ != nullptr) {  // read first in the step
        for (const StateKey& k : master_->Keys(static_cast<size_t>(c))) next.push_back(k);
      }
      next.push_back(Key(c, 0));
      next.push_back(Key(c, 1));
    }
    CommitBehind(step_ + 1, std::move(next));
    step_ += 1;
    return Status::Ok();
  }

  // The step in progress (StartStep .. RunStep).
  struct Current {
    float* params = nullptr;
    const float* grads = nullptr;
    double lr = 0.0;
    float grad_scale = 1.0f;
    double bc1 = 0.0, bc2 = 0.0;
    bool fresh = false;  // the first step: no state to read
  };
  Current cur_;
  Current begun_;           // BeginStep's values
  bool has_begun_ = false;  // BeginStep called, Step not yet
  bool active_ = false;  // a step started and not finished
  int64_t next_ = -1;    // the next chunk it updates (they go down to 0)
  int64_t early_ = 0;    // elements updated by GradientsFinalFrom this step
  int64_t final_from_ = 0;   // the gradients of the elements from here on are final
  int64_t downloaded_ = -1;  // the chunk whose staging download was issued last

  TrainingSpec t_;
  std::vector<ParamInfo> params_;
  int64_t num_params_;
  DeviceArena* arena_;
  std::vector<Run> runs_;
  int64_t chunk_ = 0;  // elements per chunk
  float* win_m_ = nullptr;
  float* win_v_ = nullptr;
  std::vector<float> host_m_, host_v_;
};

}  // namespace

std::string SerializeOptimizerState(const SafetensorsFile& file) {
  std::string out(kMagic, 4);
  PutU32(&out, static_cast<uint32_t>(file.metadata.size()));
  for (const auto& [k, v] : file.metadata) {
    PutStr(&out, k);
    PutStr(&out, v);
  }
  PutU32(&out, static_cast<uint32_t>(file.tensors.size()));
  for (const auto& [name, t] : file.tensors) {
    PutStr(&out, name);
    PutStr(&out, t.dtype);
    PutU32(&out, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) PutU64(&out, static_cast<uint64_t>(d));
    PutU64(&out, t.data.size());
    out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  return out;
}

Result<SafetensorsFile> ParseOptimizerState(const std::string& payload, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return Status::DataLoss("optimizer state in " + where + ": " + what);
  };
  if (payload.size() < 4 || std::memcmp(payload.data(), kMagic, 4) != 0) return bad("bad magic");
  Reader r(payload);
  r.Bytes(4);
  SafetensorsFile file;
  const uint64_t n_meta = r.U(4);
  for (uint64_t i = 0; i < n_meta && r.ok(); ++i) {
    std::string k = r.Str();
    file.metadata[k] = r.Str();
  }
  const uint64_t n_tensors = r.U(4);
  for (uint64_t i = 0; i < n_tensors && r.ok(); ++i) {
    const std::string name = r.Str();
    HostTensor t;
    t.dtype = r.Str();
    const uint64_t ndim = r.U(4);
    if (ndim > 8) return bad("tensor " + name + " has " + std::to_string(ndim) + " dimensions");
    for (uint64_t d = 0; d < ndim; ++d) t.shape.push_back(static_cast<int64_t>(r.U(8)));
    const std::string data = r.Bytes(r.U(8));
    t.data.assign(data.begin(), data.end());
    if (r.ok() && static_cast<int64_t>(t.data.size()) !=
                      t.numel() * static_cast<int64_t>(SafetensorsDTypeSize(t.dtype))) {
      return bad("tensor " + name + " has " + std::to_string(t.data.size()) +
                 " bytes for its dtype and shape");
    }
    file.tensors[name] = std::move(t);
  }
  if (!r.ok()) return bad("truncated");
  if (!r.done()) return bad("trailing bytes");
  return file;
}

Result<std::unique_ptr<Optimizer>> MakeOffloadedOptimizer(const TrainingSpec& training,
                                                          const std::vector<ParamInfo>& params,
                                                          int64_t num_params, DeviceArena* arena,
                                                          OptimizerStateStore* store,
                                                          const OffloadOptions& options,
                                                          const std::vector<bool>& quantized) {
  if (store == nullptr) return Status::Internal("offloaded optimizer without a store");
  if (!quantized.empty() &&
      (!OptimizerOf(training).quantized_8bit || quantized.size() != params.size())) {
    return Status::Internal("offloaded optimizer: " + std::to_string(quantized.size()) +
                            " 8-bit choices for " + std::to_string(params.size()) +
                            " parameters of " + training.optim);
  }
  for (const ParamInfo& p : params) {
    if (p.offset < 0 || p.numel < 0 || p.offset + p.numel > num_params) {
      return Status::Internal("optimizer: parameter " + p.hf_name + " lies outside the flat buffer");
    }
  }
  if (options.master_weights && options.master_sink == nullptr) {
    return Status::Internal("offloaded optimizer: master weights in the store need the model's sink");
  }
  if (OptimizerOf(training).offload == OptimizerRow::Offload::kChunkedAdamW) {
    return OffloadedAdamW::Create(training, params, num_params, arena, store, options);
  }
  std::vector<Group> groups = MakeGroups(training, params, quantized, options);
  const bool any = !groups.empty();
  std::unique_ptr<OffloadedOptimizer> opt(
      new OffloadedOptimizer(training, std::move(groups), arena, store, options));
  if (options.update_on_host) TRAIND_RETURN_IF_ERROR(opt->EnableGroupsOnHost());
  // Reject what the real optimizer rejects (options) before the first step.
  if (any) {
    TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> probe, opt->ProbeWindow());
  }
  if (options.master_weights) TRAIND_RETURN_IF_ERROR(opt->EnableGroupMaster(options.master_sink));
  return std::unique_ptr<Optimizer>(std::move(opt));
}

int64_t OffloadedOptimizerDeviceBytes(const TrainingSpec& training,
                                      const std::vector<ParamInfo>& params, int64_t num_params,
                                      const OffloadOptions& options,
                                      const std::vector<bool>& quantized) {
  if (OptimizerOf(training).offload == OptimizerRow::Offload::kChunkedAdamW) {
    return OffloadedAdamW::PlanBytes(num_params, options);
  }
  int64_t most = 0, largest = 0;
  for (const Group& g : MakeGroups(training, params, quantized, options)) {
    most = std::max(most, OptimizerPlanBytes(training, g.params, g.end - g.begin, g.quantized));
    largest = std::max(largest, g.end - g.begin);
  }
  // With the master weights: the window of the largest group's, beside a group's state; updated on
  // the host, none (the instances live in a host arena, the weights cross in staging slots).
  if (options.update_on_host) return 0;
  return most + (options.master_weights ? 4 * largest : 0);
}

}  // namespace traind::engine
