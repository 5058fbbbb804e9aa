// ZeRO-1: the rank's shard of the flat buffer through an ordinary optimizer over slices, the
// gather of the updated weights, and the unsharded state file gathered / sliced (see the header).
#include "optim/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "optim/adamw_8bit.h"
#include "optim/offloaded_optimizer.h"
#include "optim/quant8.h"
#include "optim/state_io.h"

namespace traind::engine {
namespace {

// Whether adamw_8bit keeps 8-bit moments for the whole tensor `p` (its size rule, over the
// tensor HF has: LiveNumel; training does not change min_8bit_size).
bool Quantized8bit(const TrainingSpec& t, const ParamInfo& p) {
  return OptimizerOf(t).quantized_8bit && p.numel > 0 &&
         LiveNumel(p) >= AdamW8bitOptions().min_8bit_size;
}

// The slices of `params` inside [begin, end): 1-D views with the parameter's name and decay flag,
// offsets from `begin`; `of` gets each slice's parameter index, `quantized` (adamw_8bit) whether
// its tensor keeps 8-bit moments.
std::vector<ParamInfo> SlicesIn(const TrainingSpec& t, const std::vector<ParamInfo>& params,
                                int64_t begin, int64_t end, std::vector<size_t>* of,
                                std::vector<bool>* quantized) {
  std::vector<ParamInfo> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    ParamInfo q;
    q.hf_name = p.hf_name;
    const bool whole = lo == p.offset && hi == p.offset + p.numel;
    q.shape = whole ? p.shape : std::vector<int64_t>{hi - lo};
    q.hf_shape = whole ? p.hf_shape : q.shape;
    q.offset = lo - begin;
    q.numel = hi - lo;
    q.weight_decay = p.weight_decay;
    out.push_back(std::move(q));
    if (of != nullptr) of->push_back(i);
    if (OptimizerOf(t).quantized_8bit) quantized->push_back(Quantized8bit(t, p));
  }
  return out;
}

// Whether `name` is "<hf_name>.<kind>" (a kind holds no dot).
bool IsStateOf(const std::string& name, const std::string& hf_name) {
  return name.size() > hf_name.size() + 1 && name.compare(0, hf_name.size(), hf_name) == 0 &&
         name[hf_name.size()] == '.' && name.find('.', hf_name.size() + 1) == std::string::npos;
}

// A state file's tensors as bytes, and back (the all-gather of the shards' states).
template <typename T>
void Put(std::vector<uint8_t>* out, const T& v) {
  const auto* b = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), b, b + sizeof(T));
}
void PutString(std::vector<uint8_t>* out, const std::string& s) {
  Put(out, static_cast<uint64_t>(s.size()));
  out->insert(out->end(), s.begin(), s.end());
}

std::vector<uint8_t> Pack(const SafetensorsFile& file) {
  std::vector<uint8_t> out;
  Put(&out, static_cast<uint64_t>(file.tensors.size()));
  for (const auto& [name, t] : file.tensors) {
    PutString(&out, name);
    PutString(&out, t.dtype);
    Put(&out, static_cast<uint64_t>(t.shape.size()));
    for (int64_t d : t.shape) Put(&out, d);
    Put(&out, static_cast<uint64_t>(t.data.size()));
    out.insert(out.end(), t.data.begin(), t.data.end());
  }
  return out;
}

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool U64(uint64_t* v) { return Bytes(v, sizeof(*v)); }
  bool I64(int64_t* v) { return Bytes(v, sizeof(*v)); }
  bool String(std::string* s) {
    uint64_t n = 0;
    if (!U64(&n) || n > n_ - at_) return false;
    s->assign(reinterpret_cast<const char*>(p_ + at_), n);
    at_ += n;
    return true;
  }
  bool Data(std::vector<uint8_t>* d) {
    uint64_t n = 0;
    if (!U64(&n) || n > n_ - at_) return false;
    d->assign(p_ + at_, p_ + at_ + n);
    at_ += n;
    return true;
  }

 private:
  bool Bytes(void* v, size_t n) {
    if (n > n_ - at_) return false;
    std::memcpy(v, p_ + at_, n);
    at_ += n;
    return true;
  }
  const uint8_t* p_;
  size_t n_, at_ = 0;
};

