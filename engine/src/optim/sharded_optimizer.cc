// ZeRO-1: the rank's shard of the flat buffer through an ordinary optimizer over slices, the
// gather of the updated weights, and the unsharded state file gathered / sliced (see the header).
#include "optim/sharded_optimizer.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace traind::engine {
namespace {

// The slices of `params` inside [begin, end): 1-D views with the parameter's name and decay flag,
// offsets from `begin`; `of` gets each slice's parameter index.
std::vector<ParamInfo> SlicesIn(const std::vector<ParamInfo>& params, int64_t begin, int64_t end,
                                std::vector<size_t>* of) {
  std::vector<ParamInfo> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    ParamInfo q;
    q.hf_name = p.hf_name;
    q.shape = {hi - lo};
    q.hf_shape = q.shape;
    q.offset = lo - begin;
    q.numel = hi - lo;
    q.weight_decay = p.weight_decay;
    out.push_back(std::move(q));
    if (of != nullptr) of->push_back(i);
  }
  return out;
}

// The state kind of `name` when it is "<hf_name>.<kind>" (a kind holds no dot), else empty.
std::string KindOf(const std::string& name, const std::string& hf_name) {
  if (name.size() <= hf_name.size() + 1 || name.compare(0, hf_name.size(), hf_name) != 0 ||
      name[hf_name.size()] != '.') {
    return std::string();
  }
  std::string kind = name.substr(hf_name.size() + 1);
  return kind.find('.') == std::string::npos ? kind : std::string();
}

}  // namespace

Status CheckZeroOneOptimizer(const TrainingSpec& t) {
  if (t.optim == "adamw" || t.optim == "sgd") return Status::Ok();
  const std::string why =
      t.optim == "adafactor"
          ? "adafactor factors its second moment per matrix (row and column statistics), so its "
            "state does not split by element range"
          : "adamw_8bit chooses 8-bit or fp32 moments per whole tensor, which a split tensor "
            "would change";
  return Status::InvalidArgument("distributed.zero_stage: 1 shards the state of training.optim "
                                 "adamw or sgd; " + why + ": use zero_stage 0 with " + t.optim);
}

std::pair<int64_t, int64_t> ZeroOneShard(int64_t num_params, int rank, int world) {
  const int64_t w = world, r = rank;
  return {num_params * r / w, num_params * (r + 1) / w};
}

int64_t ZeroOnePlanBytes(const TrainingSpec& training, const std::vector<ParamInfo>& params,
                         int64_t num_params, int world) {
  int64_t most = 0;
  for (int r = 0; r < world; ++r) {
    const auto [b, e] = ZeroOneShard(num_params, r, world);
    most = std::max(most, OptimizerPlanBytes(training, SlicesIn(params, b, e, nullptr), e - b));
  }
  return most;
}

Result<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(
    const TrainingSpec& training, const std::vector<ParamInfo>& params, int64_t num_params,
    Communicator* comm, DeviceArena* arena) {
  TRAIND_RETURN_IF_ERROR(CheckZeroOneOptimizer(training));
  const int world = comm->world_size();
  if (num_params < world) {
    return Status::InvalidArgument("distributed.zero_stage: 1 needs at least one trainable element "
                                   "per rank: " + std::to_string(num_params) + " for " +
                                   std::to_string(world) + " ranks");
  }
  std::unique_ptr<ShardedOptimizer> opt(new ShardedOptimizer(params, comm));
  opt->num_params_ = num_params;
  for (int r = 0; r < world; ++r) opt->ranges_.push_back(ZeroOneShard(num_params, r, world));
  opt->begin_ = opt->ranges_[static_cast<size_t>(comm->rank())].first;
  opt->end_ = opt->ranges_[static_cast<size_t>(comm->rank())].second;
  opt->local_ = SlicesIn(opt->params_, opt->begin_, opt->end_, &opt->local_of_);
  TRAIND_ASSIGN_OR_RETURN(opt->inner_,
                          MakeOptimizer(training, opt->local_, opt->end_ - opt->begin_, arena));
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
  for (size_t r = 0; r < ranges_.size(); ++r) {
    const auto [b, e] = ranges_[r];
    TRAIND_RETURN_IF_ERROR(comm_->Broadcast(params + b, static_cast<size_t>(e - b) * sizeof(float),
                                            static_cast<int>(r)));
  }
  return Status::Ok();
}

