// DecoderModel: forward, backward (with optional block recomputation), init and HF conversion.
#include "models/decoder.h"
#include "models/moe_routing.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/dynamic_code.h"
#include "core/half.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/lora.h"
#include "nn/mlp.h"
#include "nn/norm.h"

namespace traind::engine {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

// HF layout (file) -> engine layout for one tensor, into `dst` (numel of the engine shape).
void FromHfLayout(const ParamInfo& info, const ParamExtra& ex, const float* src, float* dst) {
  if (ex.transposed) {  // file (C, OC) -> engine (OC, C)
    const int64_t OC = info.shape[0], C = info.shape[1];
    for (int64_t c = 0; c < C; ++c)
      for (int64_t o = 0; o < OC; ++o) dst[o * C + c] = src[c * OC + o];
    return;
  }
  int64_t hf_numel = 1;
  for (int64_t s : info.hf_shape) hf_numel *= s;
  std::copy(src, src + hf_numel, dst);
  std::fill(dst + hf_numel, dst + info.numel, 0.0f);  // padded vocabulary rows stay zero
}

}  // namespace

DecoderModel::DecoderModel(const ModelConfig& config, const ModelOptions& options,
                           DeviceArena* arena)
    : config_(config),
      options_(options),
      d_(MakeArchDims(config)),
      table_(BuildParams(d_)),
      be_(arena->backend()),
      lora_(BuildLoraTable(d_, table_, options.lora)),
      N_(options.micro_batch * options.seq_len) {}

Result<std::unique_ptr<DecoderModel>> DecoderModel::Make(const ModelConfig& config,
                                                         const ModelOptions& options,
                                                         DeviceArena* arena) {
  std::unique_ptr<DecoderModel> m(new DecoderModel(config, options, arena));
  BufferPlanner planner;
  PlanBuffers(m->d_, options, m->table_.total, Fp32WeightElems(m->table_, options), &planner,
              &m->bufs_, m->lora_.total, m->lora_.per_layer, m->lora_.max_in);
  TRAIND_RETURN_IF_ERROR(planner.Allocate(arena));
  ResolveViews(m->d_, options, &m->bufs_);
  if (m->lora()) {
    const CheckpointLayout cl = MakeCheckpointLayout(m->d_, options);
    for (size_t i = 0; i < m->lora_.adapters.size(); ++i) {
      const LoraAdapterEntry& e = m->lora_.adapters[i];
      const int64_t set = cl.SetOf(e.layer);
      const int64_t in_layer = static_cast<int64_t>(i) - e.layer * m->lora_.per_layer;
      nn::LoraAdapter a;
      a.A = m->bufs_.lora_params + e.a_off;
      a.B = m->bufs_.lora_params + e.b_off;
      a.dA = m->bufs_.grads + e.a_off;
      a.dB = m->bufs_.grads + e.b_off;
      a.u = m->bufs_.lora_u_store + (set * m->lora_.per_layer + in_layer) * m->N_ * m->lora_.r;
      a.in = e.in;
      a.out = e.out;
      a.col = e.col;
      a.stream = static_cast<uint64_t>(i);  // adapter i of the model (layer-major)
      m->lora_ops_.push_back(a);
    }
  }
  if (m->bufs_.dropout_key != nullptr) {
    const uint64_t zero = 0;
    m->be_->CopyHostToDevice(m->bufs_.dropout_key, &zero, sizeof(zero));
  }
  m->mixed_ = options.compute_type != DType::kF32;
  if (options.quant4.enabled) {  // QLoRA: the 4-bit store's layout; the nested code table
    m->q_ = MakeQuant4Layout(m->table_);
    m->quant_ = !m->q_.tensors.empty();
    m->q_offsets_.assign(m->q_.tensors.size(), 0.0f);
    if (m->bufs_.q_code != nullptr) {
      m->be_->CopyHostToDevice(m->bufs_.q_code, DynamicCodeSigned(), 256 * sizeof(float));
    }
  }
  if ((options.master_weights_off_device || m->quant_) && m->mixed_) {
    m->master_off_ = true;
    m->resident_ = m->quant_ ? QLoraResidentTensors(m->table_, options) : Fp32ResidentTensors(m->table_);
    m->lookup16_ = m->quant_ && LookupReads16Bit(m->table_, options);
    for (const Fp32ResidentTensor& t : m->resident_) m->packed_[t.offset] = t.packed;
  }
  m->gp_ = nn::GemmPrecision{options.compute_type, m->bufs_.scratch16, m->bufs_.scratch16_elems,
                             m->bufs_.packed_activation, PackedActivationBytes(m->d_, options)};
  if (m->bufs_.packed_weights != nullptr) {
    char* at = static_cast<char*>(m->bufs_.packed_weights);
    for (const PackedWeight& w : PackedWeights(m->d_, options)) {
      int64_t offset = m->table_.lm_head;
      if (w.layer >= 0) {
        const LayerParams& p = m->table_.layers[w.layer];
        offset = w.kind == PackedWeight::kQkv    ? p.qkv_w
                 : w.kind == PackedWeight::kProj ? p.proj_w
                 : w.kind == PackedWeight::kUp   ? p.up_w
                                                 : p.down_w;
      }
      const void* b = m->W(offset);
      // The forward reads W (out, in) as B^T (K = in); the input gradient as B (K = out).
      for (const bool forward : {true, false}) {
        if (!forward && !PacksInputGradientLayout(options.compute_type)) continue;
        const int64_t K = forward ? w.in : w.out, N = forward ? w.out : w.in;
        const int64_t bytes = PackedCopyBytes(K, N, options.compute_type);
        m->gemm_packs_.push_back({b, forward, K, N, w.in, at, bytes});
        at += bytes;
      }
    }
  }
  if (m->bufs_.ones != nullptr) {  // gemma: the norms' 1 + w rows (layout.h)
    const std::vector<float> ones(static_cast<size_t>(m->d_.C), 1.0f);
    m->be_->CopyHostToDevice(m->bufs_.ones, ones.data(), ones.size() * sizeof(float));
    for (int64_t l = 0; l < m->d_.L; ++l) {
      m->norm_rows_.push_back({m->table_.layers[l].ln1_w, 2 * l});
      m->norm_rows_.push_back({m->table_.layers[l].ln2_w, 2 * l + 1});
    }
    m->norm_rows_.push_back({m->table_.lnf_w, 2 * m->d_.L});
  }
  if (m->d_.moe()) {
    m->routes_.resize(static_cast<size_t>(m->d_.L));
    m->expert_tokens_.assign(static_cast<size_t>(m->d_.L * m->d_.E), 0);
  }
  if (m->bufs_.positions != nullptr) {
    std::vector<int32_t> pos(static_cast<size_t>(m->N_));
    for (int64_t n = 0; n < m->N_; ++n) pos[n] = static_cast<int32_t>(n % options.seq_len);
    m->be_->CopyHostToDevice(m->bufs_.positions, pos.data(), pos.size() * sizeof(int32_t));
  }
  if (m->bufs_.rows != nullptr) {  // one sequence a row until the trainer writes its rows
    std::vector<int32_t> rows(static_cast<size_t>(2 * m->N_), 0);
    for (int64_t n = 0; n < m->N_; ++n) rows[m->N_ + n] = static_cast<int32_t>(n % options.seq_len);
    m->be_->CopyHostToDevice(m->bufs_.rows, rows.data(), rows.size() * sizeof(int32_t));
  }
  return m;
}

namespace {

// FNV-1a over 16-bit values, element by element (so pieces of any size give the same hash).
uint64_t Fnv1a16(uint64_t h, const uint16_t* v, int64_t n) {
  for (int64_t k = 0; k < n; ++k) h = (h ^ v[k]) * 0x100000001b3ull;
  return h;
}

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;

// n floats -> `type` (bf16 or f16) into *out (resized), with F32ToBF16 / F32ToF16: the backend
// casts' bits (cpu_cast_test), so the copy equals the one Cast would make on the device.
void To16(DType type, const float* host, int64_t n, std::vector<uint16_t>* out) {
  out->resize(static_cast<size_t>(n));
  F32To16Span(type == DType::kBF16, host, n, out->data());
}

}  // namespace