Result<SafetensorsFile> Unpack(const uint8_t* p, size_t n, int rank) {
  SafetensorsFile file;
  Reader r(p, n);
  uint64_t count = 0;
  bool ok = r.U64(&count);
  for (uint64_t i = 0; ok && i < count; ++i) {
    std::string name;
    HostTensor t;
    uint64_t dims = 0;
    ok = r.String(&name) && r.String(&t.dtype) && r.U64(&dims) && dims <= 8;
    t.shape.resize(ok ? dims : 0);
    for (int64_t& d : t.shape) ok = ok && r.I64(&d);
    ok = ok && r.Data(&t.data);
    if (ok) file.tensors[name] = std::move(t);
  }
  if (!ok) {
    return Status::Internal("zero_stage 1: the optimizer state gathered from rank " +
                            std::to_string(rank) + " is malformed");
  }
  return file;
}

// A state tensor's header: its dtype, shape and data bytes (a HostTensor's, or a file entry's).
struct TensorDesc {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// The bytes [offset, offset + bytes) of full tensor `name` that are the rank's, as a tensor of
// `dtype` and `shape`.
struct SliceRead {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;
};

// What LoadState / ReadState keep of a full state file's tensors `all`: for each slice local[i]
// (of params[local_of[i]], in the rank's range from `begin`), each of its parameter's state
// tensors: whole when the rank holds the whole parameter (the inner optimizer checks it), else
// its elements (the parameter's shape) or, `blockwise` (8-bit AdamW), its absmax blocks.
// DATA_LOSS naming a tensor of another shape.
Result<std::vector<SliceRead>> SlicesToRead(const std::map<std::string, TensorDesc>& all,
                                            const std::vector<ParamInfo>& params,
                                            const std::vector<ParamInfo>& local,
                                            const std::vector<size_t>& local_of, int64_t begin,
                                            bool blockwise) {
  std::vector<SliceRead> out;
  for (size_t i = 0; i < local.size(); ++i) {
    const ParamInfo& q = local[i];
    const ParamInfo& p = params[local_of[i]];
    const int64_t skip = begin + q.offset - p.offset;  // the slice's first element within p
    for (auto it = all.lower_bound(p.hf_name + ".");
         it != all.end() && it->first.compare(0, p.hf_name.size(), p.hf_name) == 0; ++it) {
      if (!IsStateOf(it->first, p.hf_name)) continue;
      const TensorDesc& t = it->second;
      if (q.numel == p.numel) {  // the whole tensor: its state as it is (the inner one checks)
        out.push_back({it->first, t.dtype, t.shape, 0, t.bytes});
        continue;
      }
      const int64_t unit = static_cast<int64_t>(SafetensorsDTypeSize(t.dtype));
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      // One value per element (the parameter's shape), or (8-bit AdamW) one per block.
      int64_t first = skip, count = q.numel;
      std::vector<int64_t> shape = q.shape;
      const bool per_element = t.shape == p.shape;
      const bool per_block = blockwise && t.shape == std::vector<int64_t>{Quant8Blocks(p.numel)} &&
                             skip % kQuant8Block == 0;
      if (per_block && !per_element) {
        first = skip / kQuant8Block;
        count = Quant8Blocks(q.numel);
        shape = {count};
      }
      if ((!per_element && !per_block) || unit == 0 ||
          static_cast<int64_t>(t.bytes) != numel * unit) {
        return Status::DataLoss("optimizer state: tensor " + it->first + " has dtype " + t.dtype +
                                " and a shape other than this model's");
      }
      out.push_back({it->first, t.dtype, shape, static_cast<uint64_t>(first * unit),
                     static_cast<uint64_t>(count * unit)});
    }
  }
  return out;
}

}  // namespace

Status CheckZeroOneOptimizer(const TrainingSpec& t) {
  if (FindOptimizer(t.optim) != nullptr) return Status::Ok();  // every row has its Zero1 rule
  return Status::InvalidArgument("distributed.zero_stage: 1 cannot shard the state of "
                                 "training.optim " + t.optim + ": use zero_stage 0");
}