Result<SafetensorsFile> ShardedOptimizer::Gather(bool build) const {
  const SafetensorsFile mine = inner_->SaveState();
  TRAIND_RETURN_IF_ERROR(inner_->status());
  // The state kinds ("exp_avg", ...): the same on every rank (the same optimizer at the same
  // step); checked, since a mismatch would pair different collectives.
  std::vector<std::string> kinds;
  for (const ParamInfo& q : local_) {
    for (auto it = mine.tensors.lower_bound(q.hf_name + ".");
         it != mine.tensors.end() && it->first.compare(0, q.hf_name.size(), q.hf_name) == 0; ++it) {
      const std::string kind = KindOf(it->first, q.hf_name);
      if (!kind.empty() && std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
        kinds.push_back(kind);
      }
    }
  }
  std::sort(kinds.begin(), kinds.end());
  const int world = comm_->world_size();
  std::vector<float> counts(static_cast<size_t>(world));
  const float n_kinds = static_cast<float>(kinds.size());
  TRAIND_RETURN_IF_ERROR(comm_->AllGather(&n_kinds, counts.data(), 1, CommDType::kF32));
  for (int r = 0; r < world; ++r) {
    if (counts[static_cast<size_t>(r)] != n_kinds) {
      return Status::Internal("zero_stage 1: rank " + std::to_string(r) + " holds " +
                              std::to_string(static_cast<int>(counts[static_cast<size_t>(r)])) +
                              " optimizer state kinds, rank " + std::to_string(comm_->rank()) +
                              " " + std::to_string(kinds.size()));
    }
  }
  int64_t most = 0;
  for (const auto& [b, e] : ranges_) most = std::max(most, e - b);
  SafetensorsFile file;
  file.metadata = mine.metadata;
  // One kind at a time: the rank's range (zero where no parameter lies), gathered from all ranks
  // (host memory: the cpu backend's device memory), then cut into the parameters' tensors.
  std::vector<float> shard(static_cast<size_t>(most)), all;
  all.resize(static_cast<size_t>(most) * static_cast<size_t>(world));
  for (const std::string& kind : kinds) {
    std::fill(shard.begin(), shard.end(), 0.0f);
    for (const ParamInfo& q : local_) {
      auto it = mine.tensors.find(q.hf_name + "." + kind);
      if (it == mine.tensors.end()) continue;
      const HostTensor& t = it->second;
      if (t.dtype != "F32" || t.numel() != q.numel) {
        return Status::Internal("zero_stage 1: optimizer state " + it->first + " is " + t.dtype +
                                " of " + std::to_string(t.numel()) + " elements, expected F32 of " +
                                std::to_string(q.numel));
      }
      std::memcpy(shard.data() + q.offset, t.data.data(), t.data.size());
    }
    TRAIND_RETURN_IF_ERROR(comm_->AllGather(shard.data(), all.data(), most, CommDType::kF32));
    if (!build) continue;
    for (const ParamInfo& p : params_) {
      std::vector<float> full(static_cast<size_t>(p.numel));
      for (size_t r = 0; r < ranges_.size(); ++r) {
        const auto [b, e] = ranges_[r];
        const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
        if (lo >= hi) continue;
        std::memcpy(full.data() + (lo - p.offset),
                    all.data() + static_cast<int64_t>(r) * most + (lo - b),
                    static_cast<size_t>(hi - lo) * sizeof(float));
      }
      file.tensors[p.hf_name + "." + kind] = HostTensor::FromF32(full.data(), p.shape);
    }
  }
  return file;
}

SafetensorsFile ShardedOptimizer::SaveState() const {
  Result<SafetensorsFile> file = Gather(true);
  if (!file.ok()) {
    if (gather_status_.ok()) gather_status_ = file.status();
    return SafetensorsFile();
  }
  return std::move(*file);
}

Status ShardedOptimizer::ContributeState() const { return Gather(false).status(); }

Status ShardedOptimizer::LoadState(const SafetensorsFile& file) {
  SafetensorsFile mine;
  mine.metadata = file.metadata;
  for (size_t i = 0; i < local_.size(); ++i) {
    const ParamInfo& q = local_[i];
    const ParamInfo& p = params_[local_of_[i]];
    const int64_t skip = begin_ + q.offset - p.offset;  // the slice's first element within p
    for (auto it = file.tensors.lower_bound(p.hf_name + ".");
         it != file.tensors.end() && it->first.compare(0, p.hf_name.size(), p.hf_name) == 0; ++it) {
      if (KindOf(it->first, p.hf_name).empty()) continue;
      const HostTensor& t = it->second;
      if (t.dtype != "F32" || t.shape != p.shape ||
          static_cast<int64_t>(t.data.size()) != p.numel * 4) {
        return Status::DataLoss("optimizer state: tensor " + it->first + " has dtype " + t.dtype +
                                " and a shape other than this model's (expected F32)");
      }
      HostTensor slice;
      slice.shape = q.shape;
      slice.data.assign(t.data.begin() + skip * 4, t.data.begin() + (skip + q.numel) * 4);
      mine.tensors[it->first] = std::move(slice);
    }
  }
  return inner_->LoadState(mine);
}

}  // namespace traind::engine