void InitFlatParamsTo(const ArchDims& d, const ParamTable& table, uint64_t seed,
                      const std::function<void(int64_t, const float*, int64_t)>& write) {
  std::mt19937_64 rng(seed);
  // Box-Muller on the raw 64-bit stream: the same numbers on every platform. The stream is drawn
  // in order (two draws per normal element), the transforms (log, sqrt, cos in double: most of
  // the time) run in parallel over a chunk: the same values as one element after the other.
  auto box_muller = [](uint64_t a, uint64_t b) {
    const double u1 = (static_cast<double>(a >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (static_cast<double>(b >> 11) + 0.5) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  };
  const double std_resid = 0.02 / std::sqrt(2.0 * static_cast<double>(d.L));
  constexpr int64_t kChunk = int64_t{1} << 20;  // floats per hand-off (4 MiB)
  int64_t largest = 0;
  for (const ParamInfo& info : table.infos) largest = std::max(largest, info.numel);
  std::vector<float> buf(static_cast<size_t>(std::min(kChunk, largest)));
  std::vector<uint64_t> draws;  // a chunk's raw stream: two per normal element
  for (size_t i = 0; i < table.infos.size(); ++i) {
    const ParamInfo& info = table.infos[i];
    const InitKind kind = table.extras[i].init;
    int64_t n = 1;  // the real (HF) elements: padded vocabulary rows stay zero
    for (int64_t s : info.hf_shape) n *= s;
    for (int64_t j0 = 0; j0 < info.numel; j0 += kChunk) {
      const int64_t m = std::min(kChunk, info.numel - j0);
      const int64_t real = std::clamp<int64_t>(n - j0, 0, m);  // elements j0 + k < n
      float* out = buf.data();
      if (kind == InitKind::kNormal || kind == InitKind::kNormalResidual) {
        const double scale = kind == InitKind::kNormal ? 0.02 : std_resid;
        draws.resize(static_cast<size_t>(2 * real));
        for (uint64_t& r : draws) r = rng();
        const uint64_t* dr = draws.data();
#pragma omp parallel for schedule(static) if (real >= 65536)
        for (int64_t k = 0; k < real; ++k) out[k] = static_cast<float>(scale * box_muller(dr[2 * k], dr[2 * k + 1]));
      } else {
        std::fill_n(out, real, kind == InitKind::kOnes ? 1.0f : 0.0f);
      }
      std::fill(out + real, out + m, 0.0f);
      write(info.offset + j0, out, m);
    }
  }
}

void InitFlatParams(const ArchDims& d, const ParamTable& table, uint64_t seed, float* host) {
  InitFlatParamsTo(d, table, seed, [host](int64_t offset, const float* v, int64_t n) {
    std::copy_n(v, n, host + offset);
  });
}

DecoderModel::~DecoderModel() { WeightsChanging(); }

void DecoderModel::WeightsChanging() {
  packs_stale_ = true;
  if (gemm_packs_.empty()) return;
  const char* begin = static_cast<const char*>(mixed_ ? bufs_.params16 : static_cast<void*>(bufs_.params));
  be_->ForgetPackedGemmB(begin, begin + table_.total * DTypeSize(options_.compute_type));
}

void DecoderModel::PackWeights() {
  for (const GemmPack& g : gemm_packs_) {
    (void)be_->PackGemmB(g.storage, g.bytes, g.b, g.trans_b, g.K, g.N, g.ldb,
                         options_.compute_type);
  }
  packs_stale_ = false;
}

void DecoderModel::InitRandom(uint64_t seed) {
  WeightsChanging();
  if (quant_) {  // QLoRA: the 4-bit store and the compute-type copies, a piece at a time
    InitFlatParamsTo(d_, table_, seed, [this](int64_t offset, const float* v, int64_t n) {
      WriteBase(offset, v, n);
    });
    be_->Synchronize();
    weights16_stale_ = false;
    return;
  }
  // Tensor by tensor through a bounded host buffer (a whole-model host copy was the set-up's RSS
  // peak of a 354M-parameter job: bench/offload_rss_bench).
  if (master_off_ && lora()) {  // the frozen base: the device copies only
    base16_hash_ = kFnvOffset;
    InitFlatParamsTo(d_, table_, seed, [this](int64_t offset, const float* v, int64_t n) {
      PublishFromHost(offset, v, n);
    });
    be_->Synchronize();
    weights16_stale_ = false;
    return;
  }
  if (master_off_) {  // into the store (its errors: CommitMaster) and staged for the device copies
    InitFlatParamsTo(d_, table_, seed, [this](int64_t offset, const float* v, int64_t n) {
      be_->CopyHostToDevice(bufs_.grads + offset, v, static_cast<size_t>(n) * sizeof(float));
      if (master_store_ != nullptr) (void)master_store_->PutMaster(offset, v, n);
    });
    PublishStaged();
    return;
  }
  InitFlatParamsTo(d_, table_, seed, [this](int64_t offset, const float* v, int64_t n) {
    be_->CopyHostToDevice(bufs_.params + offset, v, static_cast<size_t>(n) * sizeof(float));
  });
  be_->Synchronize();
  weights16_stale_ = true;
}

Status DecoderModel::LoadHf(const SafetensorsFile& file) { return LoadFrom(TensorSourceOf(file)); }

Status DecoderModel::LoadHfFrom(const HfWeightsReader& reader) { return LoadFrom(TensorSourceOf(reader)); }

Status DecoderModel::LoadFrom(const HfTensorSource& source) {
  WeightsChanging();
  if (quant_) {  // QLoRA: tensor by tensor (one tensor's fp32 copy on the host at a time)
    std::vector<const Quant4Slot*> prequantized(table_.infos.size(), nullptr);
    for (size_t i = 0; i < table_.infos.size(); ++i) {
      const Quant4Slot* s = q_.Find(table_.infos[i].offset);
      const std::string& name = table_.infos[i].hf_name;
      if (s == nullptr) continue;
      std::string dtype;
      std::vector<int64_t> shape;
      for (const char* t : {"nf4", "fp4"}) {
        if (source.find(name + kBnbQuantStatePrefix + t, &dtype, &shape)) prequantized[i] = s;
      }
      if (prequantized[i] == nullptr && source.find(name, &dtype, &shape) && dtype == "U8") {
        return Status::InvalidArgument(
            source.where(name) + ": tensor '" + name + "' is uint8 (bitsandbytes' packed 4 bits) "
            "but its quant state '" + name + kBnbQuantStatePrefix + "nf4' (or fp4) is missing");
      }
    }
    TRAIND_RETURN_IF_ERROR(HfToFlat(
        config_.arch, table_, source, nullptr, nullptr,
        [this](size_t i, const float* v) { WriteBase(table_.infos[i].offset, v, table_.infos[i].numel); },
        [&](size_t i) { return prequantized[i] != nullptr; }));
    for (size_t i = 0; i < prequantized.size(); ++i) {
      if (prequantized[i] != nullptr) TRAIND_RETURN_IF_ERROR(LoadQuantState(source, i, *prequantized[i]));
    }
    be_->Synchronize();
    weights16_stale_ = false;
    return Status::Ok();
  }
  std::vector<float> host(static_cast<size_t>(table_.total), 0.0f);
  TRAIND_RETURN_IF_ERROR(HfToFlat(config_.arch, table_, source, host.data(), nullptr, nullptr));
  if (master_off_ && lora()) {  // the frozen base: the device copies only, a few MiB at a time
    base16_hash_ = kFnvOffset;
    constexpr int64_t kPiece = int64_t{1} << 20;
    for (int64_t o = 0; o < table_.total; o += kPiece) {
      PublishFromHost(o, host.data() + o, std::min(kPiece, table_.total - o));
    }
    be_->Synchronize();
    weights16_stale_ = false;
    return Status::Ok();
  }
  if (master_off_) {
    if (master_store_ == nullptr) return Status::Internal("LoadHf: the master weights' store is not set");
    be_->CopyHostToDevice(bufs_.grads, host.data(), host.size() * sizeof(float));
    PublishStaged();
    return master_store_->PutMaster(0, host.data(), table_.total);
  }
  be_->CopyHostToDevice(bufs_.params, host.data(), host.size() * sizeof(float));
  be_->Synchronize();
  weights16_stale_ = true;
  return Status::Ok();
}

void DecoderModel::PublishStaged() {
  WeightsChanging();
  be_->Cast(bufs_.params16, options_.compute_type, bufs_.grads, DType::kF32, table_.total);
  for (const Fp32ResidentTensor& t : resident_) {
    be_->CopyDeviceToDevice(bufs_.params + t.packed, bufs_.grads + t.offset,
                            static_cast<size_t>(t.numel) * sizeof(float));
  }
  be_->Memset0(bufs_.grads, static_cast<size_t>(table_.total) * sizeof(float));
  be_->Synchronize();
  weights16_stale_ = false;
}

void DecoderModel::PublishFromHost(int64_t offset, const float* host, int64_t n) {
  WeightsChanging();
  To16(options_.compute_type, host, n, &host16_);
  base16_hash_ = Fnv1a16(base16_hash_, host16_.data(), n);
  be_->CopyHostToDevice(static_cast<char*>(bufs_.params16) + Dense(offset) * static_cast<int64_t>(sizeof(uint16_t)),
                        host16_.data(), static_cast<size_t>(n) * sizeof(uint16_t));
  for (auto it = FirstResidentEndingAfter(offset); it != resident_.end() && it->offset < offset + n; ++it) {
    const int64_t a = std::max(offset, it->offset), b = std::min(offset + n, it->offset + it->numel);
    be_->CopyHostToDevice(bufs_.params + it->packed + (a - it->offset), host + (a - offset),
                          static_cast<size_t>(b - a) * sizeof(float));
  }
  be_->Synchronize();  // host16_ is reused by the next call
}

std::vector<Fp32ResidentTensor>::const_iterator DecoderModel::FirstResidentEndingAfter(int64_t offset) const {
  // Table order: a binary search for the first that ends after offset.
  return std::lower_bound(resident_.begin(), resident_.end(), offset,
                          [](const Fp32ResidentTensor& t, int64_t at) { return t.offset + t.numel <= at; });
}

void DecoderModel::MasterUpdated(int64_t offset, const float* device, int64_t n) {
  WeightsChanging();
  const size_t es = DTypeSize(options_.compute_type);
  be_->Cast(static_cast<char*>(bufs_.params16) + offset * static_cast<int64_t>(es), options_.compute_type,
            device, DType::kF32, n);
  // The resident tensors overlapping [offset, offset + n).
  for (auto it = FirstResidentEndingAfter(offset); it != resident_.end() && it->offset < offset + n; ++it) {
    const int64_t a = std::max(offset, it->offset), b = std::min(offset + n, it->offset + it->numel);
    be_->CopyDeviceToDevice(bufs_.params + it->packed + (a - it->offset), device + (a - offset),
                            static_cast<size_t>(b - a) * sizeof(float));
  }
}

MasterWeightsSink::ComputeCopy DecoderModel::ComputeCopyOf(int64_t offset, int64_t n) {
  WeightsChanging();  // the caller writes the 16-bit weights through it
  ComputeCopy out;
  out.type = options_.compute_type;
  out.weights16 = static_cast<char*>(bufs_.params16) + offset * static_cast<int64_t>(DTypeSize(out.type));
  for (auto it = FirstResidentEndingAfter(offset); it != resident_.end() && it->offset < offset + n; ++it) {
    const int64_t a = std::max(offset, it->offset), b = std::min(offset + n, it->offset + it->numel);
    out.fp32.push_back({a, b - a, bufs_.params + it->packed + (a - it->offset)});
  }
  return out;
}

HfTensorSource TensorSourceOf(const SafetensorsFile& file) {
  HfTensorSource s;
  s.find = [&file](const std::string& name, std::string* dtype, std::vector<int64_t>* shape) {
    auto it = file.tensors.find(name);
    if (it == file.tensors.end()) return false;
    *dtype = it->second.dtype;
    *shape = it->second.shape;
    return true;
  };
  s.read = [&file](const std::string& name) { return file.tensors.at(name).ToF32(); };
  s.read_bytes = [&file](const std::string& name, uint64_t offset, void* dst, size_t bytes) {
    const std::vector<uint8_t>& d = file.tensors.at(name).data;
    if (offset > d.size() || bytes > d.size() - offset) {
      return Status::InvalidArgument("tensor '" + name + "': bytes outside its data");
    }
    if (bytes > 0) std::memcpy(dst, d.data() + offset, bytes);
    return Status::Ok();
  };
  s.where = [](const std::string&) { return std::string("checkpoint"); };
  return s;
}

HfTensorSource TensorSourceOf(const HfWeightsReader& reader) {
  HfTensorSource s;
  s.find = [&reader](const std::string& name, std::string* dtype, std::vector<int64_t>* shape) {
    const SafetensorsReader::Entry* e = reader.Find(name);
    if (e == nullptr) return false;
    *dtype = e->dtype;
    *shape = e->shape;
    return true;
  };
  s.read = [&reader](const std::string& name) -> Result<std::vector<float>> {
    TRAIND_ASSIGN_OR_RETURN(HostTensor t, reader.ReadTensor(name));
    return t.ToF32();
  };
  s.read_bytes = [&reader](const std::string& name, uint64_t offset, void* dst, size_t bytes) {
    return reader.ReadRange(name, offset, dst, bytes);
  };
  s.where = [&reader](const std::string& name) { return reader.PathOf(name); };
  return s;
}

Status HfToFlat(Arch arch, const ParamTable& table, const SafetensorsFile& file,
                float* host, std::vector<size_t>* missing_heads,
                const std::function<void(size_t, const float*)>& each) {
  return HfToFlat(arch, table, TensorSourceOf(file), host, missing_heads, each);
}

Status HfToFlat(Arch arch, const ParamTable& table, const HfTensorSource& source, float* host,
                std::vector<size_t>* missing_heads,
                const std::function<void(size_t, const float*)>& each,
                const std::function<bool(size_t)>& skip) {
  std::vector<float> one;  // host == nullptr: the tensor being handed to `each`
  std::string dtype;
  std::vector<int64_t> shape;
  for (size_t i = 0; i < table.infos.size(); ++i) {
    if (skip && skip(i)) continue;
    const ParamInfo& info = table.infos[i];
    std::string name = info.hf_name;
    bool found = source.find(name, &dtype, &shape);
    // GPT2Model / BertModel files name the base model's tensors without its prefix.
    for (const std::string prefix : {"transformer.", "bert."}) {
      if (!found && info.hf_name.rfind(prefix, 0) == 0) {
        name = info.hf_name.substr(prefix.size());
        found = source.find(name, &dtype, &shape);
      }
    }
    if (!found && missing_heads != nullptr && table.extras[i].task_head) {
      missing_heads->push_back(i);
      continue;
    }
    if (!found) {
      return Status::InvalidArgument("checkpoint is missing tensor '" + info.hf_name +
                                     "' (expected shape " + ShapeStr(info.hf_shape) + ") for a " +
                                     ArchName(arch) + " model of this config");
    }
    std::string qdtype;
    std::vector<int64_t> qshape;
    if (dtype == "U8" && (source.find(name + kBnbQuantStatePrefix + "nf4", &qdtype, &qshape) ||
                          source.find(name + kBnbQuantStatePrefix + "fp4", &qdtype, &qshape))) {
      return Status::InvalidArgument(
          "tensor '" + name + "' is stored in 4 bits (a bitsandbytes pre-quantized checkpoint): it "
          "loads only into a 4-bit base (model.quantization_config with training.peft, QLoRA) "
          "whose quantized weights include it");
    }
    if (shape != info.hf_shape) {
      return Status::InvalidArgument(
          "tensor '" + info.hf_name + "' has shape " + ShapeStr(shape) +
          " in the checkpoint but the model config "
          "expects " +
          ShapeStr(info.hf_shape) + ": check config.json against the weights");
    }
    auto data = source.read(name);
    if (!data.ok()) {
      return Status(data.status().code(), "tensor '" + info.hf_name + "': " + data.status().message());
    }
    if (host != nullptr) {
      FromHfLayout(info, table.extras[i], data->data(), host + info.offset);
      continue;
    }
    one.resize(static_cast<size_t>(info.numel));
    FromHfLayout(info, table.extras[i], data->data(), one.data());
    std::vector<float>().swap(*data);  // the file's copy goes before the next tensor's
    each(i, one.data());
  }
  return Status::Ok();
}

SafetensorsStream DecoderModel::StreamHf(size_t piece_bytes) {
  if (quant_) {  // QLoRA: the 4-bit tensors dequantized
    FlatWeightsSource src;
    src.read = [this](int64_t offset, float* out, int64_t n) { return ReadBase(offset, out, n); };
    return StreamFlatToHf(be_, &table_, src, piece_bytes, nullptr);
  }
  if (master_off_ && lora()) {  // the frozen base: LoadMergeBase's
    return StreamFlatToHf(be_, &table_, {nullptr, nullptr, merge_base_.empty() ? nullptr : merge_base_.data()},
                          piece_bytes, nullptr);
  }
  if (master_off_) return StreamFlatToHf(be_, &table_, {nullptr, master_store_}, piece_bytes, nullptr);
  return StreamFlatToHf(be_, &table_, {bufs_.params, nullptr}, piece_bytes, nullptr);
}

namespace {

// The reused host buffers of one stream (`whole`: a transposed tensor read from the master
// weights' store, the largest such tensor).
struct ExportBuffers {
  std::vector<float> stage, out, whole;
};

// W[o, c] += scale * sum_k B[o, k] A[k, c] (in double, as PEFT's merge) for the engine rows
// [o0, o0 + rows) and columns [c0, c0 + cols) of one tensor, held in `w` with row stride ld.
void MergeBlock(const LoraMerge& m, size_t tensor, int64_t o0, int64_t rows, int64_t c0,
                int64_t cols, float* w, int64_t ld) {
  for (const LoraAdapterEntry* e : m.by_tensor[tensor]) {
    const float* A = m.host.data() + e->a_off;
    const float* B = m.host.data() + e->b_off;
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t c = 0; c < cols; ++c) {
        double acc = 0.0;
        for (int64_t k = 0; k < m.r; ++k) {
          acc += static_cast<double>(B[(o0 + o) * m.r + k]) * A[k * e->in + c0 + c];
        }
        w[o * ld + c] += static_cast<float>(m.scale * acc);
      }
    }
  }
}

// One tensor of StreamFlatToHf into `sink`. A false sink (the write failed) stops it; the writer
// reports that error.
Status StreamTensor(Backend* be, const ParamInfo& info, const ParamExtra& ex, FlatWeightsSource source,
                    size_t piece_floats, const LoraMerge* merge, size_t tensor, ExportBuffers* buf,
                    const SafetensorsSink& sink) {
  if (source.device == nullptr && source.master == nullptr && source.host == nullptr && !source.read) {
    return Status::Internal("export of " + info.hf_name +
                            ": its fp32 weights are off the device and no source is set (the master "
                            "weights' store, or LoadMergeBase's base)");
  }
  const float* src = source.device != nullptr ? source.device + info.offset : nullptr;
  const float* host = source.host != nullptr ? source.host + info.offset : nullptr;
  const bool merged = merge != nullptr && !merge->by_tensor[tensor].empty();
  if (ex.transposed) {  // engine (OC, C) -> file (C, OC): file rows [c0, c0 + w) per piece
    const int64_t OC = info.shape[0], C = info.shape[1];
    const int64_t w = std::max<int64_t>(1, static_cast<int64_t>(piece_floats) / OC);
    buf->stage.resize(static_cast<size_t>(std::min(w, C) * OC));
    buf->out.resize(buf->stage.size());
    for (int64_t c0 = 0; c0 < C; c0 += w) {
      const int64_t cw = std::min(w, C - c0);
      // Columns [c0, c0 + cw) of every engine row: one strided copy (OC rows of cw floats, C apart).
      if (src != nullptr) {
        be->CopyDeviceToHost2D(buf->stage.data(), static_cast<size_t>(cw) * sizeof(float), src + c0,
                               static_cast<size_t>(C) * sizeof(float),
                               static_cast<size_t>(cw) * sizeof(float), static_cast<size_t>(OC));
        be->Synchronize();
      } else if (host != nullptr) {
        for (int64_t o = 0; o < OC; ++o) std::copy_n(host + o * C + c0, cw, buf->stage.data() + o * cw);
      } else {
        // From the store: the whole tensor once (each piece needs every engine row; reading rows
        // per piece would read the store's chunks once per piece), then its columns per piece.
        if (c0 == 0) {
          buf->whole.resize(static_cast<size_t>(info.numel));
          TRAIND_RETURN_IF_ERROR(source.read ? source.read(info.offset, buf->whole.data(), info.numel)
                                             : source.master->GetMaster(info.offset, buf->whole.data(), info.numel));
        }
        for (int64_t o = 0; o < OC; ++o) {
          std::copy_n(buf->whole.data() + o * C + c0, cw, buf->stage.data() + o * cw);
        }
      }
      if (merged) MergeBlock(*merge, tensor, 0, OC, c0, cw, buf->stage.data(), cw);
      for (int64_t o = 0; o < OC; ++o)
        for (int64_t c = 0; c < cw; ++c) buf->out[c * OC + o] = buf->stage[o * cw + c];
      if (!sink(buf->out.data(), static_cast<size_t>(cw * OC) * sizeof(float))) break;
    }
    return Status::Ok();
  }
  // The file's tensor is the first hf_numel elements (padded vocabulary rows dropped), sent in
  // whole engine rows (the merge works on rows); 1-D tensors in runs of elements.
  int64_t hf_numel = 1;
  for (int64_t s : info.hf_shape) hf_numel *= s;
  const int64_t row = info.shape.size() >= 2 ? info.numel / info.shape[0] : 1;
  const int64_t rows = hf_numel / row;
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(piece_floats) / row);
  buf->stage.resize(static_cast<size_t>(std::min(per, rows) * row));
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t n = std::min(per, rows - r0);
    if (src != nullptr) {
      be->CopyDeviceToHost(buf->stage.data(), src + r0 * row,
                           static_cast<size_t>(n * row) * sizeof(float));
      be->Synchronize();
    } else if (host != nullptr) {
      std::copy_n(host + r0 * row, n * row, buf->stage.data());
    } else if (source.read) {
      TRAIND_RETURN_IF_ERROR(source.read(info.offset + r0 * row, buf->stage.data(), n * row));
    } else {
      TRAIND_RETURN_IF_ERROR(source.master->GetMaster(info.offset + r0 * row, buf->stage.data(), n * row));
    }
    if (merged) MergeBlock(*merge, tensor, r0, n, 0, row, buf->stage.data(), row);
    if (!sink(buf->stage.data(), static_cast<size_t>(n * row) * sizeof(float))) break;
  }
  return Status::Ok();
}

}  // namespace