std::vector<std::pair<int64_t, int64_t>> ZeroOneShards(const TrainingSpec& t,
                                                       const std::vector<ParamInfo>& params,
                                                       int64_t num_params, int world) {
  std::vector<int64_t> cut(static_cast<size_t>(world) + 1, num_params);
  cut[0] = 0;
  switch (OptimizerOf(t).zero1) {
  case OptimizerRow::Zero1::kWholeTensors: {
    // Whole tensors (the second moment is factored per matrix), balanced by state floats: each
    // cut at the tensor boundary nearest its share.
    std::vector<ParamInfo> sorted = params;
    std::sort(sorted.begin(), sorted.end(),
              [](const ParamInfo& a, const ParamInfo& b) { return a.offset < b.offset; });
    auto floats = [&](const ParamInfo& p) {
      double n = t.optim_args.beta1.has_value() ? static_cast<double>(p.numel) : 0.0;
      if (p.shape.size() >= 2) {
        const double rows = static_cast<double>(p.shape[p.shape.size() - 2]);
        const double cols = static_cast<double>(p.shape.back());
        return n + static_cast<double>(p.numel) / (rows * cols) * (rows + cols);
      }
      return n + static_cast<double>(p.numel);
    };
    double total = 0.0;
    for (const ParamInfo& p : sorted) total += floats(p);
    size_t i = 0;
    double before = 0.0;  // the floats of sorted[0, i)
    for (int r = 1; r < world; ++r) {
      const double target = total * r / world;
      while (i < sorted.size() && before + floats(sorted[i]) / 2 < target) {
        before += floats(sorted[i++]);
      }
      const int64_t at = i < sorted.size() ? sorted[i].offset : num_params;
      cut[static_cast<size_t>(r)] = std::max(at, cut[static_cast<size_t>(r) - 1]);
    }
    break;
  }
  case OptimizerRow::Zero1::kElementwise:  // the same bytes per element
    for (int r = 1; r < world; ++r) cut[static_cast<size_t>(r)] = num_params * r / world;
    break;
  case OptimizerRow::Zero1::kQuantizedBlocks: {
    // Balanced by state bytes (an 8-bit element holds 2 bytes and its block's absmax, an fp32
    // one 8); a cut inside an 8-bit tensor moves to its nearest block boundary.
    std::vector<ParamInfo> sorted = params;
    std::sort(sorted.begin(), sorted.end(),
              [](const ParamInfo& a, const ParamInfo& b) { return a.offset < b.offset; });
    auto cost = [&](const ParamInfo& p) {
      return Quantized8bit(t, p) ? 2.0 + 8.0 / static_cast<double>(kQuant8Block) : 8.0;
    };
    auto bytes = [&](const ParamInfo& p) { return cost(p) * static_cast<double>(p.numel); };
    double total = 0.0;
    for (const ParamInfo& p : sorted) total += bytes(p);
    size_t i = 0;
    double before = 0.0;  // the bytes of sorted[0, i)
    for (int r = 1; r < world; ++r) {
      const double target = total * r / world;
      while (i < sorted.size() && before + bytes(sorted[i]) < target) before += bytes(sorted[i++]);
      int64_t at = num_params;
      if (i < sorted.size()) {
        const ParamInfo& p = sorted[i];
        int64_t k = static_cast<int64_t>(std::ceil((target - before) / cost(p)));
        if (Quantized8bit(t, p)) k = (k + kQuant8Block / 2) / kQuant8Block * kQuant8Block;
        at = p.offset + std::clamp<int64_t>(k, 0, p.numel);
      }
      cut[static_cast<size_t>(r)] = std::max(at, cut[static_cast<size_t>(r) - 1]);
    }
    break;
  }
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int r = 0; r < world; ++r) {
    ranges.emplace_back(cut[static_cast<size_t>(r)], cut[static_cast<size_t>(r) + 1]);
  }
  return ranges;
}

int64_t ZeroOnePlanBytes(const TrainingSpec& training, const std::vector<ParamInfo>& params,
                         int64_t num_params, int world) {
  int64_t most = 0;
  for (const auto& [b, e] : ZeroOneShards(training, params, num_params, world)) {
    std::vector<bool> quantized;
    const std::vector<ParamInfo> slices = SlicesIn(training, params, b, e, nullptr, &quantized);
    most = std::max(most, OptimizerPlanBytes(training, slices, e - b, quantized));
  }
  return most;
}

ZeroOneOffloadBytes ZeroOneOffloadPlanBytes(const TrainingSpec& training,
                                            const std::vector<ParamInfo>& params,
                                            int64_t num_params, int world) {
  ZeroOneOffloadBytes most;
  for (const auto& [b, e] : ZeroOneShards(training, params, num_params, world)) {
    std::vector<bool> quantized;
    const std::vector<ParamInfo> slices = SlicesIn(training, params, b, e, nullptr, &quantized);
    most.window = std::max(most.window,
                           OffloadedOptimizerDeviceBytes(training, slices, e - b, {}, quantized));
    most.state = std::max(most.state, OptimizerPlanBytes(training, slices, e - b, quantized));
  }
  return most;
}

Result<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(
    const TrainingSpec& training, const std::vector<ParamInfo>& params, int64_t num_params,
    Communicator* comm, DeviceArena* arena, OptimizerStateStore* store) {
  TRAIND_RETURN_IF_ERROR(CheckZeroOneOptimizer(training));
  const int world = comm->world_size();
  std::unique_ptr<ShardedOptimizer> opt(new ShardedOptimizer(params, comm));
  opt->num_params_ = num_params;
  opt->blockwise_ = OptimizerOf(training).zero1 == OptimizerRow::Zero1::kQuantizedBlocks;
  opt->ranges_ = ZeroOneShards(training, params, num_params, world);
  for (int r = 0; r < world; ++r) {
    const auto [b, e] = opt->ranges_[static_cast<size_t>(r)];
    if (b >= e) {
      return Status::InvalidArgument(
          "distributed.zero_stage: 1 leaves rank " + std::to_string(r) + " of " +
          std::to_string(world) + " no part of the " + std::to_string(num_params) +
          " trainable elements (" + training.optim + "): use fewer ranks or zero_stage 0");
    }
  }
  opt->begin_ = opt->ranges_[static_cast<size_t>(comm->rank())].first;
  opt->end_ = opt->ranges_[static_cast<size_t>(comm->rank())].second;
  std::vector<bool> quantized;
  opt->local_ =
      SlicesIn(training, opt->params_, opt->begin_, opt->end_, &opt->local_of_, &quantized);
  opt->shard_state_bytes_ =
      OptimizerPlanBytes(training, opt->local_, opt->end_ - opt->begin_, quantized);
  opt->offloaded_ = store != nullptr;
  if (store != nullptr) {
    TRAIND_ASSIGN_OR_RETURN(opt->inner_, MakeOffloadedOptimizer(training, opt->local_,
                                                                opt->end_ - opt->begin_, arena,
                                                                store, {}, quantized));
  } else {
    TRAIND_ASSIGN_OR_RETURN(opt->inner_, MakeOptimizer(training, opt->local_,
                                                       opt->end_ - opt->begin_, arena, quantized));
  }
  return opt;
}

void ShardedOptimizer::IssueStep(float* params, const float* grads,
                                 const StepScalars* device_scalars) {
  inner_->IssueStep(params + begin_, grads + begin_, device_scalars);
}

void ShardedOptimizer::Step(float* params, const float* grads, double lr, float grad_scale) {
  inner_->Step(params + begin_, grads + begin_, lr, grad_scale);
}

Status ShardedOptimizer::status() const {
  TRAIND_RETURN_IF_ERROR(inner_->status());
  return gather_status_;
}

Status ShardedOptimizer::GatherParams(float* params) {
  std::vector<int64_t> counts;
  for (const auto& [b, e] : ranges_) counts.push_back(e - b);
  return comm_->AllGatherInPlace(params, counts, CommDType::kF32);
}

// The streamed gather of the rank's shards into one unsharded state file (StateGather below).
namespace {

// The frames a shard's bytes cross in: one Broadcast per frame, rooted at the owner.
constexpr size_t kGatherFrameBytes = size_t{4} << 20;

// One rank's slice of a tensor of the gathered file: the rank, the index of the tensor in its
// state stream, its bytes.
struct GatherPiece {
  int rank;
  size_t local;
  uint64_t bytes;
};

}  // namespace