SafetensorsStream StreamFlatToHf(Backend* be, const ParamTable* table, FlatWeightsSource source,
                                 size_t piece_bytes, std::shared_ptr<const LoraMerge> merge) {
  SafetensorsStream out;
  out.metadata["format"] = "pt";
  for (const ParamInfo& info : table->infos) out.tensors.push_back({info.hf_name, "F32", info.hf_shape});
  const size_t piece_floats = std::max<size_t>(1, piece_bytes / sizeof(float));
  auto buf = std::make_shared<ExportBuffers>();
  out.data = [be, table, source, piece_floats, merge, buf](size_t i, const SafetensorsSink& sink) {
    return StreamTensor(be, table->infos[i], table->extras[i], source, piece_floats, merge.get(), i,
                        buf.get(), sink);
  };
  return out;
}

void DecoderModel::InitAdapters(uint64_t seed) {
  if (!lora()) return;
  std::vector<float> host(static_cast<size_t>(lora_.total), 0.0f);
  // A: U(-1/sqrt(in), 1/sqrt(in)) (torch's kaiming_uniform_(a=sqrt(5)), PEFT's default), from
  // its own stream so the base init is the same with and without LoRA. B: zeros.
  std::mt19937_64 rng(seed ^ 0x4c6f5241ull);
  for (const LoraAdapterEntry& e : lora_.adapters) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(e.in));
    for (int64_t j = 0; j < lora_.r * e.in; ++j) {
      const double u = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
      host[e.a_off + j] = static_cast<float>((2.0 * u - 1.0) * bound);
    }
  }
  be_->CopyHostToDevice(bufs_.lora_params, host.data(), host.size() * sizeof(float));
  be_->Synchronize();
}