// A collective over every rank: the headers of every rank's state stream (Optimizer::StateStream:
// names, dtypes, shapes; no data) are all-gathered, and each rank computes the same gathered file
// (a parameter's tensor of each state kind = its slices in rank order; the shape rule below). Its
// data then crosses tensor by tensor, in name order, in frames of at most kGatherFrameBytes
// broadcast by the slice's owner; the writer forwards them to its sink (the file), the others
// drop them, and the writer's own slices go from its stream straight to the sink. Every rank walks
// the same tensors in the same order (Drain: those the writer's sink did not reach), so an error
// on one rank (a store read, a short stream: its frames are padded with zeros) never leaves the
// others waiting; Finish all-gathers whether each rank's part succeeded and names the first that
// did not. Host memory: a frame and the headers, never a shard's state, let alone all of them.
class ShardedOptimizer::StateGather {
 public:
  // long function: the gathered file's header, computed the same on every rank, in one pass
  static Result<std::unique_ptr<StateGather>> Start(const ShardedOptimizer& opt, bool writer) {
    std::unique_ptr<StateGather> g(new StateGather(opt.comm_));
    Result<SafetensorsStream> local = opt.inner_->StateStream();
    if (local.ok()) {
      g->local_ = std::move(*local);
    } else {
      g->error_ = local.status();  // this rank contributes no tensors; Finish reports it
    }
    // Headers: [bytes, writes] per rank (int64 as two f32 lanes each), then the packed headers.
    SafetensorsFile header;
    for (const StreamedTensor& t : g->local_.tensors) header.tensors[t.name] = HostTensor{t.dtype, t.shape, {}};
    std::vector<size_t> index_of_name;  // header.tensors' order -> stream index
    {
      std::map<std::string, size_t> idx;
      for (size_t i = 0; i < g->local_.tensors.size(); ++i) idx[g->local_.tensors[i].name] = i;
      for (const auto& [name, t] : header.tensors) index_of_name.push_back(idx[name]);
    }
    std::vector<uint8_t> blob = Pack(header);
    const int world = g->comm_->world_size();
    const int64_t mine[2] = {static_cast<int64_t>(blob.size()), writer ? 1 : 0};
    std::vector<int64_t> sizes(static_cast<size_t>(2 * world));
    static_assert(sizeof(int64_t) == 2 * sizeof(float));
    TRAIND_RETURN_IF_ERROR(g->comm_->AllGather(mine, sizes.data(), 4, CommDType::kF32));
    int64_t most = 0;
    g->writer_ = -1;
    for (int r = 0; r < world; ++r) {
      most = std::max(most, sizes[static_cast<size_t>(2 * r)]);
      if (sizes[static_cast<size_t>(2 * r + 1)] != 0) {
        if (g->writer_ >= 0) return Status::Internal("zero_stage 1: two ranks write the optimizer state");
        g->writer_ = r;
      }
    }
    if (g->writer_ < 0) return Status::Internal("zero_stage 1: no rank writes the optimizer state");
    const int64_t lanes = (most + 3) / 4;
    blob.resize(static_cast<size_t>(lanes) * 4);
    std::vector<uint8_t> all(static_cast<size_t>(lanes) * 4 * static_cast<size_t>(world));
    TRAIND_RETURN_IF_ERROR(g->comm_->AllGather(blob.data(), all.data(), lanes, CommDType::kF32));
    std::vector<SafetensorsFile> parts;
    std::vector<std::map<std::string, size_t>> stream_index(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      TRAIND_ASSIGN_OR_RETURN(
          SafetensorsFile part,
          Unpack(all.data() + static_cast<size_t>(r) * static_cast<size_t>(lanes) * 4,
                 static_cast<size_t>(sizes[static_cast<size_t>(2 * r)]), r));
      // A tensor's position in its rank's header (name order); the owner maps it to its stream.
      size_t k = 0;
      for (const auto& [name, t] : part.tensors) stream_index[static_cast<size_t>(r)][name] = k++;
      parts.push_back(std::move(part));
    }
    // The gathered file's tensors, in name order: a parameter's tensor of each state kind is its
    // slices in rank order (ranges ascend, and an 8-bit slice starts on a block, so its absmax
    // blocks follow the previous slice's too).
    std::map<std::string, std::pair<StreamedTensor, std::vector<GatherPiece>>> files;
    for (const ParamInfo& p : opt.params_) {
      std::map<std::string, std::vector<int64_t>> shape_of;  // of a tensor one rank holds whole
      std::map<std::string, uint64_t> total;
      for (size_t r = 0; r < parts.size(); ++r) {
        const auto [b, e] = opt.ranges_[r];
        if (std::max(b, p.offset) >= std::min(e, p.offset + p.numel)) continue;
        const SafetensorsFile& part = parts[r];
        for (auto it = part.tensors.lower_bound(p.hf_name + ".");
             it != part.tensors.end() && it->first.compare(0, p.hf_name.size(), p.hf_name) == 0; ++it) {
          if (!IsStateOf(it->first, p.hf_name)) continue;
          auto& [spec, pieces] = files[it->first];
          if (pieces.empty()) spec = {it->first, it->second.dtype, {}};
          if (spec.dtype != it->second.dtype) {
            return Status::Internal("zero_stage 1: optimizer state " + it->first + " is " + spec.dtype +
                                    " on one rank and " + it->second.dtype + " on rank " + std::to_string(r));
          }
          const size_t esize = SafetensorsDTypeSize(it->second.dtype);
          if (esize == 0) {
            return Status::Internal("zero_stage 1: optimizer state " + it->first + " of rank " +
                                    std::to_string(r) + " has an unknown dtype " + it->second.dtype);
          }
          const uint64_t bytes = static_cast<uint64_t>(it->second.numel()) * esize;
          if (b <= p.offset && p.offset + p.numel <= e) shape_of[it->first] = it->second.shape;
          pieces.push_back({static_cast<int>(r), stream_index[r][it->first], bytes});
          total[it->first] += bytes;
        }
      }
      for (auto& [name, bytes] : total) {
        // The parameter's shape (one value per element), one rank's whole tensor's own shape
        // (Adafactor's row and column statistics), else 1-D (8-bit AdamW's absmax blocks).
        StreamedTensor& spec = files[name].first;
        const int64_t n = static_cast<int64_t>(bytes / SafetensorsDTypeSize(spec.dtype));
        if (n == p.numel) {
          spec.shape = p.shape;
        } else if (shape_of.count(name) != 0) {
          spec.shape = shape_of[name];
        } else {
          spec.shape = {n};
        }
      }
    }
    // This rank's own pieces name tensors in its header's (name) order: map them to its stream.
    for (auto& [name, entry] : files) {
      for (GatherPiece& pc : entry.second) {
        if (pc.rank == g->me_) pc.local = index_of_name[pc.local];
      }
      g->specs_.push_back(std::move(entry.first));
      g->pieces_.push_back(std::move(entry.second));
    }
    g->metadata_ = g->local_.metadata;
    g->done_.assign(g->specs_.size(), false);
    return g;
  }

  // The gathered file as a stream (the writer's): its data(i) is Transfer(i, sink).
  SafetensorsStream Stream() {
    SafetensorsStream out;
    out.metadata = metadata_;
    out.tensors = specs_;
    out.data = [this](size_t i, const SafetensorsSink& sink) { return Transfer(i, &sink); };
    return out;
  }

  // The tensors not transferred yet, their data dropped (the non-writers' whole part; on the
  // writer, what an error stopped its sink before).
  Status Drain() {
    if (!comm_status_.ok()) return comm_status_;  // the first collective error stays the one
    Status first;
    for (size_t i = 0; i < specs_.size(); ++i) {
      if (done_[i]) continue;
      Status s = Transfer(i, nullptr);
      if (!s.ok() && first.ok()) first = s;
      if (!comm_status_.ok()) return comm_status_;
    }
    return first;
  }

  // `mine`: this rank's result so far. Every rank learns whether every other succeeded; the
  // result is this rank's own error, else the first other rank's, named.
  Status Finish(Status mine) {
    if (!comm_status_.ok()) return comm_status_;
    if (mine.ok()) mine = error_;
    const int world = comm_->world_size();
    const std::string text = mine.ok() ? std::string() : mine.message();
    const int64_t word[2] = {static_cast<int64_t>(mine.code()), static_cast<int64_t>(text.size())};
    std::vector<int64_t> words(static_cast<size_t>(2 * world));
    TRAIND_RETURN_IF_ERROR(comm_->AllGather(word, words.data(), 4, CommDType::kF32));
    for (int r = 0; r < world; ++r) {
      const auto code = static_cast<Status::Code>(words[static_cast<size_t>(2 * r)]);
      if (code == Status::Code::kOk) continue;
      std::string message(static_cast<size_t>(words[static_cast<size_t>(2 * r + 1)]), '\0');
      if (r == me_) message = text;
      if (!message.empty()) TRAIND_RETURN_IF_ERROR(comm_->Broadcast(message.data(), message.size(), r));
      if (!mine.ok()) return mine;
      return Status(code, "zero_stage 1: rank " + std::to_string(r) +
                              " could not contribute its optimizer state: " + message);
    }
    return mine;
  }

 private:
  explicit StateGather(Communicator* comm) : comm_(comm), me_(comm->rank()) {}

  // Tensor i's pieces, in rank order. `sink` (the writer's, or null: dropped) while it accepts.
  Status Transfer(size_t i, const SafetensorsSink* sink) {
    done_[i] = true;
    Status first;
    bool forward = sink != nullptr && me_ == writer_;
    for (const GatherPiece& pc : pieces_[i]) {
      if (pc.rank == writer_) {  // the writer's own slice: no collective
        if (me_ != writer_ || !forward) continue;
        uint64_t put = 0;
        const SafetensorsSink counted = [&](const void* p, size_t n) {
          put += n;
          return put <= pc.bytes && (*sink)(p, n);
        };
        Status s = local_.data(pc.local, counted);
        if (s.ok() && put != pc.bytes) s = ShortPiece(i, put, pc.bytes);
        if (!s.ok()) {
          if (first.ok()) first = s;
          forward = false;
        }
        continue;
      }
      Status s = pc.rank == me_ ? Send(i, pc) : Receive(pc, forward ? sink : nullptr, &forward);
      if (!comm_status_.ok()) return comm_status_;
      if (!s.ok() && first.ok()) first = s;
    }
    return first;
  }