SafetensorsFile DecoderModel::ExportAdapters() {
  SafetensorsFile out;
  out.metadata["format"] = "pt";
  if (!lora()) return out;
  std::vector<float> host(static_cast<size_t>(lora_.total));
  be_->CopyDeviceToHost(host.data(), bufs_.lora_params, host.size() * sizeof(float));
  be_->Synchronize();
  for (const ParamInfo& info : lora_.infos) {
    out.tensors[info.hf_name] = HostTensor::FromF32(host.data() + info.offset, info.hf_shape);
  }
  return out;
}

Status DecoderModel::LoadAdapters(const SafetensorsFile& file) {
  if (!lora()) return Status::FailedPrecondition("LoadAdapters: the model has no LoRA adapters");
  std::vector<float> host(static_cast<size_t>(lora_.total), 0.0f);
  for (const ParamInfo& info : lora_.infos) {
    auto it = file.tensors.find(info.hf_name);
    if (it == file.tensors.end()) {
      return Status::InvalidArgument("adapter file is missing tensor '" + info.hf_name +
                                     "' (expected shape " + ShapeStr(info.hf_shape) +
                                     "): check training.peft (r, target_modules) against it");
    }
    if (it->second.shape != info.hf_shape) {
      return Status::InvalidArgument("adapter tensor '" + info.hf_name + "' has shape " +
                                     ShapeStr(it->second.shape) + ", this job expects " +
                                     ShapeStr(info.hf_shape) + " (training.peft.r)");
    }
    auto data = it->second.ToF32();
    if (!data.ok()) {
      return Status::InvalidArgument("tensor '" + info.hf_name + "': " + data.status().message());
    }
    std::copy(data->begin(), data->end(), host.begin() + info.offset);
  }
  be_->CopyHostToDevice(bufs_.lora_params, host.data(), host.size() * sizeof(float));
  be_->Synchronize();
  return Status::Ok();
}

SafetensorsStream DecoderModel::StreamMerged(size_t piece_bytes) {
  if (!lora()) return StreamHf(piece_bytes);
  auto merge = std::make_shared<LoraMerge>();
  merge->r = lora_.r;
  merge->scale = lora_.scale;
  merge->host.resize(static_cast<size_t>(lora_.total));
  be_->CopyDeviceToHost(merge->host.data(), bufs_.lora_params, merge->host.size() * sizeof(float));
  be_->Synchronize();
  // Each adapter covers one table tensor: the rows [col, col + out) of its fused site weight.
  merge->by_tensor.resize(table_.infos.size());
  for (const LoraAdapterEntry& e : lora_.adapters) {
    const int64_t offset = e.base_w + e.col * e.base_in;
    for (size_t i = 0; i < table_.infos.size(); ++i) {
      const ParamInfo& info = table_.infos[i];
      if (info.offset == offset && info.numel == e.out * e.in) merge->by_tensor[i].push_back(&e);
    }
  }
  if (quant_) {  // QLoRA: the dequantized base plus the adapters
    FlatWeightsSource src;
    src.read = [this](int64_t offset, float* out, int64_t n) { return ReadBase(offset, out, n); };
    return StreamFlatToHf(be_, &table_, src, piece_bytes, std::move(merge));
  }
  if (master_off_) {  // the fp32 base from LoadMergeBase (none: every tensor fails to export)
    const float* base = merge_base_.empty() ? nullptr : merge_base_.data();
    return StreamFlatToHf(be_, &table_, {nullptr, nullptr, base}, piece_bytes, std::move(merge));
  }
  return StreamFlatToHf(be_, &table_, {bufs_.params, nullptr}, piece_bytes, std::move(merge));
}

KvWeights DecoderModel::InferenceWeights() {
  if (!master_off_) return KvWeights::Flat(bufs_.params);
  KvWeights w;
  w.gemm_type = options_.compute_type;
  w.gemm = [this](int64_t offset) { return W(offset); };
  w.fp32 = [this](int64_t offset) -> const float* { return P(offset); };
  return w;
}

Status DecoderModel::LoadMergeBase(const SafetensorsFile* file, uint64_t seed) {
  if (!merge_needs_base()) return Status::Ok();
  merge_base_.assign(static_cast<size_t>(table_.total), 0.0f);
  Status st = Status::Ok();
  if (file == nullptr) {
    InitFlatParams(d_, table_, seed, merge_base_.data());
  } else {
    st = HfToFlat(config_.arch, table_, *file, merge_base_.data());
  }
  // The same base as the one trained on: its 16-bit copy hashes as the device's did when loaded
  // (an init_from rewritten during the job would otherwise be merged silently).
  if (st.ok()) {
    uint64_t h = kFnvOffset;
    std::vector<uint16_t> piece;
    constexpr int64_t kPiece = int64_t{1} << 20;
    for (int64_t o = 0; o < table_.total; o += kPiece) {
      const int64_t n = std::min(kPiece, table_.total - o);
      To16(options_.compute_type, merge_base_.data() + o, n, &piece);
      h = Fnv1a16(h, piece.data(), n);
    }
    if (h != base16_hash_) {
      st = Status::FailedPrecondition(
          "the fp32 base read again for the merged export differs from the base this job trained on "
          "(rewritten while the job ran?); the adapters are saved: merge them onto the original base");
    }
  }
  if (!st.ok()) std::vector<float>().swap(merge_base_);
  return st;
}

nn::LoraSite DecoderModel::Site(int64_t l, LoraSiteKind site) const {
  nn::LoraSite s;
  if (!lora()) return s;
  const int64_t first = l * lora_.per_layer;
  for (int64_t i = first; i < first + lora_.per_layer; ++i) {
    if (lora_.adapters[i].site != site) continue;
    if (s.adapters == nullptr) s.adapters = &lora_ops_[i];
    ++s.n;
  }
  s.r = lora_.r;
  s.scale = lora_.scale;
  s.du = bufs_.lora_du;
  s.x_type = options_.compute_type;
  s.dropout = training_ ? static_cast<float>(options_.lora.dropout) : 0.0f;
  s.key = bufs_.dropout_key;
  s.xs = bufs_.lora_xs;
  switch (site) {
    case LoraSiteKind::kQkv: s.ld_out = d_.qkv_width(); break;
    case LoraSiteKind::kProj: s.ld_out = d_.C; break;
    case LoraSiteKind::kUp: s.ld_out = d_.up_width(); break;
    case LoraSiteKind::kDown: s.ld_out = d_.C; break;
  }
  return s;
}

void DecoderModel::ZeroGrad() {
  be_->Memset0(bufs_.grads, static_cast<size_t>(num_trainable()) * sizeof(float));
}

const void* DecoderModel::W(int64_t offset) const {
  if (offset < 0) return nullptr;
  const size_t es = DTypeSize(options_.compute_type);
  if (quant_) {
    if (const Quant4Slot* s = q_.Find(offset)) {  // dequantized by DequantizeLayer
      return static_cast<const char*>(bufs_.q_scratch) + s->scratch * static_cast<int64_t>(es);
    }
  }
  if (!mixed_) return bufs_.params + Dense(offset);
  return static_cast<const char*>(bufs_.params16) + Dense(offset) * static_cast<int64_t>(es);
}

Quant4View DecoderModel::QView(const Quant4Slot& s) const {
  Quant4View v;
  v.type = options_.quant4.type;
  v.n = s.numel;
  v.codes = bufs_.q_codes + s.codes;
  if (options_.quant4.double_quant) {
    v.qabsmax = bufs_.q_qabsmax + s.blocks;
    v.nested_absmax = bufs_.q_nested + s.nested;
    v.nested_code = bufs_.q_code;
    v.offset = q_offsets_[static_cast<size_t>(&s - q_.tensors.data())];
  } else {
    v.absmax = bufs_.q_absmax + s.blocks;
  }
  return v;
}

void DecoderModel::DequantizeLayer(int64_t l) {
  const DType ct = options_.compute_type;
  const int64_t es = static_cast<int64_t>(DTypeSize(ct));
  for (const Quant4Slot& s : q_.tensors) {
    if (s.layer != l) continue;
    be_->Dequantize4bit(QView(s), s.cols, 0, s.rows,
                        static_cast<char*>(bufs_.q_scratch) + s.scratch * es, s.cols, ct);
  }
}

namespace {
int QuantThreads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
}  // namespace

void DecoderModel::WriteBase(int64_t offset, const float* v, int64_t n) {
  auto it = std::upper_bound(q_.tensors.begin(), q_.tensors.end(), offset,
                             [](int64_t at, const Quant4Slot& s) { return at < s.offset; });
  const Quant4Slot* s = it == q_.tensors.begin() ? nullptr : &*(it - 1);
  if (s == nullptr || offset >= s->offset + s->numel) {  // kept in the compute type
    if (master_off_) {
      PublishFromHost(offset, v, n);
    } else {
      be_->CopyHostToDevice(bufs_.params + Dense(offset), v, static_cast<size_t>(n) * sizeof(float));
      be_->Synchronize();
    }
    return;
  }
  const int64_t j0 = offset - s->offset;  // a multiple of kQuant4Block (InitFlatParamsTo's pieces)
  const Quant4Type type = options_.quant4.type;
  if (j0 == 0) q_absmax_host_.assign(static_cast<size_t>(Quant4Blocks(s->numel)), 0.0f);
  q_codes_host_.resize(static_cast<size_t>(Quant4Bytes(n)));
  cpu::Quantize4bit(v, DType::kF32, n, type, q_codes_host_.data(),
                    q_absmax_host_.data() + j0 / kQuant4Block, QuantThreads());
  be_->CopyHostToDevice(bufs_.q_codes + s->codes + j0 / 2, q_codes_host_.data(), q_codes_host_.size());
  be_->Synchronize();  // q_codes_host_ is reused by the next piece
  if (j0 + n < s->numel) return;
  const int64_t nb = Quant4Blocks(s->numel);
  if (!options_.quant4.double_quant) {
    be_->CopyHostToDevice(bufs_.q_absmax + s->blocks, q_absmax_host_.data(),
                          static_cast<size_t>(nb) * sizeof(float));
  } else {
    std::vector<uint8_t> qabsmax(static_cast<size_t>(nb));
    std::vector<float> nested(static_cast<size_t>(Quant4NestedBlocks(s->numel)));
    const size_t idx = static_cast<size_t>(s - q_.tensors.data());
    q_offsets_[idx] = cpu::QuantizeAbsmaxNested(q_absmax_host_.data(), nb, qabsmax.data(),
                                                nested.data(), QuantThreads());
    be_->CopyHostToDevice(bufs_.q_qabsmax + s->blocks, qabsmax.data(), qabsmax.size());
    be_->CopyHostToDevice(bufs_.q_nested + s->nested, nested.data(), nested.size() * sizeof(float));
    be_->CopyHostToDevice(bufs_.q_offsets + idx, &q_offsets_[idx], sizeof(float));
  }
  be_->Synchronize();
}

std::vector<uint8_t> DecoderModel::Quant4StoreBytes() const {
  if (!quant_) return {};
  std::vector<std::pair<const void*, int64_t>> parts = {{bufs_.q_codes, q_.code_bytes}};
  if (options_.quant4.double_quant) {
    parts.push_back({bufs_.q_qabsmax, q_.blocks});
    parts.push_back({bufs_.q_nested, 4 * q_.nested_blocks});
    parts.push_back({bufs_.q_offsets, 4 * static_cast<int64_t>(q_.tensors.size())});
  } else {
    parts.push_back({bufs_.q_absmax, 4 * q_.blocks});
  }
  std::vector<uint8_t> out;
  for (const auto& [p, n] : parts) {
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(n));
    be_->CopyDeviceToHost(out.data() + at, p, static_cast<size_t>(n));
  }
  be_->Synchronize();
  return out;
}

namespace {
// The quant_state JSON of one bitsandbytes 4-bit weight (`weight`, (out, in) = rows_cols),
// checked against the job's type and double quantization; returns its nested_offset (0 without
// double quantization). `bad` makes the error naming the JSON tensor.
Result<float> ParseBnbQuantState(const std::string& text, const std::string& weight, Quant4Type type,
                                 bool nested, const std::vector<int64_t>& rows_cols,
                                 const std::function<Status(const std::string&)>& bad) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("is not a JSON object");
  auto int_is = [&](const char* key, int64_t v) -> Status {
    if (!j.contains(key) || !j[key].is_number_integer()) return bad(std::string("has no integer \"") + key + "\"");
    if (j[key].get<int64_t>() != v) {
      return bad(std::string("\"") + key + "\" is " + j[key].dump() + "; only " + std::to_string(v) + " is built");
    }
    return Status::Ok();
  };
  if (!j.contains("quant_type") || j["quant_type"] != Quant4TypeName(type)) {
    return bad(std::string("\"quant_type\" is ") + (j.contains("quant_type") ? j["quant_type"].dump() : "missing") +
                            ", the tensor's name says " + Quant4TypeName(type));
  }
  TRAIND_RETURN_IF_ERROR(int_is("blocksize", kQuant4Block));
  if (!j.contains("shape") || !j["shape"].is_array() || j["shape"] != nlohmann::json(rows_cols)) {
    return bad("\"shape\" is " + (j.contains("shape") ? j["shape"].dump() : std::string("missing")) +
                            " but the model's " + weight + " is (out, in) " + ShapeStr(rows_cols));
  }
  if (!j.contains("dtype") || !j["dtype"].is_string()) return bad("has no string \"dtype\"");
  const bool file_nested = j.contains("nested_offset") || j.contains("nested_blocksize");
  if (file_nested != nested) {
    return bad(std::string(file_nested ? "is" : "is not") + " double quantized (nested_offset) but "
                        "model.quantization_config.bnb_4bit_use_double_quant is " + (nested ? "true" : "false"));
  }
  if (!nested) return 0.0f;
  TRAIND_RETURN_IF_ERROR(int_is("nested_blocksize", kQuant4NestedBlock));
  if (!j["nested_offset"].is_number() || !std::isfinite(j["nested_offset"].get<double>())) {
    return bad("\"nested_offset\" is not a finite number");
  }
  if (j.contains("nested_dtype") && j["nested_dtype"] != "float32") {
    return bad("\"nested_dtype\" is " + j["nested_dtype"].dump() + ", expected \"float32\"");
  }
  return static_cast<float>(j["nested_offset"].get<double>());
}

}  // namespace

Status DecoderModel::LoadQuantState(const HfTensorSource& src, size_t i, const Quant4Slot& s) {
  const std::string& name = table_.infos[i].hf_name;
  const Quant4Type want = options_.quant4.type;
  const bool nested = options_.quant4.double_quant;
  const std::string path = src.where(name);
  auto bad = [&](const std::string& tensor, const std::string& what) {
    return Status::InvalidArgument(path + ": tensor '" + tensor + "': " + what +
                                   " (a damaged or inconsistent bitsandbytes 4-bit state)");
  };
  std::string dtype;  // a tensor's, as src.find gives them
  std::vector<int64_t> shape;
  // The JSON tensor: exactly one of __nf4 / __fp4, the job's type.
  std::string qs_name;
  Quant4Type file_type = want;
  for (Quant4Type t : {Quant4Type::kNF4, Quant4Type::kFP4}) {
    const std::string n = name + kBnbQuantStatePrefix + Quant4TypeName(t);
    if (!src.find(n, &dtype, &shape)) continue;
    if (!qs_name.empty()) return bad(n, "a second quant state beside '" + qs_name + "'");
    qs_name = n;
    file_type = t;
  }
  if (file_type != want) {
    return bad(qs_name, std::string("is ") + Quant4TypeName(file_type) +
                            " but model.quantization_config.bnb_4bit_quant_type is " + Quant4TypeName(want));
  }
  // A companion tensor: present, of `dtype` and `shape`.
  auto entry = [&](const std::string& suffix, const std::string& want_dtype,
                   const std::vector<int64_t>& want_shape) -> Status {
    const std::string t = name + suffix;
    if (!src.find(t, &dtype, &shape)) return bad(t, "is missing (a part of the 4-bit weight '" + name + "')");
    if (dtype != want_dtype) return bad(t, "has dtype " + dtype + ", expected " + want_dtype);
    if (!want_shape.empty() && shape != want_shape) {
      return bad(t, "has shape " + ShapeStr(shape) + ", expected " + ShapeStr(want_shape));
    }
    return Status::Ok();
  };
  TRAIND_RETURN_IF_ERROR(entry(qs_name.substr(name.size()), "U8", {}));
  if (shape.size() != 1 || shape[0] > (1 << 20)) {
    return bad(qs_name, "has shape " + ShapeStr(shape) + ", expected one dimension of JSON bytes");
  }
  std::string text(static_cast<size_t>(shape[0]), '\0');
  TRAIND_RETURN_IF_ERROR(src.read_bytes(qs_name, 0, text.data(), text.size()));
  TRAIND_ASSIGN_OR_RETURN(
      const float offset,
      ParseBnbQuantState(text, name, file_type, nested, {s.rows, s.cols},
                         [&](const std::string& what) { return bad(qs_name, what); }));
  if (!nested && src.find(name + ".nested_absmax", &dtype, &shape)) {
    return bad(name + ".nested_absmax", "is present but the quant state is not double quantized");
  }
  const int64_t n = s.numel, nb = Quant4Blocks(n), nnb = Quant4NestedBlocks(n);
  TRAIND_RETURN_IF_ERROR(entry("", "U8", {Quant4Bytes(n), 1}));
  TRAIND_RETURN_IF_ERROR(entry(".quant_map", "F32", {16}));
  float qmap[16];
  TRAIND_RETURN_IF_ERROR(src.read_bytes(name + ".quant_map", 0, qmap, sizeof(qmap)));
  const float* table = Quant4Code(file_type);
  for (int c = 0; c < 16; ++c) {
    if (qmap[c] != table[c]) {
      return bad(name + ".quant_map", std::string("is not bitsandbytes' ") + Quant4TypeName(file_type) +
                                          " table (entry " + std::to_string(c) + " is " +
                                          std::to_string(qmap[c]) + ")");
    }
  }
  TRAIND_RETURN_IF_ERROR(entry(".absmax", nested ? "U8" : "F32", {nb}));
  const size_t idx = static_cast<size_t>(&s - q_.tensors.data());
  if (nested) {
    TRAIND_RETURN_IF_ERROR(entry(".nested_absmax", "F32", {nnb}));
    TRAIND_RETURN_IF_ERROR(entry(".nested_quant_map", "F32", {256}));
    std::vector<float> code(256);
    TRAIND_RETURN_IF_ERROR(src.read_bytes(name + ".nested_quant_map", 0, code.data(), 256 * sizeof(float)));
    if (std::memcmp(code.data(), DynamicCodeSigned(), 256 * sizeof(float)) != 0) {
      return bad(name + ".nested_quant_map", "is not bitsandbytes' signed dynamic map");
    }
    std::vector<uint8_t> qabsmax(static_cast<size_t>(nb));
    std::vector<float> nested_absmax(static_cast<size_t>(nnb));
    TRAIND_RETURN_IF_ERROR(src.read_bytes(name + ".absmax", 0, qabsmax.data(), qabsmax.size()));
    TRAIND_RETURN_IF_ERROR(src.read_bytes(name + ".nested_absmax", 0, nested_absmax.data(),
                                            nested_absmax.size() * sizeof(float)));
    for (float v : nested_absmax) {
      if (!std::isfinite(v)) return bad(name + ".nested_absmax", "holds a non-finite value");
    }
    q_offsets_[idx] = offset;
    be_->CopyHostToDevice(bufs_.q_qabsmax + s.blocks, qabsmax.data(), qabsmax.size());
    be_->CopyHostToDevice(bufs_.q_nested + s.nested, nested_absmax.data(), nested_absmax.size() * sizeof(float));
    be_->CopyHostToDevice(bufs_.q_offsets + idx, &q_offsets_[idx], sizeof(float));
  } else {
    q_absmax_host_.resize(static_cast<size_t>(nb));
    TRAIND_RETURN_IF_ERROR(src.read_bytes(name + ".absmax", 0, q_absmax_host_.data(), nb * sizeof(float)));
    for (float v : q_absmax_host_) {
      if (!(v >= 0.0f) || !std::isfinite(v)) return bad(name + ".absmax", "holds a negative or non-finite value");
    }
    be_->CopyHostToDevice(bufs_.q_absmax + s.blocks, q_absmax_host_.data(), nb * sizeof(float));
  }
  q_codes_host_.resize(static_cast<size_t>(Quant4Bytes(n)));
  TRAIND_RETURN_IF_ERROR(src.read_bytes(name, 0, q_codes_host_.data(), q_codes_host_.size()));
  be_->CopyHostToDevice(bufs_.q_codes + s.codes, q_codes_host_.data(), q_codes_host_.size());
  be_->Synchronize();  // the host buffers are reused by the next tensor
  return Status::Ok();
}