  // This rank's slice, framed and broadcast; a stream error or a short stream is padded with
  // zeros to the bytes announced (the collective stays in step) and returned.
  Status Send(size_t i, const GatherPiece& pc) {
    frame_.resize(kGatherFrameBytes);
    uint64_t sent = 0;
    size_t fill = 0;
    auto put = [&](const uint8_t* p, size_t n) {
      while (n > 0 && comm_status_.ok()) {
        const size_t k = std::min(n, kGatherFrameBytes - fill);
        if (p != nullptr) {
          std::memcpy(frame_.data() + fill, p, k);
          p += k;
        } else {
          std::memset(frame_.data() + fill, 0, k);
        }
        fill += k;
        sent += k;
        n -= k;
        if (fill == kGatherFrameBytes || sent == pc.bytes) {
          Bcast(frame_.data(), fill, me_);
          fill = 0;
        }
      }
    };
    bool over = false;
    const SafetensorsSink framing = [&](const void* p, size_t n) {
      if (over || n > pc.bytes - sent) {
        over = true;
        return false;
      }
      put(static_cast<const uint8_t*>(p), n);
      return comm_status_.ok();
    };
    Status s = local_.data(pc.local, framing);
    const uint64_t produced = sent;
    if (comm_status_.ok() && sent < pc.bytes) put(nullptr, static_cast<size_t>(pc.bytes - sent));
    if (!comm_status_.ok()) return comm_status_;
    if (s.ok() && (over || produced != pc.bytes)) s = ShortPiece(i, produced, pc.bytes);
    if (!s.ok() && error_.ok()) error_ = s;
    return s;
  }

  // Another rank's slice, frame by frame; forwarded to `sink` while it accepts (else *forward
  // turns false).
  Status Receive(const GatherPiece& pc, const SafetensorsSink* sink, bool* forward) {
    frame_.resize(kGatherFrameBytes);
    for (uint64_t at = 0; at < pc.bytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kGatherFrameBytes, pc.bytes - at));
      if (!Bcast(frame_.data(), n, pc.rank).ok()) return comm_status_;
      if (sink != nullptr && *forward) *forward = (*sink)(frame_.data(), n);
      at += n;
    }
    return Status::Ok();
  }

  // One frame's broadcast; after a failed one, none (a broken communicator's later calls only
  // say "failed earlier", which must not replace the first error: comm_status_ keeps it).
  const Status& Bcast(void* data, size_t bytes, int root) {
    if (comm_status_.ok()) comm_status_ = comm_->Broadcast(data, bytes, root);
    return comm_status_;
  }

  Status ShortPiece(size_t i, uint64_t put, uint64_t bytes) const {
    return Status::Internal("zero_stage 1: rank " + std::to_string(me_) + "'s optimizer state " +
                            specs_[i].name + " streamed " + std::to_string(put) + " bytes for " +
                            std::to_string(bytes));
  }

  Communicator* comm_;
  int me_;
  int writer_ = -1;
  SafetensorsStream local_;  // this rank's state stream
  Status error_;             // this rank's first error of its own part
  Status comm_status_;       // a failed collective: the ranks are out of step, nothing goes on
  std::map<std::string, std::string> metadata_;
  std::vector<StreamedTensor> specs_;              // the gathered file's, in name order
  std::vector<std::vector<GatherPiece>> pieces_;   // per tensor
  std::vector<bool> done_;
  std::vector<uint8_t> frame_;
};

// Written beside `path` first and renamed onto it only when every rank's part succeeded: a shard
// that failed (its frames padded with zeros) never leaves a file that looks whole.
Status ShardedOptimizer::WriteState(const std::string& path) const {
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<StateGather> g, StateGather::Start(*this, true));
  const std::string partial = path + ".partial";
  Status s = WriteSafetensorsStream(partial, g->Stream());
  const Status drained = g->Drain();
  if (s.ok()) s = drained;
  s = g->Finish(s);
  std::error_code ec;
  if (s.ok()) {
    std::filesystem::rename(partial, path, ec);
    if (ec) s = Status::Internal(path + ": renaming " + partial + " onto it failed: " + ec.message());
  }
  if (!s.ok()) std::filesystem::remove(partial, ec);
  return s;
}