Status DecoderModel::ReadBase(int64_t offset, float* out, int64_t n) {
  const DType ct = options_.compute_type;
  const size_t es = DTypeSize(ct);
  auto it = std::upper_bound(q_.tensors.begin(), q_.tensors.end(), offset,
                             [](int64_t at, const Quant4Slot& s) { return at < s.offset; });
  const Quant4Slot* s = it == q_.tensors.begin() ? nullptr : &*(it - 1);
  const void* src = nullptr;
  if (s != nullptr && offset < s->offset + s->numel) {  // rows [r0, r0 + n / cols) dequantized
    const int64_t r0 = (offset - s->offset) / s->cols;
    if ((offset - s->offset) % s->cols != 0 || n % s->cols != 0) {
      return Status::Internal("ReadBase: a 4-bit tensor is read in whole rows");
    }
    // In fp32 (code * absmax, unrounded): the exports' dequantized base, which a merge adds to
    // before its one rounding to the output dtype. The scratch (the largest layer's weights in the
    // compute type) holds a part of the rows at a time.
    const int64_t fit = std::max<int64_t>(1, q_.largest * static_cast<int64_t>(es) / (4 * s->cols));
    for (int64_t a = r0; a < r0 + n / s->cols; a += fit) {
      const int64_t b = std::min(r0 + n / s->cols, a + fit);
      be_->Dequantize4bit(QView(*s), s->cols, a, b, bufs_.q_scratch, s->cols, DType::kF32);
      be_->CopyDeviceToHost(out + (a - r0) * s->cols, bufs_.q_scratch,
                            static_cast<size_t>((b - a) * s->cols) * sizeof(float));
      be_->Synchronize();
    }
    return Status::Ok();
  } else {
    auto r = master_off_ ? FirstResidentEndingAfter(offset) : resident_.end();
    if (r != resident_.end() && r->offset <= offset) {
      src = bufs_.params + r->packed + (offset - r->offset);
      be_->CopyDeviceToHost(out, src, static_cast<size_t>(n) * sizeof(float));
      be_->Synchronize();
      return Status::Ok();
    }
    src = mixed_ ? static_cast<const void*>(static_cast<const char*>(bufs_.params16) +
                                             Dense(offset) * static_cast<int64_t>(es))
                 : static_cast<const void*>(bufs_.params + Dense(offset));
  }
  if (!mixed_) {
    be_->CopyDeviceToHost(out, src, static_cast<size_t>(n) * sizeof(float));
    be_->Synchronize();
    return Status::Ok();
  }
  host16_.resize(static_cast<size_t>(n));
  be_->CopyDeviceToHost(host16_.data(), src, static_cast<size_t>(n) * es);
  be_->Synchronize();
  const bool bf16 = ct == DType::kBF16;
  for (int64_t k = 0; k < n; ++k) out[k] = bf16 ? BF16ToF32(host16_[k]) : F16ToF32(host16_[k]);
  return Status::Ok();
}

void DecoderModel::NormInto(void* dst, float* mean, float* rstd, const float* inp, int64_t w,
                            int64_t b, bool keep_fp32) {
  const nn::NormShape ns{N_, d_.C, d_.rms_norm(), d_.eps};
  if (mixed_ && !keep_fp32) {  // 16-bit: rounded as it is normalised (tmp_c: the op's scratch)
    nn::NormForwardRounded(*be_, ns, dst, options_.compute_type, bufs_.tmp_c, mean, rstd, inp,
                           NormW(w), P(b));
    return;
  }
  // 16-bit with the fp32 output kept: normalise in fp32 into tmp_c (free between the block's
  // uses), then round.
  float* out = mixed_ ? bufs_.tmp_c : static_cast<float*>(dst);
  nn::NormForward(*be_, ns, out, mean, rstd, inp, NormW(w), P(b));
  if (mixed_) be_->Cast(dst, options_.compute_type, out, DType::kF32, N_ * d_.C);
}

void DecoderModel::BlockForward(int64_t l, bool recompute) {
  if (quant_) DequantizeLayer(l);
  Backend& be = *be_;
  const DType ct = options_.compute_type;
  const LayerParams& p = table_.layers[l];
  const BlockActs& a = bufs_.blocks[l];
  const float* x = bufs_.res[l];
  float* y = bufs_.res[l + 1];
  const int64_t C = d_.C;
  nn::AttentionShape as = AttentionShapeOf(d_, options_.micro_batch, options_.seq_len);
  as.operand_type = options_.compute_type;
  if (bufs_.rows != nullptr) {  // rows of examples: doc_start, then positions
    as.doc_start = bufs_.rows;
    as.positions = bufs_.rows + N_;
  }
  nn::MlpShape ms{N_, C, d_.H, d_.swiglu()};
  ms.geglu = d_.geglu();
  const nn::MlpWeights mw{W(p.up_w), P(p.up_b), W(p.down_w), P(p.down_b)};

  // Past the first block, the previous block's last residual add normalised ln1 already
  // (FusesNextNorm); a recomputation and the mixture-of-experts blocks normalise it here.
  if (recompute || l == 0 || !FusesNextNorm()) {
    NormInto(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b);
  }
  // The projection's fp32 output: qkv itself, or with 16 bits scratch_big (free in forward until
  // the MLP), rounded into qkv after the per-head norms and RoPE.
  float* qkv = mixed_ ? bufs_.scratch_big : static_cast<float*>(a.qkv);
  nn::LinearForward(be, qkv, a.ln1, W(p.qkv_w), P(p.qkv_b), N_, C, as.width(), ct);
  const nn::LoraSite qkv_lora = Site(l, LoraSiteKind::kQkv);
  if (qkv_lora.active()) nn::LoraForward(be, qkv_lora, qkv, a.ln1, N_);
  if (d_.qk_norm()) {  // qwen3: q_norm and k_norm over each head, before RoPE (input saved)
    const int64_t qw = d_.NH * d_.HS;
    be.HeadRmsNormForward(qkv, a.qk_saved, a.qk_rstd, P(p.q_norm), N_, d_.NH, d_.HS,
                          d_.qkv_width(), d_.eps);
    be.HeadRmsNormForward(qkv + qw, a.qk_saved + N_ * qw, a.qk_rstd + N_ * d_.NH, P(p.k_norm),
                          N_, d_.NKV, d_.HS, d_.qkv_width(), d_.eps);
  }
  // With 16 bits, attention reads the rounded qkv and writes atty in the compute type (softmax,
  // lse and accumulation fp32: Backend::AttentionForward16).
  if (recompute) {  // atty and lse as the first forward left them; qkv needs its rotation
    if (mixed_) {
      nn::AttentionRope16(be, as, qkv, a.qkv);
    } else {
      nn::AttentionRope(be, as, qkv);
    }
  } else if (mixed_) {
    nn::AttentionForward16(be, as, a.atty, a.lse, qkv, a.qkv);
  } else {
    nn::AttentionForward(be, as, static_cast<float*>(a.atty), a.lse, qkv);
  }
  nn::LinearForward(be, bufs_.tmp_c, a.atty, W(p.proj_w), P(p.proj_b), N_, d_.NH * d_.HS, C, ct);
  const nn::LoraSite proj_lora = Site(l, LoraSiteKind::kProj);
  if (proj_lora.active()) {
    nn::LoraForward(be, proj_lora, bufs_.tmp_c, a.atty, N_);
  }
  if (d_.moe()) {
    be.Add(a.res2, x, bufs_.tmp_c, N_ * C);
    NormInto(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, /*keep_fp32=*/true);
    // NormInto left the fp32 norm output in tmp_c (16-bit) or a.ln2 (fp32).
    MoeForward(l, mixed_ ? bufs_.tmp_c : static_cast<const float*>(a.ln2), bufs_.tmp_c);
    be.Add(y, a.res2, bufs_.tmp_c, N_ * C);
    return;
  }
  // The residual add and ln2 in one pass (16-bit: rounded as it is normalised; tmp_c, the
  // projection's output, is also the composition's scratch, written after it is read).
  const nn::NormShape ns{N_, C, d_.rms_norm(), d_.eps};
  nn::ResidualNormForward(be, ns, a.res2, a.ln2, mixed_ ? ct : DType::kF32, bufs_.tmp_c,
                          a.ln2_mean, a.ln2_rstd, x, bufs_.tmp_c, NormW(p.ln2_w), P(p.ln2_b));
  // scratch_big (free in forward) holds the fp32 MLP activation before rounding.
  const nn::MlpLora ml{Site(l, LoraSiteKind::kUp), Site(l, LoraSiteKind::kDown)};
  nn::MlpForward(be, ms, mw, bufs_.tmp_c, a.h, a.a, a.ln2, ct, bufs_.scratch_big, &ml);
  if (recompute) {
    be.Add(y, a.res2, bufs_.tmp_c, N_ * C);
    return;
  }
  // The residual add and the norm after it in one pass: the next block's ln1 (its activation set
  // is static, and this block is done with its own), or after the last block the final norm.
  const bool last = l + 1 == d_.L;
  const LayerParams& np = last ? p : table_.layers[l + 1];
  const BlockActs& na = last ? a : bufs_.blocks[l + 1];
  void* out = last ? bufs_.lnf : na.ln1;
  float* mean = last ? bufs_.lnf_mean : na.ln1_mean;
  float* rstd = last ? bufs_.lnf_rstd : na.ln1_rstd;
  const int64_t w = last ? table_.lnf_w : np.ln1_w, b = last ? table_.lnf_b : np.ln1_b;
  nn::ResidualNormForward(be, ns, y, out, mixed_ ? ct : DType::kF32, bufs_.tmp_c, mean, rstd,
                          a.res2, bufs_.tmp_c, NormW(w), P(b));
}

void DecoderModel::BlockBackward(int64_t l) {
  if (quant_) DequantizeLayer(l);
  Backend& be = *be_;
  const LayerParams& p = table_.layers[l];
  const BlockActs& a = bufs_.blocks[l];
  const float* x = bufs_.res[l];
  const int64_t C = d_.C;
  const nn::NormShape ns{N_, C, d_.rms_norm(), d_.eps};
  nn::AttentionShape as = AttentionShapeOf(d_, options_.micro_batch, options_.seq_len);
  as.operand_type = options_.compute_type;
  if (bufs_.rows != nullptr) {  // rows of examples: doc_start, then positions
    as.doc_start = bufs_.rows;
    as.positions = bufs_.rows + N_;
  }
  nn::MlpShape ms{N_, C, d_.H, d_.swiglu()};
  ms.geglu = d_.geglu();
  const nn::MlpWeights mw{W(p.up_w), P(p.up_b), W(p.down_w), P(p.down_b)};
  const nn::MlpGrads mg{G(p.up_w), G(p.up_b), G(p.down_w), G(p.down_b)};
  float* dres = bufs_.dres;   // d(block output) = d(res2) through the residual add
  float* dtmp = bufs_.tmp_c;  // reused: d(ln2), then d(atty), then d(ln1)
  float* dbig = bufs_.scratch_big;

  const nn::MlpLora ml{Site(l, LoraSiteKind::kUp), Site(l, LoraSiteKind::kDown)};
  if (d_.moe()) {
    MoeBackward(l, dtmp, dres);
  } else {
    nn::MlpBackward(be, ms, mw, mg, dtmp, dres, a.h, a.a, a.ln2,
                    d_.gated() ? bufs_.scratch_a : dbig, dbig, gp_, &ml);
  }
  nn::NormBackward(be, ns, dres, GNorm(p.ln2_w, 0), GNorm(p.ln2_b, 1), dtmp, a.res2, NormW(p.ln2_w),
                   a.ln2_mean, a.ln2_rstd);
  nn::LinearBackward(be, dtmp, G(p.proj_w), G(p.proj_b), dres, a.atty, W(p.proj_w), N_,
                     d_.NH * d_.HS, C, gp_);
  const nn::LoraSite proj_lora = Site(l, LoraSiteKind::kProj);
  if (proj_lora.active()) {
    nn::LoraBackward(be, proj_lora, dtmp, dres, a.atty, N_);
  }
  // With 16 bits the attention backward reads its output gradient rounded, into scratch16 (free
  // until the qkv backward below rounds dqkv into it).
  if (mixed_) {
    be.Cast(bufs_.scratch16, options_.compute_type, dtmp, DType::kF32, N_ * d_.attn_width());
    nn::AttentionBackward16(be, as, dbig, bufs_.scratch16, a.atty, a.lse, a.qkv);
  } else {
    nn::AttentionBackward(be, as, dbig, dtmp, static_cast<const float*>(a.atty), a.lse,
                          static_cast<const float*>(a.qkv));
  }
  if (d_.qk_norm()) {  // d(q, k before RoPE) -> d(q, k before their per-head norms)
    const int64_t qw = d_.NH * d_.HS;
    be.HeadRmsNormBackward(dbig, GNorm(p.q_norm, 0), a.qk_saved, P(p.q_norm), a.qk_rstd, N_, d_.NH,
                           d_.HS, d_.qkv_width());
    be.HeadRmsNormBackward(dbig + qw, GNorm(p.k_norm, 1), a.qk_saved + N_ * qw, P(p.k_norm),
                           a.qk_rstd + N_ * d_.NH, N_, d_.NKV, d_.HS, d_.qkv_width());
  }
  nn::LinearBackward(be, dtmp, G(p.qkv_w), G(p.qkv_b), dbig, a.ln1, W(p.qkv_w), N_, C, as.width(),
                     gp_);
  const nn::LoraSite qkv_lora = Site(l, LoraSiteKind::kQkv);
  if (qkv_lora.active()) {
    nn::LoraBackward(be, qkv_lora, dtmp, dbig, a.ln1, N_);
  }
  nn::NormBackward(be, ns, dres, GNorm(p.ln1_w, 0), GNorm(p.ln1_b, 1), dtmp, x, NormW(p.ln1_w),
                   a.ln1_mean, a.ln1_rstd);
}

void DecoderModel::ParamsChanged() {
  if (!mixed_) WeightsChanging();  // fp32: the GEMMs read the weights themselves, maybe packed
  if (!mixed_ || master_off_) return;  // master off: the optimizer refreshed them (MasterUpdated)
  WeightsChanging();
  be_->Cast(bufs_.params16, options_.compute_type, bufs_.params, DType::kF32, table_.total);
  weights16_stale_ = false;
}

void DecoderModel::ForwardToFinalNorm() {
  Backend& be = *be_;
  if (mixed_ && weights16_stale_) ParamsChanged();
  if ((packs_stale_ || !mixed_) && !gemm_packs_.empty()) PackWeights();  // fp32: every forward
  // gemma: 1 + w of every norm, from this step's weights (HF's (1.0 + weight.float()), fp32).
  for (const auto& [offset, row] : norm_rows_) {
    be.Add(bufs_.norm_plus_one + row * d_.C, P(offset), bufs_.ones, d_.C);
  }
  if (lookup16_) {  // QLoRA: the 16-bit rows gathered as floats (C / 2 a row), then widened
    be.EmbeddingForward(bufs_.tmp_c, bufs_.inputs, static_cast<const float*>(W(table_.wte)), N_,
                        d_.C / 2, /*accumulate=*/false);
    be.Cast(bufs_.res[0], DType::kF32, bufs_.tmp_c, options_.compute_type, N_ * d_.C);
  } else {
    nn::EmbeddingForward(be, bufs_.res[0], bufs_.inputs,
                         bufs_.rows != nullptr ? bufs_.rows + N_ : bufs_.positions, P(table_.wte),
                         P(table_.wpe), N_, d_.C);
  }
  if (d_.f().embed_scale) be.Scale(bufs_.res[0], EmbedScale(d_), N_ * d_.C);
  for (int64_t l = 0; l < d_.L; ++l) BlockForward(l);
  count_routes_ = false;  // a recomputation in Backward routes again without counting
  if (d_.moe()) MoeAuxLoss();
  if (!FusesNextNorm()) {  // else the last block's residual add normalised it
    NormInto(bufs_.lnf, bufs_.lnf_mean, bufs_.lnf_rstd, bufs_.res[d_.L], table_.lnf_w,
             table_.lnf_b);
  }
}

void DecoderModel::LmHeadAndLoss(bool for_backward, float grad_scale, const float* device_scale) {
  Backend& be = *be_;
  const DType ct = options_.compute_type;
  const int64_t C = d_.C, rows = bufs_.logits_rows;
  for (int64_t r0 = 0; r0 < N_; r0 += rows) {
    const int64_t n = std::min(rows, N_ - r0);
    const void* lnf = static_cast<const char*>(bufs_.lnf) + r0 * C * DTypeSize(ct);
    nn::LinearForward(be, bufs_.logits, lnf, W(table_.lm_head), nullptr, n, C, d_.Vp, ct);
    // 16-bit: the gradient comes out of the loss already rounded, into the GEMM scratch (when the
    // chunk fits there, as the layout sizes it), instead of in place and then cast.
    const bool rounded = for_backward && mixed_ && gp_.scratch_elems >= n * d_.Vp;
    be.SoftmaxCrossEntropy(bufs_.logits, bufs_.losses + r0, bufs_.targets + r0, n, d_.V, d_.Vp,
                           grad_scale, for_backward, device_scale,
                           rounded ? gp_.scratch : nullptr, ct);
    if (!for_backward) continue;
    // The chunk's dlogits into d(lnf) rows (tmp_c, read by Backward's final-norm backward) and
    // the lm-head weight gradient (+=; none for a frozen LoRA base).
    if (rounded) {
      nn::LinearBackwardRounded(be, bufs_.tmp_c + r0 * C, G(table_.lm_head), gp_.scratch, lnf,
                                W(table_.lm_head), n, C, d_.Vp, gp_);
    } else {
      nn::LinearBackward(be, bufs_.tmp_c + r0 * C, G(table_.lm_head), nullptr, bufs_.logits, lnf,
                         W(table_.lm_head), n, C, d_.Vp, gp_);
    }
  }
}

double DecoderModel::Forward(bool for_backward, float grad_scale) {
  const int64_t n_valid = nn::CountValidTargets(*be_, bufs_.targets, N_, &host_targets_);
  training_ = for_backward;  // LoRA dropout only in a forward for backward (not in eval)
  count_routes_ = for_backward;
  ForwardToFinalNorm();
  // d(mean)/d(loss_n) = 1/n_valid, folded into the op's grad scale.
  const float scale = n_valid > 0 ? grad_scale / static_cast<float>(n_valid) : 0.0f;
  LmHeadAndLoss(for_backward, scale, nullptr);
  ready_for_backward_ = for_backward;
  if (!for_backward && !mixed_) WeightsChanging();  // fp32 copies live until the backward
  // mixtral with output_router_logits: loss = mean cross-entropy + coef * aux (HF's).
  aux_grad_ = static_cast<double>(grad_scale) * d_.aux_coef;
  return nn::MeanLoss(*be_, bufs_.losses, N_, n_valid, &host_losses_) + d_.aux_coef * aux_;
}

void DecoderModel::ForwardOnDevice(const float* grad_scale, const float* loss_weight,
                                   double* loss_sum) {
  training_ = true;
  count_routes_ = true;
  ForwardToFinalNorm();
  LmHeadAndLoss(/*for_backward=*/true, 1.0f, grad_scale);
  be_->AccumulateSum(loss_sum, bufs_.losses, N_, loss_weight);
  if (d_.aux_coef > 0) {
    // The caller folded 1/(valid targets) into both scalars; the aux term is per micro-batch, so
    // it is weighted by n_valid times them (mixtral syncs here: its steps are not captured).
    const int64_t n_valid = nn::CountValidTargets(*be_, bufs_.targets, N_, &host_targets_);
    float gs = 0.0f;
    be_->CopyDeviceToHost(&gs, grad_scale, sizeof(float));
    be_->Synchronize();
    aux_grad_ = static_cast<double>(gs) * static_cast<double>(n_valid) * d_.aux_coef;
    const float term = static_cast<float>(static_cast<double>(n_valid) * d_.aux_coef * aux_);
    be_->CopyHostToDevice(bufs_.aux_loss, &term, sizeof(float));
    be_->AccumulateSum(loss_sum, bufs_.aux_loss, 1, loss_weight);
  }
  ready_for_backward_ = true;
}

std::vector<int64_t> DecoderModel::TakeExpertTokens() {
  std::vector<int64_t> out = expert_tokens_;
  std::fill(expert_tokens_.begin(), expert_tokens_.end(), 0);
  return out;
}