SafetensorsFile ShardedOptimizer::SaveState() const {
  Result<std::unique_ptr<StateGather>> g = StateGather::Start(*this, true);
  if (!g.ok()) {
    if (gather_status_.ok()) gather_status_ = g.status();
    return SafetensorsFile();
  }
  Result<SafetensorsFile> file = CollectSafetensorsStream((*g)->Stream());
  const Status drained = (*g)->Drain();
  Status s = (*g)->Finish(file.ok() ? drained : file.status());
  if (!s.ok()) {
    if (gather_status_.ok()) gather_status_ = s;
    return SafetensorsFile();
  }
  return std::move(*file);
}

Status ShardedOptimizer::ContributeState() const {
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<StateGather> g, StateGather::Start(*this, false));
  return g->Finish(g->Drain());
}

Status ShardedOptimizer::LoadState(const SafetensorsFile& file) {
  std::map<std::string, TensorDesc> all;
  for (const auto& [name, t] : file.tensors) all[name] = {t.dtype, t.shape, t.data.size()};
  TRAIND_ASSIGN_OR_RETURN(const std::vector<SliceRead> reads,
                          SlicesToRead(all, params_, local_, local_of_, begin_, blockwise_));
  SafetensorsFile mine;
  mine.metadata = file.metadata;
  for (const SliceRead& r : reads) {
    const HostTensor& t = file.tensors.at(r.name);
    HostTensor slice;
    slice.dtype = r.dtype;
    slice.shape = r.shape;
    slice.data.assign(t.data.begin() + static_cast<std::ptrdiff_t>(r.offset),
                      t.data.begin() + static_cast<std::ptrdiff_t>(r.offset + r.bytes));
    mine.tensors[r.name] = std::move(slice);
  }
  return inner_->LoadState(mine);
}

Status ShardedOptimizer::ReadState(const std::string& path) {
  TRAIND_ASSIGN_OR_RETURN(SafetensorsReader file, SafetensorsReader::Open(path));
  std::map<std::string, TensorDesc> all;
  for (const auto& [name, e] : file.tensors()) all[name] = {e.dtype, e.shape, e.bytes()};
  TRAIND_ASSIGN_OR_RETURN(const std::vector<SliceRead> reads,
                          SlicesToRead(all, params_, local_, local_of_, begin_, blockwise_));
  if (!offloaded_) {  // the shard's state goes to the arena: its slices, read by ranges
    SafetensorsFile mine;
    mine.metadata = file.metadata();
    for (const SliceRead& r : reads) {
      HostTensor slice;
      slice.dtype = r.dtype;
      slice.shape = r.shape;
      slice.data.resize(r.bytes);
      TRAIND_RETURN_IF_ERROR(file.ReadRange(r.name, r.offset, slice.data.data(), r.bytes));
      mine.tensors[r.name] = std::move(slice);
    }
    return inner_->LoadState(mine);
  }
  // Offloaded: the shard's file, its tensors copied from the ranges through one bounded buffer,
  // then streamed into the store by the offloaded optimizer (one group at a time).
  const std::string shard = path + ".rank" + std::to_string(comm_->rank()) + ".tmp";
  std::vector<StreamedTensor> specs;
  for (const SliceRead& r : reads) specs.push_back({r.name, r.dtype, r.shape});
  const size_t piece = state_io::kStatePieceBytes;
  std::unique_ptr<uint8_t[]> buffer(new uint8_t[piece]);
  Status s = WriteSafetensorsStreamed(
      shard, file.metadata(), std::move(specs), [&](size_t i, const SafetensorsSink& sink) -> Status {
        const SliceRead& r = reads[i];
        for (uint64_t at = 0; at < r.bytes;) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(piece, r.bytes - at));
          TRAIND_RETURN_IF_ERROR(file.ReadRange(r.name, r.offset + at, buffer.get(), n));
          if (!sink(buffer.get(), n)) {
            return Status::Internal(shard + ": writing tensor '" + r.name + "' failed");
          }
          at += n;
        }
        return Status::Ok();
      });
  buffer.reset();
  if (s.ok()) s = inner_->ReadState(shard);
  std::error_code ec;
  std::filesystem::remove(shard, ec);
  return s;
}

}  // namespace traind::engine