void DecoderModel::MoeForward(int64_t l, const float* ln2_f32, float* out) {
  Backend& be = *be_;
  const DType ct = options_.compute_type;
  const size_t ds = DTypeSize(ct);
  const LayerParams& p = table_.layers[l];
  const BlockActs& a = bufs_.blocks[l];
  const int64_t N = N_, C = d_.C, H = d_.H, E = d_.E, K = d_.K, R = d_.moe_rows(N_);
  MoeRoute& r = routes_[l];
  // Router logits (N,E) -> host: softmax, top-K, renormalised weights (RouteToken).
  nn::LinearForward(be, bufs_.router_dlogits, a.ln2, W(p.router_w), nullptr, N, C, E, ct);
  std::vector<float> logits(static_cast<size_t>(N * E));
  be.CopyDeviceToHost(logits.data(), bufs_.router_dlogits, logits.size() * sizeof(float));
  be.Synchronize();
  r.probs.resize(static_cast<size_t>(N * E));
  r.experts.resize(static_cast<size_t>(N * K));
  r.row_of.resize(static_cast<size_t>(N * K));
  r.offsets.assign(static_cast<size_t>(E + 1), 0);
  std::vector<float> slot_weight(static_cast<size_t>(N * K));
  std::vector<int32_t> order;
  for (int64_t n = 0; n < N; ++n) {
    RouteToken(logits.data() + n * E, E, K, r.probs.data() + n * E, r.experts.data() + n * K,
               slot_weight.data() + n * K, &order);
    for (int64_t j = 0; j < K; ++j) r.offsets[r.experts[n * K + j] + 1] += 1;
  }
  for (int64_t e = 0; e < E; ++e) r.offsets[e + 1] += r.offsets[e];
  // Rows grouped by expert, tokens in order within a group.
  std::vector<int32_t> row_token(static_cast<size_t>(R));
  std::vector<float> row_weight(static_cast<size_t>(R));
  std::vector<int64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < K; ++j) {
      const int64_t row = next[r.experts[n * K + j]]++;
      row_token[row] = static_cast<int32_t>(n);
      row_weight[row] = slot_weight[n * K + j];
      r.row_of[n * K + j] = static_cast<int32_t>(row);
    }
  }
  if (count_routes_) {
    for (int64_t e = 0; e < E; ++e) expert_tokens_[l * E + e] += r.offsets[e + 1] - r.offsets[e];
  }
  be.CopyHostToDevice(a.probs, r.probs.data(), r.probs.size() * sizeof(float));
  be.CopyHostToDevice(a.row_token, row_token.data(), row_token.size() * sizeof(int32_t));
  be.CopyHostToDevice(a.row_weight, row_weight.data(), row_weight.size() * sizeof(float));
  // Gather the inputs (fp32 rows, rounded to the compute type for the GEMMs).
  float* xg32 = mixed_ ? bufs_.moe_rows_a : static_cast<float*>(a.xg);
  be.EmbeddingForward(xg32, a.row_token, ln2_f32, R, C, /*accumulate=*/false);
  if (mixed_) be.Cast(a.xg, ct, xg32, DType::kF32, R * C);
  // Experts: [w1 | w3] up GEMM over each group's rows, SwiGLU over all rows, w2 down GEMM.
  const char* xg = static_cast<const char*>(a.xg);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = r.offsets[e], c = r.offsets[e + 1] - o;
    if (c == 0) continue;
    nn::LinearForward(be, a.h + o * 2 * H, xg + o * C * ds, W(p.expert_up[e]), nullptr, c, C,
                      2 * H, ct);
  }
  float* af = mixed_ ? bufs_.scratch_a : static_cast<float*>(a.a);
  be.SwiGluForward(af, a.h, R, H);
  if (mixed_) be.Cast(a.a, ct, af, DType::kF32, R * H);
  const char* act = static_cast<const char*>(a.a);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = r.offsets[e], c = r.offsets[e + 1] - o;
    if (c == 0) continue;
    nn::LinearForward(be, a.yg + o * C, act + o * H * ds, W(p.expert_down[e]), nullptr, c, H, C,
                      ct);
  }
  // out[token] = sum over its K rows of weight * y.
  be.CopyDeviceToDevice(bufs_.moe_rows_b, a.yg, static_cast<size_t>(R * C) * sizeof(float));
  be.ScaleRows(bufs_.moe_rows_b, a.row_weight, R, C);
  be.Memset0(out, static_cast<size_t>(N * C) * sizeof(float));
  be.EmbeddingBackward(out, bufs_.moe_rows_b, a.row_token, R, C);
}

void DecoderModel::MoeAuxLoss() {
  // HF load_balancing_loss_func over the concatenated (L*N, E) router logits of all layers:
  // aux = E * sum_e F_e * P_e, F_e = (choices of e in any of the K slots) / (L*N) and P_e the
  // mean router probability of e.
  const int64_t N = N_, E = d_.E, L = d_.L;
  aux_fraction_.assign(static_cast<size_t>(E), 0.0);
  std::vector<double> mean_prob(static_cast<size_t>(E), 0.0);
  for (int64_t l = 0; l < L; ++l) {
    const MoeRoute& r = routes_[l];
    for (int64_t e = 0; e < E; ++e) {
      aux_fraction_[e] += static_cast<double>(r.offsets[e + 1] - r.offsets[e]);
    }
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t e = 0; e < E; ++e) mean_prob[e] += r.probs[n * E + e];
    }
  }
  const double rows = static_cast<double>(L * N);
  aux_ = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    aux_fraction_[e] /= rows;
    aux_ += aux_fraction_[e] * mean_prob[e] / rows;
  }
  aux_ *= static_cast<double>(E);
}

void DecoderModel::MoeBackward(int64_t l, float* dln2, const float* dout) {
  Backend& be = *be_;
  const DType ct = options_.compute_type;
  const size_t ds = DTypeSize(ct);
  const LayerParams& p = table_.layers[l];
  const BlockActs& a = bufs_.blocks[l];
  const int64_t N = N_, C = d_.C, H = d_.H, E = d_.E, K = d_.K, R = d_.moe_rows(N_);
  const MoeRoute& r = routes_[l];
  // d y rows = weight * dout[token]; d weight = dout[token] . y.
  float* dyg = bufs_.moe_rows_a;
  be.EmbeddingForward(dyg, a.row_token, dout, R, C, /*accumulate=*/false);
  be.RowDot(bufs_.row_dweight, dyg, a.yg, R, C);
  be.ScaleRows(dyg, a.row_weight, R, C);
  float* da = bufs_.scratch_a;
  const char* act = static_cast<const char*>(a.a);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = r.offsets[e], c = r.offsets[e + 1] - o;
    if (c == 0) continue;
    nn::LinearBackward(be, da + o * H, G(p.expert_down[e]), nullptr, dyg + o * C, act + o * H * ds,
                       W(p.expert_down[e]), c, H, C, gp_);
  }
  float* dh = bufs_.scratch_big;
  be.SwiGluBackward(dh, a.h, da, R, H);
  float* dxg = bufs_.moe_rows_b;
  const char* xg = static_cast<const char*>(a.xg);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = r.offsets[e], c = r.offsets[e + 1] - o;
    if (c == 0) continue;
    nn::LinearBackward(be, dxg + o * C, G(p.expert_up[e]), nullptr, dh + o * 2 * H,
                       xg + o * C * ds, W(p.expert_up[e]), c, C, 2 * H, gp_);
  }
  be.Memset0(dln2, static_cast<size_t>(N * C) * sizeof(float));
  be.EmbeddingBackward(dln2, dxg, a.row_token, R, C);
  // The router on the host: top-K renormalisation, the load-balancing loss, the softmax.
  std::vector<float> dweight(static_cast<size_t>(R));
  be.CopyDeviceToHost(dweight.data(), bufs_.row_dweight, dweight.size() * sizeof(float));
  be.Synchronize();
  std::vector<float> dlogits(static_cast<size_t>(N * E));
  std::vector<double> dp(static_cast<size_t>(E));
  const double aux_scale =
      aux_grad_ * static_cast<double>(E) / static_cast<double>(d_.L * N);  // d aux / d p / F_e
  for (int64_t n = 0; n < N; ++n) {
    const float* pr = r.probs.data() + n * E;
    for (int64_t e = 0; e < E; ++e) dp[e] = aux_scale * aux_fraction_[e];
    double top = 0.0, g = 0.0;
    for (int64_t j = 0; j < K; ++j) top += pr[r.experts[n * K + j]];
    for (int64_t j = 0; j < K; ++j) {
      g += dweight[r.row_of[n * K + j]] * (pr[r.experts[n * K + j]] / top);
    }
    for (int64_t j = 0; j < K; ++j) {
      dp[r.experts[n * K + j]] += (dweight[r.row_of[n * K + j]] - g) / top;
    }
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) dot += dp[e] * pr[e];
    for (int64_t e = 0; e < E; ++e) dlogits[n * E + e] = static_cast<float>(pr[e] * (dp[e] - dot));
  }
  be.CopyHostToDevice(bufs_.router_dlogits, dlogits.data(), dlogits.size() * sizeof(float));
  nn::LinearBackward(be, bufs_.moe_rows_b, G(p.router_w), nullptr, bufs_.router_dlogits, a.ln2,
                     W(p.router_w), N, C, E, gp_);
  be.Add(dln2, dln2, bufs_.moe_rows_b, N * C);
}

void DecoderModel::Backward() {
  assert(ready_for_backward_ && "Backward() needs a Forward(for_backward=true) first");
  if (!ready_for_backward_) return;
  ready_for_backward_ = false;
  Backend& be = *be_;
  const int64_t C = d_.C;
  // The forward left d(lnf) in tmp_c (and the lm-head's weight gradient): the final norm's
  // backward into a fresh dres.
  be.Memset0(bufs_.dres, static_cast<size_t>(N_ * C) * sizeof(float));
  const nn::NormShape ns{N_, C, d_.rms_norm(), d_.eps};
  nn::NormBackward(be, ns, bufs_.dres, GNorm(table_.lnf_w, 0), GNorm(table_.lnf_b, 1), bufs_.tmp_c,
                   bufs_.res[d_.L], NormW(table_.lnf_w), bufs_.lnf_mean, bufs_.lnf_rstd);
  BackwardBySegments(
      d_.L, options_, [this](int64_t l) { BlockForward(l, /*recompute=*/true); },
      [this](int64_t l) {
        BlockBackward(l);
        if (on_block_gradients_) on_block_gradients_(l);
      });
  training_ = false;
  if (!mixed_) WeightsChanging();  // fp32: the optimizer writes the weights next
  if (lora()) return;  // frozen embeddings
  if (d_.f().embed_scale) be.Scale(bufs_.dres, EmbedScale(d_), N_ * C);
  nn::EmbeddingBackward(be, G(table_.wte), G(table_.wpe), bufs_.dres, bufs_.inputs,
                        bufs_.rows != nullptr ? bufs_.rows + N_ : bufs_.positions,
                        N_, C);
}

}  // namespace traind::engine
